//! NVIDIA's own nvidia-smi, unmodified (Debian's non-free builds: 535.261.03 from bookworm,
//! 550.163.01 from trixie; `.ci/nvidia-smi-setup.sh` unpacks them under
//! `/opt/gpuslice-ci/nvidia-smi/<suite>/`, `E2E_NVIDIA_SMI` names one binary instead), run
//! against the simulated GPU: on the host, in a slice, in a podman container given a slice
//! through CDI, and in two slices of one card. What it prints is compared with the fake's
//! truth (`FakeGpu::truth`), `cuMemGetInfo` and pynvml in the same slice.
//!
//! Without the binary each test prints `SKIPPED: nvidia-smi ...` and returns, except with
//! `CI=true`, where it fails. The container test also skips (fails in CI) without podman.

use cuda_e2e::containers::{self, bin_dir, copy_with_libs, text, Podman, Stage};
use cuda_e2e::{Client, ClientKind, Env, FakeGpu, Slice, DEFAULT_TIMEOUT};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const NAME: &str = "Tesla V100-PCIE-32GB";
/// What nvidia-smi prints when the library misbehaves; none may appear.
const ERRORS: [&str; 5] = [
    "Function Not Found",
    "Unknown Error",
    "Internal NVML error",
    "Mismatch in versions",
    "Failed to",
];

/// One nvidia-smi build: where it is and the CUDA version whose driver ships it (what the
/// fake then reports, `FAKEGPU_DRIVER_VERSION`).
struct Smi {
    path: PathBuf,
    cuda: &'static str,
}

/// The builds to test; empty after the loud SKIPPED line (a failure with `CI=true`).
fn builds() -> Vec<Smi> {
    let cuda_of = |version: &str| {
        if version.starts_with("535") {
            "12020"
        } else {
            "12040"
        }
    };
    let found: Vec<Smi> = match std::env::var_os("E2E_NVIDIA_SMI") {
        Some(path) => {
            let path = PathBuf::from(path);
            let version = std::fs::read_to_string(path.with_file_name("VERSION"))
                .unwrap_or_else(|_| "535".into());
            vec![Smi {
                cuda: cuda_of(&version),
                path,
            }]
        }
        None => ["bookworm", "trixie"]
            .iter()
            .map(|suite| Path::new("/opt/gpuslice-ci/nvidia-smi").join(suite))
            .filter(|dir| dir.join("nvidia-smi").is_file())
            .map(|dir| Smi {
                cuda: cuda_of(&std::fs::read_to_string(dir.join("VERSION")).unwrap_or_default()),
                path: dir.join("nvidia-smi"),
            })
            .collect(),
    };
    if found.is_empty() {
        let reason = "nvidia-smi not found in /opt/gpuslice-ci/nvidia-smi (run \
                      .ci/nvidia-smi-setup.sh) and E2E_NVIDIA_SMI not set";
        cuda_e2e::skip::skip_or_fail(reason);
    }
    found
}

/// Runs nvidia-smi with `args` in `env` (plus the build's driver version); asserts it exits 0
/// and prints none of [`ERRORS`]; returns stdout and stderr.
fn run(smi: &Smi, args: &[&str], env: &Env) -> (String, String) {
    let mut env = env.clone();
    env.push(("FAKEGPU_DRIVER_VERSION".into(), smi.cuda.into()));
    let out = cuda_e2e::run_with_timeout(
        cuda_e2e::command(&smi.path, args, &env),
        None,
        DEFAULT_TIMEOUT,
    );
    checked(smi, args, out)
}

fn checked(smi: &Smi, args: &[&str], out: Output) -> (String, String) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "{} {args:?} failed ({}):\n{stdout}{stderr}",
        smi.path.display(),
        out.status
    );
    for error in ERRORS {
        assert!(
            !stdout.contains(error) && !stderr.contains(error),
            "{} {args:?} printed {error:?}:\n{stdout}{stderr}",
            smi.path.display()
        );
    }
    (stdout, stderr)
}

