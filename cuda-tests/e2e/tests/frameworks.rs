//! PyTorch and CuPy from PyPI, unmodified, under a 2 GiB slice of the simulated V100: NVIDIA's
//! own CUDA runtime (libcudart 13 in PyTorch, 12 in CuPy) on the fake driver, with the shim
//! preloaded. Every claim is checked against the fake's truth (physical use and the
//! high-water mark), never against what the framework or the shim says about itself.
//!
//! The V100 is not in PyTorch's CUDA 13 build (machine code for 7.5 and up, no PTX): as on the
//! real card, its kernels do not load there ("no kernel image is available"), which does not
//! matter to the memory tests (allocations, the caching allocator's paths and the driver
//! calls behind them launch no kernel). Tests that launch kernels use a simulated A100 or
//! H200; cuBLAS and CuPy's compiler also check the architecture themselves and refuse sm_70
//! with CUDA 13.
//!
//! Skipping: without torch / cupy importable by `E2E_PYTHON` (default `python3`), each test
//! prints `SKIPPED: ...` and returns, except with `CI=true`, where it fails.

#[path = "common/python.rs"]
mod python;

use cuda_e2e::{wait_until, Env, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB, MIB};
use python::{have, Py};
use serde_json::Value;

const SLICE: u64 = 2 * GIB;
/// What the fake charges per context.
const CONTEXT: u64 = 300 * MIB;
const CHUNK: u64 = 64 * MIB;

const TORCH_FILL: &str = r#"
import torch
def fill(chunk, xs):
    try:
        while True:
            xs.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        return True
    except Exception as e:
        return type(e).__name__ + ": " + str(e)[:200]
"#;

