//! libgpuslice.so against a minimal C driver built in the test (tests/shim_c/): every path a
//! client takes (linked, dlopen+dlsym, cuGetProcAddress v1/v2 at 12080/13000, per-thread),
//! dlsym semantics that must not change for the host (RTLD_NEXT, repeat lookups, cu-prefixed
//! non-CUDA names, a malloc interposer calling dlsym from inside malloc), processes that never
//! touch CUDA (and the libraries the preload brings into them), fail-closed configuration, fork
//! and fork+exec.
//!
//! The mini driver is deliberately tiny and independent of fakegpu: it pins the shim's own
//! contract (including an "older driver" that lacks cuMemAllocAsync). The same effects through
//! fakegpu and the real client programs are in `shim_interception.rs`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cuda_e2e::{
    build_c_once, cc, command, run_with_timeout, shim_core_library, shim_library, Env, TempDir,
    DEFAULT_TIMEOUT, GIB,
};

const SOURCES: &[(&str, &str)] = &[
    ("mini_cuda.c", include_str!("shim_c/mini_cuda.c")),
    ("mini_nvml.c", include_str!("shim_c/mini_nvml.c")),
    ("client.c", include_str!("shim_c/client.c")),
    ("next.c", include_str!("shim_c/next.c")),
    ("probe.c", include_str!("shim_c/probe.c")),
    ("local.c", include_str!("shim_c/local.c")),
];

/// The C programs, built once per source version into target/tmp (reused across runs).
fn programs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        build_c_once(root, "shim-c", SOURCES, |work| {
            let cc = |args: &[&str]| cc(work, args);
            cc(&[
                "-shared",
                "-fPIC",
                "-o",
                "libcuda.so.1",
                "-Wl,-soname,libcuda.so.1",
                "mini_cuda.c",
            ]);
            cc(&[
                "-shared",
                "-fPIC",
                "-o",
                "libnvidia-ml.so.1",
                "-Wl,-soname,libnvidia-ml.so.1",
                "mini_nvml.c",
            ]);
            std::os::unix::fs::symlink("libcuda.so.1", work.join("libcuda.so")).unwrap();
            std::os::unix::fs::symlink("libnvidia-ml.so.1", work.join("libnvidia-ml.so")).unwrap();
            cc(&[
                "-DLINKED",
                "-o",
                "client_linked",
                "client.c",
                "-L.",
                "-lcuda",
                "-lnvidia-ml",
                "-ldl",
            ]);
            cc(&["-o", "client_dl", "client.c", "-ldl"]);
            cc(&["-o", "next", "next.c", "-ldl"]);
            cc(&["-o", "probe", "probe.c", "-ldl"]);
            cc(&[
                "-shared",
                "-fPIC",
                "-o",
                "liblocal.so",
                "local.c",
                "-L.",
                // It uses no libcuda symbol directly; keep the dependency all the same.
                "-Wl,--no-as-needed",
                "-lcuda",
                "-ldl",
            ]);
        })
    })
}

struct Run {
    stdout: String,
    stderr: String,
    success: bool,
}

impl Run {
    /// The value of `key=` on the first line starting with `prefix`.
    fn field(&self, prefix: &str, key: &str) -> String {
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{}\n{}", self.stdout, self.stderr));
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{key}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
    }
    fn bytes(&self, prefix: &str, key: &str) -> u64 {
        self.field(prefix, key).parse().unwrap()
    }
    fn line(&self, prefix: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{}\n{}", self.stdout, self.stderr))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Shim {
    Without,
    With,
}

fn run_program(program: &Path, args: &[&str], shim: Shim, extra: &[(&str, String)]) -> Run {
    run_program_preloading(program, args, shim, &shim_library(), extra)
}

/// [`run_program`] with `library` as the shim.
fn run_program_preloading(
    program: &Path,
    args: &[&str],
    shim: Shim,
    library: &Path,
    extra: &[(&str, String)],
) -> Run {
    let mut env: Env = vec![("LD_LIBRARY_PATH".into(), programs().display().to_string())];
    if shim == Shim::With {
        env.push(("LD_PRELOAD".into(), library.display().to_string()));
    }
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let output = run_with_timeout(command(program, args, &env), None, DEFAULT_TIMEOUT);
    Run {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        success: output.status.success(),
    }
}

fn client(args: &[&str], shim: Shim, extra: &[(&str, String)]) -> Run {
    let binary = if args[0] == "linked" || args[0] == "fork" {
        "client_linked"
    } else {
        "client_dl"
    };
    let run = run_program(&programs().join(binary), args, shim, extra);
    assert!(
        run.success,
        "{args:?} failed:\n{}\n{}",
        run.stdout, run.stderr
    );
    run
}

/// Writes `text` as the limit file and points GPUSLICE_CONFIG at it. A valid file gets a
/// region of its own in `dir` unless it names one: tests run concurrently, and on the default
/// /tmp region they would share one ledger entry for the mini driver's device (one test's
/// 1 GiB cap stays while its processes live and would bind another's 4 GiB slice).
fn limit_file(dir: &TempDir, text: &str) -> Vec<(&'static str, String)> {
    let path = dir.path().join("limits.json");
    let text = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(mut file)) if !file.contains_key("region") => {
            let region = dir.path().join("slice.region");
            file.insert("region".into(), region.display().to_string().into());
            serde_json::Value::Object(file).to_string()
        }
        _ => text.to_string(),
    };
    std::fs::write(&path, text).unwrap();
    vec![("GPUSLICE_CONFIG", path.display().to_string())]
}

