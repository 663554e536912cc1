//! Injected GPU faults (`FAKEGPU_NVML_FAULTS`), for the health checks of NVML clients such as
//! the DRA driver: the knob names a text file, read on every call it affects, one fault a line:
//!
//! * `lost <index>`: the GPU has fallen off the bus. Its handle lookups (by index, UUID) and
//!   every query of it answer `NVML_ERROR_GPU_IS_LOST`, as nvml.h documents, until the line is
//!   removed.
//! * `xid <index> <code>`: a critical Xid error (`nvmlEventTypeXidCriticalError`, the code in
//!   `eventData`).
//! * `dbe <index>`: a double-bit ECC error (`nvmlEventTypeDoubleBitEccError`).
//!
//! Events are delivered by `nvmlEventSetWait_v2` to each event set registered for the GPU and
//! the event type, once per set, in file order; lines present before the set was created are
//! delivered too (the fake has no clock for "before"). Other lines are ignored.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;

use crate::core::NvmlResult;

pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
pub const EVENT_XID_CRITICAL: u64 = 0x8;
/// `NVML_ERROR_TIMEOUT`.
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;

/// One line of the file.
enum Fault {
    Lost(u32),
    Event { index: u32, kind: u64, data: u64 },
}

fn faults() -> Vec<Fault> {
    let Some(path) = std::env::var_os("FAKEGPU_NVML_FAULTS") else {
        return Vec::new();
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let index = words.get(1)?.parse().ok()?;
            match words[0] {
                "lost" => Some(Fault::Lost(index)),
                "xid" => Some(Fault::Event {
                    index,
                    kind: EVENT_XID_CRITICAL,
                    data: words.get(2)?.parse().ok()?,
                }),
                "dbe" => Some(Fault::Event {
                    index,
                    kind: EVENT_DOUBLE_BIT_ECC,
                    data: 0,
                }),
                _ => None,
            }
        })
        .collect()
}

/// `Err(NVML_ERROR_GPU_IS_LOST)` for a GPU the file says is lost.
pub fn check_lost(index: u32) -> NvmlResult<()> {
    if faults()
        .iter()
        .any(|f| matches!(f, Fault::Lost(i) if *i == index))
    {
        return Err(NVML_ERROR_GPU_IS_LOST);
    }
    Ok(())
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    pub device: nvmlDevice_t,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// What an `nvmlEventSet_t` points to.
pub struct EventSet {
    inner: Mutex<SetState>,
}

struct SetState {
    /// (device index, event mask).
    registered: Vec<(u32, u64)>,
    /// Event lines (by their position among event lines) already delivered.
    delivered: usize,
}

impl EventSet {
    pub fn new() -> Box<EventSet> {
        Box::new(EventSet {
            inner: Mutex::new(SetState {
                registered: Vec::new(),
                delivered: 0,
            }),
        })
    }

    pub fn register(&self, index: u32, mask: u64) {
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        state.registered.push((index, mask));
    }

    /// The next event for a registered GPU and type: (index, type, data), waiting up to
    /// `timeout_ms` for one to be injected.
    pub fn wait(&self, timeout_ms: u32) -> NvmlResult<(u32, u64, u64)> {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        loop {
            {
                let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                let events: Vec<(u32, u64, u64)> = faults()
                    .into_iter()
                    .filter_map(|f| match f {
                        Fault::Event { index, kind, data } => Some((index, kind, data)),
                        Fault::Lost(_) => None,
                    })
                    .collect();
                while state.delivered < events.len() {
                    let (index, kind, data) = events[state.delivered];
                    state.delivered += 1;
                    if state
                        .registered
                        .iter()
                        .any(|(i, mask)| *i == index && mask & kind != 0)
                    {
                        return Ok((index, kind, data));
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(NVML_ERROR_TIMEOUT);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
