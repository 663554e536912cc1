//! How the node's GPUs are offered, and what an allocated device of ours means.
//!
//! Three models, chosen by `--model`:
//! * **products** (Kube-DC's way of selling): every GPU `i` is offered as fixed products,
//!   four 25% devices `gpu-i-25-a..d`, two 50% devices `gpu-i-50-a..b` and one 100% device
//!   `gpu-i-100`, each consuming its share of the card's shared counters (`memory`, `compute`)
//!   so the scheduler never hands out more than one card (partitionable devices:
//!   `DRAPartitionableDevices`, alpha in Kubernetes 1.33-1.35, beta and on by default in 1.36).
//! * **capacity**: one device `gpu-i` per GPU with `allowMultipleAllocations` and consumable
//!   capacities `memory` (bytes) and `compute` (percent); a claim asks for an amount
//!   (`DRAConsumableCapacity`, alpha in Kubernetes 1.34-1.35, beta in 1.36).
//! * **units**, which needs no feature gate: every GPU as [`UNITS_PER_GPU`] equal, ordinary
//!   devices `gpu-i-unit-a..d` (25% each). A larger slice is a claim for a count of units
//!   constrained to one card (`matchAttribute: gpuslice.dev/uuid`). Each unit is allocated to
//!   one claim at most, so the scheduler of any 1.34+ cluster cannot promise more than a card.
//!
//! Oversubscription is the operator's to enable (`--oversubscribe PERCENT`, off by default):
//! every device of the node then carries the attribute `oversubscriptionPercent` (and the
//! fixed-size ones `virtualMemory`), and a prepared claim's limit file gives each GPU a
//! `virtual` size of PERCENT% of its memory. A DeviceClass selects (or excludes) such devices
//! by the attribute; the card still holds at most the memory the claim was allocated.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// Which model the node's GPUs are published in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Model {
    Products,
    Capacity,
    Units,
}

impl Model {
    /// The feature gate the model's fields need on the API server and scheduler (`None`: the
    /// model needs none).
    pub fn feature_gate(self) -> Option<&'static str> {
        match self {
            Model::Products => Some("DRAPartitionableDevices"),
            Model::Capacity => Some("DRAConsumableCapacity"),
            Model::Units => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Model::Products => "products",
            Model::Capacity => "capacity",
            Model::Units => "units",
        }
    }
}

/// Opt-in oversubscription of a node's devices: a claim's virtual size is `percent`% of the
/// memory it is allocated (101..=1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Oversubscription {
    pub percent: u32,
}

impl Oversubscription {
    /// Parses `--oversubscribe`: a whole percentage above 100, at most 1000 (a trailing `%`
    /// is allowed).
    pub fn parse(text: &str) -> Result<Oversubscription, String> {
        match text.trim().trim_end_matches('%').trim().parse::<u32>() {
            Ok(percent @ 101..=1000) => Ok(Oversubscription { percent }),
            _ => Err(format!(
                "{text:?} is not an oversubscription; give the virtual size as a percentage of the physical one, 101..=1000 (150: a 8 GiB slice is told 12 GiB)"
            )),
        }
    }

    /// The virtual size of `memory`: `percent`% of it, rounded down to whole MiB, never below
    /// `memory`.
    pub fn virtual_memory(self, memory: u64) -> u64 {
        const MIB: u64 = 1 << 20;
        let exact = (memory as u128 * self.percent as u128 / 100).min(u64::MAX as u128) as u64;
        (exact / MIB * MIB).max(memory)
    }
}

/// Units per GPU in the gate-free model; a unit is `100 / UNITS_PER_GPU` percent of the card.
pub const UNITS_PER_GPU: u32 = 4;
/// The share (percent) of one unit.
pub const UNIT_SHARE: u32 = 100 / UNITS_PER_GPU;

/// The fixed products: (share in percent, devices per GPU).
pub const PRODUCTS: [(u32, u32); 3] = [(25, 4), (50, 2), (100, 1)];

/// Memory of a product: `share`% of the card, rounded down to whole MiB (so the products of
/// one card never add up to more than the card).
pub fn product_memory(card_bytes: u64, share: u32) -> u64 {
    const MIB: u64 = 1 << 20;
    let exact = (card_bytes as u128 * share as u128 / 100) as u64;
    exact / MIB * MIB
}

/// The device names of the products of GPU `index`, with their shares.
pub fn product_devices(index: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for (share, count) in PRODUCTS {
        if count == 1 {
            out.push((format!("gpu-{index}-{share}"), share));
        } else {
            for n in 0..count {
                let letter = char::from(b'a' + n as u8);
                out.push((format!("gpu-{index}-{share}-{letter}"), share));
            }
        }
    }
    out
}

/// The device names of the units of GPU `index` (units model).
pub fn unit_devices(index: u32) -> Vec<String> {
    (0..UNITS_PER_GPU)
        .map(|n| format!("gpu-{index}-unit-{}", char::from(b'a' + n as u8)))
        .collect()
}

/// The device name of GPU `index` in the capacity model.
pub fn capacity_device(index: u32) -> String {
    format!("gpu-{index}")
}

