//! THE state of this process, one type ([`ProcessState`], one instance: [`STATE`]): where
//! the process is on its way from its first hooked call to enforcing a slice, and so whether
//! a call may run. Every other answer to that question is read from it.
//!
//! ```text
//!                      first hooked call                 configuration loaded
//!  Uninitialised ──────────────────────▶ Initialising(thread) ──┬──▶ PassThrough          [open]
//!   ▲      ▲      (claimed by `thread`;     │ the same thread     ├──▶ FailClosed(reason)
//!   │      │       others wait)             │ re-entering passes  └──▶ Enforcing(config)
//!   │      └──────── its thread is gone ────┘                            │ devices listed
//!   │                (a waiter takes over)                              ├──▶ Enforcing(config,
//!   │                                                                   │     matched)  [open]
//!  fork: the child of any state (the devices' verdict survives it)      └──▶ FailClosed(reason)
//! ```
//!
//! * Uninitialised: nothing loaded (a new process, or a fork child until its next hooked call).
//! * Initialising(thread): `thread` loads the configuration (`hooks::lifecycle`); a call it
//!   makes meanwhile passes through, other threads wait for the outcome.
//! * PassThrough: no configuration; every call goes to the driver.
//! * FailClosed(reason): an invalid configuration, an unusable region, or a limit-file entry
//!   naming no device of the node; every entry point refuses (`hooks::refusal`).
//! * Enforcing(config): a valid slice; until the devices are listed (`hooks::device_check`)
//!   the gate asks each time; once every entry matched a device, never again.
//!
//! `[open]`: every call is admitted for good, until a fork. The launch hooks' hot exports
//! (`hooks::launch`) read only this (one load and a bit test) before the real function.
//!
//! The word ([`ProcessState`]'s `word`) holds the kind in its low three bits, bit 2 being
//! `[open]`, and above them the initialising thread's id or the leaked, never freed reason or
//! configuration. It is per process ([`per_process!`]): a fork child starts Uninitialised and
//! loads again. The devices' verdict (`devices`) survives the fork, because the child sees the
//! same devices: a child of a refused process is refused without listing them again, one of
//! a matched process is open as soon as it has loaded.
//!
//! Derived from it: the gate (`hooks::lifecycle::admit`), the launch hot path, the policies'
//! [`slice_config`]; the throttle's `ACTIVE` (whether a share may apply) is worked out from
//! the configuration at the first launch. The front (`libgpuslice.so`) has its own word,
//! whether the core could be loaded at all: without it every call fails closed before this
//! state exists.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use gpuslice_common::config::{ConfigError, SliceConfig};

use super::fork::{per_process, ForkReset};
use super::mode::Mode;

/// What a reader of the state sees.
#[derive(Debug, Clone, Copy)]
pub enum State {
    /// Nothing loaded yet.
    Uninitialised,
    /// `thread` loads the configuration.
    Initialising { thread: u32 },
    /// No configuration: everything goes straight to the driver.
    PassThrough,
    /// Every entry point refuses, for this reason.
    FailClosed(&'static ConfigError),
    /// A valid slice; `devices_matched`: every entry of it named a device of the node.
    Enforcing {
        config: &'static SliceConfig,
        devices_matched: bool,
    },
}

const KIND: usize = 0b111;
const UNINITIALISED: usize = 0;
const INITIALISING: usize = 1;
const FAIL_CLOSED: usize = 2;
const ENFORCING: usize = 3;
/// `[open]`: admitted for good.
const OPEN: usize = 0b100;
const PASS_THROUGH: usize = OPEN;
const ENFORCING_MATCHED: usize = OPEN | ENFORCING;

// The payloads are leaked boxes: aligned past the kind bits.
const _: () = assert!(std::mem::align_of::<ConfigError>() > KIND);
const _: () = assert!(std::mem::align_of::<SliceConfig>() > KIND);

/// `devices` once every entry matched a device (a non-null address no box can have).
const DEVICES_MATCHED: *mut ConfigError = std::ptr::dangling_mut::<ConfigError>();

/// A process's state (see the module doc): the word, and the devices' verdict.
pub struct ProcessState {
    /// The kind and its payload: per process (reset at fork).
    word: AtomicUsize,
    /// Null (not listed yet), [`DEVICES_MATCHED`], or the leaked refusal: survives fork.
    devices: AtomicPtr<ConfigError>,
}

/// A fork child starts Uninitialised; the devices' verdict is kept (the same devices).
impl ForkReset for ProcessState {
    fn reset_to(&self, fresh: Self) {
        self.word.store(fresh.word.into_inner(), Ordering::Relaxed);
    }
}

per_process! {
    /// This process's state.
    pub static STATE: ProcessState = ProcessState::new();
}

/// The slice configuration when enforcing (never initialises: the policies run inside calls
/// the gate admitted, so the state is loaded by then).
#[inline]
pub fn slice_config() -> Option<&'static SliceConfig> {
    match STATE.current() {
        State::Enforcing { config, .. } => Some(config),
        _ => None,
    }
}

