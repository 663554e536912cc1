//! `cuda-tests/gpu/driver_facts.py` (validate.sh check 8) against the fake GPU: the script that
//! establishes, on a real driver, the facts the shim relies on (cuGetProcAddress hands out
//! the hooked exports, a primary-context reset keeps its references, what a context costs).
//! Here it must find the fake faithful to them, report the fake's context cost, judge a
//! deviation a FAIL, and say "could not run" (never a traceback) without a driver.

use cuda_e2e::{command, run_with_timeout, Env, FakeGpu, DEFAULT_TIMEOUT, MIB};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// FAKEGPU_CTX_OVERHEAD's default, in MiB.
const CTX_OVERHEAD_MIB: f64 = 300.0;

fn gpu_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu")
}

struct Facts {
    code: i32,
    json: Value,
    stderr: String,
}

/// Runs `python3 ARGS...` (the script, or `-c` code importing it) and parses its one JSON line.
fn python(args: &[&str], env: &Env) -> Facts {
    let output = run_with_timeout(
        command(Path::new("python3"), args, env),
        None,
        DEFAULT_TIMEOUT,
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !stderr.contains("Traceback") && !stdout.contains("Traceback"),
        "driver_facts.py must fail soft:\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(
        stdout.lines().count(),
        1,
        "one JSON line on stdout:\n{stdout}\nstderr: {stderr}"
    );
    let json = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("no JSON ({e}):\n{stdout}\nstderr: {stderr}"));
    let code = output.status.code().expect("driver_facts.py exited");
    Facts { code, json, stderr }
}