const ONE_GIB_ON_INDEX_0: &str = r#"{"version": 1, "devices": [{"index": 0, "memory": "1GiB"}]}"#;
const CARD: u64 = 32 * GIB;

const PATHS: [&[&str]; 4] = [
    &["linked"],
    &["dlopen"],
    &["procaddr", "12080"],
    &["procaddr", "13000", "--per-thread"],
];

#[test]
fn every_path_reports_the_slice_limit_while_the_card_is_unchanged() {
    let dir = TempDir::new("shim-paths");
    let config = limit_file(&dir, ONE_GIB_ON_INDEX_0);
    for args in PATHS {
        let label = if args[0] == "procaddr" {
            "procaddr"
        } else {
            args[0]
        };
        let truth = client(args, Shim::Without, &config);
        assert_eq!(truth.bytes(label, "total"), CARD, "{args:?} without shim");
        assert_eq!(truth.bytes(label, "devtotal"), CARD);

        let sliced = client(args, Shim::With, &config);
        assert_eq!(sliced.field(label, "init"), "0", "{args:?}");
        assert_eq!(
            sliced.bytes(label, "total"),
            GIB,
            "{args:?}: cuMemGetInfo_v2 total"
        );
        assert_eq!(
            sliced.bytes(label, "free"),
            GIB,
            "{args:?}: free capped by the limit"
        );
        assert_eq!(
            sliced.bytes(label, "devtotal"),
            GIB,
            "{args:?}: cuDeviceTotalMem_v2"
        );
        assert!(
            sliced.stderr.is_empty(),
            "silent by default: {}",
            sliced.stderr
        );
    }
    for path in ["linked", "dlopen"] {
        let prefix = format!("{path} nvml");
        let truth = client(&[path], Shim::Without, &config);
        assert_eq!(truth.bytes(&prefix, "total"), CARD);
        let sliced = client(&[path], Shim::With, &config);
        let (total, used, free) = (
            sliced.bytes(&prefix, "total"),
            sliced.bytes(&prefix, "used"),
            sliced.bytes(&prefix, "free"),
        );
        assert_eq!(total, GIB, "{path}: nvmlDeviceGetMemoryInfo total");
        assert_eq!(used + free, total, "{path}: no wrap, parts add up");
    }
}

#[test]
fn cuda_runtime_path_maps_pointers_by_identity_and_keeps_abi_and_stream_choice() {
    for (version, per_thread) in [("12080", false), ("13000", true), ("13000", false)] {
        let mut args = vec!["procaddr", version];
        if per_thread {
            args.push("--per-thread");
        }
        let real = client(&args, Shim::Without, &[]);
        let shimmed = client(&args, Shim::With, &[]);
        // Probes and unknown names behave exactly as without the shim.
        assert_eq!(shimmed.line("probe"), real.line("probe"));
        assert_eq!(shimmed.line("missing"), real.line("missing"));
        // Hooked names: our wrapper for the very ABI the driver chose.
        assert_eq!(
            real.line("cuMemAlloc "),
            "cuMemAlloc -> libcuda.so.1:cuMemAlloc_v2"
        );
        assert_eq!(
            shimmed.line("cuMemAlloc "),
            "cuMemAlloc -> libgpuslice.so:cuMemAlloc_v2"
        );
        let graph = if per_thread {
            "cuGraphLaunch_ptsz"
        } else {
            "cuGraphLaunch"
        };
        assert_eq!(
            real.line("cuGraphLaunch"),
            format!("cuGraphLaunch -> libcuda.so.1:{graph}")
        );
        assert_eq!(
            shimmed.line("cuGraphLaunch"),
            format!("cuGraphLaunch -> libgpuslice.so:{graph}")
        );
        // Not hooked: the real pointer, identical to dlsym's.
        assert_eq!(
            shimmed.line("cuDriverGetVersion ->"),
            "cuDriverGetVersion -> libcuda.so.1:cuDriverGetVersion"
        );
        assert_eq!(
            shimmed.field("cuDriverGetVersion same_as_dlsym", "same_as_dlsym"),
            "1"
        );
        // Asking for cuGetProcAddress itself yields our matching v1/v2 wrapper.
        assert_eq!(
            shimmed.line("cuGetProcAddress ->"),
            "cuGetProcAddress -> libgpuslice.so:cuGetProcAddress_v2"
        );
        assert_eq!(
            shimmed.line("cuGetProcAddress@11030"),
            "cuGetProcAddress@11030 -> libgpuslice.so:cuGetProcAddress"
        );
    }
}