/// `--query-compute-apps=pid,used_memory --format=csv,noheader,nounits` as (pid, MiB).
fn compute_apps(smi: &Smi, env: &Env) -> Vec<(u32, u64)> {
    let args = [
        "--query-compute-apps=pid,used_memory",
        "--format=csv,noheader,nounits",
    ];
    let (out, _) = run(smi, &args, env);
    let mut apps: Vec<(u32, u64)> = out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (pid, mib) = l.split_once(',').unwrap_or_else(|| panic!("row {l:?}"));
            (pid.trim().parse().unwrap(), mib.trim().parse().unwrap())
        })
        .collect();
    apps.sort_unstable();
    apps
}

/// `--query-gpu=FIELDS --format=csv,noheader,nounits`, the first device's values.
fn query_gpu(smi: &Smi, fields: &str, env: &Env) -> Vec<String> {
    let (out, _) = run(
        smi,
        &[
            &format!("--query-gpu={fields}"),
            "--format=csv,noheader,nounits",
        ],
        env,
    );
    out.lines()
        .next()
        .unwrap_or_default()
        .split(',')
        .map(|v| v.trim().to_string())
        .collect()
}

/// The PIDs in the default table's Processes box.
fn table_pids(table: &str) -> Vec<u32> {
    let body = table.split("Processes:").nth(1).unwrap_or_default();
    let mut pids: Vec<u32> = body
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split_whitespace().collect();
            // "GPU GI CI PID Type Name Memory": a row starts with the GPU index.
            (cells.len() >= 6 && cells[0].parse::<u32>().is_ok())
                .then(|| cells[3].parse().ok())
                .flatten()
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The default table's memory cell of GPU 0 as (used, total) MiB ("1324MiB /  8192MiB"; the
/// builds pad it differently).
fn memory_cell(table: &str) -> (u64, u64) {
    let words: Vec<&str> = table.split_whitespace().collect();
    let mib = |w: &str| w.strip_suffix("MiB").and_then(|n| n.parse().ok());
    words
        .windows(3)
        .find_map(|w| Some((mib(w[0])?, (w[1] == "/").then_some(())?, mib(w[2])?)))
        .map(|(used, (), total)| (used, total))
        .unwrap_or_else(|| panic!("no memory cell in {table}"))
}

/// Prints a captured output under a title, so a run with `--nocapture` shows what the user
/// would see (the README's samples are taken from here).
fn show(title: &str, output: &str) {
    eprintln!("---- {title}\n{output}");
}

/// On the host (no shim) every view prints the fake's values: the default table, `-L`, `-q`,
/// `-q -d MEMORY,UTILIZATION,PIDS`, the GPU query and the compute-apps query, with the
/// process by the PID NVML reports and its physical bytes.
#[test]
fn on_the_host_every_view_prints_the_fakes_card() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let holder = Client::spawn(ClientKind::Linked, &["hold", "1GiB"], &gpu.env());
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    let pid = holder.pid();
    let spec = gpu.truth().device(0).unwrap();
    let used = gpu.truth().used_memory(0);
    let held = gpu.truth().processes(0)[0].used_memory;
    for smi in &smis {
        let env = gpu.env();
        let (table, _) = run(smi, &[], &env);
        show(&format!("{} (host)", smi.path.display()), &table);
        assert!(table.contains(NAME), "{table}");
        assert_eq!(
            memory_cell(&table),
            (used / MIB, 32768),
            "memory column is the card's physical use: {table}"
        );
        assert_eq!(table_pids(&table), vec![pid], "{table}");
        assert!(table.contains("linked-client"), "{table}");

        let (list, _) = run(smi, &["-L"], &env);
        assert_eq!(list.trim(), format!("GPU 0: {NAME} (UUID: {})", spec.uuid));

        let (q, _) = run(smi, &["-q"], &env);
        for line in [
            format!("Product Name                          : {NAME}"),
            format!("GPU UUID                              : {}", spec.uuid),
            "Total                             : 32768 MiB".into(),
            format!("Used                              : {} MiB", used / MIB),
            format!("Process ID                        : {pid}"),
        ] {
            assert!(q.contains(&line), "-q lacks {line:?}:\n{q}");
        }
        let (qd, _) = run(smi, &["-q", "-d", "MEMORY,UTILIZATION,PIDS"], &env);
        assert!(
            qd.contains("FB Memory Usage") && qd.contains("Utilization"),
            "{qd}"
        );
        assert!(
            qd.contains(&format!(
                "Used GPU Memory               : {} MiB",
                held / MIB
            )),
            "{qd}"
        );

        let fields = "name,uuid,memory.total,memory.used,memory.free,utilization.gpu";
        let values = query_gpu(smi, fields, &env);
        let reserved = fakegpu::nvml_view::RESERVED_MEMORY_BYTES;
        let free = spec.total_memory - reserved - used;
        assert_eq!(
            values,
            [
                NAME.to_string(),
                spec.uuid.clone(),
                (spec.total_memory / MIB).to_string(),
                (used / MIB).to_string(),
                (free / MIB).to_string(),
                "0".into(),
            ],
            "--query-gpu={fields}"
        );
        assert_eq!(compute_apps(smi, &env), vec![(pid, held / MIB)]);
    }
    holder.release();
}

