//! Every problem the agent sees in one view of the node, one line each, with a key that stays
//! the same while the problem lasts (so the watch loop logs a problem when it appears and
//! when it is gone, and `--once` prints them all): processes whose driver bytes the slice's
//! ledger does not account for (a bypass, or the driver's own growth not charged yet), a
//! slice over its cap by the driver's count, slots of exited processes awaiting reaping.
//! A slice's own problems (its files, a broken region) are `FoundSlice::problems`.

use crate::collect::NodeView;
use gpuslice_common::region::Liveness;

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
                let Some(card) = cards.and_then(|c| c.iter().find(|c| c.uuid == device.uuid))
                else {
                    continue;
                };
                let (driver, _) = view.driver_usage(index, card);
                if let Some(limit) = device.memory_limit.filter(|&l| driver > l + tolerance) {
                    out.push(Problem {
                        key: format!("over:{name}:{}", card.uuid),
                        line: format!(
                            "slice {name}: the driver counts {driver} bytes of its processes on device {} ({}), over its cap of {limit} bytes",
                            card.index, card.uuid
                        ),
                    });
                }
            }
        }
        for card in cards.into_iter().flatten() {
            for (pid, driver, ledger) in view.unaccounted(index, card) {
                let line = match ledger {
                    None if driver > tolerance => format!(
                        "slice {name}: process {pid} holds {driver} bytes on device {} ({}) and is not in the slice's ledger (it bypasses the shim)",
                        card.index, card.uuid
                    ),
                    Some(ledger) if driver - ledger > tolerance => format!(
                        "slice {name}: process {pid} holds {driver} bytes on device {} ({}), {} more than its ledger entry (the driver's own growth is charged within seconds; if this lasts, the bytes bypass the shim)",
                        card.index,
                        card.uuid,
                        driver - ledger
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
    use crate::collect::SliceState;
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
        let slice = SliceState {
            counters: None,
            found: FoundSlice::named("a"),
            snapshot: Some(one_device_region("GPU-1", 1024 * MIB, vec![stale])),
        };
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
}
