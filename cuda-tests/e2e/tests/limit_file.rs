//! A limit file that cannot fail open, end to end: clients under libgpuslice.so
//! against fakegpu, judged by the fake's physical numbers and by what the shim prints, and
//! `gpuslice check` on the same files.
//!
//! The anchored-file rule (`/etc/gpuslice/limits.json` wins over `GPUSLICE_CONFIG`) needs
//! that path, which only a container may have: see `containers.rs`. Every test here runs with
//! it absent, so the environment route applies.

use cuda_e2e::{
    command, run_with_timeout, Client, ClientKind, Env, FakeGpu, Slice, DEFAULT_TIMEOUT,
};
use std::path::Path;
use std::process::Output;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The `[gpuslice]` lines a process printed.
fn shim_lines(output: &Output) -> Vec<String> {
    text(&output.stderr)
        .lines()
        .filter(|l| l.starts_with("[gpuslice]"))
        .map(str::to_string)
        .collect()
}

fn assert_no_anchored_file() {
    assert!(
        !Path::new("/etc/gpuslice/limits.json").exists(),
        "this machine has an anchored limit file; these tests need the environment route"
    );
}

/// The device-0 UUID with its last hex digit changed: the one-character typo of the issue.
fn typo_of(uuid: &str) -> String {
    let last = uuid.chars().last().unwrap();
    let other = if last == '0' { '1' } else { '0' };
    format!("{}{other}", &uuid[..uuid.len() - 1])
}

fn run_pynvml_init(env: &Env) -> Output {
    let mut cmd = command(Path::new("python3"), &[], env);
    cmd.args([
        "-c",
        "import pynvml\ntry:\n    pynvml.nvmlInit(); print('init ok', pynvml.nvmlDeviceGetCount())\nexcept pynvml.NVMLError as e:\n    print('init error', e.value)",
    ]);
    run_with_timeout(cmd, None, DEFAULT_TIMEOUT)
}

#[test]
fn a_device_entry_matching_no_device_refuses_every_client_with_one_line() {
    assert_no_anchored_file();
    let gpu = FakeGpu::start("v100");
    let uuid = gpu.truth().device(0).unwrap().uuid;
    let typo = typo_of(&uuid);
    let cases = [
        (
            Slice::builder().device_uuid(&typo, "1GiB", None).build(),
            "devices[0].uuid",
            typo.clone(),
        ),
        (
            Slice::builder().device(3, "1GiB", None).build(),
            "devices[0].index",
            "index 3".to_string(),
        ),
    ];
    for (slice, field, named) in &cases {
        let env = slice.env(&gpu);
        let path = slice.config_path().display().to_string();
        for kind in ClientKind::ALL {
            gpu.truth().reset_peak_memory(0);
            // The issue's case: 2 GiB inside a "1 GiB" slice.
            let out = Client::output(kind, &["alloc", "2GiB"], &env);
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            assert!(
                stdout.contains("CUDA_ERROR_NOT_INITIALIZED") || stderr.contains("\"result\":3"),
                "{kind:?} {field}: refused: {stdout} / {stderr}"
            );
            assert_eq!(
                gpu.truth().peak_memory(0),
                0,
                "{kind:?} {field}: the card held memory: {stdout}"
            );
            let lines = shim_lines(&out);
            assert_eq!(lines.len(), 1, "{kind:?} {field}: one line: {stderr}");
            let line = &lines[0];
            for needle in [
                &path,
                *field,
                named,
                "matches no device",
                &format!("0 {uuid}"),
            ] {
                assert!(line.contains(needle), "{kind:?}: lacks {needle:?}: {line}");
            }
        }
        // An NVML-only process (pynvml) is refused the same way.
        let out = run_pynvml_init(&env);
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains("init error 1"),
            "NVML_ERROR_UNINITIALIZED: {stdout} {}",
            text(&out.stderr)
        );
        let lines = shim_lines(&out);
        assert_eq!(lines.len(), 1, "{}", text(&out.stderr));
        assert!(
            lines[0].contains(*field) && lines[0].contains(&uuid),
            "{}",
            lines[0]
        );
    }

    // The same file with the right UUID enforces: the refusal above is about the typo.
    let slice = Slice::builder().device_uuid(&uuid, "1GiB", None).build();
    for kind in ClientKind::ALL {
        let out = Client::run(kind, &["alloc", "2GiB"], &slice.env(&gpu));
        assert_eq!(
            out["results"][0], "CUDA_ERROR_OUT_OF_MEMORY",
            "{kind:?}: {out}"
        );
    }
}

