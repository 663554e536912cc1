//! `gpuslice-node` as a program: bad flags are refused with a clear message, and `--once`
//! reports a node with no driver and a broken slice instead of failing.

use std::path::PathBuf;
use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuslice-node"))
}

fn tmp(label: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("gpuslice-node-cli-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether this machine has a real NVML the dynamic loader would find anyway.
fn system_nvml() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libnvidia-ml.so"))
        .unwrap_or(false)
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    for (flag, value, reason) in [
        ("--tolerance", "lots", "lots"),
        ("--grace=-1", "", "seconds"),
        ("--interval=NaN", "", "seconds"),
    ] {
        let args: Vec<&str> = [flag, value]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let out = agent().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(reason), "{flag} {value}: {stderr}");
    }
    let out = agent()
        .args(["--listen", "not an address"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen on not an address"));
}

#[test]
fn once_reports_no_driver_and_a_broken_slice_without_failing() {
    let dir = tmp("once");
    let slices = dir.join("slices");
    std::fs::create_dir_all(&slices).unwrap();
    std::fs::write(slices.join("broken.json"), "{\"version\": 1,").unwrap();
    std::fs::write(
        slices.join("fresh.json"),
        r#"{"version": 1, "region": "/nonexistent/gpuslice/f.region", "devices": [{"index": 0, "memory": "1GiB"}]}"#,
    )
    .unwrap();
    let empty = dir.join("no-driver");
    std::fs::create_dir_all(&empty).unwrap();
    let out = agent()
        .arg("--once")
        .arg("--slices-dir")
        .arg(&slices)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("LD_LIBRARY_PATH", &empty)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("gpuslice_slice_up{slice=\"broken\"} 0"),
        "{text}"
    );
    // A slice none of whose processes ran yet has no region: not a problem.
    assert!(
        text.contains("gpuslice_slice_up{slice=\"fresh\"} 1"),
        "{text}"
    );
    assert!(text.contains("# TYPE gpuslice_slice_up gauge"), "{text}");
    if !system_nvml() {
        assert!(text.contains("gpuslice_driver_up 0"), "{text}");
        assert!(!text.contains("gpuslice_card_"), "{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The host-PID broker the agent serves answers a process with its own PID (this test runs
/// in the host's PID namespace) and a process in a PID namespace of its own with its PID
/// here; an agent outside the host's namespace, or whose socket path is taken by a file,
/// refuses to start rather than hand out wrong PIDs or none.
#[test]
fn the_host_pid_broker_tells_each_process_its_host_pid() {
    use gpuslice_common::host_pid_broker;
    use std::io::{BufRead, BufReader};
    use std::time::Duration;
    let dir = tmp("broker");
    let socket = dir.join("node/host-pid.sock");
    let mut child = agent()
        .args(["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(&dir)
        .arg("--host-pid-socket")
        .arg(&socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    let asked = host_pid_broker::ask(&socket, Duration::from_secs(10));
    // A process in a PID namespace of its own is PID 1 there, and told its PID here.
    let nested = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c"])
        .arg(format!(
            "echo own $$; python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}'); print('told', s.recv(16).decode().strip())\"",
            socket.display()
        ))
        .output()
        .unwrap();
    // The exposition counts both answers.
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_string();
    // (The broker counts an answer just after writing it: the count may trail the client.)
    let told = "gpuslice_host_pid_broker_answers_total{result=\"told\"} 2\n";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut metrics = http_get(&address, "/metrics");
    while !metrics.contains(told) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        metrics = http_get(&address, "/metrics");
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(asked, Ok(std::process::id()));
    assert!(metrics.contains(told), "{metrics}");
    assert!(
        metrics.contains("gpuslice_host_pid_broker_answers_total{result=\"failed\"} 0\n"),
        "{metrics}"
    );
    let text = String::from_utf8_lossy(&nested.stdout);
    assert!(
        nested.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&nested.stderr)
    );
    assert!(text.contains("own 1\n"), "{text}");
    let told: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("told "))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no answer: {text}"));
    assert!(told > 1, "{text}");

    // Outside the host's PID namespace the agent refuses to serve the broker.
    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_gpuslice-node"))
        .args(["--listen", "127.0.0.1:0", "--host-pid-socket"])
        .arg(dir.join("nested.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not the host's"), "{stderr}");
    // A regular file where the socket goes is left alone, and said.
    std::fs::write(dir.join("file.sock"), b"x").unwrap();
    let out = agent()
        .args(["--listen", "127.0.0.1:0", "--host-pid-socket"])
        .arg(dir.join("file.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a socket"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The body of `GET path` from the agent at `address` (HTTP/1.0: the server closes).
fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map_or(response.clone(), |(_, body)| body.to_string())
}
