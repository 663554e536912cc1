//! llama.cpp (the engine under Ollama) from Debian, unmodified, under a 2 GiB slice of the
//! simulated H200: sid's `llama.cpp-tools` 0.7.0 with `libggml0-backend-cuda` 0.27.0 (contrib)
//! and NVIDIA's `libcudart12` / `libcublas12` 12.4 (non-free). `.ci/llama-cpp-setup.sh` unpacks
//! them under `/opt/gpuslice-ci/llama.cpp/` (`E2E_LLAMA_CPP` names another tree); they need
//! sid's glibc, so every binary runs with the tree's own loader (`ld-linux-x86-64.so.2
//! --library-path ...`), in the tree's backend directory (where ggml looks for its CUDA and
//! CPU backends besides its build path). The models are llama-architecture GGUF files the
//! tests write themselves (`common/gguf.rs`).
//!
//! Every claim is checked against the fake's truth (physical use, high-water mark), never
//! against what llama.cpp or the shim says about itself; what llama.cpp prints is checked
//! against the card's figures. Without the tree each test prints `SKIPPED: ...` and returns,
//! except with `CI=true`, where it fails.

#[path = "common/gguf.rs"]
mod gguf;

use cuda_e2e::{run_with_timeout, wait_until, Env, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB, MIB};
use gguf::Llama;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const SLICE: u64 = 2048 * MIB;
/// What the fake charges per context (`FAKEGPU_CTX_OVERHEAD`'s default).
const CONTEXT: u64 = 300 * MIB;
const CARD: &str = "NVIDIA H200";
/// Model loads and a few CPU-computed tokens on a loaded 2-core machine.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// A 3.1 GiB model: 16 layers of 192 MiB (f32), more than the slice holds.
const LARGE: Llama = Llama {
    layers: 16,
    embd: 2048,
    ff: 5504,
    heads: 16,
    context: 256,
    random: false,
};

/// A 6 MiB model with random weights, for the server.
const SMALL: Llama = Llama {
    layers: 2,
    embd: 256,
    ff: 512,
    heads: 4,
    context: 256,
    random: true,
};

/// The unpacked Debian tree, or the loud skip (a failure under CI).
fn tree() -> Option<PathBuf> {
    let root = std::env::var_os("E2E_LLAMA_CPP")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/gpuslice-ci/llama.cpp"));
    if root.join("usr/bin/llama-server").is_file() {
        return Some(root);
    }
    cuda_e2e::skip::skip_or_fail(&format!(
        "llama.cpp: no Debian llama.cpp tree at {} (.ci/llama-cpp-setup.sh unpacks it; \
         E2E_LLAMA_CPP names another)",
        root.display()
    ));
    None
}

/// `bin` of the tree with `args`, under `env`, through the tree's own loader.
fn llama(tree: &Path, bin: &str, args: &[&str], env: &Env) -> Command {
    let lib = tree.join("usr/lib/x86_64-linux-gnu");
    let fake = env
        .iter()
        .find(|(k, _)| k == "LD_LIBRARY_PATH")
        .map(|(_, v)| v.clone())
        .expect("the fake GPU's library directory");
    let path = format!("{fake}:{0}/llama:{0}", lib.display());
    let bin = tree.join("usr/bin").join(bin);
    let mut all = vec!["--library-path", &path, bin.to_str().expect("a UTF-8 path")];
    all.extend(args);
    let mut cmd = cuda_e2e::command(&lib.join("ld-linux-x86-64.so.2"), &all, env);
    cmd.current_dir(lib.join("ggml/backends0"));
    cmd
}

fn run(tree: &Path, bin: &str, args: &[&str], env: &Env) -> Output {
    run_with_timeout(llama(tree, bin, args, env), None, RUN_TIMEOUT)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `offloaded K/N layers to GPU`, as llama.cpp's loader logs it (the output layer counts as
/// one: N is the model's layers + 1).
fn offloaded(log: &str) -> Option<(u32, u32)> {
    let line = log
        .lines()
        .find(|l| l.contains("offloaded ") && l.contains("layers to GPU"))?;
    let counts = line.split("offloaded ").nth(1)?.split_whitespace().next()?;
    let (k, n) = counts.split_once('/')?;
    Some((k.parse().ok()?, n.parse().ok()?))
}

#[test]
fn llama_cpp_sees_the_slice_and_its_default_fit_offloads_what_fits() {
    let Some(tree) = tree() else { return };
    let gpu = FakeGpu::start("h200");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);

    // The device list: the slice's total and what is free in it (its own context taken).
    let out = run(&tree, "llama-completion", &["--list-devices"], &env);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let expected = format!(
        "CUDA0: {CARD} ({} MiB, {} MiB free)",
        SLICE / MIB,
        (SLICE - CONTEXT) / MIB
    );
    assert!(log.contains(&expected), "expected {expected:?} in:\n{log}");

    // A model larger than the slice: the default fit offloads some layers, not all, and the
    // card never holds more than the slice.
    let model = gpu.scratch().join("large.gguf");
    let size = LARGE.write(&model);
    assert!(
        size > SLICE + GIB,
        "the model ({size}) is larger than the slice"
    );
    gpu.truth().reset_peak_memory(0);
    let model_arg = model.to_str().unwrap();
    let args = [
        "-m",
        model_arg,
        "-p",
        "hello",
        "-n",
        "2",
        "-no-cnv",
        "--no-warmup",
        "-lv",
        "4",
    ];
    let out = run(&tree, "llama-completion", &args, &env);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let (k, n) = offloaded(&log).unwrap_or_else(|| panic!("no offload line in:\n{log}"));
    assert_eq!(n, LARGE.layers + 1, "{log}");
    assert!(
        k > 0 && k < LARGE.layers,
        "the fit offloads part of the model: {k}/{n}\n{log}"
    );
    let peak = gpu.truth().peak_memory(0);
    assert!(peak <= SLICE, "the card held {peak} > the slice");
    assert!(
        peak >= CONTEXT + u64::from(k - 1) * LARGE.layer_bytes(),
        "the offloaded layers were on the card: peak {peak}, {k} layers"
    );
    wait_until("the memory leaves the card", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });

    // Forced: every layer on the GPU and no fitting. llama.cpp's own allocation error, while
    // the card has room to spare.
    gpu.truth().reset_peak_memory(0);
    let forced = [&args[..], &["-ngl", "99", "--fit", "off"]].concat();
    let out = run(&tree, "llama-completion", &forced, &env);
    let log = text(&out);
    assert!(!out.status.success(), "a full offload cannot fit: {log}");
    assert!(
        log.contains("cudaMalloc failed: out of memory"),
        "llama.cpp's own error expected:\n{log}"
    );
    let peak = gpu.truth().peak_memory(0);
    assert!(peak <= SLICE, "the card held {peak} > the slice");
    let total = gpu.truth().total_memory(0);
    assert!(total - peak > 100 * GIB, "refused while the card had room");
    wait_until("the memory leaves the card", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
}

