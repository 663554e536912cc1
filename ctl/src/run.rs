//! `gpuslice run [slice flags] -- CMD...`: runs CMD under a private slice (temporary limit
//! file and region, the shim preloaded), on the simulated GPU when asked or when there is no
//! NVIDIA driver. Prints the region path for `gpuslice status --region`, forwards SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT to CMD, exits with CMD's code (128+N if it died of signal N)
//! and removes the temporary files.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Command;

use clap::Args;
use gpuslice_common::config::DeviceSelector;

use crate::error::{CliError, CliResult};
use crate::sandbox::{self, Sandbox};
use crate::slice::{NoDevices, SliceArgs};

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub slice: SliceArgs,

    /// Use the simulated GPU (fakegpu) even if an NVIDIA driver is present.
    #[arg(long)]
    pub fake_gpu: bool,

    /// The shim to preload (default: libgpuslice.so beside the gpuslice binary).
    #[arg(long, value_name = "PATH")]
    pub lib: Option<PathBuf>,

    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Signals passed on to the child instead of ending gpuslice.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Returns the exit code to leave with (the command's).
pub fn run(args: &RunArgs) -> CliResult<i32> {
    let shim = sandbox::find_shim(args.lib.as_deref())?;
    let use_fake = args.fake_gpu || !sandbox::real_driver_present();
    let mut config = args.slice.to_config(None, NoDevices::AllIndices)?;
    let sandbox = Sandbox::create("gpuslice-run", shim, use_fake, None)?;
    if let Some(fake) = &sandbox.fake {
        let why = if args.fake_gpu {
            "--fake-gpu"
        } else {
            "no NVIDIA driver found (no /dev/nvidia0 or libcuda.so.1)"
        };
        eprintln!(
            "gpuslice: {why}: using the simulated GPU (fakegpu libraries in {}, state {})",
            fake.lib_dir.display(),
            fake.state.display()
        );
    }
    match sandbox.host_cards() {
        Ok(cards) => {
            if args.slice.devices.is_empty() {
                // "Every device" means every device of this machine: an entry naming a device
                // it lacks would make the shim refuse the whole slice.
                config.devices.retain(|limit| {
                    matches!(limit.selector, DeviceSelector::Index(i) if (i as usize) < cards.len())
                });
            }
            sandbox::check_against_cards(&config, &cards, !args.slice.devices.is_empty())?
        }
        Err(e) => eprintln!(
            "gpuslice: warning: cannot compare the limits with the card: {}",
            e.message
        ),
    }
    sandbox.write_config(&config)?;
    eprintln!(
        "gpuslice: slice region {} (watch it: gpuslice status --region {})",
        sandbox.region_path.display(),
        sandbox.region_path.display()
    );

    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    sandbox.in_slice(&mut cmd);
    let code = run_forwarding_signals(cmd, &args.command[0])?;
    drop(sandbox);
    Ok(code)
}

/// Spawns `cmd` with the forwarded signals blocked here and delivered to the child by a
/// `sigwait` thread; the child gets them unblocked again before exec.
pub fn run_forwarding_signals(mut cmd: Command, shown: &OsString) -> CliResult<i32> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; blocking applies to this thread and the threads it
    // creates afterwards (the forwarder), so no handler ever runs in gpuslice.
    unsafe {
        libc::sigemptyset(&mut set);
        for signal in FORWARDED {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let unblock = set;
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // pthread_sigmask, which is async-signal-safe; it gives the command the signal mask
    // gpuslice had before blocking (std does not reset the mask on every spawn path).
    unsafe {
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &unblock, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            crate::error::EXIT_INVALID
        } else {
            crate::error::EXIT_RUNTIME
        };
        CliError {
            code,
            message: format!("cannot start {} ({e})", shown.to_string_lossy()),
        }
    })?;
    let pid = child.id() as libc::pid_t;
    std::thread::spawn(move || loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: `set` is initialised and `signal` is a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut signal) } == 0 {
            // SAFETY: plain kill(2). Until the main thread reaps the child, `pid` names it (or
            // its zombie); after that gpuslice exits at once, so a reused pid would need a
            // signal and a full pid wraparound inside that window.
            unsafe { libc::kill(pid, signal) };
        }
    });
    let status = child
        .wait()
        .map_err(|e| CliError::runtime(format!("waiting for the command failed ({e})")))?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        _ => crate::error::EXIT_RUNTIME,
    })
}
