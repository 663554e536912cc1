//! PyTorch and CuPy from PyPI, driven from the tests: a Python process runs
//! `harness.py`, which executes the statements a test sends and answers each with a JSON
//! line, so that the test can check the fake's truth between two steps.
//!
//! `E2E_PYTHON` names the interpreter (default `python3`). A framework that does not import
//! is a loud `SKIPPED:` line, or a failure with `CI=true`.

use cuda_e2e::{command, Env, DEFAULT_TIMEOUT};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const HARNESS: &str = include_str!("harness.py");

/// Framework steps can be slow on a loaded 2-core machine (PyTorch's import alone is
/// seconds).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(120);

pub fn interpreter() -> String {
    std::env::var("E2E_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether `module` imports; otherwise the loud skip (a failure under CI).
#[allow(dead_code)]
pub fn have(module: &str) -> bool {
    let out = std::process::Command::new(interpreter())
        .args(["-c", &format!("import {module}")])
        .output();
    let why = match out {
        Ok(o) if o.status.success() => return true,
        Ok(o) => String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("")
            .to_string(),
        Err(e) => format!("cannot run {}: {e}", interpreter()),
    };
    let reason = format!(
        "{module} is not installed for {} ({why}); .ci/run installs it from PyPI",
        interpreter()
    );
    cuda_e2e::skip::skip_or_fail(&reason);
    false
}

/// One Python process under `env`.
pub struct Py {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    label: String,
}

/// The interpreter's arguments that run the harness.
#[allow(dead_code)]
pub fn harness_args() -> [&'static str; 3] {
    ["-u", "-c", HARNESS]
}

impl Py {
    #[allow(dead_code)]
    pub fn start(label: &str, env: &Env) -> Py {
        let mut env = env.clone();
        // torch warns that the simulated card's architecture is not in its build (true
        // for a V100 and CUDA 13); the warning is not what these tests look at.
        env.push(("PYTHONWARNINGS".into(), "ignore".into()));
        let cmd = command(std::path::Path::new(&interpreter()), &harness_args(), &env);
        Py::start_command(label, cmd)
    }

    /// The harness run by `cmd` (another interpreter, or one wrapped by another program).
    pub fn start_command(label: &str, mut cmd: std::process::Command) -> Py {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", interpreter()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut py = Py {
            child,
            stdin,
            lines: rx,
            label: label.into(),
        };
        let ready = py.answer("start");
        assert_eq!(ready["out"], "ready", "{label}: {ready}");
        py
    }

    /// The process id (the serial compute binary measures it on the timeline).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn answer(&mut self, what: &str) -> Value {
        let line = self.lines.recv_timeout(STEP_TIMEOUT).unwrap_or_else(|e| {
            let _ = self.child.kill();
            panic!("{}: no answer to {what:?} ({e})", self.label)
        });
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line:?}", self.label))
    }

    /// Runs `code`; returns the whole answer (`ok`, `out` or `error`).
    pub fn exec(&mut self, code: &str) -> Value {
        let stdin = self.stdin.as_mut().expect("stdin open");
        let line = serde_json::to_string(code).expect("a string") + "\n";
        stdin.write_all(line.as_bytes()).expect("write to python");
        stdin.flush().expect("flush to python");
        self.answer(code)
    }

    /// Runs `code`, which must succeed; returns `out`.
    pub fn ok(&mut self, code: &str) -> Value {
        let a = self.exec(code);
        assert_eq!(a["ok"], true, "{}: {code:?} failed: {a}", self.label);
        a["out"].clone()
    }

    /// Ends the process (stdin EOF) and waits for it.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + DEFAULT_TIMEOUT;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                assert!(st.success(), "{} exited with {st}", self.label);
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not exit",
                self.label
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
