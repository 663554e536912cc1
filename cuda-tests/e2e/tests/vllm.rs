//! vLLM from PyPI, unmodified, under a 2 GiB slice of a simulated H200 or A100: a tiny Llama
//! built from a config with dummy weights (`py/vllm_probe.py`; no download), judged by the
//! card's own figures (physical use and the high-water mark), never by what vLLM or the shim
//! say about themselves.
//!
//! vLLM sizes its KV cache from the device's total and free memory at start-up
//! (`gpu_memory_utilization` x total, less what profiling used) and refuses with its own
//! `ValueError` when free memory is below that budget: under a slice, both follow the slice.
//!
//! Two of vLLM's settings are fixed here, each for a reason a real host shares or that the
//! fake cannot serve (see cuda-tests/README.md, "vLLM on the fake"):
//! - `VLLM_USE_V2_MODEL_RUNNER=0`: the V2 model runner counts each request's new tokens on
//!   the device (`torch.ones` filled by a kernel, then a Triton kernel) and reads the count
//!   back; the fake runs no kernel code, so the count stays 0 and `generate()` never ends. The
//!   V1 runner takes the count from the batch's shape on the host.
//! - `VLLM_USE_FLASHINFER_SAMPLER=0`: FlashInfer's sampler compiles itself with nvcc at first
//!   use; the venv has no CUDA toolkit, as a plain `pip install vllm` host has none.
//!
//! `E2E_VLLM_PYTHON` names the venv's interpreter (default
//! `/var/cache/gpuslice/venvs/vllm/bin/python`, which `.ci/vllm-setup.sh` builds). Without
//! vLLM each test prints `SKIPPED: ...` and returns, except with `CI=true`, where it fails.
//! A serial binary (`cargo xtask test` runs it with one thread): each vLLM start is minutes of
//! CPU and gigabytes of RAM. Six starts in all, 9.3 min on the loaded 2-core development
//! machine (the figures per test are in `.ci/vllm-setup.sh`).

use cuda_e2e::{command, wait_until, Env, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB, MIB};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SLICE: u64 = 2 * GIB;
/// What the fake charges per context.
const CONTEXT: u64 = 300 * MIB;
/// One vLLM start (import, engine, profiling, KV cache) on a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(900);
/// vLLM logs GiB with two decimals.
const LOG_ROUNDING: f64 = 0.01;

fn python() -> PathBuf {
    std::env::var_os("E2E_VLLM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/gpuslice/venvs/vllm/bin/python".into())
}

/// Whether vLLM is installed for [`python`]; otherwise the loud skip (a failure under CI).
fn have_vllm() -> bool {
    let py = python();
    let out = std::process::Command::new(&py)
        .args([
            "-c",
            "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)",
        ])
        .output();
    if matches!(&out, Ok(o) if o.status.success()) {
        return true;
    }
    cuda_e2e::skip::skip_or_fail(&format!(
        "vLLM is not installed for {} (E2E_VLLM_PYTHON); .ci/vllm-setup.sh builds that venv",
        py.display()
    ));
    false
}

fn probe_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("py/vllm_probe.py")
}

/// One `vllm_probe.py` process: its stdout and stderr as one stream of lines, kept whole
/// for the assertions and for failure messages.
struct Vllm {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    log: Arc<Mutex<Vec<String>>>,
    label: String,
}

impl Vllm {
    /// The probe under `slice`, the shim preloaded as the tests' slices do.
    fn start(label: &str, gpu: &FakeGpu, slice: &Slice, util: f64, extra: &[&str]) -> Vllm {
        Vllm::spawn(label, gpu, slice.env(gpu), &[], util, extra)
    }

    /// The probe as a user runs it: `gpuslice run --fake-gpu -m MEMORY -- python probe`, on
    /// `gpu`'s state (the run's fake GPU follows FAKEGPU_STATE and FAKEGPU_DEVICES).
    fn under_gpuslice_run(label: &str, gpu: &FakeGpu, memory: &str, util: f64) -> Vllm {
        let python = python().display().to_string();
        let run = ["run", "--fake-gpu", "-m", memory, "--", &python];
        Vllm::spawn(label, gpu, gpu.env(), &run, util, &[])
    }