/// In an 8 GiB slice of the 32 GB V100 (the shim preloaded): the seed's check prints exactly
/// `Tesla V100-PCIE-32GB, 8192 MiB`; the table's memory column and `memory.used` are the
/// slice's and agree with `cuMemGetInfo` and pynvml in the same slice; the process list holds
/// the slice's process alone, under the PID its container knows (`FAKEGPU_PID_OFFSET` plays
/// the container's namespace), not the neighbour outside the slice. Without the shim the
/// same commands show the card and both processes.
#[test]
fn in_a_slice_nvidia_smi_shows_the_slice() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_PID_OFFSET".into(), "100000".into()));
    let mut host = gpu.env();
    host.push(("FAKEGPU_PID_OFFSET".into(), "100000".into()));
    let neighbour = Client::spawn(ClientKind::Linked, &["hold", "512MiB"], &host);
    let holder = Client::spawn(ClientKind::Linked, &["hold", "1GiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    let slice_used = 8 * GIB - holder.first["mem_free"].as_u64().unwrap();

    // pynvml in the same slice.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/memory_slice_probe.py");
    let mut cmd = cuda_e2e::command(Path::new("python3"), &[], &env);
    cmd.arg(&script);
    let out = cuda_e2e::run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
    assert!(out.status.success(), "pynvml: {}", text(&out.stderr));
    let probe: Value = serde_json::from_str(text(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(
        probe["v2_used"], slice_used,
        "pynvml vs cuMemGetInfo: {probe}"
    );

    for smi in &smis {
        let (line, _) = run(
            smi,
            &["--query-gpu=name,memory.total", "--format=csv,noheader"],
            &env,
        );
        assert_eq!(line, "Tesla V100-PCIE-32GB, 8192 MiB\n");
        let used = query_gpu(smi, "memory.used,memory.free", &env);
        assert_eq!(
            used,
            [
                (slice_used / MIB).to_string(),
                ((8 * GIB - slice_used) / MIB).to_string()
            ],
            "memory.used/free are the slice's (cuMemGetInfo and pynvml: {slice_used} used)"
        );
        let (table, _) = run(smi, &[], &env);
        show(&format!("{} (8 GiB slice)", smi.path.display()), &table);
        assert_eq!(
            memory_cell(&table),
            (slice_used / MIB, 8192),
            "memory column is the slice's: {table}"
        );
        assert_eq!(table_pids(&table), vec![holder.pid()], "{table}");
        let apps = compute_apps(smi, &env);
        assert_eq!(apps.len(), 1, "{apps:?}");
        assert_eq!(
            apps[0].0,
            holder.pid(),
            "the container's PID, not the host's"
        );

        // Without the shim: the card, both processes by the PIDs NVML reports.
        let (line, _) = run(
            smi,
            &["--query-gpu=name,memory.total", "--format=csv,noheader"],
            &host,
        );
        assert_eq!(line, "Tesla V100-PCIE-32GB, 32768 MiB\n");
        let mut card: Vec<u32> = compute_apps(smi, &host).iter().map(|a| a.0).collect();
        card.sort_unstable();
        let mut expected = vec![holder.pid() + 100000, neighbour.pid() + 100000];
        expected.sort_unstable();
        assert_eq!(card, expected);
    }
    holder.release();
    neighbour.release();
}

/// An oversubscribed slice (memory 2 GiB, virtual 3 GiB) holding 2.5 GiB, a part of it in
/// host memory: nvidia-smi shows the virtual size as the total and the slice's bytes, card and
/// host, as used, the same figures `cuMemGetInfo` gives; the card's own figure is the share.
#[test]
fn an_oversubscribed_slice_shows_its_virtual_size() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder()
        .raw(r#"{"version": 1, "region": "{region}", "devices": [{"index": 0, "memory": "2GiB", "virtual": "3GiB"}]}"#)
        .build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_MANAGED_MEMORY".into(), "on-demand".into()));
    // 300 MiB of context, 8 chunks of 256 MiB: 6 on the card, 2 in host memory.
    let holder = Client::spawn(
        ClientKind::ProcAddr,
        &["oversubscribe", "256MiB", "--max", "8"],
        &env,
    );
    assert_eq!(holder.first["ok"], 8, "{}", holder.first);
    let free = holder.first["mem_free_during"].as_u64().unwrap();
    let used = 3 * GIB - free;
    assert_eq!(used, 300 * MIB + 8 * 256 * MIB, "{}", holder.first);
    for smi in &smis {
        let values = query_gpu(smi, "memory.total,memory.used,memory.free", &env);
        assert_eq!(
            values,
            [
                "3072".to_string(),
                (used / MIB).to_string(),
                (free / MIB).to_string()
            ],
            "{}",
            smi.path.display()
        );
        let (table, _) = run(smi, &[], &env);
        show(
            &format!("{} (2 GiB slice, virtual 3 GiB)", smi.path.display()),
            &table,
        );
        assert_eq!(memory_cell(&table), (used / MIB, 3072), "{table}");
        // Outside the slice: the card holds the share and no more.
        let host = query_gpu(smi, "memory.used", &gpu.env());
        assert_eq!(host, [(gpu.truth().used_memory(0) / MIB).to_string()]);
        assert!(gpu.truth().used_memory(0) <= 2 * GIB);
    }
    holder.release();
}

/// The seed's check as a user types it: `gpuslice run --fake-gpu -m 8GiB -- nvidia-smi ...`.
#[test]
fn gpuslice_run_with_nvidia_smi_prints_the_seeds_line() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let env: Env = vec![(
        "FAKEGPU_STATE".into(),
        gpu.state_path().display().to_string(),
    )];
    for smi in &smis {
        let mut env = env.clone();
        env.push(("FAKEGPU_DRIVER_VERSION".into(), smi.cuda.into()));
        let path = smi.path.display().to_string();
        let args = [
            "run",
            "--fake-gpu",
            "-m",
            "8GiB",
            "--",
            &path,
            "--query-gpu=name,memory.total",
            "--format=csv,noheader",
        ];
        let out = cuda_e2e::run_with_timeout(
            cuda_e2e::command(&cuda_e2e::gpuslice_binary(), &args, &env),
            None,
            DEFAULT_TIMEOUT,
        );
        let (stdout, _) = checked(smi, &args, out);
        assert_eq!(stdout, "Tesla V100-PCIE-32GB, 8192 MiB\n");
    }
}

/// A slice's process killed with SIGKILL leaves nvidia-smi's list once the driver has
/// released it; nvidia-smi in the slice then shows no process and the slice's memory free.
#[test]
fn a_killed_slice_process_leaves_the_list() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", None).build();
    let env = slice.env(&gpu);
    for smi in &smis {
        let holder = Client::spawn(ClientKind::Linked, &["hold", "1GiB"], &env);
        let pid = holder.pid();
        assert_eq!(compute_apps(smi, &env).len(), 1);
        holder.kill();
        cuda_e2e::wait_until("the killed holder leaves the list", DEFAULT_TIMEOUT, || {
            compute_apps(smi, &env).is_empty() && memory_cell(&run(smi, &[], &env).0).0 == 0
        });
        let (table, _) = run(smi, &[], &env);
        assert!(table.contains("No running processes found"), "{table}");
        assert!(!table_pids(&table).contains(&pid));
        assert_eq!(memory_cell(&table), (0, 8192), "{table}");
    }
}

/// Two slices of one card, a process in each: nvidia-smi in each slice lists its own process
/// alone (table and query); the host lists both.
#[test]
fn two_slices_on_one_card_each_see_only_their_own_processes() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let a = Slice::builder().device(0, "4GiB", None).build();
    let b = Slice::builder().device(0, "6GiB", None).build();
    let in_a = Client::spawn(ClientKind::Linked, &["hold", "256MiB"], &a.env(&gpu));
    let in_b = Client::spawn(ClientKind::Cudarc, &["hold", "512MiB"], &b.env(&gpu));
    for smi in &smis {
        for (slice, own, total) in [(&a, in_a.pid(), 4096), (&b, in_b.pid(), 6144)] {
            let env = slice.env(&gpu);
            let (table, _) = run(smi, &[], &env);
            assert_eq!(table_pids(&table), vec![own], "{table}");
            assert_eq!(memory_cell(&table).1, total, "{table}");
            let apps: Vec<u32> = compute_apps(smi, &env).iter().map(|p| p.0).collect();
            assert_eq!(apps, vec![own]);
        }
        let mut both = vec![in_a.pid(), in_b.pid()];
        both.sort_unstable();
        let (table, _) = run(smi, &[], &gpu.env());
        assert_eq!(table_pids(&table), both, "host: {table}");
    }
    in_a.release();
    in_b.release();
}

