//! `gpuslice demo`: the README's main job. Cuts an 8 GiB / 25% slice (of a simulated
//! Tesla V100-PCIE-32GB when no NVIDIA driver is present) and shows, step by step, with real
//! client programs (`linked-client`, `procaddr-client` beside gpuslice):
//!
//! 1. the slice as the application sees it: cuMemGetInfo, and `gpuslice smi` with and without
//!    the shim;
//! 2. the cap: one process holds memory, a second allocates until refused with
//!    CUDA_ERROR_OUT_OF_MEMORY, while the card (host view) still has memory free;
//! 3. compute: NVML's measured utilisation of an unthrottled run against a run in the 25%
//!    slice.
//!
//! Between 2 and 3, when PyTorch is installed (`python3 -c "import torch"` works), the same
//! slice under PyTorch from PyPI: what `torch.cuda.mem_get_info()` reports, and allocating
//! until `torch.cuda.OutOfMemoryError`. Without it, one line says the step was skipped.
//!
//! A step whose outcome is wrong ends the demo with exit code 4, so CI notices a broken demo.
//! Step 3 fails the demo unless the slice's measured utilisation is within 10 points of its
//! share (the throttle holds it within 5 on the test matrix, loaded machines included).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use gpuslice_common::config::{
    ComputePolicy, ConfigSource, DeviceLimit, DeviceSelector, SliceConfig,
};
use gpuslice_common::size::{format_size, format_size_approx};
use serde_json::Value;

use crate::error::{CliError, CliResult};
use crate::sandbox::{self, Sandbox};

const GIB: u64 = 1 << 30;
const SLICE_MEMORY: u64 = 8 * GIB;
const SLICE_COMPUTE: u32 = 25;
const HOLD: u64 = 6 * GIB;
const CHUNK: u64 = 256 << 20;
/// Each compute run's length; NVML's utilisation window is about a second.
const RUN_SECONDS: f64 = 2.5;
/// Longest any one client may take before the demo calls it hung.
const CLIENT_DEADLINE: Duration = Duration::from_secs(20);

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Use the simulated GPU even if an NVIDIA driver is present.
    #[arg(long)]
    pub fake_gpu: bool,

    /// The shim to preload (default: libgpuslice.so beside the gpuslice binary).
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,
}