#[test]
fn devices_match_by_uuid_before_index_and_hami_env_works() {
    let dir = TempDir::new("shim-uuid");
    let config = limit_file(
        &dir,
        r#"{"version": 1, "devices": [
            {"index": 0, "memory": "1GiB"},
            {"uuid": "GPU-A0A1A2A3-A4A5-A6A7-A8A9-AAABACADAEAF", "memory": "3GiB"}]}"#,
    );
    let run = client(&["linked"], Shim::With, &config);
    assert_eq!(run.bytes("linked init", "total"), 3 * GIB);
    assert_eq!(run.bytes("linked nvml", "total"), 3 * GIB);

    // HAMi's region variable too: the default /tmp region is shared with concurrent tests.
    let hami = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "2048m".to_string()),
        (
            "CUDA_DEVICE_MEMORY_SHARED_CACHE",
            dir.path().join("hami.region").display().to_string(),
        ),
    ];
    let run = client(&["dlopen"], Shim::With, &hami);
    assert_eq!(run.bytes("dlopen init", "total"), 2 * GIB);
    assert_eq!(run.bytes("dlopen nvml", "total"), 2 * GIB);
}

#[test]
fn dlsym_lookups_keep_their_meaning_for_the_host() {
    let real = run_program(&programs().join("next"), &[], Shim::Without, &[]);
    let shimmed = run_program(&programs().join("next"), &[], Shim::With, &[]);
    assert!(
        real.success && shimmed.success,
        "{}\n{}",
        shimmed.stdout,
        shimmed.stderr
    );
    for (a, b) in real.stdout.lines().zip(shimmed.stdout.lines()) {
        if a.starts_with("next cuInit") {
            // RTLD_NEXT from the program: the next definition after it. With the shim that is
            // the shim's own export, which proves the caller's return address was kept.
            assert_eq!(a, "next cuInit = NULL");
            assert!(b.starts_with("next cuInit = libgpuslice.so+"), "{b}");
        } else {
            assert_eq!(a, b, "same answer with and without the shim");
        }
    }
    assert_eq!(real.stdout.lines().count(), shimmed.stdout.lines().count());
    assert!(shimmed.stdout.contains("malloc interposer ok calls=1"));
    assert!(shimmed.stdout.contains("next malloc = libc.so.6+"));

    let dl = client(&["dlopen"], Shim::With, &[]);
    assert_eq!(dl.line("repeat"), "repeat same=1 nonnull=1");
    // A hooked name the driver lacks: NULL plus dlerror, exactly as without the shim.
    assert_eq!(dl.line("missing"), "missing null=1 dlerror=1");
    // Through the global scope too, although our own export of that name is there.
    assert_eq!(dl.line("global missing"), "global missing rc=-2");
}

#[test]
fn processes_that_never_touch_cuda_are_unaffected() {
    let cases: [(&str, &[&str]); 3] = [
        ("/bin/sh", &["-c", "echo hi | tr a-z A-Z"]),
        ("python3", &["-c", "import ctypes, json, hashlib; print(json.dumps([hashlib.sha1(b'x').hexdigest(), ctypes.CDLL(None).strlen(b'abc')]))"]),
        ("/bin/sh", &["-c", "ls / | sort | head -3; echo $?"]),
    ];
    for (program, args) in cases {
        let program = which(program);
        let real = run_program(&program, args, Shim::Without, &[]);
        let shimmed = run_program(&program, args, Shim::With, &[]);
        assert!(real.success, "{program:?} {args:?}: {}", real.stderr);
        assert_eq!(shimmed.stdout, real.stdout, "{program:?} {args:?}");
        assert_eq!(shimmed.stderr, real.stderr, "{program:?} {args:?}");
        assert!(shimmed.success);
    }
}