const CUPY_FILL: &str = r#"
import cupy
def fill(chunk, xs):
    try:
        while True:
            xs.append(cupy.empty(chunk, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError as e:
        return True
    except Exception as e:
        return type(e).__name__ + ": " + str(e)[:200]
"#;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn slice_env(gpu: &FakeGpu, slice: &Slice, extra: &[(&str, &str)]) -> Env {
    let mut env = slice.env(gpu);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// The reported (free, total) against the card: total is the slice, free is the slice
/// minus what the card holds for this process.
fn assert_reports_slice(gpu: &FakeGpu, free_total: &Value, what: &str) {
    let (free, total) = (u(&free_total[0]), u(&free_total[1]));
    let used = gpu.truth().used_memory(0);
    assert_eq!(total, SLICE, "{what}: total is the slice");
    assert_eq!(
        free,
        SLICE - used,
        "{what}: free is the slice less the card's use ({used})"
    );
}

/// After a fill hit OOM: the card holds no more than the slice, never did, still has room,
/// and the fill used the slice up to one chunk (and the allocator's own granularity).
fn assert_held_to_slice(gpu: &FakeGpu, filled: u64, others: u64, what: &str) {
    let used = gpu.truth().used_memory(0);
    let peak = gpu.truth().peak_memory(0);
    let total = gpu.truth().total_memory(0);
    assert!(used <= SLICE, "{what}: the card holds {used} > the slice");
    assert!(
        peak <= SLICE,
        "{what}: the card held {peak} > the slice at its peak"
    );
    assert!(
        total - used > 20 * GIB,
        "{what}: OOM while the card has room"
    );
    let room = SLICE - others;
    assert!(
        filled + 3 * CHUNK >= room,
        "{what}: filled only {filled} of {room}"
    );
}

/// PyTorch under the slice with one allocator configuration: reports, OOM, cap, give-back.
fn torch_scenario(alloc_conf: Option<&str>) {
    if !have("torch") {
        return;
    }
    let what = alloc_conf.unwrap_or("default allocator");
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let extra: Vec<(&str, &str)> = alloc_conf
        .map(|c| vec![("PYTORCH_CUDA_ALLOC_CONF", c)])
        .unwrap_or_default();
    let mut py = Py::start(what, &slice_env(&gpu, &slice, &extra));
    py.ok(TORCH_FILL);
    let info = py.ok("torch.cuda.init(); out = list(torch.cuda.mem_get_info())");
    assert_reports_slice(&gpu, &info, what);
    let base = gpu.truth().used_memory(0);
    assert!(
        base >= CONTEXT,
        "{what}: the context is on the card ({base})"
    );
    gpu.truth().reset_peak_memory(0);

    let r = py.ok(&format!(
        "xs = []; r = fill({CHUNK}, xs); out = [r, len(xs), torch.cuda.memory_reserved()]"
    ));
    assert_eq!(
        r[0], true,
        "{what}: torch.cuda.OutOfMemoryError expected: {r}"
    );
    assert_held_to_slice(&gpu, u(&r[1]) * CHUNK, base, what);
    let info = py.ok("out = list(torch.cuda.mem_get_info())");
    assert_reports_slice(&gpu, &info, &format!("{what}, full"));

    py.ok("del xs; torch.cuda.empty_cache()");
    assert_eq!(
        gpu.truth().used_memory(0),
        base,
        "{what}: empty_cache gave it all back"
    );
    let info = py.ok("out = list(torch.cuda.mem_get_info())");
    assert_reports_slice(&gpu, &info, &format!("{what}, emptied"));
    // And the slice is whole again: a second fill gets as far as the first.
    let again = py.ok(&format!(
        "xs = []; r = fill({CHUNK}, xs); out = [r, len(xs)]"
    ));
    assert_eq!(again[1], r[1], "{what}: the second fill got as far");
    py.ok("del xs; torch.cuda.empty_cache()");
    py.finish();
    wait_until(
        "the process's memory leaves the card",
        DEFAULT_TIMEOUT,
        || gpu.truth().used_memory(0) == 0,
    );
}

#[test]
fn torch_sees_the_slice_and_is_held_to_it() {
    torch_scenario(None);
}

#[test]
fn torch_with_expandable_segments_is_held_to_the_slice() {
    torch_scenario(Some("expandable_segments:True"));
}

#[test]
fn torch_with_the_cuda_malloc_async_backend_is_held_to_the_slice() {
    torch_scenario(Some("backend:cudaMallocAsync"));
}

#[test]
fn torch_cuda_graph_replays_within_the_slice() {
    if !have("torch") {
        return;
    }
    // The graph launches kernels: a card PyTorch's build has code for.
    let gpu = FakeGpu::start("a100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let mut py = Py::start("graph", &slice.env(&gpu));
    py.ok(TORCH_FILL);
    py.ok("torch.cuda.init()");
    let base = gpu.truth().used_memory(0);
    gpu.truth().reset_peak_memory(0);
    // Warm up on a side stream, capture (with an allocation inside the graph), replay.
    let r = py.ok(r#"
x = torch.ones(1 << 20, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    y = x * 2
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = x * 2
    z = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for _ in range(5):
    g.replay()
torch.cuda.synchronize()
out = torch.cuda.memory_reserved()
"#);
    assert!(
        u(&r) >= 256 * MIB,
        "the graph's pool holds its allocation: {r}"
    );
    let with_graph = gpu.truth().used_memory(0);
    assert!(
        with_graph >= base + 256 * MIB,
        "the graph's memory is on the card"
    );
    let f = py.ok(&format!(
        "xs = []; r = fill({CHUNK}, xs); out = [r, len(xs)]"
    ));
    assert_eq!(f[0], true, "OOM expected after the graph: {f}");
    assert_held_to_slice(&gpu, u(&f[1]) * CHUNK, with_graph, "graph");
    py.ok("del xs; g.replay(); torch.cuda.synchronize(); torch.cuda.empty_cache()");
    // Warm-up blocks may go; the graph's private pool (its 256 MiB) stays.
    let kept = gpu.truth().used_memory(0);
    assert!(
        kept <= with_graph && kept >= base + 256 * MIB,
        "the graph keeps its own pool: {kept} (with graph {with_graph}, base {base})"
    );
    py.ok("del g, y, z; torch.cuda.synchronize(); torch.cuda.empty_cache()");
    assert!(
        gpu.truth().used_memory(0) < with_graph,
        "the graph's memory goes with it"
    );
    py.finish();
}

#[test]
fn two_torch_processes_share_one_slice() {
    if !have("torch") {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    let mut a = Py::start("first", &env);
    a.ok(TORCH_FILL);
    a.ok("held = [torch.empty(512 << 20, dtype=torch.uint8, device='cuda') for _ in range(2)]");
    let held = gpu.truth().used_memory(0);
    assert!(held >= CONTEXT + GIB);
    gpu.truth().reset_peak_memory(0);
    let mut b = Py::start("second", &env);
    b.ok(TORCH_FILL);
    let info = b.ok("torch.cuda.init(); out = list(torch.cuda.mem_get_info())");
    let used = gpu.truth().used_memory(0);
    assert_eq!(u(&info[1]), SLICE);
    assert_eq!(
        u(&info[0]),
        SLICE - used,
        "the second sees what the first holds"
    );
    let f = b.ok(&format!(
        "xs = []; r = fill({CHUNK}, xs); out = [r, len(xs)]"
    ));
    assert_eq!(f[0], true, "the second hits the slice: {f}");
    assert_held_to_slice(&gpu, u(&f[1]) * CHUNK, used, "two processes");
    // The first gives its memory back; the second can then take it.
    a.ok("del held; torch.cuda.empty_cache()");
    let g = b.ok(&format!("r = fill({CHUNK}, xs); out = [r, len(xs)]"));
    assert_eq!(g[0], true, "{g}");
    assert!(
        u(&g[1]) >= u(&f[1]) + GIB / CHUNK - 1,
        "the freed GiB went to the other: {g}"
    );
    assert!(gpu.truth().peak_memory(0) <= SLICE, "never past the slice");
    a.finish();
    b.ok("del xs; torch.cuda.empty_cache()");
    b.finish();
}

#[test]
fn cupy_sees_the_slice_and_is_held_to_it() {
    if !have("cupy") {
        return;
    }
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let mut py = Py::start("cupy", &slice.env(&gpu));
    py.ok(CUPY_FILL);
    let info = py.ok("out = list(cupy.cuda.runtime.memGetInfo())");
    assert_reports_slice(&gpu, &info, "cupy");
    let base = gpu.truth().used_memory(0);
    gpu.truth().reset_peak_memory(0);
    let r = py.ok(&format!(
        "xs = []; r = fill({CHUNK}, xs); out = [r, len(xs)]"
    ));
    assert_eq!(
        r[0], true,
        "cupy.cuda.memory.OutOfMemoryError expected: {r}"
    );
    assert_held_to_slice(&gpu, u(&r[1]) * CHUNK, base, "cupy");
    py.ok("del xs; cupy.get_default_memory_pool().free_all_blocks()");
    assert_eq!(
        gpu.truth().used_memory(0),
        base,
        "free_all_blocks gave it all back"
    );
    let info = py.ok("out = list(cupy.cuda.runtime.memGetInfo())");
    assert_reports_slice(&gpu, &info, "cupy, emptied");
    py.finish();
}

#[test]
fn a_runtime_call_the_fake_cannot_serve_is_a_clear_error() {
    if !have("cupy") {
        return;
    }
    // Interprocess events are not simulated: the runtime call fails with the driver's
    // NOT_SUPPORTED (801) and the fake names the entry point once; the process carries on.
    let gpu = FakeGpu::start("v100");
    let mut py = Py::start("unsupported", &gpu.env());
    let r = py.ok(r#"
import cupy
from cupy.cuda import runtime
e = cupy.cuda.Event(block=False, disable_timing=True, interprocess=True)
try:
    runtime.ipcGetEventHandle(e.ptr)
    out = "served"
except runtime.CUDARuntimeError as err:
    out = str(err)
"#);
    let msg = r.as_str().unwrap_or_default().to_string();
    assert!(msg.contains("cudaErrorNotSupported"), "{msg}");
    let z = py.ok("a = cupy.zeros(1 << 20, dtype=cupy.uint8); out = runtime.memGetInfo()[1]");
    assert_eq!(u(&z), gpu.truth().total_memory(0), "still running");
    py.finish();
}

#[test]
fn cublas_matmuls_launch_on_an_a100_and_an_h200_and_refuse_a_v100() {
    if !have("torch") {
        return;
    }
    // cuBLAS's kernels load from its fatbins and take the time their geometry gives: at
    // 100 us a wave, ten matmuls put at least 1 ms on the card's timeline for this process.
    const MATMULS: &str = "import torch\n\
        a = torch.ones(4096, 4096, device='cuda', dtype=DTYPE)\n\
        for _ in range(10):\n    c = a @ a\n\
        torch.cuda.synchronize()\n\
        out = list(c.shape)";
    for preset in ["a100", "h200"] {
        let gpu = FakeGpu::start(preset);
        let slice = Slice::builder().device(0, "2GiB", None).build();
        let env = slice_env(&gpu, &slice, &[("FAKEGPU_NS_PER_WAVE", "100000")]);
        let mut py = Py::start(&format!("matmul {preset}"), &env);
        for dtype in ["torch.float32", "torch.float16"] {
            let from = fakegpu::state::now_ns();
            let shape = py.ok(&MATMULS.replace("DTYPE", dtype));
            let busy = gpu
                .truth()
                .busy_ns(0, Some(py.pid()), from, fakegpu::state::now_ns());
            assert_eq!(shape, serde_json::json!([4096, 4096]), "{preset} {dtype}");
            assert!(
                busy >= 1_000_000,
                "{preset} {dtype}: ten matmuls took {busy} ns of the card"
            );
        }
        py.finish();
    }
    // Neither cuBLAS 13 nor PyTorch's own kernels have code for sm_70, as on a real V100:
    // cuBLAS refuses with its own error, PyTorch's kernel fails with the runtime's "no kernel
    // image" (the driver's CUDA_ERROR_NO_BINARY_FOR_GPU), and the process goes on.
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let mut py = Py::start("matmul v100", &slice_env(&gpu, &slice, &[]));
    let r = py.exec("import torch; a = torch.empty(64, 64, device='cuda'); c = a @ a");
    assert_eq!(r["ok"], false, "{r}");
    let msg = r["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("CUBLAS_STATUS_ARCH_MISMATCH"), "{msg}");
    let r = py.exec("b = torch.ones(64, device='cuda') * 2; torch.cuda.synchronize()");
    assert_eq!(r["ok"], false, "{r}");
    let msg = r["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("no kernel image is available for execution on the device"),
        "{msg}"
    );
    py.ok("b = torch.empty(1 << 20, device='cuda')");
    py.finish();
}

#[test]
fn cupy_compiles_and_launches_its_kernels_on_an_a100() {
    if !have("cupy") {
        return;
    }
    // CuPy compiles its elementwise and reduction kernels with NVRTC for the card's
    // architecture (which needs one NVRTC still supports: not the V100's sm_70 in CUDA 13)
    // and launches them through the runtime: each takes at least a wave, 100 us here.
    let gpu = FakeGpu::start("a100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice_env(&gpu, &slice, &[("FAKEGPU_NS_PER_WAVE", "100000")]);
    let mut py = Py::start("cupy kernels", &env);
    let from = fakegpu::state::now_ns();
    py.ok("import cupy\n\
        x = cupy.ones(1 << 20, dtype=cupy.float32)\n\
        for _ in range(10):\n    y = (x * 2 + 1).sum()\n\
        cupy.cuda.runtime.deviceSynchronize()");
    let busy = gpu
        .truth()
        .busy_ns(0, Some(py.pid()), from, fakegpu::state::now_ns());
    assert!(
        busy >= 2_000_000,
        "twenty kernels took {busy} ns of the card"
    );
    py.finish();
}

#[test]
fn a_build_without_code_for_the_card_fails_as_on_the_card_and_the_shim_says_which_card() {
    if !have("torch") {
        return;
    }
    // PyTorch 2.15's CUDA 13 build has no code for sm_70: each kernel fails with the runtime's
    // own error (the driver refused the image), memory still works, and the shim names the
    // card's capability once however many loads fail.
    const SCRIPT: &str = "import torch\n\
        x = torch.empty(1 << 20, device='cuda')\n\
        for _ in range(3):\n\
        \x20   try:\n\
        \x20       (x + 1).sum().item()\n\
        \x20       print('ran')\n\
        \x20   except Exception as e:\n\
        \x20       print(str(e).splitlines()[0])\n";
    let slice = Slice::builder().device(0, "2GiB", None).build();
    // (stdout, stderr) of the script in the slice of a fresh `preset`.
    let run = |preset: &str| {
        let gpu = FakeGpu::start(preset);
        let mut env = slice.env(&gpu);
        env.push(("PYTHONWARNINGS".into(), "ignore".into()));
        let python = std::path::PathBuf::from(python::interpreter());
        let out = cuda_e2e::command(&python, &["-c", SCRIPT], &env)
            .output()
            .expect("python runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{preset}: {stdout}\n{stderr}");
        (stdout, stderr)
    };
    let (stdout, stderr) = run("v100");
    let failures = stdout
        .lines()
        .filter(|l| l.contains("no kernel image is available for execution on the device"))
        .count();
    assert_eq!(
        failures, 3,
        "each try fails with the runtime's error: {stdout}"
    );
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[gpuslice]") && l.contains("compute capability"))
        .collect();
    assert_eq!(said.len(), 1, "one line per process: {stderr}");
    assert!(
        said[0].contains("GPU 0 has compute capability 7.0 (sm_70)")
            && said[0].contains("CUDA_ERROR_NO_BINARY_FOR_GPU"),
        "{}",
        said[0]
    );
    // The same build on an H200 runs and the shim says nothing.
    let (stdout, stderr) = run("h200");
    assert_eq!(
        stdout.lines().filter(|l| *l == "ran").count(),
        3,
        "{stdout}"
    );
    assert!(!stderr.contains("compute capability"), "{stderr}");
}
