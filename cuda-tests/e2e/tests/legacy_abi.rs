//! The legacy (pre-3.2) driver entry points under libgpuslice.so against fakegpu, judged by
//! the fake's PHYSICAL truth and the region (`gpuslice status --json`), never by the shim's
//! own numbers: the 32-bit `cuMemAlloc` / `cuMemAllocPitch` / `cuArrayCreate` /
//! `cuArray3DCreate` / `cuMemFree`, the v1 `cuCtxCreate` / `cuCtxDestroy`, the v1 primary
//! release and reset NVIDIA's loaders get from cuGetProcAddress at 7000, the 32-bit
//! `cuMemGetInfo` / `cuDeviceTotalMem`, and the deprecated launches. Each is reached by its
//! bare name through dlsym and through cuGetProcAddress_v2 at the version that answers it,
//! by the C client tests/shim_c/legacy.c. (The share those launches get, a timing figure, is
//! in the serial `throttle.rs`.)
//!
//! Context cost in the fake: 300 MiB; allocations round to 2 MiB.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::{mpsc, OnceLock};
use std::thread::JoinHandle;

use cuda_e2e::{command, Client, ClientKind, Env, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB, MIB};
use serde_json::Value;

const CONTEXT: u64 = 300 * MIB;
const U32_MAX: u64 = u32::MAX as u64;

/// The legacy client, built once per source version.
fn legacy_client() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| cuda_e2e::legacy_client(Path::new(env!("CARGO_TARGET_TMPDIR"))))
}

/// One run of the legacy client: its stdout lines as they come, stdin to let it go on past a
/// checkpoint.
struct Legacy {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    seen: Vec<String>,
    what: String,
}

impl Legacy {
    fn spawn(args: &[&str], env: &Env) -> Legacy {
        let mut cmd = command(legacy_client(), args, env);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the legacy client");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let mut stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Legacy {
            child: Some(child),
            stdin,
            lines,
            stderr: Some(stderr),
            seen: Vec::new(),
            what: format!("legacy {args:?}"),
        }
    }

    /// Reads up to the line `checkpoint NAME` (the client then waits for [`Legacy::go`]).
    fn until(&mut self, name: &str) {
        let wanted = format!("checkpoint {name}");
        loop {
            match self.lines.recv_timeout(DEFAULT_TIMEOUT) {
                Ok(line) => {
                    let done = line == wanted;
                    self.seen.push(line);
                    if done {
                        return;
                    }
                }
                Err(_) => panic!(
                    "{}: no {wanted:?}; output so far:\n{}",
                    self.what,
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(b"go\n").expect("write to the client");
        stdin.flush().expect("flush to the client");
    }

    /// The last line so far starting with `prefix`.
    fn line(&self, prefix: &str) -> &str {
        self.seen
            .iter()
            .rev()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "{}: no line {prefix:?} in:\n{}",
                    self.what,
                    self.seen.join("\n")
                )
            })
    }

    /// The value of `key=` on the last line starting with `prefix`.
    fn field(&self, prefix: &str, key: &str) -> u64 {
        let line = self.line(prefix);
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{}: no number {key}= in {line:?}", self.what))
    }

    /// Lets the client run to its end; returns its stderr after checking it succeeded.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let mut child = self.child.take().expect("child present");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = rx
            .recv_timeout(DEFAULT_TIMEOUT)
            .unwrap_or_else(|_| panic!("{} did not exit in time", self.what))
            .expect("wait for the client");
        self.seen.extend(self.lines.try_iter());
        let stderr = self.stderr.take().unwrap().join().unwrap_or_default();
        assert!(
            status.success(),
            "{} failed ({status}):\n{}\n{stderr}",
            self.what,
            self.seen.join("\n")
        );
        stderr
    }
}

impl Drop for Legacy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the client to its end (no checkpoints); returns (stdout lines, stderr).
fn run_to_end(args: &[&str], env: &Env) -> (Legacy, String) {
    let mut run = Legacy::spawn(args, env);
    drop(run.stdin.take());
    let mut child = run.child.take().expect("child present");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx
        .recv_timeout(DEFAULT_TIMEOUT)
        .unwrap_or_else(|_| panic!("{} did not exit in time", run.what))
        .expect("wait for the client");
    while let Ok(line) = run.lines.recv_timeout(DEFAULT_TIMEOUT) {
        run.seen.push(line);
    }
    let stderr = run.stderr.take().unwrap().join().unwrap_or_default();
    assert!(
        status.success(),
        "{} failed ({status}):\n{}\n{stderr}",
        run.what,
        run.seen.join("\n")
    );
    (run, stderr)
}

fn region_used(slice: &Slice) -> u64 {
    let mut cmd = std::process::Command::new(cuda_e2e::gpuslice_binary());
    cmd.args(["status", "--json", "--region"])
        .arg(slice.region_path());
    let out = cuda_e2e::run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gpuslice status --json: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // Exited processes keep their slot until someone reaps it: the live ones must match.
    v["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes in {v}"))
        .iter()
        .filter(|p| p["alive"] == true)
        .map(|p| p["used_total"].as_u64().unwrap())
        .sum()
}