/// A private table whose layout the shim does not know (here the fake's, made 8 bytes longer
/// than 550's) passes through unchanged: nvidia-smi still runs in the slice, the shim says so
/// once at debug level, and the process list is then the driver's own (the neighbour shows:
/// the documented limit of an unknown driver).
#[test]
fn an_unknown_table_layout_passes_through_and_says_so_once() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", None).build();
    let neighbour = Client::spawn(ClientKind::Linked, &["hold", "256MiB"], &gpu.env());
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_NVML_TABLE_BYTES".into(), "2016".into()));
    env.push(("GPUSLICE_LOG".into(), "debug".into()));
    for smi in &smis {
        let (table, stderr) = run(smi, &[], &env);
        assert_eq!(
            stderr.matches("unknown layout (2016 bytes)").count(),
            1,
            "said once: {stderr}"
        );
        assert_eq!(
            memory_cell(&table).1,
            8192,
            "memory still the slice's: {table}"
        );
        assert_eq!(table_pids(&table), vec![neighbour.pid()], "{table}");
    }
    neighbour.release();
}

/// In a podman container given an 8 GiB slice through CDI (`gpuslice cdi`): nvidia-smi prints
/// the slice and lists the container's own process under its container PID, while a
/// process outside the container is not shown.
#[test]
fn in_a_cdi_container_nvidia_smi_shows_the_slice_and_its_own_process() {
    let smis = builds();
    if smis.is_empty() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpuslice-e2e-smi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let podman = match Podman::probe(&dir.join("conf")) {
        Ok(podman) => podman,
        Err(reason) => {
            containers::skip_or_fail(&reason);
            return;
        }
    };
    let stage = Stage::new(&dir);
    let rootfs = dir.join("rootfs");
    copy_with_libs(&rootfs, Path::new("/bin/sleep"), "/bin/sleep");
    // The neighbour: on the host, on the same card, outside any slice.
    let host_env: Env = vec![
        ("FAKEGPU_STATE".into(), stage.state().display().to_string()),
        (
            "LD_LIBRARY_PATH".into(),
            fake_lib(&dir).display().to_string(),
        ),
    ];
    let neighbour = Client::spawn(ClientKind::Linked, &["hold", "256MiB"], &host_env);

    let limits = dir.join("smi.json");
    std::fs::write(
        &limits,
        "{\"version\": 1, \"region\": \"/var/run/gpuslice/smi.region\", \"policy\": \"cap\", \
         \"devices\": [{\"index\": 0, \"memory\": \"8GiB\"}]}\n",
    )
    .unwrap();
    let id = std::process::id();
    let kind = format!("gpuslice-e2e.dev/smi{id}");
    let spec = PathBuf::from(format!("/etc/cdi/gpuslice-e2e-{id}-smi.json"));
    let out = Command::new(bin_dir().join("gpuslice"))
        .args(["cdi", "--kind", &kind, "--output-dir", "/etc/cdi", "--name"])
        .arg(spec.file_name().unwrap())
        .arg("--lib")
        .arg(bin_dir().join("libgpuslice.so"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--slice")
        .arg(format!("smi={}", limits.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "gpuslice cdi: {}", text(&out.stderr));
    let device = format!("{kind}=smi");

    for smi in &smis {
        copy_with_libs(&rootfs, &smi.path, "/usr/bin/nvidia-smi");
        let name = format!("gpuslice-e2e-{id}-smi");
        let mut args = stage.run_args(&name, false, &[&device]);
        let at = args.len() - 2;
        args.splice(
            at..at,
            [
                "-e".to_string(),
                format!("FAKEGPU_DRIVER_VERSION={}", smi.cuda),
            ],
        );
        // A holder in the background, then the views; the holder's own line says its PID.
        // The root file system (and its /tmp) is shared by the runs: the file starts afresh.
        let script = ": > /tmp/hold; sleep 600 | /usr/bin/linked-client hold 1GiB > /tmp/hold & \
            while [ ! -s /tmp/hold ]; do sleep 0.05; done; cat /tmp/hold; \
            echo ====; /usr/bin/nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; \
            echo ====; /usr/bin/nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; \
            echo ====; /usr/bin/nvidia-smi";
        let out = podman
            .cmd()
            .args(&args)
            .args(["/bin/sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        podman.remove(&name);
        let (stdout, _) = checked(smi, &["(in a container)"], out);
        let parts: Vec<&str> = stdout.split("====\n").collect();
        assert_eq!(parts.len(), 4, "{stdout}");
        let hold: Value = serde_json::from_str(parts[0].trim())
            .unwrap_or_else(|e| panic!("holder line ({e}): {stdout}"));
        assert_eq!(hold["result"], "CUDA_SUCCESS", "{hold}");
        let container_pid = hold["pid"].as_u64().unwrap() as u32;
        assert_eq!(parts[1], "Tesla V100-PCIE-32GB, 8192 MiB\n");
        let apps: Vec<u32> = parts[2]
            .lines()
            .filter_map(|l| l.split(',').next()?.trim().parse().ok())
            .collect();
        assert_eq!(
            apps,
            vec![container_pid],
            "only the container's process: {stdout}"
        );
        show(
            &format!("{} (container, 8 GiB slice)", smi.path.display()),
            parts[3],
        );
        assert_eq!(table_pids(parts[3]), vec![container_pid], "{}", parts[3]);
        let slice_used = 8 * GIB - hold["mem_free"].as_u64().unwrap();
        assert_eq!(
            memory_cell(parts[3]),
            (slice_used / MIB, 8192),
            "the slice's use as cuMemGetInfo saw it: {}",
            parts[3]
        );
        assert!(!table_pids(parts[3]).contains(&neighbour.pid()));
    }
    neighbour.release();
    let _ = std::fs::remove_file(&spec);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fake driver installed on the host side of a container bed.
fn fake_lib(dir: &Path) -> PathBuf {
    let lib = dir.join("fake");
    containers::install_fake(&lib);
    lib
}
