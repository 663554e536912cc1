//! Oversubscription the operator enables (`--oversubscribe PERCENT`): devices carry it as an
//! attribute a DeviceClass can select, and a prepared claim's limit file gives its GPU a
//! virtual size of PERCENT% of the memory it was allocated, never more card memory.

mod common;

use std::fs;

use common::*;
use gpuslice_common::config::parse_limit_file;
use gpuslice_dra::inventory::Gpu;
use gpuslice_dra::model::{Model, Oversubscription};
use gpuslice_dra::prepare::{ClaimRef, Preparer};
use gpuslice_dra::publish::{desired_slices, Layout};

fn oversubscribed(percent: Option<u32>) -> Vec<Gpu> {
    gpus()
        .into_iter()
        .map(|gpu| Gpu {
            oversubscription: percent.map(|percent| Oversubscription { percent }),
            ..gpu
        })
        .collect()
}

#[test]
fn an_oversubscribed_product_is_told_its_virtual_size_and_holds_its_share() {
    let scratch = Scratch::new("oversubscribed");
    let p = Preparer::new(settings(&scratch, false), oversubscribed(Some(150)));
    let uid = "0b9f4c1e-1111-4000-8000-0000000000a1";
    let claim = claim("team-a", "claim-o", uid, &[ours("slice", "gpu-0-25-a")]);
    p.prepare(
        &ClaimRef {
            namespace: "team-a".into(),
            name: "claim-o".into(),
            uid: uid.into(),
        },
        &claim,
    )
    .expect("prepared");
    let limits = p.claim_dir(uid).join("limits.json");
    let config = parse_limit_file(&limits, &fs::read_to_string(&limits).unwrap()).unwrap();
    assert_eq!(config.devices[0].memory_limit, Some(8 * GIB));
    assert_eq!(config.devices[0].virtual_memory, Some(12 * GIB));
}

#[test]
fn devices_carry_the_oversubscription_only_where_the_operator_enabled_it() {
    let attributes = |gpus: &[Gpu]| {
        let slices = desired_slices(
            "gpuslice.dev",
            NODE,
            gpus,
            Model::Products,
            Layout::Split,
            1,
            &Default::default(),
            false,
        );
        slices
            .into_iter()
            .flat_map(|(_, spec)| spec.devices.unwrap_or_default())
            .map(|d| (d.name, d.attributes.unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    for (name, attrs) in attributes(&oversubscribed(Some(150))) {
        assert_eq!(
            attrs["oversubscriptionPercent"].int,
            Some(150),
            "{name}: {attrs:?}"
        );
        let share = attrs["share"].int.unwrap() as u64;
        assert_eq!(
            attrs["virtualMemory"].int,
            Some((32 * GIB * share / 100 * 3 / 2) as i64),
            "{name}"
        );
    }
    for (name, attrs) in attributes(&oversubscribed(None)) {
        assert!(
            !attrs.contains_key("oversubscriptionPercent") && !attrs.contains_key("virtualMemory"),
            "{name}: off by default"
        );
    }
}
