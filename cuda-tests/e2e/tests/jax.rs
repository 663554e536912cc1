//! JAX from PyPI (0.10.2 with its CUDA 13 plugin, `jax[cuda13]`), unmodified, under a 2 GiB
//! slice of the simulated H200: NVIDIA's CUDA 13 runtime, CUPTI, cuBLAS and XLA's compiled
//! kernels on the fake driver, with the shim preloaded. JAX pins its own NVIDIA wheels, so it
//! lives in a venv of its own (`.ci/jax-setup.sh`: `/opt/gpuslice-ci/venvs/jax`;
//! `E2E_JAX_PYTHON` names another interpreter). JAX uses the GPU only when `/dev/nvidiactl` or
//! `/dev/nvidia0` exists, so each process runs with stand-ins in a private mount namespace
//! (`cuda_e2e::dev_nodes`).
//!
//! Every claim is checked against the fake's truth (physical use and the high-water mark):
//! preallocation takes its fraction of the slice (75 % by default,
//! `XLA_PYTHON_CLIENT_MEM_FRACTION` otherwise), `XLA_PYTHON_CLIENT_PREALLOCATE=false` grows on
//! demand, a jitted computation runs, past the slice JAX raises its own `RESOURCE_EXHAUSTED`
//! while the card has room, and the card has the memory back when the process ends (XLA keeps
//! what it took until then, with either allocator). Without the venv or the right to make a mount
//! namespace each test prints `SKIPPED: ...` and returns, except with `CI=true`.

#[path = "common/python.rs"]
mod python;

use cuda_e2e::{dev_nodes, wait_until, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB, MIB};
use python::{harness_args, Py};
use serde_json::Value;
use std::path::PathBuf;

const SLICE: u64 = 2 * GIB;
/// What the fake charges per context.
const CONTEXT: u64 = 300 * MIB;

fn jax_python() -> Option<PathBuf> {
    let python = std::env::var_os("E2E_JAX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/gpuslice-ci/venvs/jax/bin/python"));
    if python.is_file() {
        return Some(python);
    }
    cuda_e2e::skip::skip_or_fail(&format!(
        "jax: no JAX venv at {} (.ci/jax-setup.sh makes it; E2E_JAX_PYTHON names another)",
        python.display()
    ));
    None
}