pub fn run(args: &DemoArgs) -> CliResult<()> {
    let started = Instant::now();
    let shim = sandbox::find_shim(args.lib.as_deref())?;
    let use_fake = args.fake_gpu || !sandbox::real_driver_present();
    let sandbox = Sandbox::create("gpuslice-demo", shim, use_fake, Some("v100".into()))?;
    let config = SliceConfig {
        source: ConfigSource::Env,
        devices: vec![DeviceLimit {
            selector: DeviceSelector::Index(0),
            memory_limit: Some(SLICE_MEMORY),
            compute_percent: Some(SLICE_COMPUTE),
            virtual_memory: None,
        }],
        region_path: None,
        policy: ComputePolicy::Cap,
        priority: Default::default(),
        log_level: None,
        context_bound: None,
    };
    let cards = sandbox.host_cards()?;
    let card = cards
        .first()
        .cloned()
        .ok_or_else(|| CliError::runtime("the GPU reports no devices"))?;
    sandbox::check_against_cards(&config, &cards, true)?;
    sandbox.write_config(&config)?;
    let gpu_kind = if use_fake {
        "simulated (fakegpu; no NVIDIA driver here, or --fake-gpu)"
    } else {
        "real"
    };
    say(&format!(
        "gpuslice demo: an {} / {SLICE_COMPUTE}% slice of a {gpu_kind} {} ({} on the card)",
        format_size(SLICE_MEMORY),
        card.name,
        format_size_approx(card.memory_total)
    ));
    say(&format!("  region {}", sandbox.region_path.display()));

    step_view(&sandbox, &card)?;
    step_cap(&sandbox)?;
    step_torch(&sandbox)?;
    step_compute(&sandbox)?;
    say(&format!(
        "demo complete in {:.1} s: memory capped, compute held to its share, queries show the slice.",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

fn say(line: &str) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

fn failed(step: &str, what: String) -> CliError {
    CliError::runtime(format!("demo step {step} failed: {what}"))
}

fn client(name: &str) -> CliResult<PathBuf> {
    sandbox::sibling(name, "build the clients with `cargo build -p cuda-clients`")
}

/// Runs a client scenario to completion and returns its JSON line.
fn run_client(sandbox: &Sandbox, name: &str, args: &[&str], in_slice: bool) -> CliResult<Value> {
    let mut cmd = Command::new(client(name)?);
    cmd.args(args).stdin(Stdio::null());
    if in_slice {
        sandbox.in_slice(&mut cmd);
    } else {
        sandbox.host_view(&mut cmd);
    }
    let output = output_within(cmd, name, CLIENT_DEADLINE)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    last_json_line(&stdout).ok_or_else(|| {
        CliError::runtime(format!(
            "{name} {} printed no result ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    })
}

/// Runs `cmd` to completion, killing it after `deadline` so a hung client fails the demo
/// instead of hanging it.
fn output_within(
    mut cmd: Command,
    name: &str,
    deadline: Duration,
) -> CliResult<std::process::Output> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .map_err(|e| CliError::runtime(format!("cannot run {name} ({e})")))?;
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(deadline).is_err() {
            // SAFETY: plain kill(2) of our child. It is reaped only when it exits; the window
            // between that reap and the `done` message is microseconds, far too short for its
            // pid to be reused.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return true;
        }
        false
    });
    let output = child.wait_with_output();
    let _ = done.send(());
    let killed = watchdog.join().unwrap_or(false);
    let output =
        output.map_err(|e| CliError::runtime(format!("waiting for {name} failed ({e})")))?;
    if killed {
        return Err(CliError::runtime(format!(
            "{name} did not finish within {} s and was killed",
            deadline.as_secs()
        )));
    }
    Ok(output)
}

/// The last stdout line that is a JSON object (clients print exactly one).
pub fn last_json_line(stdout: &str) -> Option<Value> {
    stdout
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
        .find(Value::is_object)
}

/// The PyTorch step's script: one JSON line (slice as seen, then a fill to OOM).
const TORCH_SCRIPT: &str = r#"
import json, warnings
warnings.simplefilter("ignore")
import torch
free, total = torch.cuda.mem_get_info()
xs, oom = [], False
try:
    while True:
        xs.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.cuda.OutOfMemoryError:
    oom = True
print(json.dumps({"free": free, "total": total, "filled": len(xs) * (256 << 20), "oom": oom,
                  "version": torch.__version__}))
"#;

/// How long PyTorch may take to import and fill the slice on a loaded machine.
const TORCH_DEADLINE: Duration = Duration::from_secs(90);

fn torch_installed() -> bool {
    Command::new("python3")
        .args(["-c", "import torch"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn step_torch(sandbox: &Sandbox) -> CliResult<()> {
    say("[2+] PyTorch from PyPI in the same slice");
    if !torch_installed() {
        say("      PyTorch is not installed for python3 (pip install torch): step skipped");
        return Ok(());
    }
    let mut cmd = Command::new("python3");
    cmd.args(["-c", TORCH_SCRIPT]).stdin(Stdio::null());
    sandbox.in_slice(&mut cmd);
    let output = output_within(cmd, "python3 (torch)", TORCH_DEADLINE)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let out = last_json_line(&stdout).ok_or_else(|| {
        failed(
            "2+",
            format!(
                "PyTorch printed no result ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        )
    })?;
    let total = out["total"].as_u64();
    let filled = out["filled"].as_u64().unwrap_or(0);
    say(&format!(
        "      torch {} torch.cuda.mem_get_info(): total {}, free {}",
        out["version"].as_str().unwrap_or("?"),
        total.map_or("?".into(), format_size_approx),
        out["free"].as_u64().map_or("?".into(), format_size_approx)
    ));
    if total != Some(SLICE_MEMORY) {
        return Err(failed(
            "2+",
            format!("PyTorch saw total {total:?} bytes, not the slice's {SLICE_MEMORY}"),
        ));
    }
    say(&format!(
        "      torch.empty(256 MiB) until refused: {} allocated, then {}",
        format_size_approx(filled),
        if out["oom"] == true {
            "torch.cuda.OutOfMemoryError"
        } else {
            "no error"
        },
    ));
    if out["oom"] != true || filled > SLICE_MEMORY {
        return Err(failed(
            "2+",
            format!("PyTorch was not held to the slice: {out}"),
        ));
    }
    Ok(())
}

fn step_view(sandbox: &Sandbox, card: &crate::smi::Card) -> CliResult<()> {
    say("[1/3] the slice as the application sees it");
    let meminfo = run_client(sandbox, "linked-client", &["meminfo"], true)?;
    let total = meminfo["total"].as_u64();
    let free = meminfo["free"].as_u64();
    say(&format!(
        "      cuMemGetInfo (linked-client meminfo): {} -> total {}, free {}",
        meminfo["result"].as_str().unwrap_or("?"),
        total.map_or("?".into(), format_size_approx),
        free.map_or("?".into(), format_size_approx)
    ));
    if total != Some(SLICE_MEMORY) {
        return Err(failed(
            "1",
            format!(
                "the application saw total {total:?} bytes, not the slice's {SLICE_MEMORY} (is the shim's memory slice in place?)"
            ),
        ));
    }
    let slice_cards = sandbox.slice_cards()?;
    let seen = slice_cards.first().map(|c| c.memory_total);
    say(&format!(
        "      gpuslice smi inside the slice: {} MiB total   (without the shim: {} MiB, the whole card)",
        seen.map_or("?".into(), |b| (b >> 20).to_string()),
        card.memory_total >> 20
    ));
    if seen != Some(SLICE_MEMORY) {
        return Err(failed(
            "1",
            format!("NVML under the shim reported {seen:?} bytes, not the slice's {SLICE_MEMORY}"),
        ));
    }
    Ok(())
}

/// Kills and reaps a background client however the step ends.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        // Closing stdin lets `hold` free and exit by itself; kill covers a stuck one.
        drop(self.0.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn step_cap(sandbox: &Sandbox) -> CliResult<()> {
    say(&format!(
        "[2/3] the cap: one process holds {}, a second allocates {} at a time until refused",
        format_size(HOLD),
        format_size(CHUNK)
    ));
    let mut cmd = Command::new(client("linked-client")?);
    cmd.args(["hold", &format!("{HOLD}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    sandbox.in_slice(&mut cmd);
    let mut holder = Background(
        cmd.spawn()
            .map_err(|e| CliError::runtime(format!("cannot run linked-client ({e})")))?,
    );
    let mut line = String::new();
    if let Some(stdout) = holder.0.stdout.take() {
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    let held = last_json_line(&line)
        .ok_or_else(|| failed("2", "the holding client printed nothing".into()))?;
    let held_ok = held["result"].as_str() == Some("CUDA_SUCCESS");
    say(&format!(
        "      pid {} holds {}: {}",
        held["pid"],
        format_size(HOLD),
        held["result"].as_str().unwrap_or("?")
    ));
    if !held_ok {
        return Err(failed(
            "2",
            format!("holding {HOLD} bytes inside an 8 GiB slice failed: {held}"),
        ));
    }
    let oom = run_client(
        sandbox,
        "procaddr-client",
        &["alloc-until-oom", &format!("{CHUNK}")],
        true,
    )?;
    let got = oom["total_bytes"].as_u64().unwrap_or(0);
    let error = oom["error"].as_str().unwrap_or("none").to_string();
    // The host view while the holder still holds: the card's own numbers, no shim.
    let card = sandbox.host_cards()?.into_iter().next();
    let card_free = card.as_ref().map_or(0, |c| c.memory_free);
    say(&format!(
        "      procaddr-client (the CUDA runtime's cuGetProcAddress path) got {} more, then: {error}",
        format_size_approx(got)
    ));
    say(&format!(
        "      meanwhile the card itself (host view, no shim) has {} free of {}",
        format_size_approx(card_free),
        format_size_approx(card.as_ref().map_or(0, |c| c.memory_total))
    ));
    if error != "CUDA_ERROR_OUT_OF_MEMORY" {
        return Err(failed(
            "2",
            format!("the allocation past the cap was not refused with CUDA_ERROR_OUT_OF_MEMORY (got {error}) after {got} bytes"),
        ));
    }
    if HOLD + got > SLICE_MEMORY {
        return Err(failed(
            "2",
            format!(
                "the two processes held {} together, more than the slice's {}",
                format_size_approx(HOLD + got),
                format_size(SLICE_MEMORY)
            ),
        ));
    }
    if card_free < CHUNK {
        return Err(failed(
            "2",
            "the card itself was full, so the refusal does not show the cap".into(),
        ));
    }
    drop(holder);
    Ok(())
}

/// One compute run and what NVML measured meanwhile.
struct Measured {
    nvml_util: Option<f64>,
    /// Kernel time / wall time as the client saw it.
    duty: Option<f64>,
}

fn step_compute(sandbox: &Sandbox) -> CliResult<()> {
    say(&format!(
        "[3/3] compute: NVML-measured utilisation, unthrottled vs. the {SLICE_COMPUTE}% slice ({RUN_SECONDS} s each)"
    ));
    let free = measure(sandbox, false)?;
    say(&format!("      unthrottled (no shim):  {}", show(&free)));
    let sliced = measure(sandbox, true)?;
    say(&format!(
        "      in the {SLICE_COMPUTE}% slice:      {}",
        show(&sliced)
    ));
    let Some(util) = sliced.nvml_util else {
        return Err(failed("3", "NVML reported no utilisation".into()));
    };
    if (util - f64::from(SLICE_COMPUTE)).abs() > 10.0 {
        return Err(failed(
            "3",
            format!("the slice ran at {util:.0}% utilisation, not near its {SLICE_COMPUTE}% share"),
        ));
    }
    Ok(())
}

fn show(m: &Measured) -> String {
    format!(
        "NVML utilisation {}, kernel time {} of wall time",
        m.nvml_util.map_or("n/a".into(), |u| format!("{u:.0}%")),
        m.duty
            .map_or("n/a".into(), |d| format!("{:.0}%", d * 100.0))
    )
}

/// Runs `launch` for RUN_SECONDS and samples the card's utilisation (host view) while it runs.
fn measure(sandbox: &Sandbox, in_slice: bool) -> CliResult<Measured> {
    // 160 blocks of 1024 threads fill one wave of a V100 (80 SMs x 2 blocks); 1 ms per wave.
    let ns_per_wave: u64 = 1_000_000;
    let mut cmd = Command::new(client("linked-client")?);
    cmd.args([
        "launch",
        "--grid",
        "160",
        "--block",
        "1024",
        "--kernels",
        "20",
        "--ns-per-wave",
        &ns_per_wave.to_string(),
        "--duration-s",
        &RUN_SECONDS.to_string(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if in_slice {
        sandbox.in_slice(&mut cmd);
    } else {
        sandbox.host_view(&mut cmd);
    }
    let started = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| CliError::runtime(format!("cannot run linked-client ({e})")))?;
    // Sample after the first second (NVML's window) until the run ends.
    let mut samples = Vec::new();
    let mut child = Background(child);
    while started.elapsed() < Duration::from_secs_f64(RUN_SECONDS) {
        if let Ok(Some(_)) = child.0.try_wait() {
            break;
        }
        if started.elapsed() >= Duration::from_secs(1) {
            if let Ok(cards) = sandbox.host_cards() {
                if let Some(util) = cards.first().and_then(|c| c.gpu_util) {
                    samples.push(f64::from(util));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut out = String::new();
    let stdout = child.0.stdout.take();
    let status = child
        .0
        .wait()
        .map_err(|e| CliError::runtime(format!("waiting for linked-client failed ({e})")))?;
    if let Some(mut stdout) = stdout {
        use std::io::Read;
        let _ = stdout.read_to_string(&mut out);
    }
    let result = last_json_line(&out).ok_or_else(|| {
        failed(
            "3",
            format!("linked-client launch printed no result ({status})"),
        )
    })?;
    let launches = result["launches"].as_u64().unwrap_or(0);
    let ok = result["ok"].as_u64().unwrap_or(0);
    if launches == 0 || ok != launches {
        return Err(failed(
            "3",
            format!(
                "kernel launches failed: {ok} of {launches} succeeded ({})",
                result["codes"]
            ),
        ));
    }
    let elapsed = result["elapsed_ns"].as_u64().unwrap_or(0);
    let duty = (elapsed > 0).then(|| (ok * ns_per_wave) as f64 / elapsed as f64);
    let nvml_util =
        (!samples.is_empty()).then(|| samples.iter().sum::<f64>() / samples.len() as f64);
    Ok(Measured { nvml_util, duty })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_clients_json_line() {
        let out = "noise\n{\"total\": 8589934592, \"free\": 1}\n";
        assert_eq!(last_json_line(out).unwrap()["total"], 8_589_934_592u64);
        assert!(last_json_line("no json here\n42\n").is_none());
    }
}