/// What every exec in a sliced container pays for the preload: the loader maps the
/// shim and NOTHING else on its behalf (libm and libgcc_s used to come with it, at every exec
/// of every shell command). Judged by the loader's own trace (`LD_DEBUG=files`), with and
/// without the shim.
#[test]
fn the_shim_brings_no_other_library_into_a_process() {
    let loaded = |preload: bool| -> Vec<String> {
        let mut env: Env = vec![("LD_DEBUG".into(), "files".into())];
        if preload {
            env.push(("LD_PRELOAD".into(), shim_library().display().to_string()));
        }
        let output = run_with_timeout(
            command(Path::new("/bin/true"), &[], &env),
            None,
            DEFAULT_TIMEOUT,
        );
        assert!(output.status.success(), "/bin/true failed");
        // Lines look like "  123:\tfile=libc.so.6 [0];  needed by /bin/true [0]".
        let mut files: Vec<String> = String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter_map(|line| line.split("file=").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(|name| {
                Path::new(name)
                    .file_name()
                    .map_or(name.into(), |n| n.to_string_lossy().into_owned())
            })
            .collect();
        files.sort();
        files.dedup();
        files
    };
    let without = loaded(false);
    let with = loaded(true);
    assert!(!without.is_empty(), "LD_DEBUG=files printed nothing");
    let added: Vec<&String> = with.iter().filter(|f| !without.contains(f)).collect();
    let shim_name = shim_library()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    // libgcc_s.so.1 (std's unwinder) is linked statically (shim/build.rs), libm is not used.
    assert_eq!(
        added,
        [&shim_name],
        "objects the preload added to /bin/true (without: {without:?})"
    );
}

/// The shim must load wherever CUDA containers run: a preload the loader cannot load (a
/// symbol version the container's glibc lacks) is skipped and the container runs UNLIMITED.
/// RHEL 9 / UBI 9 CUDA images have glibc 2.34, so nothing newer than GLIBC_2.34 may be
/// required (the static unwinder's `_dl_find_object@GLIBC_2.35` is defined inside the shim,
/// `shim/src/find_object.rs`). Read from the library's own version-needs table.
/// Both files count: the front is what the loader preloads, the core what it dlopens at the
/// first hooked call (a core that cannot load fails closed, but fails).
#[test]
fn the_shim_needs_no_glibc_newer_than_2_34() {
    for library in [shim_library(), shim_core_library()] {
        let bytes = std::fs::read(&library).expect("read the shim library");
        let needs = elf_version_needs(&bytes);
        assert!(
            needs.iter().any(|(file, _)| file == "libc.so.6"),
            "{}: no libc version needs found: {needs:?}",
            library.display()
        );
        let too_new: Vec<_> = needs
            .iter()
            .filter(|(_, version)| {
                glibc_version(version).is_some_and(|(major, minor)| (major, minor) > (2, 34))
            })
            .collect();
        assert!(
            too_new.is_empty(),
            "{} requires {too_new:?}: it would not load on glibc 2.34",
            library.display()
        );
    }
}

/// The defined dynamic function symbols of `library` (`nm -D --defined-only`), sorted.
fn exported_functions(library: &Path) -> Vec<String> {
    let output = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(library)
        .output()
        .expect("run nm (binutils)");
    assert!(output.status.success(), "nm {}", library.display());
    let mut names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (_, kind, name) = (words.next()?, words.next()?, words.next()?);
            (kind == "T").then(|| name.split('@').next().unwrap_or(name).to_string())
        })
        .collect();
    names.sort();
    names
}

/// The front (what every process maps) exports exactly the hooks of the registry plus
/// `dlsym`: one it lacked would never reach the shim (a direct call or a weak reference
/// binding to the driver is a path around the slice), one too many would interpose on a name
/// the core does not handle. The core's exports are the registry (it can still be preloaded
/// alone) plus the attach entry point.
#[test]
fn the_front_exports_exactly_the_registry() {
    let front = exported_functions(&shim_library());
    let core = exported_functions(&shim_core_library());
    let core_hooks: Vec<&String> = core
        .iter()
        .filter(|name| *name != "gpuslice_core_attach")
        .collect();
    assert!(
        core.iter().any(|n| n == "gpuslice_core_attach"),
        "the core has no attach entry point: {core:?}"
    );
    assert_eq!(
        front.iter().collect::<Vec<_>>(),
        core_hooks,
        "front and core export different hooks"
    );
    for name in [
        "dlsym",
        "cuInit",
        "cuMemAlloc_v2",
        "cuLaunchKernel_ptsz",
        "nvmlInit_v2",
    ] {
        assert!(front.iter().any(|n| n == name), "{name} missing: {front:?}");
    }
}

/// Without its core beside it (a half-installed or half-mounted shim), the front fails
/// CLOSED: one clear line on stderr, every CUDA and NVML entry point refuses (never the
/// unlimited driver), and a process that never touches CUDA runs exactly as without the shim.
#[test]
fn without_its_core_the_front_fails_closed_with_one_clear_line() {
    let dir = TempDir::new("shim-no-core");
    let alone = dir.path().join("libgpuslice.so");
    std::fs::copy(shim_library(), &alone).unwrap();
    let config = limit_file(
        &dir,
        r#"{"version": 1, "devices": [{"index": 0, "memory": "1GiB"}]}"#,
    );
    for args in PATHS {
        let binary = if args[0] == "linked" {
            "client_linked"
        } else {
            "client_dl"
        };
        let run =
            run_program_preloading(&programs().join(binary), args, Shim::With, &alone, &config);
        assert!(run.success, "{args:?}:\n{}\n{}", run.stdout, run.stderr);
        // The CUDA runtime's path: cuGetProcAddress answers (never "not found", which
        // bindings report as a missing function) with functions that refuse, so nothing
        // reaches the driver unlimited and the application sees a CUDA error.
        if args[0] == "procaddr" {
            assert_eq!(run.field("self", "rc"), "0", "{args:?}\n{}", run.stdout);
            assert!(
                !run.line("cuDriverGetVersion ->").contains("NULL"),
                "{args:?}: a function the driver has is answered\n{}",
                run.stdout
            );
        }
        assert_eq!(
            run.field(args[0], "init"),
            "3",
            "{args:?}: CUDA_ERROR_NOT_INITIALIZED\n{}",
            run.stdout
        );
        if args[0] == "linked" {
            assert_eq!(
                run.field("linked nvml", "init"),
                "1",
                "NVML_ERROR_UNINITIALIZED"
            );
        }
        let lines: Vec<_> = run.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{args:?}: one line per process: {}",
            run.stderr
        );
        assert!(
            lines[0].contains("cannot load")
                && lines[0].contains(&dir.path().join("libgpuslice_core.so").display().to_string()),
            "names what is missing: {}",
            lines[0]
        );
    }
    let program = which("/bin/sh");
    let args = ["-c", "echo hi | tr a-z A-Z"];
    let real = run_program(&program, &args, Shim::Without, &[]);
    let shimmed = run_program_preloading(&program, &args, Shim::With, &alone, &config);
    assert_eq!((shimmed.stdout, shimmed.stderr), (real.stdout, real.stderr));
}

