//! One throttled device of this process: its [`DeviceThrottle`] (the share in force, the
//! slice-wide words, the local credit and counters the launch path spends and the watcher
//! refreshes), the words' layout, and how one is built from the configuration and the
//! slice's region. The launch path (`throttle/mod.rs`) owns the per-process table of them.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use gpuslice_abi::cuda::CUdevice;
use gpuslice_common::config::{ComputePolicy, Priority, SliceConfig};
use gpuslice_common::region::{DeviceId, DeviceLimits, Region, THROTTLE_WORDS};

use gpuslice_policy::{self as policy, Credit, LaunchCost, PidTable};

pub const W_VTIME: usize = 0;
pub const W_INV_RATE: usize = 1;
pub const W_COST: usize = 2;
pub const W_LAUNCHES: usize = 3;
pub const W_WAITS: usize = 4;
pub const W_LEADER: usize = 5;
pub const W_LOG_C: usize = 6;
pub const W_BYPASS: usize = 7;
pub const W_UNRESOLVED_UNTIL: usize = 8;
pub const W_PIDS: usize = 9;

/// Bucket capacity: an idle slice may start this much wall time of refill at once.
pub const TOLERANCE_NS: u64 = 30_000_000;
/// Refill a process takes from the shared bucket at a time (wall time of refill).
pub const CHUNK_WALL_NS: u64 = 2_000_000;
/// Longest single sleep of a launch waiting for its reservation: it then looks whether the
/// rate changed (the leader ticks every 50 ms) and sleeps again until the reservation is due.
pub const RATE_CHECK_NS: u64 = 50_000_000;
/// A bucket word further ahead of now than this is from another clock (the region file
/// outlived a reboot) or corrupt, and is put back to now (`policy::repair_lead`).
pub const MAX_LEAD_NS: u64 = 60_000_000_000;

/// Per process, per throttled device.
pub struct DeviceThrottle {
    pub ordinal: CUdevice,
    pub uuid: String,
    /// The share this process's own configuration asks for (1..=99; `None` = none: the
    /// process is throttled only because its region entry holds a share).
    pub configured_percent: Option<u32>,
    /// The share in force (1..=99): the stricter of the configured one and the region
    /// entry's (stricter-wins rule, `common/src/region/mod.rs`), refreshed every tick.
    pub percent: AtomicU32,
    pub policy: ComputePolicy,
    /// Who gets idle time first under `burst`.
    pub priority: Priority,
    /// The slice-wide words (in the region, or process-local when there is none).
    pub words: &'static [AtomicU64; THROTTLE_WORDS],
    /// The region entry the leader publishes its measured utilisation to (for
    /// `gpuslice status`); `None` without a usable region.
    pub region_entry: Option<(&'static Region, DeviceId)>,
    pub credit: Credit,
    /// Local copies refreshed by the watcher, so launches read no shared cache line.
    pub cost: LaunchCost,
    pub bypass: AtomicBool,
    /// Launches this process made on the device (the watcher flushes the growth to the shared
    /// counter); waits since the watcher last flushed them.
    pub launches: AtomicU64,
    pub waits: AtomicU64,
    /// Launches asleep right now (a long wait spans ticks: still demand).
    pub sleeping: AtomicU64,
    /// This process does not know yet which NVML PID it is on this device.
    pub unresolved: AtomicBool,
    /// The start-up estimate from this process's own launches (until the cost is learned).
    pub probe: policy::Probe,
}

impl DeviceThrottle {
    pub fn pid_table(&self) -> PidTable<'static> {
        PidTable::new(&self.words[W_PIDS..])
    }

    /// The share in force, 0 < share < 1.
    pub fn share(&self) -> f64 {
        f64::from(self.percent.load(Ordering::Relaxed).clamp(1, 99)) / 100.0
    }

    /// The refill setting in force (the share itself until a leader has written one).
    pub fn inv_rate(&self) -> u64 {
        match self.words[W_INV_RATE].load(Ordering::Relaxed) {
            0 => policy::inv_rate_fixed(self.share()),
            inv => inv,
        }
    }

    /// Re-reads the share in force from the region entry (a process that joined with a
    /// tighter limit file tightened it for everyone); returns the new percent when it changed.
    pub fn refresh_share(&self) -> Option<u32> {
        let region = self.region_entry.map(|(r, id)| r.compute_percent(id));
        let wanted = effective_percent(self.configured_percent, region.flatten())?;
        let old = self.percent.swap(wanted, Ordering::Relaxed);
        (old != wanted).then_some(wanted)
    }
}

