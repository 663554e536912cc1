//! Process lifecycle, at the top of the layers: the configuration loaded lazily ONCE at the
//! first hooked call (never in a library constructor: the host's own initialisation, its
//! environment and its allocator must be up first), the fail-closed gate every export passes,
//! and the registration of the fork handler. It calls down into the layers (`memory::attach`,
//! which has the session map the region and register the process; `session::mode` to publish
//! the mode; `session::fork` for the handler); nothing below calls it.
//!
//! Owns `PHASE` (per process: a fork child initialises again) and the constant mode answered
//! during a re-entrant init. The mode itself is published in one place, `session::mode`.
//!
//! Init order (bytehound-style, explicit):
//! 1. library load: nothing runs (no constructor);
//! 2. first `dlsym` call: only the real dlsym is resolved (`real`), no allocation, no locks;
//! 3. first hooked CUDA/NVML call: `mode()` loads the configuration (allocates, reads the file),
//!    sets the log level, attaches an enforcing process to its slice (region, slot, ledger),
//!    publishes the mode, registers the fork handler;
//! 4. after `fork()`: the child handler (`session::fork`) puts every piece of per-process
//!    state back to its fresh value, this phase and the published mode included; the child
//!    re-initialises at its next hooked call.
//!
//! Re-entrancy: the phase word carries the initialising thread's id. The same thread re-entering
//! during init (config loading calling back into a hooked function) gets pass-through instead
//! of a deadlock; other threads wait for the result. A thread that waits on an initialiser which
//! no longer exists (forked away mid-init) takes over.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use gpuslice_common::config::{self, ConfigError, Loaded, SliceConfig};

use crate::ground::real::Library;
use crate::hooks::refusal::{refusal_line, Fault};
use crate::session::fork::per_process;
use crate::session::mode::{self as published, mode_from, region_error, Mode};

const PHASE_UNINIT: u64 = 0;
const PHASE_READY: u64 = 1;
/// `INITIALIZING | tid << 8` while thread `tid` loads the configuration.
const PHASE_INITIALIZING: u64 = 2;

per_process! {
    /// Where this process is in its initialisation (`PHASE_*`).
    static PHASE: AtomicU64 = AtomicU64::new(PHASE_UNINIT);
}
/// What a thread re-entering its own initialisation is answered (a constant: survives fork).
static PASS_THROUGH_DURING_INIT: Mode = Mode::PassThrough;

/// The gate each export passes first: `Err(code)` when the configuration is invalid, or
/// (once the driver can list them) names a device the node does not have (`device_check`).
#[inline]
pub fn admit(library: Library) -> Result<(), u32> {
    match mode() {
        Mode::FailClosed(_) => Err(library.fail_closed_code()),
        Mode::Enforcing(config) => crate::hooks::device_check::admit(config, library),
        Mode::PassThrough => Ok(()),
    }
}

/// This process's mode, initialising it on first use. Once published it is one load.
#[inline]
pub fn mode() -> &'static Mode {
    match published::published() {
        Some(mode) => mode,
        None => initialise(),
    }
}

/// The slice configuration when enforcing.
#[inline]
pub fn slice_config() -> Option<&'static SliceConfig> {
    match mode() {
        Mode::Enforcing(config) => Some(config),
        _ => None,
    }
}

#[cold]
fn initialise() -> &'static Mode {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() } as u32 as u64;
    let initialising_by_me = PHASE_INITIALIZING | (me << 8);
    loop {
        match PHASE.compare_exchange(
            PHASE_UNINIT,
            initialising_by_me,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                let mode: &'static Mode = Box::leak(Box::new(load_mode()));
                published::publish(mode);
                PHASE.store(PHASE_READY, Ordering::Release);
                crate::session::fork::register_handler();
                return mode;
            }
            Err(PHASE_READY) => {
                // READY is stored only after the mode is published.
                if let Some(mode) = published::published() {
                    return mode;
                }
            }
            Err(current) if current == initialising_by_me => return &PASS_THROUGH_DURING_INIT,
            Err(current) => {
                let owner = (current >> 8) as libc::pid_t;
                if !thread_exists(owner) {
                    // The initialiser vanished (we are a fork child of a process that was
                    // mid-init): start over.
                    let _ = PHASE.compare_exchange(
                        current,
                        PHASE_UNINIT,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                std::thread::yield_now();
            }
        }
    }
}

fn thread_exists(tid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks existence; no signal is delivered.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, 0) };
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
            published::set_anchored(outcome.anchored);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_initialises_once_and_answers_the_same_afterwards() {
        let first = mode() as *const Mode;
        let second = mode() as *const Mode;
        assert_eq!(first, second);
        assert_eq!(
            published::published().map(|m| m as *const Mode),
            Some(first)
        );
        // SAFETY: gettid has no preconditions.
        assert!(thread_exists(unsafe { libc::gettid() }));
    }

    /// A thread that re-enters its own initialisation (the configuration's loading calling a
    /// hooked function) passes through instead of waiting for itself.
    #[test]
    fn the_initialising_thread_re_entering_gets_pass_through() {
        let published = mode() as *const Mode;
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32 as u64;
        // Other threads read the published mode and never look at the phase.
        PHASE.store(PHASE_INITIALIZING | (me << 8), Ordering::Release);
        let during = initialise() as *const Mode;
        PHASE.store(PHASE_READY, Ordering::Release);
        assert_eq!(during, &PASS_THROUGH_DURING_INIT as *const Mode);
        assert_eq!(mode() as *const Mode, published);
    }
}
