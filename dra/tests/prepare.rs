//! The functional core: an allocated claim becomes a limit file, a region directory and a CDI
//! spec that the shim and the container runtime read; repeated and restarted prepares return
//! the same answer without rewriting; unprepare waits for the slice's processes; bad claims
//! get errors that name what is wrong.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::*;
use gpuslice_common::config::{parse_limit_file, DeviceSelector};
use gpuslice_common::region::Region;
use gpuslice_dra::prepare::{ClaimRef, Preparer};
use serde_json::Value;

fn want(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

fn preparer(scratch: &Scratch) -> Preparer {
    Preparer::new(settings(scratch, true), gpus())
}

/// With `--host-pid-dir`, a claim's spec mounts the broker's directory read-only where the
/// shim asks; while the directory is missing (the agent not started since a reboot emptied
/// /run) the spec leaves it out, since a runtime refuses a container whose mount source is
/// missing: the container starts, and its processes measure their host PIDs.
#[test]
fn the_host_pid_broker_is_mounted_only_while_its_directory_exists() {
    let scratch = Scratch::new("broker");
    let node = scratch.path().join("node");
    let mut settings = settings(&scratch, false);
    settings.host_pid_dir = Some(node.clone());
    let p = Preparer::new(settings, gpus());
    let broker_mount = |uid: &str| {
        let claim = claim(
            "team-a",
            &format!("claim-{uid}"),
            uid,
            &[ours("slice", "gpu-1-25-c")],
        );
        p.prepare(&want(uid), &claim).expect("prepared");
        let spec: Value = serde_json::from_slice(&fs::read(p.spec_path(uid)).unwrap()).unwrap();
        spec["devices"][0]["containerEdits"]["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["containerPath"] == "/run/gpuslice/node")
            .cloned()
    };
    assert_eq!(broker_mount("0b9f4c1e-2222-4000-8000-000000000001"), None);
    fs::create_dir(&node).unwrap();
    let mount = broker_mount("0b9f4c1e-2222-4000-8000-000000000002").expect("mounted");
    assert_eq!(mount["hostPath"], node.to_str().unwrap());
    assert_eq!(mount["options"][0], "ro");
}

/// The node's bound on a context's cost reaches every claim's limit file, where the shim
/// reads it (the environment cannot change it under an anchored file).
#[test]
fn the_nodes_context_bound_is_written_into_each_limit_file() {
    for bound in [None, Some(768 << 20)] {
        let scratch = Scratch::new("bound");
        let mut settings = settings(&scratch, false);
        settings.context_bound = bound;
        let p = Preparer::new(settings, gpus());
        let uid = "0b9f4c1e-3333-4000-8000-000000000001";
        let claim = claim("team-a", "claim-b", uid, &[ours("slice", "gpu-1-25-c")]);
        p.prepare(&want(uid), &claim).expect("prepared");
        let limits = p.claim_dir(uid).join("limits.json");
        let text = fs::read_to_string(&limits).unwrap();
        let config = parse_limit_file(&limits, &text).unwrap();
        assert_eq!(config.context_bound, bound, "{text}");
        assert_eq!(text.contains("context_overhead"), bound.is_some(), "{text}");
    }
}

#[test]
fn a_quarter_product_becomes_an_8gib_25_percent_slice_with_its_cdi_spec() {
    let scratch = Scratch::new("quarter");
    let p = preparer(&scratch);
    let uid = "0b9f4c1e-1111-4000-8000-000000000001";
    let claim = claim("team-a", "claim-x", uid, &[ours("slice", "gpu-1-25-c")]);
    let devices = p.prepare(&want(uid), &claim).expect("prepared");

    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].pool_name, NODE);
    assert_eq!(devices[0].device_name, "gpu-1-25-c");
    assert_eq!(devices[0].request_names, vec!["slice".to_string()]);
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![
            format!("gpuslice.dev/claim={uid}"),
            format!("nvidia.com/gpu={UUID1}")
        ]
    );

    // The limit file, as the shim parses it.
    let dir = p.claim_dir(uid);
    let limits = dir.join("limits.json");
    let config = parse_limit_file(&limits, &fs::read_to_string(&limits).unwrap()).unwrap();
    assert_eq!(config.devices.len(), 1);
    assert_eq!(
        config.devices[0].selector,
        DeviceSelector::Uuid(UUID1.into())
    );
    assert_eq!(config.devices[0].memory_limit, Some(8 * GIB));
    assert_eq!(config.devices[0].compute_percent, Some(25));
    assert_eq!(
        config.region_path.as_deref(),
        Some(std::path::Path::new("/var/run/gpuslice/slice.region"))
    );
    // The region exists, initialised, for processes of any user in the container.
    let region = dir.join("region/slice.region");
    assert_eq!(fs::metadata(&region).unwrap().mode() & 0o777, 0o666);
    Region::open_existing(&region).expect("an initialised region");

    // The CDI spec: one device named after the claim, mounting those files.
    let spec: Value = serde_json::from_slice(&fs::read(p.spec_path(uid)).unwrap()).unwrap();
    assert_eq!(spec["kind"], "gpuslice.dev/claim");
    assert_eq!(spec["devices"][0]["name"], uid);
    let mounts = spec["devices"][0]["containerEdits"]["mounts"]
        .as_array()
        .unwrap();
    let mount = |container: &str| {
        mounts
            .iter()
            .find(|m| m["containerPath"] == container)
            .unwrap_or_else(|| panic!("no mount at {container}: {spec}"))
            .clone()
    };
    assert_eq!(
        mount("/etc/gpuslice/limits.json")["hostPath"],
        limits.to_str().unwrap()
    );
    assert!(mount("/etc/gpuslice/limits.json")["options"]
        .as_array()
        .unwrap()
        .contains(&Value::from("ro")));
    assert_eq!(
        mount("/var/run/gpuslice")["hostPath"],
        dir.join("region").to_str().unwrap()
    );
    assert_eq!(
        fs::read_to_string(mount("/etc/ld.so.preload")["hostPath"].as_str().unwrap()).unwrap(),
        "/usr/lib/gpuslice/libgpuslice.so\n"
    );
    // The front loads its core from its own directory: both files are mounted side by side.
    assert!(mount("/usr/lib/gpuslice/libgpuslice_core.so")["hostPath"]
        .as_str()
        .unwrap()
        .ends_with("/libgpuslice_core.so"));
}

