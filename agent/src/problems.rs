//! Every problem the agent sees in one view of the node, one line each, with a key that stays
//! the same while the problem lasts (so the watch loop logs a problem when it appears and
//! when it is gone, and `--once` prints them all): processes whose driver bytes the slice's
//! ledger does not account for (a bypass, or a registered process beyond its entry plus the
//! bound on what the driver places by itself), a slice over its cap by the driver's count, a
//! region whose words a process of the slice wrote (a limit above the limit file's, a slot
//! naming a process that is not the slice's), slots of exited processes awaiting reaping. A
//! slice's own problems (its files, a broken region) are `FoundSlice::problems`.

use crate::backstop::UNACCOUNTED_FOR;
use crate::collect::{CapSource, Ledger, NodeView};
use gpuslice_common::region::Liveness;
use gpuslice_common::unpriced::UNPRICED_BOUND_BYTES;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub line: String,
}

/// The problems of `view`; `tolerance` as the backstop's.
pub fn problems(view: &NodeView, tolerance: u64) -> Vec<Problem> {
    let mut out = Vec::new();
    let cards = view.cards.as_ref().ok();
    for (index, slice) in view.slices.iter().enumerate() {
        let name = &slice.found.name;
        if let Some(snapshot) = &slice.snapshot {
            let stale: Vec<_> = snapshot
                .processes
                .iter()
                .filter(|p| p.liveness == Liveness::Stale)
                .collect();
            let bytes: u64 = stale.iter().map(|p| p.used_bytes.iter().sum::<u64>()).sum();
            if !stale.is_empty() {
                out.push(Problem {
                    key: format!("stale:{name}"),
                    line: format!(
                        "slice {name}: {} slots of exited processes hold {bytes} bytes of its ledger until a process of the slice reaps them",
                        stale.len()
                    ),
                });
            }
            for device in &snapshot.devices {
                if let Some((word, cap)) = view.raised_limit(index, &device.uuid) {
                    out.push(Problem {
                        key: format!("limit:{name}:{}", device.uuid),
                        line: format!(
                            "slice {name}: its region's limit word for device {} allows {word} bytes, more than its limit file's {cap}: a process of the slice wrote it (or the file was lowered since its processes started); the backstop judges against the file",
                            device.uuid
                        ),
                    });
                }
            }
        }
        for (_, slot, pid) in view.forged.iter().filter(|(i, _, _)| *i == index) {
            out.push(Problem {
                key: format!("forged:{name}:{}", slot.index()),
                line: format!(
                    "slice {name}: slot {} of its region names process {pid}, which maps no region of the slice and has none of its mounts: not the slice's, ignored (a process of the slice wrote the slot)",
                    slot.index()
                ),
            });
        }
        for card in cards.into_iter().flatten() {
            let cap = view.cap(index, &card.uuid);
            let (driver, _) = view.driver_usage(index, card);
            if let Some((limit, source)) =
                cap.filter(|&(l, _)| driver > l.saturating_add(tolerance))
            {
                let from = match source {
                    CapSource::LimitFile => "",
                    CapSource::Region => " (as bound in its region: no limit file found)",
                };
                out.push(Problem {
                    key: format!("over:{name}:{}", card.uuid),
                    line: format!(
                        "slice {name}: the driver counts {driver} bytes of its processes on device {} ({}), over its cap of {limit} bytes{from}",
                        card.index, card.uuid
                    ),
                });
            }
            for member in view.members(index, card) {
                let (pid, driver) = (member.pid, member.driver);
                let line = match member.ledger {
                    Ledger::Unregistered if driver > tolerance => format!(
                        "slice {name}: process {pid} holds {driver} bytes on device {} ({}) and is not in the slice's ledger (it bypasses the shim)",
                        card.index, card.uuid
                    ),
                    Ledger::Entry(entry) if cap.is_some() && member.unaccounted() > 0 => format!(
                        "slice {name}: process {pid} holds {driver} bytes on device {} ({}), {} more than its ledger entry, beyond the {UNPRICED_BOUND_BYTES}-byte bound on memory the driver places by itself: bytes that bypass the shim (with --enforce it is ended once this has lasted {} s)",
                        card.index,
                        card.uuid,
                        driver - entry,
                        UNACCOUNTED_FOR.as_secs()
                    ),
                    _ => continue,
                };
                out.push(Problem {
                    key: format!("unaccounted:{name}:{pid}:{}", card.uuid),
                    line,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::fixtures::{self, one_device_region};
    use crate::discovery::FoundSlice;
    use crate::driver::Card;
    use gpuslice_common::region::{ProcessSnapshot, SlotId, MAX_DEVICES};

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_bypass_an_over_cap_slice_and_stale_slots_are_one_line_each() {
        let stale = ProcessSnapshot {
            slot: SlotId::from_index(1).unwrap(),
            pid: 5,
            host_pid: 5,
            start_time: 0,
            pid_ns: 0,
            used_bytes: [MIB; MAX_DEVICES],
            contexts: [0; MAX_DEVICES],
            liveness: Liveness::Stale,
        };
        let slice = fixtures::slice(
            FoundSlice::named("a"),
            Some(one_device_region("GPU-1", 1024 * MIB, vec![stale])),
        );
        let mut used = [0; MAX_DEVICES];
        used[0] = 900 * MIB;
        let card = Card {
            index: 0,
            uuid: "GPU-1".into(),
            total: 16384 * MIB,
            used: 0,
            free: 0,
            utilization: None,
            // 10: in the ledger; 11: in the slice's container, not registered.
            processes: vec![(10, Some(900 * MIB)), (11, Some(400 * MIB))],
        };
        let view = NodeView {
            owner: [(10, 0), (11, 0)].into_iter().collect(),
            ledger: [(10, (0, used))].into_iter().collect(),
            ..fixtures::view(vec![slice], Ok(vec![card]))
        };
        let found = problems(&view, 64 * MIB);
        let keys: Vec<&str> = found.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["stale:a", "over:a:GPU-1", "unaccounted:a:11:GPU-1"],
            "{found:?}"
        );
        assert!(found[2].line.contains("process 11 holds 419430400 bytes"));
        // A broken region's holder is that problem, not a bypass.
        let mut broken = view.clone();
        broken.broken.push((0, 11, "/r (deleted)".into()));
        assert!(!problems(&broken, 64 * MIB)
            .iter()
            .any(|p| p.key.starts_with("unaccounted")));
    }

    #[test]
    fn a_registered_surplus_past_the_bound_and_written_region_words_are_one_line_each() {
        const UUID: &str = "GPU-12345678-1234-1234-1234-123456789abc";
        let slice = fixtures::slice(
            FoundSlice {
                // The file caps the card at 1 GiB; the region's word says 4 GiB.
                config: Some(
                    gpuslice_common::config::parse_limit_file(
                        std::path::Path::new("a.json"),
                        r#"{"version": 1, "region": "/r/a.region", "devices": [{"uuid": "GPU-12345678-1234-1234-1234-123456789abc", "memory": "1GiB"}]}"#,
                    )
                    .unwrap(),
                ),
                ..FoundSlice::named("a")
            },
            Some(one_device_region(UUID, 4096 * MIB, Vec::new())),
        );
        let entry = |bytes| {
            let mut used = [0; MAX_DEVICES];
            used[0] = bytes;
            used
        };
        let card = Card {
            index: 0,
            uuid: UUID.into(),
            total: 16384 * MIB,
            used: 0,
            free: 0,
            utilization: None,
            // 10: 100 MiB beyond its entry; 11: within the bound.
            processes: vec![
                (10, Some(300 * MIB)),
                (11, Some(200 * MIB + UNPRICED_BOUND_BYTES)),
            ],
        };
        let view = NodeView {
            owner: [(10, 0), (11, 0)].into_iter().collect(),
            ledger: [(10, (0, entry(200 * MIB))), (11, (0, entry(200 * MIB)))]
                .into_iter()
                .collect(),
            forged: vec![(0, SlotId::from_index(3).unwrap(), 77)],
            ..fixtures::view(vec![slice], Ok(vec![card]))
        };
        let found = problems(&view, 64 * MIB);
        let keys: Vec<String> = found.iter().map(|p| p.key.clone()).collect();
        assert_eq!(
            keys,
            [
                format!("limit:a:{UUID}"),
                "forged:a:3".into(),
                format!("unaccounted:a:10:{UUID}"),
            ],
            "{found:?}"
        );
        assert!(
            found[2]
                .line
                .contains("104857600 more than its ledger entry"),
            "{found:?}"
        );
    }
}