impl ProcessState {
    pub const fn new() -> ProcessState {
        ProcessState {
            word: AtomicUsize::new(UNINITIALISED),
            devices: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Whether every call is admitted, for good (until a fork). One load and a bit test.
    #[inline(always)]
    pub fn open(&self) -> bool {
        self.word.load(Ordering::Acquire) & OPEN != 0
    }

    /// The state now.
    #[inline]
    pub fn current(&self) -> State {
        decode(self.word.load(Ordering::Acquire))
    }

    /// The state once loaded: loads it on first use with `load`, on this thread (`me`).
    /// Another thread's load is waited for, unless `alive` says its thread is gone (a fork
    /// child of a process that was loading), when this one takes over. A call on the loading
    /// thread itself (the load calling a hooked function) gets `Initialising` back: it must
    /// pass through, not wait for itself.
    pub fn loaded(
        &self,
        me: u32,
        load: impl FnOnce() -> Mode,
        alive: impl Fn(u32) -> bool,
    ) -> State {
        let mut load = Some(load);
        loop {
            let word = self.word.load(Ordering::Acquire);
            match decode(word) {
                State::Uninitialised => {
                    let claim = INITIALISING | ((me as usize) << 3);
                    if self
                        .word
                        .compare_exchange(word, claim, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        let Some(load) = load.take() else {
                            unreachable!("a thread claims the state once")
                        };
                        return self.publish(load());
                    }
                }
                State::Initialising { thread } if thread == me => return decode(word),
                State::Initialising { thread } => {
                    if !alive(thread) {
                        let _ = self.word.compare_exchange(
                            word,
                            UNINITIALISED,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                    }
                    std::thread::yield_now();
                }
                loaded => return loaded,
            }
        }
    }

    /// Initialising -> the loaded outcome. An enforcing one starts at the devices' verdict
    /// when it is known (a fork child's parent listed them). The payload is leaked.
    fn publish(&self, mode: Mode) -> State {
        let word = match mode {
            Mode::PassThrough => PASS_THROUGH,
            Mode::FailClosed(error) => FAIL_CLOSED | leak(error),
            Mode::Enforcing(config) => {
                let devices = self.devices.load(Ordering::Acquire);
                if devices.is_null() {
                    ENFORCING | leak(config)
                } else if devices == DEVICES_MATCHED {
                    ENFORCING_MATCHED | leak(config)
                } else {
                    FAIL_CLOSED | devices as usize
                }
            }
        };
        self.word.store(word, Ordering::Release);
        decode(word)
    }

    /// Enforcing -> Enforcing, devices matched: the gate is open for good.
    pub fn devices_matched(&self) {
        let _ = self.devices.compare_exchange(
            std::ptr::null_mut(),
            DEVICES_MATCHED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (word & KIND == ENFORCING).then_some(word | OPEN)
            });
    }

    /// Enforcing -> FailClosed(`error`): an entry names no device. `Some(reason)` to the one
    /// caller that made the refusal (it says so once); `None` when another thread already
    /// had. Several threads may list the devices at once and all reach the same answer.
    pub fn devices_refused(&self, error: ConfigError) -> Option<&'static ConfigError> {
        let leaked = Box::into_raw(Box::new(error));
        let first = self
            .devices
            .compare_exchange(
                std::ptr::null_mut(),
                leaked,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if !first {
            // SAFETY: nobody else ever saw `leaked`; it came from Box::into_raw above.
            drop(unsafe { Box::from_raw(leaked) });
        }
        let refusal = self.devices.load(Ordering::Acquire);
        if refusal != DEVICES_MATCHED {
            let _ = self
                .word
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                    (word & KIND == ENFORCING).then_some(FAIL_CLOSED | refusal as usize)
                });
        }
        // SAFETY: `leaked` is a leaked Box, never freed since it was published.
        first.then(|| unsafe { &*leaked })
    }
}

impl Default for ProcessState {
    fn default() -> Self {
        Self::new()
    }
}