/// The two lookups: by bare name through dlsym, and through cuGetProcAddress_v2.
const LOOKUPS: [&[&str]; 2] = [&[], &["--procaddr"]];

fn args<'a>(lookup: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
    lookup.iter().chain(rest).copied().collect()
}

/// Every legacy name resolved to the shim's wrapper of exactly that name (the v1 one).
fn assert_wrapped(run: &Legacy, names: &[&str]) {
    for name in names {
        assert_eq!(
            run.line(&format!("where {name} ")),
            format!("where {name} -> libgpuslice.so:{name}"),
            "{}",
            run.what
        );
    }
}

#[test]
fn v1_allocations_are_capped_freed_and_their_v1_context_charged_and_refunded() {
    let gpu = FakeGpu::start("v100");
    let cap = 640 * MIB;
    let slice = Slice::builder().device(0, "640MiB", None).build();
    let env = slice.env(&gpu);
    for lookup in LOOKUPS {
        for path in ["alloc", "pitch", "array", "array3d"] {
            gpu.truth().reset_peak_memory(0);
            let mut run = Legacy::spawn(&args(lookup, &["alloc", path, "64"]), &env);
            run.until("held");
            let what = format!("{lookup:?} {path}");
            assert_wrapped(
                &run,
                &[
                    "cuCtxCreate",
                    "cuCtxDestroy",
                    "cuMemAlloc",
                    "cuMemAllocPitch",
                    "cuMemFree",
                    "cuMemGetInfo",
                    "cuDeviceTotalMem",
                    "cuArrayCreate",
                    "cuArray3DCreate",
                ],
            );
            assert_eq!(run.line("context"), "context rc=0", "{what}");
            // The slice through the 32-bit queries: 640 MiB, less the context.
            assert_eq!(run.field("meminfo ", "rc"), 0, "{what}");
            assert_eq!(run.field("meminfo ", "total"), cap, "{what}");
            assert_eq!(run.field("meminfo ", "devtotal"), cap, "{what}");
            assert_eq!(run.field("meminfo ", "free"), cap - CONTEXT, "{what}");
            // 340 MiB after the context: five 64 MiB chunks, the sixth is out of memory
            // (the fake alone would give eight from its 512 MiB low range, or many arrays).
            assert_eq!(
                run.line("alloc count"),
                "alloc count=5 error=2",
                "{what}: capped"
            );
            assert_eq!(run.field("meminfo_held", "free"), 20 * MIB, "{what}");
            let held = CONTEXT + 5 * 64 * MIB;
            assert!(gpu.truth().peak_memory(0) <= cap, "{what}: past the cap");
            assert_eq!(gpu.truth().used_memory(0), held, "{what}");
            assert_eq!(region_used(&slice), held, "{what}: the region");

            run.go();
            run.until("freed");
            assert_eq!(run.line("free"), "free ok=5 failed=0", "{what}");
            assert_eq!(run.field("meminfo_freed", "free"), cap - CONTEXT, "{what}");
            assert_eq!(gpu.truth().used_memory(0), CONTEXT, "{what}");
            assert_eq!(region_used(&slice), CONTEXT, "{what}: freed in the region");

            run.go();
            run.until("destroyed");
            assert_eq!(run.line("destroy"), "destroy rc=0", "{what}");
            assert_eq!(gpu.truth().used_memory(0), 0, "{what}");
            assert_eq!(region_used(&slice), 0, "{what}: the v1 context refunded");
            run.go();
            run.finish();
        }
    }
}