#[test]
fn consumed_capacity_becomes_the_slice_and_one_claim_over_two_gpus_is_one_slice() {
    let scratch = Scratch::new("capacity");
    let p = Preparer::new(settings(&scratch, false), gpus());
    let uid = "0b9f4c1e-2222-4000-8000-000000000002";
    let mut a = ours("a", "gpu-0");
    a.consumed = Some(("12Gi", "30"));
    let mut b = ours("b", "gpu-1");
    b.consumed = Some(("1536Mi", "100"));
    let devices = p
        .prepare(&want(uid), &claim("team-a", "c", uid, &[a, b]))
        .unwrap();
    // Without NVIDIA's CDI spec only the slice; once per request.
    assert_eq!(
        devices[0].cdi_device_ids,
        vec![format!("gpuslice.dev/claim={uid}")]
    );
    assert_eq!(
        devices[1].cdi_device_ids,
        vec![format!("gpuslice.dev/claim={uid}")]
    );
    let limits = p.claim_dir(uid).join("limits.json");
    let config = parse_limit_file(&limits, &fs::read_to_string(&limits).unwrap()).unwrap();
    let by_uuid = |uuid: &str| {
        config
            .devices
            .iter()
            .find(|d| d.selector == DeviceSelector::Uuid(uuid.into()))
            .unwrap()
            .clone()
    };
    assert_eq!(by_uuid(UUID0).memory_limit, Some(12 * GIB));
    assert_eq!(by_uuid(UUID0).compute_percent, Some(30));
    assert_eq!(by_uuid(UUID1).memory_limit, Some(1536 << 20));
    // 100% is "not throttled".
    assert_eq!(by_uuid(UUID1).compute_percent, None);
}

#[test]
fn two_products_of_one_card_in_one_request_give_each_cdi_device_once() {
    let scratch = Scratch::new("twice");
    let p = preparer(&scratch);
    let uid = "0b9f4c1e-6666-4000-8000-000000000006";
    let c = claim(
        "team-a",
        "half",
        uid,
        &[
            ours("gpu", "gpu-0-25-a"),
            ours("gpu", "gpu-0-25-b"),
            ours("other", "gpu-0-25-c"),
        ],
    );
    let devices = p.prepare(&want(uid), &c).unwrap();
    let slice = format!("gpuslice.dev/claim={uid}");
    let gpu = format!("nvidia.com/gpu={UUID0}");
    assert_eq!(devices[0].cdi_device_ids, vec![slice.clone(), gpu.clone()]);
    assert!(devices[1].cdi_device_ids.is_empty(), "{devices:?}");
    // Another request of the claim: a container naming only it still gets both.
    assert_eq!(devices[2].cdi_device_ids, vec![slice, gpu]);
    let limits = p.claim_dir(uid).join("limits.json");
    let config = parse_limit_file(&limits, &fs::read_to_string(&limits).unwrap()).unwrap();
    assert_eq!(config.devices[0].memory_limit, Some(24 * GIB));
    assert_eq!(config.devices[0].compute_percent, Some(75));
}