/// One HTTP/1.1 exchange with the server on 127.0.0.1:`port` (Connection: close).
fn http(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u32, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(RUN_TIMEOUT))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

/// The server process, killed when the test ends however it ends (a failed assertion too).
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn llama_server_answers_a_request_in_the_slice() {
    let Some(tree) = tree() else { return };
    let gpu = FakeGpu::start("h200");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    let model = gpu.scratch().join("small.gguf");
    SMALL.write(&model);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().unwrap().port()
    };
    let port_arg = port.to_string();
    let args = [
        "-m",
        model.to_str().unwrap(),
        "--host",
        "127.0.0.1",
        "--port",
        &port_arg,
        "-ngl",
        "99",
        "--no-warmup",
        "-np",
        "1",
        "-lv",
        "4",
    ];
    let log_path = gpu.scratch().join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut server = Server(
        llama(&tree, "llama-server", &args, &env)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("llama-server starts"),
    );
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_until("llama-server is ready", RUN_TIMEOUT, || {
        if let Ok(Some(st)) = server.0.try_wait() {
            panic!("llama-server exited with {st}:\n{}", read_log());
        }
        matches!(http(port, "GET", "/health", ""), Ok((200, _)))
    });
    let (status, body) = http(
        port,
        "POST",
        "/completion",
        // The fake runs no kernel code, so the logits are whatever the memory held: an end of
        // text may come first, and is not what is under test.
        r#"{"prompt": "hello the slice", "n_predict": 4, "ignore_eos": true}"#,
    )
    .expect("the request is answered");
    assert_eq!(status, 200, "{body}\n{}", read_log());
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(answer["content"].is_string(), "{answer}");
    assert_eq!(
        answer["tokens_predicted"], 4,
        "four tokens predicted: {answer}"
    );
    let log = read_log();
    let (k, n) = offloaded(&log).unwrap_or_else(|| panic!("no offload line in:\n{log}"));
    assert_eq!(k, n, "the small model is all on the GPU: {log}");
    let used = gpu.truth().used_memory(0);
    assert!(
        used > CONTEXT && used <= SLICE,
        "the server's memory is on the card, within the slice: {used}"
    );
    assert!(gpu.truth().peak_memory(0) <= SLICE);
    drop(server);
    wait_until("the memory leaves the card", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
}

#[test]
fn llama_cpp_under_gpuslice_run_lists_the_slice_of_the_simulated_card() {
    // What the README shows a user: `gpuslice run --fake-gpu -m 8GiB` around llama.cpp (the
    // simulated V100 by default; ggml's PTX for compute_70 runs there).
    let Some(tree) = tree() else { return };
    let lib = tree.join("usr/lib/x86_64-linux-gnu");
    let script = format!(
        "cd {lib}/ggml/backends0 && exec {lib}/ld-linux-x86-64.so.2 \
         --library-path \"$LD_LIBRARY_PATH:{lib}/llama:{lib}\" {bin} --list-devices",
        lib = lib.display(),
        bin = tree.join("usr/bin/llama-completion").display()
    );
    let cmd = cuda_e2e::command(
        &cuda_e2e::gpuslice_binary(),
        &["run", "--fake-gpu", "-m", "8GiB", "--", "sh", "-c", &script],
        &Vec::new(),
    );
    let out = run_with_timeout(cmd, None, RUN_TIMEOUT);
    let log = text(&out);
    println!("{log}");
    assert!(out.status.success(), "{log}");
    let expected = format!(
        "CUDA0: Tesla V100-PCIE-32GB (8192 MiB, {} MiB free)",
        8192 - CONTEXT / MIB
    );
    assert!(log.contains(&expected), "expected {expected:?} in:\n{log}");
}