/// Packages and `/etc/ld.so.preload` entries often reach the library through a symbolic link
/// in another directory: the core is found beside the front's real file, the links
/// followed (a relative link to a relative link here), and the slice is enforced.
#[test]
fn a_front_reached_through_symbolic_links_finds_its_core_beside_the_real_file() {
    let dir = TempDir::new("shim-links");
    let install = dir.path().join("usr/lib/gpuslice");
    let links = dir.path().join("etc/preload.d");
    let hop = dir.path().join("opt/gpuslice");
    for d in [&install, &links, &hop] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::copy(shim_library(), install.join("libgpuslice.so")).unwrap();
    std::fs::copy(shim_core_library(), install.join("libgpuslice_core.so")).unwrap();
    // etc/preload.d/libgpuslice.so -> ../../opt/gpuslice/libgpuslice.so -> /abs/usr/lib/...
    std::os::unix::fs::symlink(install.join("libgpuslice.so"), hop.join("libgpuslice.so")).unwrap();
    std::os::unix::fs::symlink(
        "../../opt/gpuslice/libgpuslice.so",
        links.join("libgpuslice.so"),
    )
    .unwrap();
    let config = limit_file(&dir, ONE_GIB_ON_INDEX_0);
    for args in PATHS {
        let binary = if args[0] == "linked" {
            "client_linked"
        } else {
            "client_dl"
        };
        let run = run_program_preloading(
            &programs().join(binary),
            args,
            Shim::With,
            &links.join("libgpuslice.so"),
            &config,
        );
        assert!(run.success, "{args:?}:\n{}\n{}", run.stdout, run.stderr);
        assert_eq!(
            run.field(args[0], "init"),
            "0",
            "{args:?}\n{}\n{}",
            run.stdout,
            run.stderr
        );
        assert_eq!(
            run.bytes(args[0], "total"),
            GIB,
            "{args:?}: the slice\n{}\n{}",
            run.stdout,
            run.stderr
        );
        assert!(run.stderr.is_empty(), "{args:?}: {}", run.stderr);
    }
}

/// The core is loaded at the first lookup or call of a HOOKED name, never for another name:
/// Python and other hosts call dlsym constantly (judged by the loader's own trace).
#[test]
fn lookups_of_other_names_never_load_the_core() {
    let python = which("python3");
    let loads_core = |lookup: &str| -> bool {
        let code = format!("import ctypes; print(hasattr(ctypes.CDLL(None), '{lookup}'))");
        let run = run_program(
            &python,
            &["-c", &code],
            Shim::With,
            &[("LD_DEBUG", "files".into())],
        );
        assert!(run.success, "{}", run.stderr);
        run.stderr
            .lines()
            .any(|l| l.contains("file=") && l.contains("libgpuslice_core.so"))
    };
    for other in [
        "strlen",
        "cudnnCreate",
        "curl_easy_init",
        "nvmlSomethingNew",
    ] {
        assert!(!loads_core(other), "dlsym of {other} loaded the core");
    }
    assert!(loads_core("cuInit"), "a hooked name loads the core");
}

