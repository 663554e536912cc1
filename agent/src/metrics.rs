//! The metric families: names, labels and values of `/metrics`, from one [`NodeView`].
//!
//! Labels: `slice` (the slice's name), `uuid` (the device's UUID), `index` (the device's
//! NVML index on this node, empty when the driver cannot be read). Base units: bytes and
//! ratios (0..1), never MiB or percent.

use crate::backstop::Counters;
use crate::collect::NodeView;
use crate::exposition::{Family, Kind};
use gpuslice_common::config::DeviceSelector;
use gpuslice_common::host_memory::host_entry_device;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the host-PID broker (`--host-pid-socket`) has answered since the agent started.
#[derive(Debug, Default)]
pub struct BrokerCounts {
    /// Connections told their host PID.
    pub told: AtomicU64,
    /// Connections that could not be (a peer gone before the answer, or one whose PID has no
    /// name in the agent's namespace).
    pub failed: AtomicU64,
}

/// Renders the whole exposition. `broker`: the host-PID broker's counts, when it serves.
/// `scrape_seconds` is how long collecting took.
pub fn render(
    view: &NodeView,
    counters: &Counters,
    broker: Option<&BrokerCounts>,
    scrape_seconds: f64,
) -> String {
    use Kind::{Counter, Gauge};
    let mut broker_answers = Family::new(
        "gpuslice_host_pid_broker_answers_total",
        Counter,
        "Connections to the host-PID broker (--host-pid-socket), by result: told (the process learnt its host PID) or failed (it could not be told; it measures its host PID instead). Absent when the broker does not serve.",
    );
    if let Some(broker) = broker {
        broker_answers.add(
            &[("result", "told")],
            broker.told.load(Ordering::Relaxed) as f64,
        );
        broker_answers.add(
            &[("result", "failed")],
            broker.failed.load(Ordering::Relaxed) as f64,
        );
    }
    let mut driver_up = Family::new(
        "gpuslice_driver_up",
        Gauge,
        "1 when the driver (NVML) could be read on this scrape, else 0 (the log says why).",
    );
    let mut slice_up = Family::new(
        "gpuslice_slice_up",
        Gauge,
        "1 when the slice's limit file and region could be read (or the region does not exist yet), else 0 (the log says why).",
    );
    let mut slice_info = Family::new(
        "gpuslice_slice_info",
        Gauge,
        "1 for every slice found, labelled with its limit file and region file (empty: none).",
    );
    let mut slice_processes = Family::new(
        "gpuslice_slice_processes",
        Gauge,
        "Processes registered in the slice's region and not known to have exited.",
    );
    let mut limit = Family::new(
        "gpuslice_slice_memory_limit_bytes",
        Gauge,
        "The slice's memory cap on the device, as its limit file sets it (what the backstop judges the driver's count against; for a slice found without a limit file, as bound in its region) (absent: not limited).",
    );
    let mut ledger = Family::new(
        "gpuslice_slice_memory_ledger_bytes",
        Gauge,
        "Bytes the slice's ledger (region) counts on the device against the cap, without those of exited processes whose memory the driver has released (their slots await reaping).",
    );
    let mut ledger_stale = Family::new(
        "gpuslice_slice_memory_ledger_stale_bytes",
        Gauge,
        "Of the ledger's bytes, those of processes that have exited whose memory the driver still holds (or cannot say).",
    );
    let mut host_limit = Family::new(
        "gpuslice_slice_host_memory_limit_bytes",
        Gauge,
        "An oversubscribed device: what the slice may place in its containers' host memory past its memory cap (the limit file's virtual size less its memory), as bound in its region or set by its limit file.",
    );
    let mut host_ledger = Family::new(
        "gpuslice_slice_host_memory_bytes",
        Gauge,
        "An oversubscribed device: bytes the slice's processes placed in host memory past the cap (checked against their memory cgroup when placed), without those of exited processes the driver has released.",
    );
    let mut driver_bytes = Family::new(
        "gpuslice_slice_memory_driver_bytes",
        Gauge,
        "Bytes the driver (NVML per-process usage) reports for the slice's processes on the device.",
    );
    let mut driver_processes = Family::new(
        "gpuslice_slice_device_processes",
        Gauge,
        "The slice's processes the driver reports on the device.",
    );
    let mut share = Family::new(
        "gpuslice_slice_compute_share_ratio",
        Gauge,
        "The slice's compute share of the device (1 = not throttled).",
    );
    let mut measured = Family::new(
        "gpuslice_slice_utilization_ratio",
        Gauge,
        "The slice's utilisation of the device as its compute throttle last measured it.",
    );
    let mut context_cost = Family::new(
        "gpuslice_slice_context_cost_bytes",
        Gauge,
        "What one CUDA context costs on the device, the largest figure a process of the slice measured from the driver (absent: none measured yet). Above gpuslice_slice_context_bound_bytes, contexts started together may pass the cap by the difference: raise the bound.",
    );
    let mut context_bound = Family::new(
        "gpuslice_slice_context_bound_bytes",
        Gauge,
        "The most one context may cost as the slice's limit file sets it (context_overhead; absent: the shim's default, 512 MiB): what contexts started together each reserve.",
    );
    let mut refused = Family::new(
        "gpuslice_slice_refused_allocations_total",
        Counter,
        "Allocations the slice refused on the device past its cap (counted by the shim in the region, across process exits).",
    );
    let mut throttled = Family::new(
        "gpuslice_slice_throttled_seconds_total",
        Counter,
        "Time the slice's kernel launches waited for its compute share on the device (counted by the shim in the region).",
    );
    let mut fail_closed = Family::new(
        "gpuslice_slice_fail_closed_events_total",
        Counter,
        "Processes of the slice that opened its region and then failed closed (e.g. a limit-file entry naming no device).",
    );
    let mut card_total = Family::new(
        "gpuslice_card_memory_total_bytes",
        Gauge,
        "The card's memory.",
    );
    let mut card_used = Family::new(
        "gpuslice_card_memory_used_bytes",
        Gauge,
        "The card's memory in use, as the driver reports it.",
    );
    let mut card_free = Family::new(
        "gpuslice_card_memory_free_bytes",
        Gauge,
        "The card's free memory, as the driver reports it.",
    );
    let mut card_util = Family::new(
        "gpuslice_card_utilization_ratio",
        Gauge,
        "Fraction of the driver's last sample period in which a kernel ran on the card.",
    );
    let mut unsliced = Family::new(
        "gpuslice_card_unsliced_processes",
        Gauge,
        "Compute processes on the card that belong to no slice.",
    );
    let mut unsliced_bytes = Family::new(
        "gpuslice_card_unsliced_memory_bytes",
        Gauge,
        "Bytes the driver reports for the card's processes that belong to no slice.",
    );
    let mut over_cap = Family::new(
        "gpuslice_backstop_over_cap_events_total",
        Counter,
        "Times the driver showed the slice's processes over its cap beyond the tolerance for longer than the grace time (once per grace time while it lasts; slice \"\": a process of no slice on a slices-only device).",
    );
    let mut kills = Family::new(
        "gpuslice_backstop_kills_total",
        Counter,
        "Processes the backstop ended with SIGKILL (only with --enforce), for either rule.",
    );
    let mut accounted = Family::new(
        "gpuslice_backstop_accounted_over_cap_events_total",
        Counter,
        "Of the over-cap events, those in which the slice's ledger accounted for every byte: the ledger itself held more than the limit file allows (a process of the slice wrote its region's limit or total words, or memory the driver placed was charged past the cap); with --enforce the process holding the most is ended.",
    );
    let mut unaccounted_bytes = Family::new(
        "gpuslice_slice_unaccounted_bytes",
        Gauge,
        "Bytes the driver reports for the slice's processes on the device that its ledger does not account for: all of an unregistered process's, and a registered one's beyond its ledger entry plus the bound on memory the driver places by itself (gpuslice_common::unpriced::UNPRICED_BOUND_BYTES, 64 MiB per process and device): bytes that bypass the shim.",
    );
    let mut unaccounted_processes = Family::new(
        "gpuslice_slice_unaccounted_processes",
        Gauge,
        "The slice's processes on the device holding bytes its ledger does not account for (see gpuslice_slice_unaccounted_bytes).",
    );
    let mut unpriced_bytes = Family::new(
        "gpuslice_slice_unpriced_bytes",
        Gauge,
        "Bytes the driver reports for the slice's registered processes on the device beyond their ledger entries but within the bound on memory the driver places by itself (what the shim's model of it missed).",
    );
    let mut unaccounted_events = Family::new(
        "gpuslice_backstop_unaccounted_events_total",
        Counter,
        "Times a registered process of the slice held bytes its ledger does not account for (beyond its entry plus the bound) on the device for 3 s (once per 3 s while it lasts); with --enforce the process is ended.",
    );
    let mut over_cap_bytes = Family::new(
        "gpuslice_slice_memory_over_cap_bytes",
        Gauge,
        "How far the driver's count of the slice's processes on the device is above its cap (0: within it).",
    );
    let mut broken_region = Family::new(
        "gpuslice_slice_broken_region_processes",
        Gauge,
        "Processes of the slice that map its region file after it was unlinked, renamed or replaced (the slice's ledger cannot be read; they are not judged).",
    );
    let mut stale_slots = Family::new(
        "gpuslice_slice_stale_slots",
        Gauge,
        "Slots of the slice's region held by processes that have exited, awaiting reaping.",
    );
    let mut unverified = Family::new(
        "gpuslice_unverified_processes",
        Gauge,
        "Registered processes the agent cannot verify (no host PID in the slot, or one whose mappings it may not read: run it with the host's PID namespace and CAP_SYS_PTRACE); such a process is never judged as one of no slice.",
    );
    let mut scrape = Family::new(
        "gpuslice_scrape_duration_seconds",
        Gauge,
        "How long collecting this scrape's figures took.",
    );

    let cards = view.cards.as_ref().ok();
    driver_up.add(&[], if cards.is_some() { 1.0 } else { 0.0 });
    // The driver's word on a host PID: listed on any card (None: the driver cannot be asked).
    let listed = |host_pid: u32| {
        cards.map(|cards| {
            cards
                .iter()
                .any(|c| c.processes.iter().any(|(pid, _)| *pid == host_pid))
        })
    };
    for (index, slice) in view.slices.iter().enumerate() {
        let name = slice.found.name.as_str();
        let up = if slice.found.problems.is_empty() {
            1.0
        } else {
            0.0
        };
        slice_up.add(&[("slice", name)], up);
        let path = |p: &Option<std::path::PathBuf>| {
            p.as_ref()
                .map_or(String::new(), |p| p.display().to_string())
        };
        slice_info.add(
            &[
                ("slice", name),
                ("limit_file", &path(&slice.found.limit_file)),
                ("region", &path(&slice.found.region)),
            ],
            1.0,
        );
        slice_processes.add(&[("slice", name)], slice.registered().count() as f64);
        if let Some(bound) = slice.found.config.as_ref().and_then(|c| c.context_bound) {
            context_bound.add(&[("slice", name)], bound as f64);
        }
        let broken = view.broken.iter().filter(|(i, _, _)| *i == index).count();
        broken_region.add(&[("slice", name)], broken as f64);
        if let Some(snapshot) = &slice.snapshot {
            let stale = snapshot
                .processes
                .iter()
                .filter(|p| p.liveness == gpuslice_common::region::Liveness::Stale)
                .count();
            stale_slots.add(&[("slice", name)], stale as f64);
        }
        let Some(snapshot) = &slice.snapshot else {
            // No process of the slice has run yet (or its region is unreadable): the caps
            // its limit file sets, on the cards they select here.
            let configured = slice
                .found
                .config
                .as_ref()
                .map_or(&[][..], |c| &c.devices[..]);
            for card in cards.into_iter().flatten() {
                let index = card.index.to_string();
                let labels = [
                    ("slice", name),
                    ("uuid", card.uuid.as_str()),
                    ("index", index.as_str()),
                ];
                let entry = configured.iter().find(|d| match &d.selector {
                    DeviceSelector::Index(i) => *i == card.index,
                    DeviceSelector::Uuid(u) => *u == card.uuid,
                });
                if let Some(bytes) = entry.and_then(|d| d.memory_limit) {
                    limit.add(&labels, bytes as f64);
                }
                if let Some(bytes) = entry.and_then(|d| d.host_excess()) {
                    host_limit.add(&labels, bytes as f64);
                }
            }
            continue;
        };
        if let Some(counters) = &slice.counters {
            fail_closed.add(&[("slice", name)], counters.fail_closed_events as f64);
        }
        for device in &snapshot.devices {
            // A device's host bytes (oversubscription) are an entry of their own in the
            // region, labelled with their device.
            let (uuid, host_side) = match host_entry_device(&device.uuid) {
                Some(uuid) => (uuid, true),
                None => (device.uuid.as_str(), false),
            };
            let card = cards.and_then(|c| c.iter().find(|c| c.uuid == uuid));
            let card_index = card.map_or(String::new(), |c| c.index.to_string());
            let labels = [
                ("slice", name),
                ("uuid", uuid),
                ("index", card_index.as_str()),
            ];
            if host_side {
                let released = snapshot.released_bytes(device.id.index(), &listed);
                host_limit.add(&labels, device.memory_limit.unwrap_or(0) as f64);
                host_ledger.add(&labels, device.used_bytes.saturating_sub(released) as f64);
                continue;
            }
            if let Some((bytes, _)) = view.cap(index, &device.uuid) {
                limit.add(&labels, bytes as f64);
            }
            if let Some(bytes) = device.context_cost {
                context_cost.add(&labels, bytes as f64);
            }
            let entry = device.id.index();
            let released = snapshot.released_bytes(entry, &listed);
            ledger.add(&labels, device.used_bytes.saturating_sub(released) as f64);
            let kept = slice
                .counters
                .as_ref()
                .and_then(|c| c.devices.iter().find(|(id, _, _)| *id == device.id));
            if let Some((_, refusals, waited_ns)) = kept {
                refused.add(&labels, *refusals as f64);
                throttled.add(&labels, *waited_ns as f64 / 1e9);
            }
            let stale: u64 = snapshot
                .processes
                .iter()
                .filter(|p| p.liveness == gpuslice_common::region::Liveness::Stale)
                .filter(|p| !p.exited_and_released(&listed))
                .map(|p| p.used_bytes[entry])
                .sum();
            ledger_stale.add(&labels, stale as f64);
            share.add(
                &labels,
                f64::from(device.compute_percent.unwrap_or(100)) / 100.0,
            );
            if let Some(m) = device.measured_utilization {
                measured.add(&labels, f64::from(m.basis_points) / 10_000.0);
            }
            if let Some(card) = card {
                let (bytes, n) = view.driver_usage(index, card);
                driver_bytes.add(&labels, bytes as f64);
                driver_processes.add(&labels, n as f64);
                let members = view.members(index, card);
                let unaccounted: Vec<u64> = members
                    .iter()
                    .map(|m| m.unaccounted())
                    .filter(|&b| b > 0)
                    .collect();
                unaccounted_bytes.add(&labels, unaccounted.iter().sum::<u64>() as f64);
                unaccounted_processes.add(&labels, unaccounted.len() as f64);
                let unpriced: u64 = members.iter().map(|m| m.unpriced()).sum();
                unpriced_bytes.add(&labels, unpriced as f64);
                if let Some((cap, _)) = view.cap(index, &device.uuid) {
                    over_cap_bytes.add(&labels, bytes.saturating_sub(cap) as f64);
                }
            }
        }
    }
    for card in cards.into_iter().flatten() {
        let index = card.index.to_string();
        let labels = [("uuid", card.uuid.as_str()), ("index", index.as_str())];
        card_total.add(&labels, card.total as f64);
        card_used.add(&labels, card.used as f64);
        card_free.add(&labels, card.free as f64);
        if let Some(u) = card.utilization {
            card_util.add(&labels, f64::from(u) / 100.0);
        }
        let (n, bytes) = view
            .unsliced(card)
            .fold((0usize, 0u64), |(n, b), (_, bytes)| {
                (n + 1, b + bytes.unwrap_or(0))
            });
        unsliced.add(&labels, n as f64);
        unsliced_bytes.add(&labels, bytes as f64);
    }
    for ((slice, uuid, index), count) in &counters.over_cap {
        over_cap.add(
            &[("slice", slice), ("uuid", uuid), ("index", index)],
            *count as f64,
        );
    }
    for ((slice, uuid, index), count) in &counters.kills {
        kills.add(
            &[("slice", slice), ("uuid", uuid), ("index", index)],
            *count as f64,
        );
    }
    for ((slice, uuid, index), count) in &counters.unaccounted {
        unaccounted_events.add(
            &[("slice", slice), ("uuid", uuid), ("index", index)],
            *count as f64,
        );
    }
    for ((slice, uuid, index), count) in &counters.accounted {
        accounted.add(
            &[("slice", slice), ("uuid", uuid), ("index", index)],
            *count as f64,
        );
    }
    unverified.add(&[], view.unverified as f64);
    scrape.add(&[], scrape_seconds);

    let mut out = String::with_capacity(8192);
    for family in [
        &driver_up,
        &slice_up,
        &slice_info,
        &slice_processes,
        &limit,
        &ledger,
        &ledger_stale,
        &host_limit,
        &host_ledger,
        &driver_bytes,
        &driver_processes,
        &share,
        &measured,
        &context_cost,
        &context_bound,
        &refused,
        &throttled,
        &fail_closed,
        &card_total,
        &card_used,
        &card_free,
        &card_util,
        &unsliced,
        &unsliced_bytes,
        &unaccounted_bytes,
        &unaccounted_processes,
        &unpriced_bytes,
        &over_cap_bytes,
        &broken_region,
        &stale_slots,
        &over_cap,
        &kills,
        &unaccounted_events,
        &accounted,
        &unverified,
        &broker_answers,
        &scrape,
    ] {
        family.write(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::SliceState;
    use crate::discovery::FoundSlice;
    use crate::driver::Card;
    use gpuslice_common::config::parse_limit_file;
    use std::path::Path;

    #[test]
    fn a_slice_that_never_ran_shows_its_limit_files_caps() {
        let config = parse_limit_file(
            Path::new("fresh.json"),
            r#"{"version": 1, "region": "/r/f.region", "devices": [
                {"index": 1, "memory": "1GiB"}, {"uuid": "GPU-12345678-1234-1234-1234-123456789abc", "memory": "2GiB"}]}"#,
        )
        .unwrap();
        let card = |index: u32, uuid: &str| Card {
            index,
            uuid: uuid.into(),
            total: 1 << 34,
            used: 0,
            free: 1 << 34,
            utilization: None,
            processes: Vec::new(),
        };
        let slice = SliceState {
            counters: None,
            found: FoundSlice {
                config: Some(config),
                ..FoundSlice::named("fresh")
            },
            snapshot: None,
            region_id: None,
        };
        let cards = vec![
            card(0, "GPU-12345678-1234-1234-1234-123456789abc"),
            card(1, "GPU-bbbb"),
            card(2, "GPU-cccc"),
        ];
        let view = crate::collect::fixtures::view(vec![slice], Ok(cards));
        let text = render(&view, &Counters::default(), None, 0.0);
        let caps: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpuslice_slice_memory_limit_bytes{"))
            .collect();
        assert_eq!(
            caps,
            [
                "gpuslice_slice_memory_limit_bytes{slice=\"fresh\",uuid=\"GPU-12345678-1234-1234-1234-123456789abc\",index=\"0\"} 2147483648",
                "gpuslice_slice_memory_limit_bytes{slice=\"fresh\",uuid=\"GPU-bbbb\",index=\"1\"} 1073741824",
            ]
        );
        assert!(
            !text.contains("gpuslice_slice_memory_ledger_bytes{"),
            "{text}"
        );
    }

    #[test]
    fn an_oversubscribed_devices_host_bytes_are_labelled_with_the_device() {
        const MIB: u64 = 1 << 20;
        let mut region = crate::collect::fixtures::one_device_region("GPU-a", 1 << 30, vec![]);
        let mut host = region.devices[0].clone();
        host.id = gpuslice_common::region::DeviceId::from_index(1).unwrap();
        host.uuid = "host:GPU-a".into();
        host.memory_limit = Some(2 << 30);
        host.used_bytes = 768 * MIB;
        region.devices.push(host);
        let slice = SliceState {
            counters: None,
            found: FoundSlice::named("s"),
            snapshot: Some(region),
            region_id: None,
        };
        let view = crate::collect::fixtures::view(vec![slice], Err("no driver".into()));
        let text = render(&view, &Counters::default(), None, 0.0);
        assert!(
            text.contains("gpuslice_slice_host_memory_limit_bytes{slice=\"s\",uuid=\"GPU-a\",index=\"\"} 2147483648"),
            "{text}"
        );
        assert!(
            text.contains(
                "gpuslice_slice_host_memory_bytes{slice=\"s\",uuid=\"GPU-a\",index=\"\"} 805306368"
            ),
            "{text}"
        );
        assert!(
            !text.contains("host:GPU-a"),
            "never a device of its own: {text}"
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("gpuslice_slice_memory_limit_bytes{"))
                .count(),
            1,
            "{text}"
        );
    }

    /// The measured context cost per device and the limit file's bound per slice, side by
    /// side: a cost above the bound is what an operator raises the bound for.
    #[test]
    fn a_slices_context_cost_is_shown_beside_its_bound() {
        let mut region = crate::collect::fixtures::one_device_region("GPU-a", 1 << 30, vec![]);
        region.devices[0].context_cost = Some(600 << 20);
        let config = parse_limit_file(
            Path::new("s.json"),
            r#"{"version": 1, "context_overhead": "512MiB", "devices": []}"#,
        )
        .unwrap();
        let slice = SliceState {
            counters: None,
            found: FoundSlice {
                config: Some(config),
                ..FoundSlice::named("s")
            },
            snapshot: Some(region),
            region_id: None,
        };
        let view = crate::collect::fixtures::view(vec![slice], Err("no driver".into()));
        let text = render(&view, &Counters::default(), None, 0.0);
        assert!(
            text.contains(
                "gpuslice_slice_context_cost_bytes{slice=\"s\",uuid=\"GPU-a\",index=\"\"} 629145600"
            ),
            "{text}"
        );
        assert!(
            text.contains("gpuslice_slice_context_bound_bytes{slice=\"s\"} 536870912"),
            "{text}"
        );
    }

    /// A slot of a process that exited: its bytes count while the driver still lists its
    /// host PID, and nowhere once the driver has released them.
    #[test]
    fn memory_of_an_exited_process_the_driver_released_is_not_shown() {
        use gpuslice_common::region::{Liveness, ProcessSnapshot, SlotId};
        const MIB: u64 = 1 << 20;
        let process = |pid: u32, bytes: u64, liveness| {
            let mut used_bytes = [0; gpuslice_common::region::MAX_DEVICES];
            used_bytes[0] = bytes;
            ProcessSnapshot {
                slot: SlotId::from_index(pid as usize % 8).unwrap(),
                pid,
                host_pid: pid,
                start_time: 1,
                pid_ns: 1,
                used_bytes,
                contexts: [0; gpuslice_common::region::MAX_DEVICES],
                liveness,
            }
        };
        let render_with = |listed: Vec<(u32, Option<u64>)>| {
            let mut region = crate::collect::fixtures::one_device_region(
                "GPU-a",
                1 << 30,
                vec![
                    process(10, 200 * MIB, Liveness::Alive),
                    process(11, 300 * MIB, Liveness::Stale),
                ],
            );
            region.devices[0].used_bytes = 500 * MIB;
            let slice = SliceState {
                counters: None,
                found: FoundSlice::named("s"),
                snapshot: Some(region),
                region_id: None,
            };
            let card = Card {
                index: 0,
                uuid: "GPU-a".into(),
                total: 1 << 34,
                used: 0,
                free: 1 << 34,
                utilization: None,
                processes: listed,
            };
            let view = crate::collect::fixtures::view(vec![slice], Ok(vec![card]));
            let text = render(&view, &Counters::default(), None, 0.0);
            let value = |name: &str| -> String {
                text.lines()
                    .find(|l| l.starts_with(&format!("{name}{{")))
                    .and_then(|l| l.rsplit(' ').next())
                    .unwrap_or_else(|| panic!("no {name} in {text}"))
                    .to_string()
            };
            (
                value("gpuslice_slice_memory_ledger_bytes"),
                value("gpuslice_slice_memory_ledger_stale_bytes"),
            )
        };
        let held = render_with(vec![(10, Some(200 * MIB)), (11, Some(300 * MIB))]);
        assert_eq!(held, ((500 * MIB).to_string(), (300 * MIB).to_string()));
        let released = render_with(vec![(10, Some(200 * MIB))]);
        assert_eq!(released, ((200 * MIB).to_string(), "0".to_string()));
    }
}