fn driver_facts(env: &Env, extra: &[&str]) -> Facts {
    let script = gpu_dir().join("driver_facts.py");
    let mut args = vec![script.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    python(&args, env)
}

fn actives(facts: &Value) -> Vec<Value> {
    facts["primary_reset"]["observed"]
        .as_array()
        .expect("observed steps")
        .iter()
        .map(|step| step["active"].clone())
        .collect()
}

#[test]
fn the_fake_keeps_every_fact_and_reports_its_context_cost() {
    let gpu = FakeGpu::start("h200");
    let f = driver_facts(&gpu.env(), &[]);
    let j = &f.json;
    assert_eq!(j["verdict"], "PASS", "{j}\n{}", f.stderr);
    assert_eq!(f.code, 0, "{j}");
    assert_eq!(j["cuda_driver_version"], 13000, "{j}");

    let pa = &j["proc_address"];
    assert_eq!(pa["query"], "cuGetProcAddress_v2", "{pa}");
    assert_eq!(pa["versions"], serde_json::json!([12080, 13000]), "{pa}");
    assert!(pa["checked"].as_u64().unwrap() > 100, "{pa}");
    assert_eq!(
        pa["matched"], pa["checked"],
        "every lookup is the export: {pa}"
    );
    for list in ["mismatches", "absent", "not_offered"] {
        assert_eq!(pa[list], serde_json::json!([]), "{list}: {pa}");
    }

    let reset = &j["primary_reset"];
    assert_eq!(reset["status"], "PASS", "{reset}");
    assert_eq!(actives(j), [0, 1, 0, 1, 1, 0].map(Value::from), "{reset}");
    assert_eq!(reset["differences"], serde_json::json!([]), "{reset}");

    let cost = &j["context_cost"];
    assert_eq!(cost["context_mib"], CTX_OVERHEAD_MIB, "{cost}");
    assert_eq!(cost["context_source"], "process", "{cost}");
    assert_eq!(cost["reset_frees_mib"], CTX_OVERHEAD_MIB, "{cost}");
    assert_eq!(cost["granularity_min_bytes"], 2 << 20, "{cost}");
    assert_eq!(cost["alloc_1_byte_mib"], 2.0, "a 1-byte cuMemAlloc: {cost}");
    assert_eq!(cost["notes"], serde_json::json!([]), "{cost}");
    // (d): the fake's contexts cost the same whatever the flags and connections.
    let variants = &j["context_variants"];
    for name in [
        "default",
        "blocking_sync",
        "lmem_resize_to_max",
        "max_connections_32",
    ] {
        assert_eq!(
            variants[name]["mib"], CTX_OVERHEAD_MIB,
            "{name}: {variants}"
        );
    }
    assert_eq!(variants["dearest"]["mib"], CTX_OVERHEAD_MIB, "{variants}");
    // It released what it took (raw: before any reaping of its exited process), and at most
    // held one context and one 2 MiB allocation.
    assert_eq!(gpu.truth().used_memory_raw(0), 0);
    assert_eq!(gpu.truth().peak_memory(0), (300 + 2) * MIB);
}

#[test]
fn in_a_pid_namespace_the_context_cost_is_the_device_delta() {
    let gpu = FakeGpu::start("v100");
    let mut env = gpu.env();
    env.push(("FAKEGPU_PID_OFFSET".into(), "100000".into()));
    let f = driver_facts(&env, &[]);
    let cost = &f.json["context_cost"];
    assert_eq!(f.json["verdict"], "PASS", "{}", f.json);
    assert_eq!(cost["context_source"], "device_delta", "{cost}");
    assert_eq!(cost["context_mib"], CTX_OVERHEAD_MIB, "{cost}");
    assert_eq!(cost["alloc_1_byte_mib"], 2.0, "{cost}");
}

#[test]
fn a_bypass_or_another_reset_sequence_is_a_fail() {
    let gpu = FakeGpu::start("h200");
    // The fake hands out cuMemAlloc_v2 for "cuMemAlloc"; expecting the v1 export instead, and
    // an inactive context after the first release, stands for a driver that differs.
    let code = format!(
        "import sys; sys.argv = ['driver_facts.py']; sys.path.insert(0, {dir:?})\n\
         import driver_facts as d\n\
         d.HOOKED.append(('cuMemAlloc', 'cuMemAlloc', None))\n\
         d.RESET_SEQUENCE[4] = ('release', 0)\n\
         sys.exit(d.main())",
        dir = gpu_dir().to_str().expect("utf-8 path")
    );
    let f = python(&["-B", "-c", &code], &gpu.env());
    let j = &f.json;
    assert_eq!(j["verdict"], "FAIL", "{j}");
    assert_eq!(f.code, 1, "{j}");
    let mismatches = j["proc_address"]["mismatches"].as_array().unwrap();
    assert_eq!(mismatches.len(), 4, "2 versions x 2 flags: {j}");
    assert!(
        mismatches
            .iter()
            .all(|m| m["name"] == "cuMemAlloc" && m["resolved_to"] == "cuMemAlloc_v2"),
        "{j}"
    );
    assert_eq!(
        j["primary_reset"]["differences"],
        serde_json::json!(["step 4 (release): active 1, documented 0"]),
        "{j}"
    );
    let reasons = j["reasons"].to_string();
    assert!(
        reasons.contains("cuMemAlloc@12080 -> cuMemAlloc_v2"),
        "{reasons}"
    );
}

#[test]
fn without_a_driver_it_could_not_run_and_without_nvml_it_still_judges() {
    let gpu = FakeGpu::start("v100");
    let missing = gpu.scratch().join("no-such-dir/libcuda.so.1");
    let f = driver_facts(&gpu.env(), &["--libcuda", missing.to_str().unwrap()]);
    assert_eq!(f.json["verdict"], "ERROR", "{}", f.json);
    assert_eq!(f.code, 2);
    assert!(
        f.json["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("cannot load"),
        "{}",
        f.json
    );

    let missing = gpu.scratch().join("no-such-dir/libnvidia-ml.so.1");
    let f = driver_facts(&gpu.env(), &["--libnvml", missing.to_str().unwrap()]);
    let cost = &f.json["context_cost"];
    assert_eq!(f.json["verdict"], "PASS", "{}", f.json);
    assert_eq!(cost["context_mib"], Value::Null, "{cost}");
    assert!(cost["notes"].to_string().contains("cannot load"), "{cost}");
}

#[test]
fn validate_sh_only_8_runs_it_without_the_shim_and_reports_it() {
    let gpu = FakeGpu::start("h200");
    let out = gpu.scratch().join("report");
    let mut env = gpu.env();
    env.push(("OUT".into(), out.display().to_string()));
    env.push(("GPUSLICE_LIB".into(), "/nonexistent/libgpuslice.so".into()));
    let validate = gpu_dir().join("validate.sh");
    let output = run_with_timeout(
        command(
            Path::new("bash"),
            &[validate.to_str().unwrap(), "--only", "8"],
            &env,
        ),
        None,
        DEFAULT_TIMEOUT,
    );
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "validate.sh --only 8: {log}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json"))
            .expect("report JSON");
    assert_eq!(report["overall"], "PASS", "{report}");
    let row = &report["checks"][0];
    assert_eq!(row["id"], "8", "{report}");
    assert_eq!(row["status"], "PASS", "{row}");
    assert_eq!(row["numbers"]["context_mib"], CTX_OVERHEAD_MIB, "{row}");
    assert_eq!(
        row["numbers"]["primary_active_sequence"], "0,1,0,1,1,0",
        "{row}"
    );
    assert_eq!(row["numbers"]["procaddr_mismatches"], 0, "{row}");
}
