//! What `libgpuslice.so` costs a process that never touches CUDA or NVML: every shell, `ls`,
//! compiler and Python worker of a container pays it on each exec (`/etc/ld.so.preload`).
//!
//! Runs each command under each preload configuration, ALTERNATING (round-robin, rotated each
//! round so no configuration always runs right after another), hyperfine-style, and reports
//! medians of the wall time and of the child's CPU time (user + sys from `wait4`), plus the
//! median of the per-round paired differences against the EMPTY preload library (the floor
//! any preload library pays: open + mmap + a link-map entry). Alternation and medians matter
//! on a shared 2-core VM, where a neighbour's build makes single runs meaningless.
//!
//! ```text
//! cargo build --release -p gpuslice-shim -p gpuslice-benches
//! target/release/preload-cost [--rounds N] [--lib LABEL=PATH]... [-- CMD ARGS...]
//! ```
//!
//! Defaults: 400 rounds; configurations `none` (no LD_PRELOAD), `empty` (an empty C library
//! built with `cc` into the target dir on first use) and `gpuslice`
//! (`target/release/libgpuslice.so`); commands `/bin/true`, `sh -c true`, `python3 -c pass`.
//! `--lib` replaces the default library list after `none` and `empty` (repeat it to compare
//! several builds of the shim in one alternating run). The child's environment is the
//! parent's plus `LD_PRELOAD`; stdout/stderr go to /dev/null.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

struct Config {
    label: String,
    preload: Option<PathBuf>,
}

struct Sample {
    wall_us: f64,
    cpu_us: f64,
}

fn main() {
    let mut rounds = 400usize;
    let mut libs: Vec<(String, PathBuf)> = Vec::new();
    let mut commands: Vec<Vec<OsString>> = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--rounds") => {
                rounds = args
                    .next()
                    .and_then(|v| v.to_str().and_then(|s| s.parse().ok()))
                    .unwrap_or_else(|| usage("--rounds needs a number"));
            }
            Some("--lib") => {
                let spec = args
                    .next()
                    .unwrap_or_else(|| usage("--lib needs LABEL=PATH"));
                let spec = spec.to_string_lossy().into_owned();
                let (label, path) = spec
                    .split_once('=')
                    .unwrap_or_else(|| usage("--lib needs LABEL=PATH"));
                libs.push((label.to_owned(), PathBuf::from(path)));
            }
            Some("--") => {
                // Everything after is commands, each introduced by `--`.
                let mut current: Vec<OsString> = Vec::new();
                for word in args.by_ref() {
                    if word == "--" {
                        if !current.is_empty() {
                            commands.push(std::mem::take(&mut current));
                        }
                    } else {
                        current.push(word);
                    }
                }
                if !current.is_empty() {
                    commands.push(current);
                }
            }
            Some("-h" | "--help") => usage(""),
            _ => usage(&format!("unknown argument {arg:?}")),
        }
    }
    let dir = gpuslice_benches::artifact_dir();
    // `target/release/preload-cost` sits next to the cdylibs, not in deps/.
    let release = if dir.join("libgpuslice.so").exists() {
        dir.clone()
    } else {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or(dir)
    };
    if libs.is_empty() {
        libs.push(("gpuslice".into(), release.join("libgpuslice.so")));
    }
    if commands.is_empty() {
        commands = vec![
            vec!["/bin/true".into()],
            vec!["sh".into(), "-c".into(), "true".into()],
            vec!["python3".into(), "-c".into(), "pass".into()],
        ];
    }
    let empty = empty_library(&release);
    let mut configs = vec![
        Config {
            label: "none".into(),
            preload: None,
        },
        Config {
            label: "empty".into(),
            preload: Some(empty),
        },
    ];
    for (label, path) in libs {
        assert!(path.exists(), "{} does not exist", path.display());
        configs.push(Config {
            label,
            preload: Some(path),
        });
    }

    println!(
        "{rounds} alternating rounds per command; medians in microseconds \
         (wall = spawn to reap, cpu = child user+sys)"
    );
    for command in &commands {
        let mut samples: Vec<Vec<Sample>> = configs.iter().map(|_| Vec::new()).collect();
        // Warm-up: page cache, python's bytecode cache.
        for config in &configs {
            run(command, config);
        }
        for round in 0..rounds {
            for k in 0..configs.len() {
                let index = (round + k) % configs.len();
                samples[index].push(run(command, &configs[index]));
            }
        }
        let shown: Vec<String> = command.iter().map(|a| a.to_string_lossy().into()).collect();
        println!("\n{}", shown.join(" "));
        println!(
            "  {:<12} {:>10} {:>10} {:>16} {:>16}",
            "preload", "wall", "cpu", "wall-vs-empty", "cpu-vs-empty"
        );
        let empty_index = 1;
        for (index, config) in configs.iter().enumerate() {
            let wall = median(samples[index].iter().map(|s| s.wall_us).collect());
            let cpu = median(samples[index].iter().map(|s| s.cpu_us).collect());
            let paired = |f: fn(&Sample) -> f64| {
                median(
                    samples[index]
                        .iter()
                        .zip(&samples[empty_index])
                        .map(|(a, b)| f(a) - f(b))
                        .collect(),
                )
            };
            println!(
                "  {:<12} {:>10.1} {:>10.1} {:>+16.1} {:>+16.1}",
                config.label,
                wall,
                cpu,
                paired(|s| s.wall_us),
                paired(|s| s.cpu_us),
            );
        }
    }
}

fn usage(problem: &str) -> ! {
    if !problem.is_empty() {
        eprintln!("preload-cost: {problem}");
    }
    eprintln!("usage: preload-cost [--rounds N] [--lib LABEL=PATH]... [-- CMD ARGS...]...");
    std::process::exit(2);
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// An empty shared library (no code, no dependencies beyond what `cc -shared` adds), built
/// once next to the shim: the floor any preload library costs.
fn empty_library(dir: &Path) -> PathBuf {
    let so = dir.join("libpreload-empty.so");
    if so.exists() {
        return so;
    }
    let source = dir.join("preload-empty.c");
    std::fs::write(
        &source,
        "/* intentionally empty: the cost floor of any preload */\n",
    )
    .expect("write the empty library's source");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&source)
        .status()
        .expect("run cc to build the empty preload library");
    assert!(status.success(), "cc failed to build {}", so.display());
    so
}

// The child is reaped by `wait4` (which also gives its rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn run(command: &[OsString], config: &Config) -> Sample {
    let mut cmd = Command::new(&command[0]);
    cmd.args(&command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match &config.preload {
        Some(path) => cmd.env("LD_PRELOAD", path),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    let start = Instant::now();
    let child = cmd.spawn().expect("spawn the command");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 writes it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid out-pointers.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall_us = start.elapsed().as_secs_f64() * 1e6;
    assert_eq!(rc, pid, "wait4 failed");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{command:?} with {} failed: status {status}",
        config.label
    );
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Sample {
        wall_us,
        cpu_us: tv(usage.ru_utime) + tv(usage.ru_stime),
    }
}