/// What a device name of ours stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceName {
    /// A fixed product: `share`% of GPU `gpu`.
    Product { gpu: u32, share: u32 },
    /// A whole GPU whose capacity is consumed by amount (capacity model).
    Consumable { gpu: u32 },
    /// One unit ([`UNIT_SHARE`]%) of GPU `gpu` (units model).
    Unit { gpu: u32 },
}

impl DeviceName {
    /// The GPU index the device is on.
    pub fn gpu(self) -> u32 {
        match self {
            DeviceName::Product { gpu, .. }
            | DeviceName::Consumable { gpu }
            | DeviceName::Unit { gpu } => gpu,
        }
    }
}

/// Parses `gpu-I`, `gpu-I-100`, `gpu-I-SHARE-L` or `gpu-I-unit-L`; `None` for anything else
/// (including a share or letter that no product or unit has).
pub fn parse_device_name(name: &str) -> Option<DeviceName> {
    let rest = name.strip_prefix("gpu-")?;
    if let Some((gpu_text, _)) = rest.split_once("-unit-") {
        let gpu: u32 = gpu_text.parse().ok()?;
        return (gpu_text.len() <= 4
            && gpu_text.bytes().all(|b| b.is_ascii_digit())
            && unit_devices(gpu).iter().any(|known| known == name))
        .then_some(DeviceName::Unit { gpu });
    }
    let mut parts = rest.split('-');
    let gpu_text = parts.next()?;
    if gpu_text.is_empty() || !gpu_text.bytes().all(|b| b.is_ascii_digit()) || gpu_text.len() > 4 {
        return None;
    }
    let gpu: u32 = gpu_text.parse().ok()?;
    let Some(share_text) = parts.next() else {
        return Some(DeviceName::Consumable { gpu });
    };
    let share: u32 = share_text.parse().ok()?;
    let letter = parts.next();
    if parts.next().is_some() {
        return None;
    }
    product_devices(gpu)
        .iter()
        .any(|(known, _)| known == name)
        .then_some(DeviceName::Product { gpu, share })
        .filter(|_| letter.is_some() || share == 100)
}

/// Memory (bytes) and compute (percent) one allocated device of the capacity model consumes,
/// from the allocation result's `consumedCapacity`.
pub fn consumed(consumed: Option<&BTreeMap<String, Quantity>>) -> Result<(u64, u32), String> {
    let consumed = consumed.ok_or_else(|| {
        "the allocation has no consumedCapacity (the capacity model needs the \
         DRAConsumableCapacity feature gate on the API server and scheduler)"
            .to_string()
    })?;
    let get = |name: &str| {
        consumed
            .get(name)
            .ok_or_else(|| format!("consumedCapacity has no {name:?}"))
            .and_then(|q| {
                quantity::parse(&q.0).map_err(|e| format!("consumedCapacity.{name}: {e}"))
            })
    };
    let memory = get("memory")?;
    let compute = get("compute")?;
    let compute = u32::try_from(compute)
        .map_err(|_| format!("consumedCapacity.compute {compute} is not a percentage"))?;
    Ok((memory, compute))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversubscription_is_a_bounded_percentage() {
        let over = Oversubscription::parse("150%").unwrap();
        assert_eq!(over.virtual_memory(8 << 30), 12 << 30);
        assert_eq!(
            over.virtual_memory((1 << 20) + 1),
            (1 << 20) + 1,
            "never below"
        );
        for bad in ["100", "0", "1001", "1.5", "lots", ""] {
            assert!(Oversubscription::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn product_names_round_trip() {
        let names = product_devices(3);
        assert_eq!(names.len(), 7);
        for (name, share) in names {
            assert_eq!(
                parse_device_name(&name),
                Some(DeviceName::Product { gpu: 3, share }),
                "{name}"
            );
        }
        assert_eq!(
            parse_device_name(&capacity_device(2)),
            Some(DeviceName::Consumable { gpu: 2 })
        );
        for name in unit_devices(5) {
            assert_eq!(
                parse_device_name(&name),
                Some(DeviceName::Unit { gpu: 5 }),
                "{name}"
            );
        }
    }

    #[test]
    fn unknown_names_are_refused() {
        for name in [
            "gpu-",
            "gpu-0-30-a",
            "gpu-0-25-e",
            "gpu-0-25",
            "gpu-0-100-a",
            "gpu-x",
            "cpu-0",
            "gpu-0-25-a-b",
            "gpu-+1",
            "gpu-0-unit-e",
            "gpu-0-unit-",
            "gpu--unit-a",
            "gpu-+0-unit-a",
            "gpu-0-unit-a-b",
        ] {
            assert_eq!(parse_device_name(name), None, "{name}");
        }
    }

    #[test]
    fn products_never_exceed_the_card() {
        for card in [
            32u64 << 30,
            34_089_730_048,
            16_945_709_056,
            (80 << 30) + 12345,
        ] {
            for (share, count) in PRODUCTS {
                assert!(product_memory(card, share) * count as u64 <= card);
            }
        }
        assert_eq!(product_memory(32 << 30, 25), 8 << 30);
    }
}