/// A JAX process under `slice` of `gpu`, with `extra` environment, seeing device nodes.
fn start(gpu: &FakeGpu, slice: &Slice, extra: &[(&str, &str)], label: &str) -> Option<Py> {
    let python = jax_python()?;
    let host_dev = gpu.scratch().join(format!("host-dev-{label}"));
    std::fs::create_dir_all(&host_dev).unwrap();
    if !dev_nodes::available(gpu.scratch()) {
        cuda_e2e::skip::skip_or_fail("jax: cannot make a mount namespace with device nodes");
        return None;
    }
    let mut env = slice.env(gpu);
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env.push(("PYTHONWARNINGS".into(), "ignore".into()));
    // XLA's C++ logging (autotuning notes) is not what the tests read.
    env.push(("TF_CPP_MIN_LOG_LEVEL".into(), "2".into()));
    let cmd = dev_nodes::wrap(&host_dev, &python, &harness_args(), &env);
    let mut py = Py::start_command(label, cmd);
    let dev = py.ok("import jax, jax.numpy as jnp\n\
         d = jax.devices()[0]\n\
         out = [d.platform, d.device_kind, d.memory_stats()['bytes_limit']]");
    assert_eq!(dev[0], "gpu", "{label}: JAX uses the GPU: {dev}");
    assert_eq!(dev[1], "NVIDIA H200", "{label}: {dev}");
    Some(py)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

const JIT: &str = "f = jax.jit(lambda a: (a @ a + 1.0).sum())\n\
    out = list(f(jnp.ones((512, 512), jnp.float32)).shape)";

/// Allocates 256 MiB arrays until JAX refuses; returns [error, count].
const FILL: &str = "xs = []\n\
    err = None\n\
    try:\n\
    \x20   while len(xs) < 64:\n\
    \x20       xs.append(jnp.ones((64 << 20,), jnp.float32).block_until_ready())\n\
    except Exception as e:\n\
    \x20   err = str(e)[:300]\n\
    out = [err, len(xs)]";

fn assert_refused_in_the_slice(gpu: &FakeGpu, r: &Value, what: &str) {
    let err = r[0]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: never refused: {r}"));
    assert!(
        err.contains("RESOURCE_EXHAUSTED"),
        "{what}: JAX's own error: {err}"
    );
    let peak = gpu.truth().peak_memory(0);
    assert!(peak <= SLICE, "{what}: the card held {peak} > the slice");
    let total = gpu.truth().total_memory(0);
    assert!(
        total - peak > 100 * GIB,
        "{what}: refused while the card had room"
    );
}

#[test]
fn jax_preallocates_its_fraction_of_the_slice_and_is_refused_past_it() {
    for (fraction, share) in [(None, 0.75), (Some("0.5"), 0.5)] {
        let gpu = FakeGpu::start("h200");
        let slice = Slice::builder().device(0, "2GiB", None).build();
        let extra: Vec<(&str, &str)> = fraction
            .map(|f| vec![("XLA_PYTHON_CLIENT_MEM_FRACTION", f)])
            .unwrap_or_default();
        let what = format!("fraction {share}");
        let Some(mut py) = start(&gpu, &slice, &extra, &what) else {
            return;
        };
        let limit = u(&py.ok("out = d.memory_stats()['bytes_limit']"));
        let expected = (SLICE as f64 * share) as u64;
        assert!(
            limit <= expected && limit + 4 * MIB >= expected,
            "{what}: bytes_limit {limit} is {share} of the slice ({expected})"
        );
        // The pool is taken from the driver at the first allocation.
        assert_eq!(py.ok(JIT), serde_json::json!([]), "{what}: a scalar");
        let used = gpu.truth().used_memory(0);
        assert!(
            used >= CONTEXT + limit && used <= SLICE,
            "{what}: the preallocation is on the card, within the slice: {used}"
        );
        let r = py.ok(FILL);
        assert_refused_in_the_slice(&gpu, &r, &what);
        assert!(
            (u(&r[1]) + 1) * 256 * MIB >= limit - 256 * MIB,
            "{what}: filled most of the preallocation: {r}"
        );
        py.finish();
        wait_until(
            "the process's memory leaves the card",
            DEFAULT_TIMEOUT,
            || gpu.truth().used_memory(0) == 0,
        );
    }
}

#[test]
fn jax_without_preallocation_grows_in_the_slice() {
    let gpu = FakeGpu::start("h200");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let extra = [("XLA_PYTHON_CLIENT_PREALLOCATE", "false")];
    let Some(mut py) = start(&gpu, &slice, &extra, "no preallocation") else {
        return;
    };
    let base = gpu.truth().used_memory(0);
    assert!(base < CONTEXT + 512 * MIB, "nothing preallocated: {base}");
    gpu.truth().reset_peak_memory(0);
    assert_eq!(py.ok(JIT), serde_json::json!([]));
    py.ok("x = jnp.ones((256 << 20,), jnp.float32).block_until_ready()");
    let with_x = gpu.truth().used_memory(0);
    assert!(
        with_x >= base + GIB && with_x <= SLICE,
        "1 GiB on the card, within the slice: {with_x}"
    );
    let r = py.ok(FILL);
    assert_refused_in_the_slice(&gpu, &r, "no preallocation");
    // XLA keeps what it took from the driver until the process ends; then the card has it back.
    py.finish();
    wait_until(
        "the process's memory leaves the card",
        DEFAULT_TIMEOUT,
        || gpu.truth().used_memory(0) == 0,
    );
}
