//! The process's way through its states (`session::state`, where they are drawn), driven from
//! the hook layer: the configuration loaded lazily ONCE at the first hooked call (never in a
//! library constructor: the host's own initialisation, its environment and its allocator
//! must be up first), the gate every export passes ([`admit`]), and `cuInit`, where the
//! devices are first listed. It calls down into the layers (`memory::attach`, which has the
//! session map the region and register the process; `session::state`; `session::fork` for
//! the handler) and into `device_check` and `refusal` beside it; none of them calls it.
//!
//! Init order (bytehound-style, explicit):
//! 1. library load: nothing runs (no constructor);
//! 2. first `dlsym` call: only the real dlsym is resolved (`real`), no allocation, no locks;
//! 3. first hooked CUDA/NVML call: the calling thread claims the state (`Initialising`),
//!    loads the configuration (allocates, reads the file), sets the log level, attaches an
//!    enforcing process to its slice (region, slot, ledger), publishes the outcome and
//!    registers the fork handler;
//! 4. after `fork()`: the child handler (`session::fork`) puts every piece of per-process
//!    state back to its fresh value, the process state included; the child loads again at
//!    its next hooked call.
//!
//! Re-entrancy: the same thread re-entering during the load (config loading calling back
//! into a hooked function) passes through instead of waiting for itself; other threads wait
//! for the outcome. A thread that waits on a loader which no longer exists (forked away
//! mid-load) takes over.

use std::path::Path;

use gpuslice_abi::cuda::result::CUDA_SUCCESS;
use gpuslice_common::config::{self, ConfigError, Loaded, SliceConfig};

use crate::ground::real::Library;
use crate::hooks::refusal::{refusal_line, Fault};
use crate::session::mode::{mode_from, region_error, set_anchored, Mode};
use crate::session::state::{State, STATE};

/// The gate each export passes first: `Err(code)` when the configuration is invalid, or
/// (once the driver can list them) names a device the node does not have (`device_check`).
/// Open for good: one load and a bit test.
#[inline]
pub fn admit(library: Library) -> Result<(), u32> {
    if STATE.open() {
        return Ok(());
    }
    gate(state(), library)
}

/// The gate's answer in `state` (loaded, or loading on this thread).
fn gate(state: State, library: Library) -> Result<(), u32> {
    match state {
        State::FailClosed(_) => Err(library.fail_closed_code()),
        State::Enforcing {
            config,
            devices_matched: false,
        } => crate::hooks::device_check::check(config, library),
        // Open, or this thread's own load calling back: it passes through.
        _ => Ok(()),
    }
}

/// This process's state, loading the configuration on first use. Once loaded, one load;
/// `Initialising` only on the thread that is loading it (a call it makes meanwhile).
#[inline]
pub fn state() -> State {
    match STATE.current() {
        State::Uninitialised | State::Initialising { .. } => load(),
        loaded => loaded,
    }
}

/// The slice configuration when enforcing.
#[inline]
pub fn slice_config() -> Option<&'static SliceConfig> {
    match state() {
        State::Enforcing { config, .. } => Some(config),
        _ => None,
    }
}

#[cold]
fn load() -> State {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32;
    let state = STATE.loaded(me, load_mode, thread_exists);
    if !matches!(state, State::Initialising { .. }) {
        crate::session::fork::register_handler();
    }
    state
}

fn thread_exists(tid: u32) -> bool {
    // SAFETY: signal 0 only checks existence; no signal is delivered.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Reads the configuration; a panic while doing so fails closed rather than leaving other
/// threads waiting forever.
fn load_mode() -> Mode {
    let loaded = std::panic::catch_unwind(|| {
        config::load_anchored(Path::new(config::DEFAULT_CONFIG_PATH), &|key| {
            std::env::var(key).ok()
        })
    });
    let (mode, fault) = match loaded {
        Ok(outcome) => {
            set_anchored(outcome.anchored);
            let fault = match &outcome.loaded {
                Loaded::Configured(config) => Fault::Region(
                    crate::session::slice::region_path(config)
                        .display()
                        .to_string(),
                ),
                _ => Fault::Configuration,
            };
            let mode = mode_from(outcome.loaded);
            // After `mode_from`: the file's log level decides whether these print.
            for warning in &outcome.warnings {
                crate::log_warn!("{warning}");
            }
            (attach_region(mode), fault)
        }
        Err(_) => (
            Mode::FailClosed(ConfigError {
                origin: "gpuslice".into(),
                field: String::new(),
                problem: "internal error while loading the configuration".into(),
            }),
            Fault::Internal,
        ),
    };
    match &mode {
        Mode::FailClosed(error) => crate::log_error!("{}", refusal_line(error, fault)),
        Mode::Enforcing(config) => {
            crate::log_info!(
                "enforcing slice from {:?}: {:?}",
                config.source,
                config.devices
            )
        }
        Mode::PassThrough => crate::log_debug!("no configuration: pass-through"),
    }
    mode
}

/// An enforcing process opens the slice's shared region and registers in it (the memory
/// ledger); a region that cannot be opened fails closed like an invalid configuration. The
/// message names where the region path came from (the limit file and its `region` field, or
/// the HAMi variable) so the operator knows what to fix, not only which path failed.
fn attach_region(mode: Mode) -> Mode {
    match mode {
        Mode::Enforcing(config) => match crate::memory::attach(&config) {
            Ok(()) => Mode::Enforcing(config),
            Err(problem) => Mode::FailClosed(region_error(&config, problem)),
        },
        other => other,
    }
}

/// `cuInit`: a configuration that cannot be applied (an entry or HAMi variable naming a
/// device the node lacks) is refused here, at the first call, once the driver can list its
/// devices: "is CUDA available?" checks then say no, instead of the application failing at
/// its first device query.
///
/// # Safety
/// The handler contract (see [`crate::hooks`]).
pub(crate) unsafe fn cu_init(real: crate::hooks::registry::signature::cuInit, flags: u32) -> u32 {
    // SAFETY: by-value argument, unchanged.
    let result = unsafe { real(flags) };
    if result != CUDA_SUCCESS {
        return result;
    }
    match admit(Library::Cuda) {
        Ok(()) => result,
        Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_loads_once_and_answers_the_same_afterwards() {
        let first = state();
        assert!(matches!(first, State::PassThrough), "no configuration here");
        assert!(STATE.open(), "pass-through admits every call for good");
        assert!(matches!(state(), State::PassThrough));
        assert_eq!(admit(Library::Cuda), Ok(()));
        // SAFETY: gettid has no preconditions.
        assert!(thread_exists(unsafe { libc::gettid() } as u32));
    }

    #[test]
    fn the_gate_refuses_a_failed_state_and_passes_a_loading_thread_through() {
        let reason: &'static ConfigError = Box::leak(Box::new(ConfigError {
            origin: "x".into(),
            field: String::new(),
            problem: "bad".into(),
        }));
        assert_eq!(
            gate(State::FailClosed(reason), Library::Cuda),
            Err(Library::Cuda.fail_closed_code())
        );
        assert_eq!(
            gate(State::FailClosed(reason), Library::Nvml),
            Err(Library::Nvml.fail_closed_code())
        );
        assert_eq!(
            gate(State::Initialising { thread: 1 }, Library::Cuda),
            Ok(())
        );
        assert_eq!(gate(State::PassThrough, Library::Nvml), Ok(()));
    }
}
