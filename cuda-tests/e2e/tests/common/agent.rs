//! The node agent (`gpuslice-node`) as the tests run it: started on a free loopback port, its
//! `/metrics` read directly, and the processes it judges looked at from the host. Shared by
//! `node_agent.rs` (slices on the host) and `containers.rs` (slices in podman containers);
//! each uses a part, hence `dead_code` allowed.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A child process ended (SIGKILL) and reaped on drop.
pub struct Daemon {
    pub child: Child,
    pub what: &'static str,
    pub log: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: String = log
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            let _ = writeln!(std::io::stderr(), "--- {} log ---\n{tail}", self.what);
        }
    }
}

/// Starts the agent on a free loopback port with `env` (the fake GPU's), state directory
/// `dir/state` and log `dir/agent.log`, a pass every 0.2 s unless `extra` names an
/// `--interval`; returns it and its address.
pub fn start(
    env: &[(String, String)],
    dir: &Path,
    slices_dir: &Path,
    extra: &[&str],
) -> (Daemon, String) {
    let log = dir.join("agent.log");
    // E2E_AGENT_BIN: another build of the agent (the release build for `measure_*`).
    let binary = std::env::var_os("E2E_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| cuda_e2e::artifact("gpuslice-node"));
    let mut cmd = Command::new(binary);
    cmd.args(["--listen", "127.0.0.1:0"]);
    if !extra.contains(&"--interval") {
        cmd.args(["--interval", "0.2"]);
    }
    cmd.arg("--slices-dir")
        .arg(slices_dir)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("agent log"));
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start gpuslice-node (cargo build --workspace): {e}"));
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read agent's first line");
    let daemon = Daemon {
        child,
        what: "gpuslice-node",
        log,
    };
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("agent printed {line:?}, not its address"))
        .to_string();
    (daemon, address)
}

/// A plain HTTP/1.0 GET on loopback: (status, body), or `None` when nothing answers.
pub fn http_get(address: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The value of the agent's own `/metrics` line starting with `prefix` (e.g.
/// `name{slice="s",`), when there is exactly one.
pub fn scraped(agent: &str, prefix: &str) -> Option<f64> {
    let (_, body) = http_get(agent, "/metrics")?;
    let mut lines = body.lines().filter(|l| l.starts_with(prefix));
    let line = lines.next()?;
    if lines.next().is_some() {
        return None;
    }
    line.rsplit(' ').next()?.parse().ok()
}

pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.to_string()))
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// The report-only backstop (slice "s", `--tolerance 64MiB --grace 1`) seen through the agent
/// at `addr`: an over-cap event is counted (awaited up to `timeout`), the slice's driver bytes
/// are `slice_bytes` (the bypassing process's included: it is counted against its
/// container's slice), no process is outside a slice, nothing is killed and both processes
/// still run.
pub fn assert_reports_without_killing(
    addr: &str,
    timeout: Duration,
    slice_bytes: u64,
    member_pid: u32,
    bypass_pid: u32,
) {
    let events = "gpuslice_backstop_over_cap_events_total{slice=\"s\",";
    cuda_e2e::wait_until(
        "the report-only backstop counts an over-cap event of the slice",
        timeout,
        || scraped(addr, events).is_some_and(|n| n >= 1.0),
    );
    assert_eq!(
        scraped(addr, "gpuslice_slice_memory_driver_bytes{slice=\"s\","),
        Some(slice_bytes as f64),
        "the process outside the shim is counted against its container's slice"
    );
    assert_eq!(
        scraped(addr, "gpuslice_card_unsliced_processes{"),
        Some(0.0)
    );
    assert_eq!(scraped(addr, "gpuslice_backstop_kills_total{"), None);
    assert!(is_running(bypass_pid) && is_running(member_pid));
}