#[test]
fn a_uuid_nvidia_smi_cannot_print_is_refused_by_the_parser() {
    let gpu = FakeGpu::start("v100");
    let uuid = gpu.truth().device(0).unwrap().uuid;
    for bad in [uuid[4..].to_string(), uuid[..uuid.len() - 1].to_string()] {
        let slice = Slice::builder().device_uuid(&bad, "1GiB", None).build();
        let out = Client::output(ClientKind::Linked, &["alloc", "2GiB"], &slice.env(&gpu));
        assert!(
            text(&out.stdout).contains("CUDA_ERROR_NOT_INITIALIZED"),
            "{bad}"
        );
        let lines = shim_lines(&out);
        assert_eq!(lines.len(), 1, "{}", text(&out.stderr));
        assert!(
            lines[0].contains("devices[0].uuid") && lines[0].contains("GPU UUID")
                || lines[0].contains("lacks the \"GPU-\" prefix"),
            "{}",
            lines[0]
        );
        let check = gpuslice(&["check", "--no-probe"], &slice.config_path(), &Vec::new());
        assert_eq!(
            check.status.code(),
            Some(3),
            "{bad}: {}",
            text(&check.stderr)
        );
        assert!(
            text(&check.stderr).contains("devices[0].uuid"),
            "{}",
            text(&check.stderr)
        );
    }
}

#[test]
fn a_limit_larger_than_the_card_is_warned_once_at_the_default_level() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "64GiB", None).build();
    let out = Client::output(
        ClientKind::Linked,
        &["alloc", "64MiB", "64MiB"],
        &slice.env(&gpu),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = shim_lines(&out);
    assert_eq!(lines.len(), 1, "{}", text(&out.stderr));
    assert!(
        lines[0].contains("warning: memory limit 64 GiB of device")
            && lines[0].contains("larger than the card (32 GiB)"),
        "{}",
        lines[0]
    );
}

#[test]
fn a_region_the_shim_cannot_use_is_reported_by_check_and_by_the_shim_naming_file_and_field() {
    let gpu = FakeGpu::start("v100");
    // A missing directory, deep enough that the path is ~4 KB: the one line stays bounded.
    let deep: String = (0..15)
        .map(|i| format!("/{}{i}", "d".repeat(250)))
        .collect();
    let region = format!("{}/absent{deep}/a.region", gpu.scratch().display());
    let slice = Slice::builder()
        .raw(&format!(
            r#"{{"version": 1, "region": "{region}", "devices": [{{"index": 0, "memory": "1GiB"}}]}}"#
        ))
        .build();
    let path = slice.config_path().display().to_string();

    let check = gpuslice(&["check"], &slice.config_path(), &gpu.env());
    let stderr = text(&check.stderr);
    assert_eq!(check.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&path)
            && stderr.contains(": region: ")
            && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(stderr.len() < 4096, "{} bytes", stderr.len());
    // --no-probe checks the file alone (it may be meant for another machine).
    let alone = gpuslice(&["check", "--no-probe"], &slice.config_path(), &gpu.env());
    assert_eq!(alone.status.code(), Some(0), "{}", text(&alone.stderr));

    let out = Client::output(ClientKind::Linked, &["alloc", "64MiB"], &slice.env(&gpu));
    assert!(text(&out.stdout).contains("CUDA_ERROR_NOT_INITIALIZED"));
    let lines = shim_lines(&out);
    assert_eq!(lines.len(), 1, "{}", text(&out.stderr));
    assert!(
        lines[0].contains(&path) && lines[0].contains(": region: "),
        "{}",
        lines[0]
    );
    assert!(lines[0].len() <= 2048, "{} bytes", lines[0].len());

    // A symbolic link at the region path: check refuses it.
    let target = gpu.scratch().join("real.region");
    let link = gpu.scratch().join("link.region");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let linked = Slice::builder()
        .raw(&format!(
            r#"{{"version": 1, "region": "{}", "devices": []}}"#,
            link.display()
        ))
        .build();
    let check = gpuslice(&["check"], &linked.config_path(), &gpu.env());
    assert_eq!(check.status.code(), Some(3), "{}", text(&check.stderr));
    assert!(
        text(&check.stderr).contains("symbolic link"),
        "{}",
        text(&check.stderr)
    );
}