/// A leaked, never freed box's address (aligned past the kind bits).
fn leak<T>(value: T) -> usize {
    Box::into_raw(Box::new(value)) as usize
}

fn decode(word: usize) -> State {
    let payload = word & !KIND;
    match word & KIND {
        UNINITIALISED => State::Uninitialised,
        INITIALISING => State::Initialising {
            thread: (word >> 3) as u32,
        },
        PASS_THROUGH => State::PassThrough,
        // SAFETY: a FAIL_CLOSED word carries a leaked, never freed ConfigError (`publish`,
        // `devices_refused`).
        FAIL_CLOSED => State::FailClosed(unsafe { &*(payload as *const ConfigError) }),
        kind @ (ENFORCING | ENFORCING_MATCHED) => State::Enforcing {
            // SAFETY: an ENFORCING word carries a leaked, never freed SliceConfig (`publish`).
            config: unsafe { &*(payload as *const SliceConfig) },
            devices_matched: kind == ENFORCING_MATCHED,
        },
        // Never stored (`[open]` goes only with the two kinds above).
        _ => State::Uninitialised,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::config::{ComputePolicy, ConfigSource};
    use std::sync::atomic::AtomicU32;
    use std::sync::mpsc;

    fn config() -> SliceConfig {
        SliceConfig {
            source: ConfigSource::Env,
            devices: vec![],
            region_path: None,
            policy: ComputePolicy::Cap,
            priority: Default::default(),
            log_level: None,
            context_bound: None,
        }
    }

    fn error(problem: &str) -> ConfigError {
        ConfigError {
            origin: "test".into(),
            field: String::new(),
            problem: problem.into(),
        }
    }

    const ME: u32 = 11;
    fn alive(_: u32) -> bool {
        true
    }

    #[test]
    fn each_loaded_outcome_is_published_once_and_only_pass_through_is_open_at_once() {
        for (mode, open) in [
            (Mode::PassThrough, true),
            (Mode::FailClosed(error("bad")), false),
            (Mode::Enforcing(config()), false),
        ] {
            let state = ProcessState::new();
            assert!(matches!(state.current(), State::Uninitialised));
            let loads = AtomicU32::new(0);
            let outcome = state.loaded(
                ME,
                || {
                    loads.fetch_add(1, Ordering::Relaxed);
                    mode
                },
                alive,
            );
            let again = state.loaded(ME, || unreachable!("loaded once"), alive);
            assert_eq!(loads.load(Ordering::Relaxed), 1);
            assert_eq!(state.open(), open, "{outcome:?}");
            match (outcome, again) {
                (State::PassThrough, State::PassThrough) => {}
                (State::FailClosed(a), State::FailClosed(b)) => {
                    assert!(std::ptr::eq(a, b));
                    assert_eq!(a.problem, "bad");
                }
                (
                    State::Enforcing {
                        config: a,
                        devices_matched: false,
                    },
                    State::Enforcing { config: b, .. },
                ) => assert!(std::ptr::eq(a, b)),
                other => panic!("{other:?}"),
            }
        }
    }

    /// The loading thread calling a hooked function while it loads (the configuration's
    /// reading calling back) is told it is loading: it passes through instead of waiting for
    /// itself.
    #[test]
    fn a_re_entrant_call_during_the_load_is_told_its_own_thread_is_loading() {
        let state = ProcessState::new();
        let mut during = None;
        let outcome = state.loaded(
            ME,
            || {
                during = Some(state.loaded(ME, || unreachable!("no second load"), alive));
                Mode::PassThrough
            },
            alive,
        );
        assert!(matches!(during, Some(State::Initialising { thread: ME })));
        assert!(matches!(outcome, State::PassThrough));
    }

    /// A second thread arriving during the load waits for it and answers its outcome; it
    /// never loads itself.
    #[test]
    fn a_second_thread_waits_for_the_load_and_gets_its_outcome() {
        let state: &'static ProcessState = Box::leak(Box::new(ProcessState::new()));
        let (loading, started) = mpsc::channel();
        let (finish, release) = mpsc::channel::<()>();
        let loader = std::thread::spawn(move || {
            state.loaded(
                ME,
                || {
                    loading.send(()).unwrap();
                    release.recv().unwrap();
                    Mode::FailClosed(error("from the loader"))
                },
                alive,
            )
        });
        started.recv().unwrap();
        assert!(matches!(
            state.current(),
            State::Initialising { thread: ME }
        ));
        let (answered, answer) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let outcome = state.loaded(ME + 1, || unreachable!("the waiter loads"), alive);
            answered.send(()).unwrap();
            outcome
        });
        assert!(
            answer.try_recv().is_err(),
            "the waiter returned while the load was still running"
        );
        finish.send(()).unwrap();
        let loaded = loader.join().unwrap();
        let waited = waiter.join().unwrap();
        match (loaded, waited) {
            (State::FailClosed(a), State::FailClosed(b)) => {
                assert!(std::ptr::eq(a, b));
                assert_eq!(b.problem, "from the loader");
            }
            other => panic!("{other:?}"),
        }
    }

    /// A fork child of a process that was loading finds the loading thread gone and loads
    /// itself.
    #[test]
    fn a_waiter_takes_over_from_a_loader_that_no_longer_exists() {
        let state = ProcessState::new();
        state.word.store(INITIALISING | (7 << 3), Ordering::Relaxed);
        let outcome = state.loaded(ME, || Mode::PassThrough, |thread| thread != 7);
        assert!(matches!(outcome, State::PassThrough));
    }

    #[test]
    fn listing_the_devices_opens_an_enforcing_state_or_fails_it_closed_once() {
        let matched = ProcessState::new();
        matched.loaded(ME, || Mode::Enforcing(config()), alive);
        assert!(!matched.open());
        matched.devices_matched();
        assert!(matched.open());
        assert!(matches!(
            matched.current(),
            State::Enforcing {
                devices_matched: true,
                ..
            }
        ));

        let refused = ProcessState::new();
        refused.loaded(ME, || Mode::Enforcing(config()), alive);
        let first = refused.devices_refused(error("no such device"));
        assert_eq!(first.map(|e| e.problem.as_str()), Some("no such device"));
        assert!(
            refused.devices_refused(error("again")).is_none(),
            "said once"
        );
        assert!(!refused.open());
        match refused.current() {
            State::FailClosed(reason) => assert_eq!(reason.problem, "no such device"),
            other => panic!("{other:?}"),
        }

        // Neither verdict changes a state that is not enforcing.
        let passing = ProcessState::new();
        passing.loaded(ME, || Mode::PassThrough, alive);
        passing.devices_refused(error("x"));
        assert!(matches!(passing.current(), State::PassThrough));
    }

    per_process! {
        /// One per state a fork can find: uninitialised, initialising, pass-through, fail
        /// closed, enforcing unchecked, enforcing matched, enforcing refused.
        static FORKED: [ProcessState; 7] = [const { ProcessState::new() }; 7];
    }

    /// A fork child of a process in any state starts Uninitialised and loads again; the
    /// devices' verdict is kept (the child sees the same devices): a child of a matched
    /// process is open once it has loaded, one of a refused process fails closed.
    #[test]
    fn a_fork_child_of_each_state_starts_uninitialised_and_keeps_the_devices_verdict() {
        FORKED[1]
            .word
            .store(INITIALISING | (ME as usize) << 3, Ordering::Relaxed);
        FORKED[2].loaded(ME, || Mode::PassThrough, alive);
        FORKED[3].loaded(ME, || Mode::FailClosed(error("bad")), alive);
        FORKED[4].loaded(ME, || Mode::Enforcing(config()), alive);
        FORKED[5].loaded(ME, || Mode::Enforcing(config()), alive);
        FORKED[5].devices_matched();
        FORKED[6].loaded(ME, || Mode::Enforcing(config()), alive);
        FORKED[6].devices_refused(error("no such device"));
        let modes: Vec<Mode> = (0..7).map(|_| Mode::Enforcing(config())).collect();
        let child = crate::session::fork::in_fork_child(move || {
            let fresh = FORKED
                .iter()
                .all(|state| matches!(state.current(), State::Uninitialised));
            let reloaded: Vec<State> = FORKED
                .iter()
                .zip(modes)
                .map(|(state, mode)| state.loaded(ME, || mode, alive))
                .collect();
            fresh
                && matches!(
                    reloaded[5],
                    State::Enforcing {
                        devices_matched: true,
                        ..
                    }
                )
                && FORKED[5].open()
                && matches!(reloaded[6], State::FailClosed(reason) if reason.problem == "no such device")
                && reloaded[..5].iter().all(|state| {
                    matches!(
                        state,
                        State::Enforcing {
                            devices_matched: false,
                            ..
                        }
                    )
                })
        });
        assert!(child, "a fork child's states");
        assert!(FORKED[5].open(), "the parent keeps its own");
        assert!(matches!(FORKED[3].current(), State::FailClosed(_)));
    }
}