#[test]
fn v1_memory_queries_report_the_slice_clamped_to_32_bits() {
    let gpu = FakeGpu::start("v100");
    // Without a slice: the 32 GiB card, clamped by the fake like the driver clamps.
    let mut run = Legacy::spawn(&["alloc", "alloc", "64"], &gpu.env());
    run.until("held");
    assert_eq!(run.field("meminfo ", "total"), U32_MAX);
    assert_eq!(run.field("meminfo ", "devtotal"), U32_MAX);
    run.go();
    run.until("freed");
    run.go();
    run.until("destroyed");
    run.go();
    run.finish();

    // A 6 GiB slice of which another process holds 3 GiB: the total is clamped, the free is
    // the slice's (6 GiB - 3 GiB - two contexts), computed from the full figures.
    let slice = Slice::builder().device(0, "6GiB", None).build();
    let env = slice.env(&gpu);
    let holder = Client::spawn(ClientKind::Linked, &["hold", "3GiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    for lookup in LOOKUPS {
        let mut run = Legacy::spawn(&args(lookup, &["alloc", "alloc", "64"]), &env);
        run.until("held");
        let free = 6 * GIB - 3 * GIB - 2 * CONTEXT;
        assert_eq!(run.field("meminfo ", "total"), U32_MAX, "{lookup:?}");
        assert_eq!(run.field("meminfo ", "devtotal"), U32_MAX, "{lookup:?}");
        assert_eq!(run.field("meminfo ", "free"), free, "{lookup:?}");
        run.go();
        run.until("freed");
        run.go();
        run.until("destroyed");
        run.go();
        run.finish();
    }
    holder.release();
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn v1_primary_release_and_reset_give_back_the_context_and_what_it_owned() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    for lookup in LOOKUPS {
        for end in ["release", "reset"] {
            let what = format!("{lookup:?} {end}");
            let mut run = Legacy::spawn(&args(lookup, &["primary", end]), &env);
            run.until("held");
            // cuGetProcAddress("cuDevicePrimaryCtxRelease", 7000) is the v1 function.
            assert_wrapped(
                &run,
                &["cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset"],
            );
            assert_eq!(run.line("alloc"), "alloc rc=0", "{what}");
            let held = CONTEXT + 64 * MIB;
            assert_eq!(gpu.truth().used_memory(0), held, "{what}");
            assert_eq!(region_used(&slice), held, "{what}: the region");

            run.go();
            run.until("ended");
            assert_eq!(run.line("end"), format!("end {end} rc=0"), "{what}");
            assert_eq!(gpu.truth().used_memory(0), 0, "{what}: the card");
            assert_eq!(region_used(&slice), 0, "{what}: the region gave it back");

            run.go();
            run.until("again");
            assert_eq!(run.line("retain"), "retain rc=0", "{what}");
            assert_eq!(gpu.truth().used_memory(0), CONTEXT, "{what}");
            assert_eq!(region_used(&slice), CONTEXT, "{what}: charged anew");
            run.go();
            run.finish();
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_destroyed_context_gives_back_only_the_pointers_it_owned() {
    // In a process that sees one device the shim charges a pointer without asking the driver
    // for its context, and asks it of the driver (per pointer) only when a context is about to
    // end: a context destroyed while another's memory lives on must take back exactly its own.
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    for lookup in LOOKUPS {
        let what = format!("{lookup:?}");
        let mut run = Legacy::spawn(&args(lookup, &["owners"]), &env);
        run.until("held");
        for step in ["first", "alloc first", "second", "alloc second"] {
            assert_eq!(run.line(step), format!("{step} rc=0"), "{what}");
        }
        let held = 2 * CONTEXT + 64 * MIB + 128 * MIB;
        assert_eq!(gpu.truth().used_memory(0), held, "{what}: the card");
        assert_eq!(region_used(&slice), held, "{what}: the region");

        run.go();
        run.until("ended");
        assert_eq!(run.line("destroy first"), "destroy first rc=0", "{what}");
        let left = CONTEXT + 128 * MIB;
        assert_eq!(gpu.truth().used_memory(0), left, "{what}: the card");
        assert_eq!(
            region_used(&slice),
            left,
            "{what}: the region kept the second context's memory and only that"
        );

        run.go();
        run.until("done");
        assert_eq!(run.line("free second"), "free second rc=0", "{what}");
        assert_eq!(run.line("destroy second"), "destroy second rc=0", "{what}");
        // With no context current the driver answers CUDA_ERROR_INVALID_CONTEXT (201), below
        // the cap and past it alike (not the slice's OUT_OF_MEMORY), and nothing stays charged.
        for size in ["small", "large"] {
            let step = format!("alloc without {size}");
            assert_eq!(run.line(&step), format!("{step} rc=201"), "{what}");
        }
        assert_eq!(gpu.truth().used_memory(0), 0, "{what}: the card");
        assert_eq!(region_used(&slice), 0, "{what}: the region");
        run.go();
        run.finish();
    }
}

#[test]
fn deprecated_launches_pass_the_throttle() {
    // The throttle sets a device up (and says so at info level) at the first launch that
    // reaches its gate, and nowhere else: a process whose only launches are the deprecated
    // ones says so only if they are gated. (Whether they then follow the share is timing:
    // see throttle.rs.)
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", Some(25)).build();
    let mut env = slice.env(&gpu);
    env.push(("GPUSLICE_LOG".into(), "info".into()));
    for lookup in LOOKUPS {
        for path in ["launch", "grid", "grid-async"] {
            let what = format!("{lookup:?} {path}");
            // From the start of the current 1 ms bucket of the fake's timeline.
            let from = fakegpu::state::now_ns() / 1_000_000 * 1_000_000;
            let (run, stderr) = run_to_end(&args(lookup, &["launch", path, "2", "0"]), &env);
            assert_wrapped(&run, &["cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync"]);
            assert_eq!(run.line("function"), "function rc=0", "{what}");
            assert_eq!(run.line("launch "), "launch launches=2 ok=2", "{what}");
            assert!(
                stderr.contains("compute share 25%"),
                "{what}: the launch reached the throttle: {stderr}"
            );
            let busy = gpu.truth().busy_ns(0, None, from, u64::MAX);
            let at_least = if path == "launch" { 2_000 } else { 2_000_000 };
            assert!(busy >= at_least, "{what}: the kernels ran: {busy} ns");
        }
    }
}