#[test]
fn prepare_is_idempotent_and_survives_a_restart_without_rewriting() {
    let scratch = Scratch::new("idempotent");
    let uid = "0b9f4c1e-3333-4000-8000-000000000003";
    let c = claim("team-a", "shared", uid, &[ours("slice", "gpu-0-50-a")]);
    let first = preparer(&scratch).prepare(&want(uid), &c).unwrap();
    let p = preparer(&scratch);
    let limits = p.claim_dir(uid).join("limits.json");
    let spec = p.spec_path(uid);
    let inodes = (
        fs::metadata(&limits).unwrap().ino(),
        fs::metadata(&spec).unwrap().ino(),
    );
    // A new Preparer is a restarted plugin: it knows the claim from its checkpoint.
    assert_eq!(p.prepared(), vec![want(uid)]);
    // The second pod of a shared claim, or the kubelet retrying: same answer, same files.
    let again = p.prepare(&want(uid), &c).unwrap();
    assert_eq!(again, first);
    assert_eq!(
        (
            fs::metadata(&limits).unwrap().ino(),
            fs::metadata(&spec).unwrap().ino()
        ),
        inodes,
        "a prepared claim's files were rewritten"
    );
    assert_eq!(fs::read_dir(scratch.path().join("cdi")).unwrap().count(), 1);
}

#[test]
fn unprepare_waits_for_the_slice_processes_then_removes_everything() {
    let scratch = Scratch::new("unprepare");
    let p = preparer(&scratch);
    let uid = "0b9f4c1e-4444-4000-8000-000000000004";
    let other = "0b9f4c1e-4444-4000-8000-00000000000f";
    p.prepare(
        &want(uid),
        &claim("team-a", "x", uid, &[ours("r", "gpu-0-25-a")]),
    )
    .unwrap();
    p.prepare(
        &want(other),
        &claim("team-a", "y", other, &[ours("r", "gpu-0-25-b")]),
    )
    .unwrap();

    // A process of the slice maps its region (what the shim does in a container).
    let region_path = p.claim_dir(uid).join("region/slice.region");
    let region = Region::open_or_create(&region_path).unwrap();
    let error = p.unprepare(uid).unwrap_err();
    assert!(error.contains("still in use"), "{error}");
    assert!(p.spec_path(uid).exists() && region_path.exists());

    drop(region);
    p.unprepare(uid).unwrap();
    assert!(!p.spec_path(uid).exists());
    assert!(!p.claim_dir(uid).exists());
    // Again (the kubelet retries): still success. The other claim is untouched.
    p.unprepare(uid).unwrap();
    assert!(p.spec_path(other).exists());
    assert_eq!(p.prepared(), vec![want(other)]);
}

#[test]
fn bad_claims_get_errors_naming_what_is_wrong() {
    let scratch = Scratch::new("bad");
    let p = preparer(&scratch);
    let uid = "0b9f4c1e-5555-4000-8000-000000000005";
    let check = |allocs: &[Alloc], expect: &[&str]| {
        let error = p
            .prepare(&want(uid), &claim("team-a", "bad", uid, allocs))
            .unwrap_err();
        for part in expect {
            assert!(error.contains(part), "{error:?} lacks {part:?}");
        }
        assert!(error.contains(uid), "{error}");
        assert!(!p.claim_dir(uid).exists() && !p.spec_path(uid).exists());
    };
    let mut other_node = ours("r", "gpu-0-25-a");
    other_node.pool = "gpu-node-2";
    check(&[other_node], &["gpu-0-25-a", "gpu-node-2", "another node"]);
    check(
        &[ours("r", "gpu-7-25-a")],
        &["GPU 7", "does not have", "2 GPUs"],
    );
    let mut too_big = ours("r", "gpu-0");
    too_big.consumed = Some(("40Gi", "10"));
    check(&[too_big], &["40Gi", "has only 32Gi"]);
    let mut too_much_compute = ours("r", "gpu-0");
    too_much_compute.consumed = Some(("1Gi", "150"));
    check(&[too_much_compute], &["150%"]);
    check(
        &[ours("a", "gpu-0-50-a"), ours("b", "gpu-0-100")],
        &["48Gi", "has only 32Gi"],
    );
    check(
        &[ours("r", "gpu-0-33-a")],
        &["not a device this driver publishes"],
    );
    let mut foreign = ours("r", "gpu-0-25-a");
    foreign.driver = "gpu.nvidia.com";
    check(&[foreign], &["no device of driver gpuslice.dev"]);
    check(&[], &["no device of driver"]);
    let mut unallocated = claim("team-a", "bad", uid, &[]);
    unallocated.status = None;
    let error = p.prepare(&want(uid), &unallocated).unwrap_err();
    assert!(error.contains("not allocated"), "{error}");
    // The API server's claim of that name is another one (deleted and recreated).
    let replaced = claim(
        "team-a",
        "bad",
        "0b9f4c1e-9999-4000-8000-000000000009",
        &[ours("r", "gpu-0-25-a")],
    );
    let error = p.prepare(&want(uid), &replaced).unwrap_err();
    assert!(error.contains("replaced"), "{error}");
    // A UID that is not one never becomes a path.
    let error = p.unprepare("../../etc").unwrap_err();
    assert!(error.contains("not a UID"), "{error}");
}

