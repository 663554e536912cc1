//! Opt-in oversubscription on the simulated V100 with managed memory's residency
//! (`FAKEGPU_MANAGED_MEMORY=on-demand`): a 2 GiB slice whose limit file says `virtual` 3 GiB.
//! Every claim is checked against the fake's truth (the card's use and its high-water mark)
//! and the kernel's (the process's resident memory, a real memory cgroup's counters), never
//! against what the shim says about itself.

#[path = "common/python.rs"]
mod python;

use std::path::{Path, PathBuf};

use cuda_e2e::{
    command, run_with_timeout, wait_until, Client, ClientKind, Env, FakeGpu, Slice,
    DEFAULT_TIMEOUT, GIB, MIB,
};
use gpuslice_common::host_memory::{locate, CgroupVersion, HOST_MARGIN_BYTES};
use python::{have, Py};
use serde_json::Value;

const PHYSICAL: u64 = 2 * GIB;
const VIRTUAL: u64 = 3 * GIB;
/// What the fake charges per context.
const CONTEXT: u64 = 300 * MIB;
const CHUNK: u64 = 256 * MIB;
/// Chunks the physical share holds beside the context, and the host the rest of the virtual
/// size.
const ON_CARD: u64 = (PHYSICAL - CONTEXT) / CHUNK;
const ON_HOST: u64 = (VIRTUAL - PHYSICAL) / CHUNK;
/// The fake's V100 host link (PCIe 3.0 x16).
const LINK_BYTES_PER_S: u64 = 12_000_000_000;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A 2 GiB slice of device 0, with `virtual` when given.
fn slice(virtual_size: Option<&str>) -> Slice {
    let device = match virtual_size {
        Some(size) => format!(r#"{{"index": 0, "memory": "2GiB", "virtual": "{size}"}}"#),
        None => r#"{"index": 0, "memory": "2GiB"}"#.to_string(),
    };
    Slice::builder()
        .raw(&format!(
            r#"{{"version": 1, "region": "{{region}}", "devices": [{device}]}}"#
        ))
        .build()
}

fn env(gpu: &FakeGpu, slice: &Slice) -> Env {
    let mut env = slice.env(gpu);
    env.push(("FAKEGPU_MANAGED_MEMORY".into(), "on-demand".into()));
    env
}

/// Resident memory of `pid` (what its cgroup is charged for its pages).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[test]
fn an_oversubscribed_slice_allocates_to_its_virtual_size_and_the_card_holds_only_its_share() {
    let gpu = FakeGpu::start("v100");
    let slice = slice(Some("3GiB"));
    let env = env(&gpu, &slice);
    for kind in [ClientKind::Linked, ClientKind::ProcAddr] {
        gpu.truth().reset_peak_memory(0);
        let run = Client::spawn(kind, &["oversubscribe", "256MiB"], &env);
        let line = &run.first;
        let what = format!("{kind:?}: {line}");
        // Up to the virtual size, then the out-of-memory code.
        assert_eq!(u(&line["ok"]), ON_CARD + ON_HOST, "{what}");
        assert_eq!(line["refusal"], "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        // What the application is told: the virtual size, in every view.
        assert_eq!(u(&line["total_mem"]), VIRTUAL, "{what}: cuDeviceTotalMem");
        assert_eq!(u(&line["mem_total"]), VIRTUAL, "{what}: cuMemGetInfo total");
        assert_eq!(
            u(&line["mem_free_before"]),
            VIRTUAL - CONTEXT,
            "{what}: free before"
        );
        assert_eq!(
            u(&line["mem_free_during"]),
            PHYSICAL - CONTEXT - ON_CARD * CHUNK,
            "{what}: free when full"
        );
        // The card: never more than the physical share; the rest is this process's memory.
        let peak = gpu.truth().peak_memory(0);
        assert!(peak <= PHYSICAL, "{what}: the card held {peak}");
        assert_eq!(
            peak,
            CONTEXT + ON_CARD * CHUNK,
            "{what}: the share was used"
        );
        assert_eq!(gpu.truth().used_memory(0), CONTEXT + ON_CARD * CHUNK);
        let resident = resident_bytes(run.pid());
        assert!(
            resident >= ON_HOST * CHUNK,
            "{what}: the host holds {resident} bytes of the process, fewer than it placed there"
        );
        // Advice or a prefetch that would move memory onto the card: the answer a real
        // driver gives for device memory, on both sides.
        for key in [
            "first_advise",
            "first_prefetch",
            "last_advise",
            "last_prefetch",
        ] {
            assert_eq!(line[key], "CUDA_ERROR_INVALID_VALUE", "{what}: {key}");
        }
        assert_eq!(
            gpu.truth().peak_memory(0),
            peak,
            "{what}: nothing moved onto the card"
        );
        // Kernels read the host part over the link: each launch reading 256 MiB of it
        // takes at least 256 MiB / 12 GB/s on the fake's timeline.
        assert_eq!(line["last_touch"]["CUDA_SUCCESS"], 4, "{what}");
        let floor = CHUNK * 1_000_000_000 / LINK_BYTES_PER_S;
        assert!(u(&line["last_touch_ns"]) >= floor, "{what}: {floor}");
        // The ledger: the share and the host part, apart.
        let status = cuda_e2e::region_status(&slice.region_path());
        let device = &status["devices"][0];
        assert_eq!(u(&device["used"]), CONTEXT + ON_CARD * CHUNK, "{status}");
        assert_eq!(u(&device["host_used"]), ON_HOST * CHUNK, "{status}");
        assert_eq!(u(&device["virtual"]), VIRTUAL, "{status}");
        run.release();
        wait_until("the card is empty", DEFAULT_TIMEOUT, || {
            gpu.truth().used_memory(0) == 0
        });
    }
    let status = cuda_e2e::region_status(&slice.region_path());
    assert_eq!(u(&status["devices"][0]["host_used"]), 0, "{status}");
}

#[test]
fn without_a_virtual_size_the_same_allocations_are_refused_at_the_share() {
    let gpu = FakeGpu::start("v100");
    for (virtual_size, what) in [(None, "no virtual"), (Some("2GiB"), "virtual = memory")] {
        let slice = slice(virtual_size);
        let run = Client::spawn(
            ClientKind::ProcAddr,
            &["oversubscribe", "256MiB"],
            &env(&gpu, &slice),
        );
        let line = &run.first;
        assert_eq!(u(&line["ok"]), ON_CARD, "{what}: {line}");
        assert_eq!(line["refusal"], "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
        assert_eq!(u(&line["mem_total"]), PHYSICAL, "{what}");
        assert_eq!(u(&line["total_mem"]), PHYSICAL, "{what}");
        assert!(
            resident_bytes(run.pid()) < CHUNK,
            "{what}: nothing placed on the host"
        );
        run.release();
        wait_until("the card is empty", DEFAULT_TIMEOUT, || {
            gpu.truth().used_memory(0) == 0
        });
    }
}

#[test]
fn cudarc_allocates_past_the_share_and_nvml_reports_the_virtual_size() {
    let gpu = FakeGpu::start("v100");
    let slice = slice(Some("3GiB"));
    let env = env(&gpu, &slice);
    gpu.truth().reset_peak_memory(0);
    let count = (ON_CARD + ON_HOST + 1).to_string();
    let out = Client::run(
        ClientKind::Cudarc,
        &["alloc", "256MiB", "--count", &count],
        &env,
    );
    assert_eq!(u(&out["ok"]), ON_CARD + ON_HOST, "{out}");
    assert!(gpu.truth().peak_memory(0) <= PHYSICAL, "{out}");
    assert_eq!(gpu.truth().used_memory(0), 0, "all freed: {out}");
    // NVML (linked-client's nvml scenario): total is the virtual size too.
    let nvml = Client::run(ClientKind::Linked, &["nvml"], &env);
    let device = &nvml["devices"][0];
    assert_eq!(u(&device["memory"]["total"]), VIRTUAL, "{nvml}");
    assert_eq!(u(&device["memory_v2"]["total"]), VIRTUAL, "{nvml}");
    let v2 = &device["memory_v2"];
    assert_eq!(
        u(&v2["reserved"]) + u(&v2["used"]) + u(&v2["free"]),
        VIRTUAL,
        "NVML's parts add up: {nvml}"
    );
}

/// PyTorch's caching allocator (cudaMalloc = cuMemAlloc_v2) fills the virtual size, and a
/// kernel still runs beside it.
#[test]
fn torch_fills_the_virtual_size_and_the_card_holds_only_the_share() {
    if !have("torch") {
        return;
    }
    // An H200: PyTorch's CUDA 13 build has code for it (its kernels refuse a V100).
    let gpu = FakeGpu::start("h200");
    let slice = slice(Some("3GiB"));
    let mut py = Py::start("torch", &env(&gpu, &slice));
    py.ok(r#"
import torch
def fill(chunk, xs):
    try:
        while True:
            xs.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError:
        return True
"#);
    let info = py.ok("torch.cuda.init(); out = list(torch.cuda.mem_get_info())");
    assert_eq!(u(&info[1]), VIRTUAL, "torch's total: {info}");
    gpu.truth().reset_peak_memory(0);
    let r = py.ok(&format!(
        "xs = []; r = fill({}, xs); x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); out = [r, len(xs), torch.cuda.memory_reserved()]",
        64 * MIB
    ));
    assert_eq!(r[0], true, "OutOfMemoryError at the end: {r}");
    let reserved = u(&r[2]);
    assert!(
        reserved > PHYSICAL,
        "torch holds {reserved}: past the physical share"
    );
    assert!(
        reserved + 3 * 64 * MIB >= VIRTUAL - CONTEXT,
        "torch filled only {reserved} of the virtual size"
    );
    let peak = gpu.truth().peak_memory(0);
    assert!(peak <= PHYSICAL, "the card held {peak}");
    let info = py.ok("out = list(torch.cuda.mem_get_info())");
    assert_eq!(u(&info[1]), VIRTUAL, "{info}");
    py.ok("del xs, x; torch.cuda.empty_cache()");
    let info = py.ok("out = list(torch.cuda.mem_get_info())");
    assert!(u(&info[0]) + 64 * MIB >= VIRTUAL - CONTEXT, "{info}");
    py.finish();
    wait_until("the card is empty", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
}

/// A memory cgroup of this test's making, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    version: CgroupVersion,
}

impl Cgroup {
    /// A child memory cgroup limited to `limit` bytes: under this process's own cgroup (v1),
    /// or under the hierarchy's root (v2, whose rule forbids controllers below a cgroup that
    /// holds processes). `Err` says why it cannot be made here.
    fn new(limit: u64) -> Result<Cgroup, String> {
        let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"));
        let (version, dir, mount) =
            locate(&read("/proc/self/cgroup")?, &read("/proc/self/mountinfo")?)
                .ok_or("no memory cgroup hierarchy is mounted")?;
        let name = format!("gpuslice-oversubscribe-{}", std::process::id());
        let (dir, limit_file) = match version {
            CgroupVersion::V1 => (dir.join(name), "memory.limit_in_bytes"),
            CgroupVersion::V2 => {
                let control = mount.join("cgroup.subtree_control");
                let _ = std::fs::write(&control, "+memory");
                if !read(control.to_str().unwrap_or(""))?.contains("memory") {
                    return Err(format!(
                        "cannot enable the memory controller in {}",
                        control.display()
                    ));
                }
                (mount.join(name), "memory.max")
            }
        };
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cgroup = Cgroup { dir, version };
        std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
            .map_err(|e| format!("cannot limit {}: {e}", cgroup.dir.display()))?;
        Ok(cgroup)
    }

    /// [`Cgroup::new`], or the loud skip (a failure under `CI=true`) saying why not.
    fn or_skip(limit: u64) -> Option<Cgroup> {
        Cgroup::new(limit)
            .map_err(|why| {
                cuda_e2e::skip::skip_or_fail(&format!(
                    "a real memory cgroup cannot be made here ({why}); run as root with a memory controller"
                ))
            })
            .ok()
    }

    /// `program args...` started inside this cgroup (by a shell that moves itself in first).
    fn command(&self, program: &Path, args: &[&str], env: &Env) -> std::process::Command {
        let procs = self.dir.join("cgroup.procs").display().to_string();
        let mut all = vec![
            "-c",
            "echo $$ > \"$0\" && exec \"$@\"",
            procs.as_str(),
            program.to_str().expect("utf-8 path"),
        ];
        all.extend_from_slice(args);
        command(Path::new("/bin/sh"), &all, env)
    }

    /// Processes the kernel's OOM killer ended in this cgroup.
    fn oom_kills(&self) -> u64 {
        let (file, key) = match self.version {
            CgroupVersion::V1 => ("memory.oom_control", "oom_kill "),
            CgroupVersion::V2 => ("memory.events", "oom_kill "),
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The most the cgroup ever held.
    fn peak(&self) -> u64 {
        let file = match self.version {
            CgroupVersion::V1 => "memory.max_usage_in_bytes",
            CgroupVersion::V2 => "memory.peak",
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once its processes have exited (the kernel may take a moment to notice).
        for _ in 0..200 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// A pod whose memory limit cannot hold the slice's excess: the allocation that would pass
/// it gets `CUDA_ERROR_OUT_OF_MEMORY` and the process lives on; the same cgroup kills a
/// process that takes its memory without asking.
#[test]
fn a_cgroup_too_small_for_the_excess_gets_out_of_memory_not_a_kill() {
    const LIMIT: u64 = GIB;
    let Some(cgroup) = Cgroup::or_skip(LIMIT) else {
        return;
    };
    let gpu = FakeGpu::start("v100");
    // 2 GiB of host excess: far more than the 1 GiB pod can hold.
    let slice = slice(Some("4GiB"));
    let client = ClientKind::ProcAddr.binary();
    let cmd = cgroup.command(&client, &["oversubscribe", "256MiB"], &env(&gpu, &slice));
    let out = run_with_timeout(cmd, Some(b""), DEFAULT_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the client must live: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    let line: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    let placed = u(&line["ok"]) - ON_CARD;
    assert_eq!(line["refusal"], "CUDA_ERROR_OUT_OF_MEMORY", "{line}");
    assert!(
        (1..8).contains(&placed),
        "some of the excess fits the pod, not all of it: {line}"
    );
    assert_eq!(cgroup.oom_kills(), 0, "no process was OOM-killed");
    let peak = cgroup.peak();
    assert!(
        peak >= placed * CHUNK,
        "the cgroup held the host part ({peak} < {})",
        placed * CHUNK
    );
    assert!(
        peak <= LIMIT - HOST_MARGIN_BYTES + 32 * MIB,
        "the shim kept the margin free: peak {peak}"
    );
    assert!(gpu.truth().peak_memory(0) <= PHYSICAL);
    // The same cgroup is real: taking 2 GiB without asking gets its process killed.
    let greedy = cgroup.command(
        Path::new("/usr/bin/env"),
        &["python3", "-c", "b = bytearray(2 << 30); print('survived')"],
        &Vec::new(),
    );
    let out = run_with_timeout(greedy, None, DEFAULT_TIMEOUT);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{:?}", out.status);
    assert!(cgroup.oom_kills() >= 1);
}

/// Two processes of the slice placing in the same pod at the same instant: each reads the
/// cgroup with the other's pages in it (the slice serialises placements), so together they
/// never take it past its limit less the margin, and neither is killed.
#[test]
fn two_processes_placing_at_once_are_judged_one_after_the_other() {
    use std::io::{BufRead, BufReader};
    const LIMIT: u64 = 1536 * MIB;
    let Some(cgroup) = Cgroup::or_skip(LIMIT) else {
        return;
    };
    let gpu = FakeGpu::start("v100");
    // Room on the card for the two contexts only (a 384 MiB chunk never fits beside one):
    // every chunk of both goes to the host, whose budget (3 GiB) is more than the pod holds.
    let slice = Slice::builder()
        .raw(r#"{"version": 1, "region": "{region}", "devices": [{"index": 0, "memory": "640MiB", "virtual": "3712MiB"}]}"#)
        .build();
    let mut barrier = cuda_e2e::StartBarrier::new();
    let mut env = env(&gpu, &slice);
    env.push(barrier.env());
    let client = ClientKind::ProcAddr.binary();
    let mut children: Vec<_> = (0..2)
        .map(|_| {
            let mut cmd = cgroup.command(&client, &["oversubscribe", "384MiB"], &env);
            cmd.stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null());
            cmd.spawn().expect("start a client")
        })
        .collect();
    barrier.release(2);
    let lines: Vec<Value> = children
        .iter_mut()
        .map(|child| {
            let mut line = String::new();
            BufReader::new(child.stdout.take().expect("piped"))
                .read_line(&mut line)
                .expect("a line");
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
        })
        .collect();
    // Both hold what they got until here.
    let peak = cgroup.peak();
    for mut child in children {
        drop(child.stdin.take());
        let status = child.wait().expect("wait");
        assert!(status.success(), "{status:?}: {lines:?}");
    }
    let placed: u64 = lines
        .iter()
        .map(|l| {
            assert_eq!(l["refusal"], "CUDA_ERROR_OUT_OF_MEMORY", "{l}");
            u(&l["ok"])
        })
        .sum::<u64>();
    assert!(placed >= 2, "the pod held some of the excess: {lines:?}");
    assert_eq!(cgroup.oom_kills(), 0, "no process was OOM-killed");
    assert!(
        peak <= LIMIT - HOST_MARGIN_BYTES + 32 * MIB,
        "together they kept the margin free: peak {peak}, {lines:?}"
    );
    assert!(gpu.truth().peak_memory(0) <= 640 * MIB);
}