/// `GLIBC_2.34` -> (2, 34); other version names -> None.
fn glibc_version(name: &str) -> Option<(u32, u32)> {
    let mut parts = name.strip_prefix("GLIBC_")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// (file, version) of every entry of an ELF64 little-endian object's `SHT_GNU_verneed`
/// section: the symbol versions the loader must find for the object to load.
fn elf_version_needs(elf: &[u8]) -> Vec<(String, String)> {
    const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    assert_eq!(&elf[..5], b"\x7fELF\x02", "not an ELF64 file");
    assert_eq!(elf[5], 1, "not little-endian");
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let section = |i: usize| shoff + i * shentsize;
    let string = |table: usize, at: usize| {
        let start = u64_at(section(table) + 0x18) + at;
        let end = start + elf[start..].iter().position(|&b| b == 0).unwrap();
        String::from_utf8_lossy(&elf[start..end]).into_owned()
    };
    let mut needs = Vec::new();
    for i in 0..shnum {
        let header = section(i);
        if u32_at(header + 4) != SHT_GNU_VERNEED as usize {
            continue;
        }
        let (offset, strtab, count) = (
            u64_at(header + 0x18),
            u32_at(header + 0x28),
            u32_at(header + 0x2c),
        );
        let mut need = offset;
        for _ in 0..count {
            // Elf64_Verneed: vn_version u16, vn_cnt u16, vn_file u32, vn_aux u32, vn_next u32.
            let file = string(strtab, u32_at(need + 4));
            let mut aux = need + u32_at(need + 8);
            for _ in 0..u16_at(need + 2) {
                // Elf64_Vernaux: hash u32, flags u16, other u16, name u32, next u32.
                needs.push((file.clone(), string(strtab, u32_at(aux + 8))));
                aux += u32_at(aux + 12);
            }
            need += u32_at(need + 12);
        }
    }
    needs
}

fn which(program: &str) -> PathBuf {
    if program.starts_with('/') {
        return PathBuf::from(program);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.exists())
        })
        .unwrap_or_else(|| panic!("{program} not on PATH"))
}