#[test]
fn units_add_up_per_card_and_the_guard_fails_closed_on_an_unreadable_ledger() {
    let scratch = Scratch::new("units");
    let p = preparer(&scratch);
    let a = "0b9f4c1e-7777-4000-8000-00000000000a";
    let b = "0b9f4c1e-7777-4000-8000-00000000000b";
    let c = "0b9f4c1e-7777-4000-8000-00000000000c";
    // Three units of GPU 1 (count 3, matchAttribute uuid): 24 GiB and 75%.
    p.prepare(
        &want(a),
        &claim(
            "team-a",
            "three",
            a,
            &[
                ours("gpu", "gpu-1-unit-a"),
                ours("gpu", "gpu-1-unit-b"),
                ours("gpu", "gpu-1-unit-c"),
            ],
        ),
    )
    .unwrap();
    let limits = p.claim_dir(a).join("limits.json");
    let config = parse_limit_file(&limits, &fs::read_to_string(&limits).unwrap()).unwrap();
    assert_eq!(config.devices[0].memory_limit, Some(24 * GIB));
    assert_eq!(config.devices[0].compute_percent, Some(75));
    // The same unit again (a stale slice, a scheduler bug): refused.
    let error = p
        .prepare(
            &want(b),
            &claim(
                "team-b",
                "two",
                b,
                &[ours("gpu", "gpu-1-unit-c"), ours("gpu", "gpu-1-unit-d")],
            ),
        )
        .unwrap_err();
    assert!(
        error.contains("16Gi and 50%") && error.contains("claim-"),
        "{error}"
    );
    // Consumed capacity over the card with what is prepared: refused too.
    let mut big = ours("r", "gpu-1");
    big.consumed = Some(("12Gi", "10"));
    let error = p
        .prepare(&want(c), &claim("team-c", "big", c, &[big]))
        .unwrap_err();
    assert!(error.contains("36Gi and 85%"), "{error}");
    // A prepared claim's limit file is unreadable: nothing more is prepared on trust.
    fs::write(&limits, b"{ not json").unwrap();
    let error = p
        .prepare(
            &want(b),
            &claim("team-b", "one", b, &[ours("gpu", "gpu-0-unit-a")]),
        )
        .unwrap_err();
    assert!(
        error.contains("not prepared") && error.contains(a),
        "{error}"
    );
}

#[test]
fn the_node_lock_excludes_every_other_holder_and_gives_up_after_its_wait() {
    use gpuslice_dra::node_lock::NodeLock;
    use std::time::Duration;
    let scratch = Scratch::new("node-lock");
    let state = scratch.path().join("state");
    let held = NodeLock::acquire(&state, Duration::from_secs(1)).unwrap();
    // Another description (here of this process; another process's is the same to flock)
    // waits, then gives up with an error naming the lock, rather than hang.
    let error = NodeLock::acquire(&state, Duration::from_millis(100)).unwrap_err();
    assert!(
        error.contains("held the prepare lock") && error.contains(state.to_str().unwrap()),
        "{error}"
    );
    drop(held);
    let again = NodeLock::acquire(&state, Duration::from_millis(100)).unwrap();
    drop(again);
    // The lock is the directory's: no file was left to mean anything.
    assert_eq!(fs::read_dir(&state).unwrap().count(), 0);
}