#[cfg(test)]
impl DeviceThrottle {
    /// Test helper: device 0 at `percent` under `policy`, over `words`, nothing spent yet.
    pub(crate) fn for_test(
        percent: u32,
        policy: ComputePolicy,
        words: &'static [AtomicU64; THROTTLE_WORDS],
        region_entry: Option<(&'static Region, DeviceId)>,
    ) -> DeviceThrottle {
        DeviceThrottle {
            ordinal: 0,
            uuid: "GPU-TEST".into(),
            configured_percent: Some(percent),
            percent: AtomicU32::new(percent),
            policy,
            priority: Priority::Normal,
            words,
            region_entry,
            credit: Credit::new(),
            cost: LaunchCost::new(0),
            bypass: AtomicBool::new(false),
            launches: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            sleeping: AtomicU64::new(0),
            unresolved: AtomicBool::new(false),
            probe: policy::Probe::new(),
        }
    }
}

/// Pure: the share in force from the configured one and the region entry's (1..=99 each,
/// `None` = none): the stricter; `None` = no share at all.
pub fn effective_percent(configured: Option<u32>, region: Option<u32>) -> Option<u32> {
    let valid = |p: Option<u32>| p.filter(|p| (1..=99).contains(p));
    match (valid(configured), valid(region)) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(super) fn build_device(config: &SliceConfig, ordinal: CUdevice) -> Option<DeviceThrottle> {
    if config.policy == ComputePolicy::Off {
        return None;
    }
    let uuid = crate::ground::devices::cuda_device_uuid(ordinal);
    let limit = config.limit_for(ordinal as u32, &uuid)?;
    let configured = limit.compute_percent.filter(|p| (1..=99).contains(p));
    let (words, region_entry) = match configured {
        Some(percent) => shared_words(&uuid, limit.memory_limit, percent),
        // No share of our own: throttled only if the region this process is registered in
        // holds one for this device.
        None => {
            let (region, _) = crate::session::slice::registered()?;
            let id = region.device_named(&uuid)?;
            (region.throttle_words(id), Some((region, id)))
        }
    };
    let region_percent = region_entry.and_then(|(r, id)| r.compute_percent(id));
    let percent = effective_percent(configured, region_percent)?;
    if configured == Some(percent) {
        crate::log_info!(
            "compute share {percent}% ({}, {} priority) on device {ordinal} {uuid}",
            config.policy,
            config.priority
        );
    } else {
        crate::log_info!(
            "compute share {percent}% ({}) on device {ordinal} {uuid}: the slice's region holds it (configured: {})",
            config.policy,
            configured.map_or("none".to_string(), |p| format!("{p}%"))
        );
    }
    Some(DeviceThrottle {
        ordinal,
        uuid,
        configured_percent: configured,
        percent: AtomicU32::new(percent),
        policy: config.policy,
        priority: config.priority,
        words,
        region_entry,
        credit: Credit::new(),
        cost: LaunchCost::new(policy::INITIAL_COST_NS as u64),
        bypass: AtomicBool::new(false),
        launches: AtomicU64::new(0),
        waits: AtomicU64::new(0),
        sleeping: AtomicU64::new(0),
        unresolved: AtomicBool::new(true),
        probe: policy::Probe::new(),
    })
}

/// The device's throttle words in the slice's region; process-local words (one line logged)
/// when the region cannot be used, so throttling still applies to this process.
fn shared_words(
    uuid: &str,
    memory_limit: Option<u64>,
    percent: u32,
) -> (
    &'static [AtomicU64; THROTTLE_WORDS],
    Option<(&'static Region, DeviceId)>,
) {
    let local = || -> (&'static [AtomicU64; THROTTLE_WORDS], _) {
        let words = Box::leak(Box::new([const { AtomicU64::new(0) }; THROTTLE_WORDS]));
        (&*words, None)
    };
    // The mapping the session opened at attach (one mapping and one registration per process).
    let Some(region) = crate::session::slice::region() else {
        crate::log_error!("no shared region is mapped; compute share enforced per process only");
        return local();
    };
    // The memory ledger usually bound the entry already: find it without the registration lock.
    if let Some(id) = region.device_named(uuid) {
        return (region.throttle_words(id), Some((region, id)));
    }
    match region.bind_devices(&[DeviceLimits {
        uuid: uuid.to_string(),
        memory_limit,
        compute_percent: Some(percent),
    }]) {
        Ok(binding) => (
            region.throttle_words(binding.ids[0]),
            Some((region, binding.ids[0])),
        ),
        Err(error) => {
            crate::log_error!("{error}; compute share enforced per process only");
            local()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stricter_of_the_configured_and_the_region_share_is_in_force() {
        assert_eq!(effective_percent(Some(50), Some(25)), Some(25));
        assert_eq!(effective_percent(Some(25), Some(50)), Some(25));
        assert_eq!(
            effective_percent(None, Some(25)),
            Some(25),
            "no share of its own"
        );
        assert_eq!(effective_percent(Some(40), None), Some(40));
        assert_eq!(effective_percent(Some(100), Some(30)), Some(30));
        assert_eq!(effective_percent(None, None), None);
    }

    /// A leader at 50 % follows the region entry when another process tightens it to 25 %.
    #[test]
    fn a_tightened_region_entry_is_picked_up_at_the_next_refresh() {
        let dir = std::env::temp_dir().join(format!("gpuslice-share-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("region");
        let _ = std::fs::remove_file(&path);
        let region: &'static Region = Box::leak(Box::new(Region::open_or_create(&path).unwrap()));
        let limits = |p| DeviceLimits {
            uuid: "GPU-SHARE".into(),
            memory_limit: None,
            compute_percent: Some(p),
        };
        let id = region.bind_devices(&[limits(50)]).unwrap().ids[0];
        let device = DeviceThrottle::for_test(
            50,
            ComputePolicy::Cap,
            region.throttle_words(id),
            Some((region, id)),
        );
        assert_eq!(device.refresh_share(), None);
        assert_eq!(device.inv_rate(), policy::inv_rate_fixed(0.5));
        // Another process of the slice binds a tighter file (stricter wins in the entry).
        region.bind_devices(&[limits(25)]).unwrap();
        assert_eq!(device.refresh_share(), Some(25));
        assert_eq!(device.share(), 0.25);
        assert_eq!(device.inv_rate(), policy::inv_rate_fixed(0.25));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