#[test]
fn a_malformed_limit_file_fails_closed_with_one_clear_line() {
    let dir = TempDir::new("shim-bad-config");
    let config = limit_file(
        &dir,
        r#"{"version": 1, "devices": [{"index": 0, "memory": "8XB"}]}"#,
    );
    let path = config[0].1.clone();
    let run = client(&["linked"], Shim::With, &config);
    assert_eq!(
        run.field("linked init", "init"),
        "3",
        "CUDA_ERROR_NOT_INITIALIZED"
    );
    assert_eq!(
        run.field("linked nvml", "init"),
        "1",
        "NVML_ERROR_UNINITIALIZED"
    );
    let lines: Vec<_> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("[gpuslice]"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per process: {}", run.stderr);
    assert!(lines[0].contains(&path), "names the file: {}", lines[0]);
    assert!(
        lines[0].contains("devices[0].memory"),
        "names the field: {}",
        lines[0]
    );

    for args in &PATHS[1..] {
        let run = client(args, Shim::With, &config);
        let label = if args[0] == "procaddr" {
            "procaddr"
        } else {
            args[0]
        };
        if args[0] == "procaddr" {
            // cuGetProcAddress stays open (a refused lookup reads as a missing function to
            // the runtime and to cuda-bindings): the runtime gets its entry points, the
            // driver's own cuDriverGetVersion among them, and cuInit is the one that refuses.
            assert_eq!(run.field("self", "rc"), "0", "{}", run.stdout);
            assert_eq!(
                run.line("cuDriverGetVersion same_as_dlsym"),
                "cuDriverGetVersion same_as_dlsym=1"
            );
        }
        assert_eq!(run.field(label, "init"), "3", "{args:?}: {}", run.stdout);
    }
}

#[test]
fn no_configuration_is_identical_to_no_shim() {
    assert!(
        !Path::new(gpuslice_common_default_path()).exists(),
        "this machine has a system-wide limit file; the test needs none"
    );
    for args in PATHS {
        let real = client(args, Shim::Without, &[]);
        let shimmed = client(args, Shim::With, &[]);
        let strip = |s: &str| {
            s.lines()
                .filter(|l| !l.contains("libgpuslice.so") && !l.contains("libcuda.so.1:"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(strip(&shimmed.stdout), strip(&real.stdout), "{args:?}");
        assert_eq!(shimmed.stderr, "", "{args:?}");
    }
}

fn gpuslice_common_default_path() -> &'static str {
    "/etc/gpuslice/limits.json"
}

#[test]
fn fork_and_fork_exec_children_work_under_the_shim() {
    let dir = TempDir::new("shim-fork");
    let mut config = limit_file(&dir, ONE_GIB_ON_INDEX_0);
    config.push(("GPUSLICE_LOG", "info".to_string()));
    let run = client(&["fork"], Shim::With, &config);
    assert_eq!(run.bytes("parent", "total"), GIB);
    assert_eq!(
        run.bytes("child init", "total"),
        GIB,
        "forked child re-initialises"
    );
    assert_eq!(run.line("child exit"), "child exit=0");
    assert_eq!(
        run.bytes("linked init", "total"),
        GIB,
        "exec'd child inherits the preload"
    );
    assert_eq!(run.bytes("linked nvml", "total"), GIB);
    assert_eq!(run.line("exec child exit"), "exec child exit=0");
    // Each process initialised once: parent, forked child (clean per-process state), exec'd
    // child.
    let inits = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("[gpuslice] enforcing slice"))
        .count();
    assert_eq!(inits, 3, "{}", run.stderr);
}

/// A driver answer the shim cannot map to a wrapper, for a function family it hooks, is a path
/// around the slice: with a slice configured it is reported once at error level, never
/// passed silently; without one the shim stays silent (pure pass-through).
#[test]
fn an_unmappable_proc_address_answer_for_a_hooked_family_is_reported() {
    let dir = TempDir::new("shim-unmapped");
    let config = limit_file(&dir, ONE_GIB_ON_INDEX_0);
    let sliced = client(&["procaddr-unmapped"], Shim::With, &config);
    assert_eq!(sliced.line("unmapped rc"), "unmapped rc=0 status=0");
    assert_eq!(
        sliced.line("unmapped is_dlsym_answer"),
        "unmapped is_dlsym_answer=0",
        "the driver's own (unexported) choice is handed through"
    );
    assert!(
        sliced
            .line("cuMemAllocManaged ->")
            .starts_with("cuMemAllocManaged -> libcuda.so.1:"),
        "{}",
        sliced.stdout
    );
    assert_eq!(
        sliced
            .stderr
            .matches("cuGetProcAddress(\"cuMemAllocManaged\")")
            .count(),
        1,
        "reported once: {}",
        sliced.stderr
    );
    assert!(sliced.stderr.contains("NOT limited"), "{}", sliced.stderr);

    let unconfigured = client(&["procaddr-unmapped"], Shim::With, &[]);
    assert!(unconfigured.stderr.is_empty(), "{}", unconfigured.stderr);
}

/// NVML's graphics and MPS process lists (every layout) show only the slice's processes:
/// another tenant's PID and memory are not disclosed. Without a slice they are untouched.
#[test]
fn graphics_and_mps_process_lists_hide_other_tenants() {
    let dir = TempDir::new("shim-lists");
    let config = limit_file(&dir, ONE_GIB_ON_INDEX_0);
    let names = [
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    ];
    let real = client(&["nvml-lists"], Shim::Without, &config);
    let sliced = client(&["nvml-lists"], Shim::With, &config);
    assert_eq!(
        sliced.line("lists"),
        "lists init=0 handle=0",
        "{}",
        sliced.stderr
    );
    for name in names {
        assert_eq!(
            real.line(&format!("{name} ")),
            format!("{name} query=7 need=2 rc=0 n=2 pids=4242,0,"),
            "the mini driver lists both"
        );
        assert_eq!(
            sliced.line(&format!("{name} ")),
            format!("{name} query=7 need=1 rc=0 n=1 pids=0,"),
            "{name}: only this process, under its own pid\n{}",
            sliced.stderr
        );
    }
}

/// A driver whose functions call its own exports (the mini driver's 32-bit `cuMemAlloc` calls
/// the exported `cuMemAlloc_v2` through the PLT) reaches the shim twice on one thread: only
/// the outer wrapper may account for it, or one allocation is charged twice.
#[test]
fn a_driver_calling_its_own_exports_is_charged_once() {
    let dir = TempDir::new("shim-nested");
    let config = limit_file(
        &dir,
        r#"{"version": 1, "devices": [{"index": 0, "memory": "4GiB"}]}"#,
    );
    let sliced = client(&["legacy-nested"], Shim::With, &config);
    assert_eq!(
        sliced.line("nested"),
        format!(
            "nested alloc=0 meminfo=0 free={} total={}",
            3 * GIB,
            4 * GIB
        ),
        "{}",
        sliced.stderr
    );
}

/// The legacy 32-bit `cuMemAlloc` that cuGetProcAddress answers below version 3020 is the
/// driver's exported symbol of that name, which the shim hooks: it maps to the wrapper of
/// the same name by identity, and nothing is reported (the slice covers it).
#[test]
fn a_legacy_proc_address_answer_maps_to_the_legacy_wrapper() {
    let dir = TempDir::new("shim-legacy");
    let config = limit_file(&dir, ONE_GIB_ON_INDEX_0);
    let real = client(&["procaddr-legacy"], Shim::Without, &config);
    assert_eq!(
        real.line("cuMemAlloc@3010"),
        "cuMemAlloc@3010 -> libcuda.so.1:cuMemAlloc"
    );
    let sliced = client(&["procaddr-legacy"], Shim::With, &config);
    assert_eq!(sliced.line("legacy"), "legacy rc=0 status=0");
    assert_eq!(
        sliced.line("cuMemAlloc@3010"),
        "cuMemAlloc@3010 -> libgpuslice.so:cuMemAlloc",
        "the driver's v1 choice, wrapped by the v1 wrapper"
    );
    assert!(
        sliced.stderr.is_empty(),
        "nothing to report: {}",
        sliced.stderr
    );
}

/// Programs that probe for CUDA without linking it (`dlsym(RTLD_DEFAULT, "cuInit")`,
/// `dlsym(dlopen(NULL), ...)` as `ctypes.CDLL(None).cuInit` does) get what they would get
/// without the shim, although the shim exports every hooked name: NULL while no driver is in
/// their scope, the (wrapped) driver function once it is. A weak reference binds to our
/// export by ordinary ELF symbol resolution, which the shim cannot avoid while it interposes
/// on programs linked with -lcuda: it is non-NULL and answers an error code.
#[test]
fn probing_for_cuda_finds_it_only_where_the_driver_is() {
    let real = run_program(&programs().join("probe"), &[], Shim::Without, &[]);
    let shimmed = run_program(&programs().join("probe"), &[], Shim::With, &[]);
    assert!(
        real.success && shimmed.success,
        "{}\n{}\n{}",
        real.stdout,
        shimmed.stdout,
        shimmed.stderr
    );
    // Same lines, and every lookup is NULL or non-NULL exactly as without the shim (a found
    // driver function is handed out as our wrapper, so only the object differs).
    let lookups = |run: &Run| -> Vec<String> {
        run.stdout
            .lines()
            .filter(|l| !l.starts_with("weak"))
            .map(str::to_string)
            .collect()
    };
    let (a_lines, b_lines) = (lookups(&real), lookups(&shimmed));
    assert_eq!(
        a_lines.len(),
        b_lines.len(),
        "{}\n{}",
        real.stdout,
        shimmed.stdout
    );
    for (a, b) in a_lines.iter().zip(&b_lines) {
        let (a, b) = (a.as_str(), b.as_str());
        let null = |line: &str| line.ends_with("= NULL");
        assert_eq!(null(a), null(b), "without: {a:?} with: {b:?}");
        if let Some(real_def) = a.strip_suffix("libcuda.so.1:cuInit") {
            assert_eq!(
                b.strip_suffix("libgpuslice.so:cuInit"),
                Some(real_def),
                "the driver's function comes wrapped: {b}"
            );
        } else if a.contains(" = ") && !null(a) {
            assert!(b.contains("libgpuslice.so:"), "{b}");
        }
    }
    for stage in ["nodriver", "local"] {
        for name in [
            "cuInit",
            "cuMemAlloc_v2",
            "cuGetProcAddress_v2",
            "nvmlInit_v2",
        ] {
            assert_eq!(
                shimmed.line(&format!("{stage} default {name} =")),
                format!("{stage} default {name} = NULL")
            );
            assert_eq!(
                shimmed.line(&format!("{stage} default {name} dlerror")),
                format!("{stage} default {name} dlerror=1")
            );
            assert_eq!(
                shimmed.line(&format!("{stage} main {name}")),
                format!("{stage} main {name} = NULL")
            );
        }
    }
    assert_eq!(
        shimmed.line("global default cuInit"),
        "global default cuInit = libgpuslice.so:cuInit"
    );
    assert_eq!(
        shimmed.line("global main cuInit"),
        "global main cuInit = libgpuslice.so:cuInit"
    );
    // The mini driver has no NVML: still nothing in the global scope for that name.
    assert_eq!(
        shimmed.line("global default nvmlInit_v2"),
        "global default nvmlInit_v2 = NULL"
    );
    assert_eq!(
        shimmed.line("from local cuInit"),
        "from local cuInit = libgpuslice.so:cuInit"
    );
    assert_eq!(
        shimmed.line("from local cuNotAFunction"),
        "from local cuNotAFunction = NULL"
    );
    // The limit: a weak reference binds to our export. Calling it answers an error code.
    assert_eq!(real.line("weak cuInit"), "weak cuInit = NULL");
    assert_eq!(
        shimmed.line("weak cuInit ="),
        "weak cuInit = libgpuslice.so:cuInit"
    );

    // With no driver anywhere on the library path: every lookup NULL, and the weak
    // reference (our export) answers CUDA_ERROR_NOT_SUPPORTED (801) when called.
    let empty = TempDir::new("no-driver");
    let alone = run_program(
        &programs().join("probe"),
        &[],
        Shim::With,
        &[("LD_LIBRARY_PATH", empty.path().display().to_string())],
    );
    assert!(alone.stdout.contains("no libcuda"), "{}", alone.stdout);
    for line in alone.stdout.lines().filter(|l| l.starts_with("nodriver")) {
        assert!(
            line.ends_with("= NULL") || line.ends_with("dlerror=1"),
            "{line}"
        );
    }
    assert_eq!(alone.line("weak cuInit rc"), "weak cuInit rc=801");

    // Python's ctypes.CDLL(None) (dlsym on the main program's handle) finds no CUDA or NVML
    // name either.
    let script = "import ctypes, json\n\
        main = ctypes.CDLL(None)\n\
        print(json.dumps({n: hasattr(main, n) for n in ['cuInit', 'cuMemAlloc_v2', 'nvmlInit_v2', 'strlen']}))\n";
    let env: Env = vec![
        ("LD_LIBRARY_PATH".into(), empty.path().display().to_string()),
        ("LD_PRELOAD".into(), shim_library().display().to_string()),
    ];
    let output = run_with_timeout(
        command(Path::new("python3"), &["-c", script], &env),
        None,
        DEFAULT_TIMEOUT,
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        r#"{"cuInit": false, "cuMemAlloc_v2": false, "nvmlInit_v2": false, "strlen": true}"#,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