    /// Runs the probe with `env` and the settings below; `run` non-empty runs it as
    /// `gpuslice RUN... probe ARGS` (RUN ending with the interpreter).
    fn spawn(
        label: &str,
        gpu: &FakeGpu,
        mut env: Env,
        run: &[&str],
        util: f64,
        extra: &[&str],
    ) -> Vllm {
        // The two settings of the header; then no Hugging Face Hub and no usage report
        // (nothing outside the machine is reachable, and the model is a local config).
        for (k, v) in [
            ("VLLM_USE_V2_MODEL_RUNNER", "0"),
            ("VLLM_USE_FLASHINFER_SAMPLER", "0"),
            ("HF_HUB_OFFLINE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
            ("DO_NOT_TRACK", "1"),
        ] {
            env.push((k.into(), v.into()));
        }
        let model_dir = gpu
            .scratch()
            .join(format!("model-{}", label.replace(' ', "-")));
        let mut args: Vec<String> = run.iter().map(|s| s.to_string()).collect();
        args.extend([
            probe_script().display().to_string(),
            "--model-dir".into(),
            model_dir.display().to_string(),
            "--util".into(),
            util.to_string(),
        ]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let program = if run.is_empty() {
            python()
        } else {
            cuda_e2e::gpuslice_binary()
        };
        let mut cmd = command(&program, &args, &env);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", python().display()));
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stdout: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().expect("piped"));
        let stderr: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().expect("piped"));
        for stream in [stdout, stderr] {
            let (tx, log) = (tx.clone(), log.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    log.lock().unwrap().push(line.clone());
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Vllm {
            child,
            stdin,
            lines: rx,
            log,
            label: label.into(),
        }
    }

    /// The last lines of its output, for failure messages.
    fn tail(&self) -> String {
        let log = self.log.lock().unwrap();
        let from = log.len().saturating_sub(40);
        log[from..].join("\n")
    }

    /// The next result line (`@@ {...}`); panics with the output's tail if none comes.
    fn result(&mut self) -> Value {
        loop {
            match self.lines.recv_timeout(START_TIMEOUT) {
                Ok(line) => {
                    if let Some(json) = line.strip_prefix("@@ ") {
                        return serde_json::from_str(json).expect("the probe prints JSON");
                    }
                }
                Err(e) => panic!(
                    "{}: no result ({e}); its output ends:\n{}",
                    self.label,
                    self.tail()
                ),
            }
        }
    }

    /// The next result, which must carry `key`.
    fn expect(&mut self, key: &str) -> Value {
        let r = self.result();
        assert!(
            r.get(key).is_some(),
            "{}: expected {key}, got {r}; its output ends:\n{}",
            self.label,
            self.tail()
        );
        r
    }

    /// The numbers (GiB) in the first line of its output holding `prefix`, read from the
    /// first `(` after it when `paren` (vLLM names the device before it: `cuda:0`).
    fn logged_gib(&self, prefix: &str, paren: bool) -> Vec<f64> {
        let log = self.log.lock().unwrap();
        let rest = log
            .iter()
            .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest.to_string()))
            .unwrap_or_else(|| panic!("{}: no {prefix:?} in its output", self.label));
        let rest = if paren {
            rest.split_once('(').map_or("", |(_, r)| r).to_string()
        } else {
            rest
        };
        rest.split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|s| !s.is_empty())
            .take(2)
            .map(|s| s.trim_end_matches('.').parse().expect("a number"))
            .collect()
    }

    /// vLLM's "Free memory on device (free/total GiB) on startup", logged when it starts
    /// and in its refusal: (free, total).
    fn startup_free_total(&self) -> (f64, f64) {
        let v = self.logged_gib("Free memory on device", true);
        (v[0], v[1])
    }

    /// vLLM's "Available KV cache memory: X GiB".
    fn kv_cache_gib(&self) -> f64 {
        self.logged_gib("Available KV cache memory: ", false)[0]
    }

    fn has_line(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Writes one line to its stdin (the probe's cue to go on).
    fn send_line(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(b"go\n").expect("write to the probe");
        stdin.flush().expect("flush to the probe");
    }

    /// Closes stdin and waits for the exit status.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + DEFAULT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not exit; its output ends:\n{}",
                self.label,
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

/// The card never held more than the slice, and gives everything back once the processes
/// (the probe and vLLM's engine process) are gone.
fn assert_capped_and_returned(gpu: &FakeGpu, what: &str) {
    let peak = gpu.truth().peak_memory(0);
    assert!(
        peak <= SLICE,
        "{what}: the card held {peak} bytes at its peak, past the {SLICE}-byte slice"
    );
    wait_until("vLLM's memory leaves the card", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
}

/// One engine at `util` under the slice: the total vLLM sees is the slice's, its KV cache is
/// `util` of the slice less its own profiled use, and the card holds that cache.
fn sized_engine(gpu: &FakeGpu, slice: &Slice, util: f64, extra: &[&str]) -> Vllm {
    let label = format!("vllm at {util}");
    let mut v = Vllm::start(&label, gpu, slice, util, extra);
    v.expect("ready");
    let (free, total) = v.startup_free_total();
    assert_eq!(
        total, 2.0,
        "{label}: vLLM's total is the slice, not the card"
    );
    let card_used = gpu.truth().used_memory(0);
    assert!(
        free <= 2.0 && free >= gib(SLICE - CONTEXT) - 0.2,
        "{label}: {free} GiB free at start in a 2 GiB slice"
    );
    let kv = v.kv_cache_gib();
    let budget = util * 2.0;
    // The tiny model's weights and activations are a few MiB: nearly all the budget is cache.
    assert!(
        kv <= budget && kv >= budget - 0.1,
        "{label}: KV cache {kv} GiB of a {budget} GiB budget"
    );
    assert!(
        gib(card_used) + LOG_ROUNDING >= kv + gib(CONTEXT) && card_used <= SLICE,
        "{label}: the card holds {} GiB for a {kv} GiB cache",
        gib(card_used)
    );
    v
}

/// An engine asked for `util` of the slice when less is free: vLLM's own `ValueError`,
/// naming the slice's total and the budget (`budget` GiB as vLLM prints it), exit code 3.
fn refused(label: &str, gpu: &FakeGpu, slice: &Slice, util: f64, budget: &str) {
    let mut v = Vllm::start(label, gpu, slice, util, &[]);
    let r = v.expect("error");
    let needle = format!("is less than desired GPU memory utilization ({util}, {budget} GiB)");
    assert!(
        v.has_line(&needle),
        "{label}: not vLLM's own ValueError: {r}; its output ends:\n{}",
        v.tail()
    );
    let (_, total) = v.startup_free_total();
    assert_eq!(total, 2.0, "{label}: the refusal names the slice's total");
    assert_eq!(v.finish().code(), Some(3));
}

#[test]
fn vllm_sizes_its_kv_cache_to_the_slice_and_generate_returns() {
    if !have_vllm() {
        return;
    }
    let gpu = FakeGpu::start("h200");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    gpu.truth().reset_peak_memory(0);
    // 0.75 of the slice, 1.5 GiB: what is free once the context is made and the shim has
    // priced the driver's own memory (about 1.57 GiB) holds it.
    let mut v = sized_engine(&gpu, &slice, 0.75, &["--generate", "4"]);
    let tokens = v.expect("tokens");
    assert_eq!(
        tokens["tokens"].as_array().map(Vec::len),
        Some(4),
        "generate() returned its four tokens (their values mean nothing without kernel code)"
    );
    v.expect("done");
    assert!(v.finish().success());
    assert_capped_and_returned(&gpu, "at 0.75");
}

#[test]
fn vllm_refuses_with_its_own_error_where_the_slice_is_too_small() {
    if !have_vllm() {
        return;
    }
    let gpu = FakeGpu::start("h200");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    gpu.truth().reset_peak_memory(0);
    // 0.95 of the slice is 1.9 GiB, more than is free once the context is made; the card
    // itself has 140 GiB free.
    refused("vllm at 0.95", &gpu, &slice, 0.95, "1.9");
    assert!(gpu.truth().total_memory(0) - gpu.truth().peak_memory(0) > 100 * GIB);
    assert_capped_and_returned(&gpu, "refused");
}

#[test]
fn two_vllm_processes_share_one_slice() {
    if !have_vllm() {
        return;
    }
    let gpu = FakeGpu::start("a100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    gpu.truth().reset_peak_memory(0);
    // The first holds 0.25 of the slice for its engine, plus its context, and keeps it.
    let mut first = sized_engine(&gpu, &slice, 0.25, &["--hold"]);
    first.expect("holding");
    let held = gpu.truth().used_memory(0);

    // The second sees what the first left: it fits 0.2 of the slice and generates. It
    // allocates through vLLM's sleep-mode allocator (cuMemCreate and cuMemMap, the VMM path
    // peers' shims missed), which gives its KV cache back while it sleeps.
    let mut second = Vllm::start(
        "second at 0.2",
        &gpu,
        &slice,
        0.2,
        &["--generate", "2", "--sleep-mode"],
    );
    second.expect("ready");
    let (free, total) = second.startup_free_total();
    assert_eq!(total, 2.0);
    assert!(
        free <= gib(SLICE - held - CONTEXT) + LOG_ROUNDING,
        "the second saw {free} GiB free while the first held {} GiB",
        gib(held)
    );
    let kv = second.kv_cache_gib();
    assert!(kv <= 0.4 && kv >= 0.3, "the second's KV cache: {kv} GiB");
    let both = gpu.truth().used_memory(0);
    assert!(both <= SLICE);
    second.expect("tokens");
    // Read after generate() (whose activations the caching allocator keeps, outside the
    // sleep-mode pool) and before the sleep.
    second.expect("sleepy");
    let before_sleep = gpu.truth().used_memory(0);
    assert!(before_sleep <= SLICE);
    second.send_line();
    second.expect("asleep");
    let asleep = gpu.truth().used_memory(0);
    assert!(
        gib(before_sleep - asleep) >= 0.9 * kv,
        "asleep, the second gave back {} GiB of its {kv} GiB cache (the card: {} GiB before \
         generate(), {} GiB before the sleep)",
        gib(before_sleep - asleep),
        gib(both),
        gib(before_sleep)
    );
    second.send_line();
    second.expect("awake");
    let awake = gpu.truth().used_memory(0);
    assert!(
        awake >= before_sleep - 2 * MIB && awake <= SLICE,
        "awake, the card holds {awake} bytes (before sleep {before_sleep})"
    );
    second.expect("done");
    assert!(second.finish().success());

    // A third asks for 0.4 of the slice, more than the first leaves: vLLM's own refusal,
    // while the card has 37 GiB free.
    refused("third at 0.4", &gpu, &slice, 0.4, "0.8");
    assert_eq!(
        gpu.truth().used_memory(0),
        held,
        "only the first's memory is left"
    );
    assert!(first.finish().success());
    assert_capped_and_returned(&gpu, "two processes");
}

#[test]
fn gpuslice_run_shows_vllm_an_8_gib_slice() {
    if !have_vllm() {
        return;
    }
    // What the README shows: a user's `gpuslice run --fake-gpu -m 8GiB` around vLLM, on a
    // simulated H200 (140.4 GiB).
    let gpu = FakeGpu::start("h200");
    gpu.truth().reset_peak_memory(0);
    let mut v = Vllm::under_gpuslice_run("gpuslice run", &gpu, "8GiB", 0.9);
    v.expect("ready");
    let (free, total) = v.startup_free_total();
    let kv = v.kv_cache_gib();
    for line in v.log.lock().unwrap().iter() {
        if line.contains("gpuslice:")
            || line.contains("Free memory on device")
            || line.contains("Available KV cache memory")
            || line.contains("GPU KV cache size")
        {
            eprintln!("{line}");
        }
    }
    assert_eq!(total, 8.0, "vLLM's total is the 8 GiB slice");
    assert!(
        free <= 8.0 && free >= gib(8 * GIB - CONTEXT) - 0.2,
        "{free} GiB free"
    );
    assert!(kv <= 7.2 && kv >= 7.1, "KV cache {kv} GiB of 0.9 x 8 GiB");
    assert!(gpu.truth().peak_memory(0) <= 8 * GIB);
    assert!(v.finish().success());
    wait_until("vLLM's memory leaves the card", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
}
