//! Skipping a test whose outside tool (podman, Prometheus, nvidia-smi, PyTorch, root) is
//! missing, loudly and countably.
//!
//! A skipped test passes in the harness's count, so a skip must be seen elsewhere: it prints a
//! `SKIPPED:` line straight to fd 2 (the harness captures `eprintln!` of passing tests) and,
//! when `GPUSLICE_SKIP_LOG` names a file, appends one line to it (`cargo xtask test` sets it
//! and lists every skip at the end). With `CI=true` nothing skips: the test fails instead,
//! naming what was missing.

use std::io::Write;

/// The variable naming the file every skip is appended to (one `test<TAB>reason` line).
pub const SKIP_LOG_VAR: &str = "GPUSLICE_SKIP_LOG";

/// `CI` is set to true: a test that cannot run must fail rather than skip.
pub fn ci() -> bool {
    matches!(
        std::env::var("CI").as_deref(),
        Ok("true") | Ok("TRUE") | Ok("1")
    )
}

/// The test cannot run here because of `reason`: with `CI=true` this panics (the test
/// fails); otherwise it prints the SKIPPED line, records it, and the caller returns.
pub fn skip_or_fail(reason: &str) {
    if ci() {
        panic!("{reason} (CI=true: failing, not skipping)")
    }
    record_skip(reason);
}

/// Prints and records a skip without the CI check, for a test whose skip is by design
/// (it needs a privilege CI has, say) and that has already decided.
pub fn record_skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(str::to_owned)
        .or_else(|| {
            std::env::args()
                .next()
                .map(|bin| bin.rsplit('/').next().unwrap_or(&bin).to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {reason}");
    if let Some(path) = std::env::var_os(SKIP_LOG_VAR) {
        // One write of one short line in append mode: lines from parallel tests never mix.
        let line = format!("{test}\t{}\n", reason.replace(['\n', '\t'], " "));
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = file.write_all(line.as_bytes());
        }
    }
}