#[test]
fn check_refuses_an_entry_matching_no_device_and_says_when_it_cannot_tell() {
    let gpu = FakeGpu::start("v100");
    let uuid = gpu.truth().device(0).unwrap().uuid;
    let slice = Slice::builder()
        .device_uuid(&typo_of(&uuid), "1GiB", None)
        .build();
    let check = gpuslice(&["check"], &slice.config_path(), &gpu.env());
    let stderr = text(&check.stderr);
    assert_eq!(check.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("devices[0].uuid") && stderr.contains(&format!("0 {uuid}")),
        "{stderr}"
    );
    let json = gpuslice(&["check", "--json"], &slice.config_path(), &gpu.env());
    assert!(
        text(&json.stdout).contains("\"valid\":false"),
        "{}",
        text(&json.stdout)
    );

    // No NVML here: the file is valid as far as check can see, and it says what it skipped.
    let empty = gpu.scratch().join("no-driver");
    std::fs::create_dir_all(&empty).unwrap();
    let env: Env = vec![("LD_LIBRARY_PATH".into(), empty.display().to_string())];
    let blind = gpuslice(&["check"], &slice.config_path(), &env);
    assert_eq!(blind.status.code(), Some(0), "{}", text(&blind.stderr));
    assert!(
        text(&blind.stderr).contains("cannot list this machine's devices"),
        "{}",
        text(&blind.stderr)
    );
}

/// `gpuslice ARGS FILE` with `env`.
fn gpuslice(args: &[&str], file: &Path, env: &Env) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    let file = file.display().to_string();
    all.push(&file);
    run_with_timeout(
        command(&cuda_e2e::gpuslice_binary(), &all, env),
        None,
        DEFAULT_TIMEOUT,
    )
}

/// A configuration that cannot be applied is refused at the FIRST call, `cuInit`, so that an
/// "is CUDA available?" check says no (it used to say yes, and the application failed later,
/// from `cuDeviceTotalMem` on): a limit-file entry for a UUID the node lacks, and a HAMi env
/// variable naming a device index the node lacks (`CUDA_DEVICE_MEMORY_LIMIT_7` on a one-GPU
/// node, which ran unlimited and silent before). The line names the variable or the file.
#[test]
fn a_configuration_that_cannot_be_applied_is_refused_at_cu_init() {
    assert_no_anchored_file();
    let gpu = FakeGpu::start("v100");
    let uuid = gpu.truth().device(0).unwrap().uuid;
    let typo = Slice::builder()
        .device_uuid(&typo_of(&uuid), "1GiB", None)
        .build();
    let mut hami = gpu.env();
    hami.push((
        "LD_PRELOAD".into(),
        cuda_e2e::shim_library().display().to_string(),
    ));
    let region = typo.config_path().with_file_name("hami.region");
    hami.push((
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
        region.display().to_string(),
    ));
    let mut hami_sm = hami.clone();
    hami.push(("CUDA_DEVICE_MEMORY_LIMIT_7".into(), "1g".into()));
    hami_sm.push(("CUDA_DEVICE_SM_LIMIT_3".into(), "50".into()));
    let cases = [
        (typo.env(&gpu), typo.config_path().display().to_string()),
        (hami, "CUDA_DEVICE_MEMORY_LIMIT_7".to_string()),
        (hami_sm, "CUDA_DEVICE_SM_LIMIT_3".to_string()),
    ];
    for (env, named) in &cases {
        for kind in ClientKind::ALL {
            gpu.truth().reset_peak_memory(0);
            let out = Client::output(kind, &["alloc", "2GiB"], env);
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            let json: serde_json::Value =
                serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_default();
            assert_eq!(
                (json["failed_step"].as_str(), json["error"].as_str()),
                (Some("cuInit"), Some("CUDA_ERROR_NOT_INITIALIZED")),
                "{kind:?} {named}: refused at cuInit: {stdout} / {stderr}"
            );
            assert_eq!(gpu.truth().peak_memory(0), 0, "{kind:?} {named}");
            let lines = shim_lines(&out);
            assert_eq!(lines.len(), 1, "{kind:?} {named}: one line: {stderr}");
            assert!(
                lines[0].contains(named.as_str()) && lines[0].contains(&uuid),
                "{kind:?}: names {named} and the devices there: {}",
                lines[0]
            );
        }
        let out = run_pynvml_init(env);
        assert!(
            text(&out.stdout).contains("init error 1"),
            "{named}: NVML_ERROR_UNINITIALIZED: {} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    // HAMi variables naming the device the node has still enforce.
    let mut good = gpu.env();
    good.push((
        "LD_PRELOAD".into(),
        cuda_e2e::shim_library().display().to_string(),
    ));
    good.push((
        "CUDA_DEVICE_MEMORY_SHARED_CACHE".into(),
        region.with_file_name("good.region").display().to_string(),
    ));
    good.push(("CUDA_DEVICE_MEMORY_LIMIT_0".into(), "1g".into()));
    let out = Client::run(ClientKind::Linked, &["alloc", "2GiB"], &good);
    assert_eq!(out["results"][0], "CUDA_ERROR_OUT_OF_MEMORY", "{out}");
}
