//! The memory slice end to end: clients under libgpuslice.so against fakegpu, judged by the
//! fake's PHYSICAL truth (never by the shim's own numbers). Context cost in the fake: 300 MiB
//! per context; every allocation rounds to 2 MiB.

use cuda_e2e::{wait_until, Client, ClientKind, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB, MIB};
use serde_json::Value;
use std::time::{Duration, Instant};

const CONTEXT: u64 = 300 * MIB;
const PATHS: [&str; 9] = [
    "alloc", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap",
];

fn region_used(slice: &Slice) -> u64 {
    cuda_e2e::live_ledger_bytes(&slice.region_path())
}

/// The card (the fake's physical count) and the slice's ledger both hold exactly `bytes`.
fn assert_card_and_region(gpu: &FakeGpu, slice: &Slice, bytes: u64, what: impl std::fmt::Display) {
    assert_eq!(gpu.truth().used_memory(0), bytes, "{what}: the card");
    assert_eq!(region_used(slice), bytes, "{what}: the region");
}

#[test]
fn a_context_asked_for_before_cu_init_does_not_unbind_the_cap() {
    // The driver refuses a context before cuInit, and so cannot name the device's UUID then.
    // The shim used to match the device by index at that moment and cache the answer: a
    // UUID-keyed slice became unlimited, an index-keyed one got a second budget.
    for by_uuid in [true, false] {
        let gpu = FakeGpu::start("v100");
        let uuid = gpu.truth().device(0).unwrap().uuid;
        let slice = if by_uuid {
            Slice::builder().device_uuid(&uuid, "1GiB", None).build()
        } else {
            Slice::builder().device(0, "1GiB", None).build()
        };
        let env = slice.env(&gpu);
        // A process of the slice already holds half of it, in the device's (UUID) entry.
        let holder = Client::spawn(ClientKind::Cudarc, &["hold", "212MiB"], &env);
        assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
        let held = CONTEXT + 212 * MIB;
        // cudarc initialises the driver itself before any context: only the other two can
        // ask too early.
        for kind in [ClientKind::Linked, ClientKind::ProcAddr] {
            gpu.truth().reset_peak_memory(0);
            let args = ["alloc-until-oom", "64MiB", "--before-init", "context"];
            let out = Client::run(kind, &args, &env);
            let what = format!(
                "{kind:?}, slice by {}",
                if by_uuid { "UUID" } else { "index" }
            );
            assert_eq!(
                out["before_init"], "CUDA_ERROR_NOT_INITIALIZED",
                "{what}: {out}"
            );
            assert_eq!(out["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{what}: {out}");
            // 1024 - 512 held - 300 (this context) = 212 MiB: three 64 MiB chunks.
            assert_eq!(out["count"], 3, "{what}: {out}");
            assert!(gpu.truth().peak_memory(0) <= GIB, "{what}: past the cap");
            assert_eq!(gpu.truth().used_memory(0), held, "{what}: all given back");
        }
        holder.release();
    }
}

#[test]
fn every_path_reaches_the_cap_and_the_next_allocation_is_out_of_memory() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        for path in PATHS {
            let out = Client::run(kind, &["alloc-until-oom", "64MiB", "--path", path], &env);
            assert_eq!(
                out["error"], "CUDA_ERROR_OUT_OF_MEMORY",
                "{kind:?} {path}: {out}"
            );
            // 1 GiB - one context = 724 MiB: eleven 64 MiB chunks fit, the twelfth does not.
            assert_eq!(out["count"], 11, "{kind:?} {path}: {out}");
            assert_eq!(out["mem_free_at_oom"], 20 * MIB, "{kind:?} {path}: {out}");
            let frees = out["free_results"].as_object().unwrap();
            assert_eq!(frees.keys().collect::<Vec<_>>(), ["CUDA_SUCCESS"], "{out}");
        }
    }
    // Everyone exited: a fresh process reaps them and the physical card is empty again.
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn the_cap_is_container_wide_and_usage_returns_to_the_contexts_then_zero() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    let a = Client::spawn(ClientKind::Linked, &["hold", "700MiB"], &env);
    let b = Client::spawn(ClientKind::Cudarc, &["hold", "700MiB"], &env);
    assert_eq!(a.first["result"], "CUDA_SUCCESS");
    assert_eq!(b.first["result"], "CUDA_SUCCESS");
    // 2 GiB - 2 x (300 + 700) MiB = 48 MiB left; a third process cannot even get a context.
    let c = Client::run(ClientKind::ProcAddr, &["alloc", "64MiB"], &env);
    assert_eq!(c["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{c}");
    assert!(gpu.truth().used_memory(0) <= 2 * GIB);
    assert_card_and_region(&gpu, &slice, 2 * (CONTEXT + 700 * MIB), "");
    a.release();
    b.release();
    assert_eq!(gpu.truth().used_memory(0), 0);
    let after = Client::run(ClientKind::Linked, &["meminfo"], &env);
    assert_eq!(after["free"], 2 * GIB - CONTEXT, "{after}");
    assert_eq!(region_used(&slice), 0, "the meminfo process exited too");
}

#[test]
fn a_sigkilled_holder_gives_its_half_back() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    let holder = Client::spawn(ClientKind::Linked, &["hold", "1GiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS");
    let refused = Client::run(ClientKind::Cudarc, &["alloc", "1GiB"], &env);
    assert_eq!(
        refused["results"][0], "CUDA_ERROR_OUT_OF_MEMORY",
        "{refused}"
    );
    holder.kill();
    let granted = Client::run(ClientKind::Cudarc, &["alloc", "1GiB"], &env);
    assert_eq!(granted["results"][0], "CUDA_SUCCESS", "{granted}");
}

#[test]
fn four_processes_of_sixteen_threads_never_pass_the_cap() {
    let gpu = FakeGpu::start("v100");
    let limit = 2250 * MIB;
    let slice = Slice::builder().device(0, "2250MiB", None).build();
    let mut env = slice.env(&gpu);
    // Four processes create their first context at once: reserve the known cost, not the
    // default bound, so all four contexts fit next to each other.
    env.push(("GPUSLICE_CONTEXT_OVERHEAD".into(), "300MiB".into()));
    // Near the cap: a holder (300 + 600 MiB) and four contexts leave 150 MiB, room for one
    // 100 MiB allocation at a time, so overlapping threads must be refused.
    let holder = Client::spawn(ClientKind::Linked, &["hold", "600MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS");
    let outputs: Vec<Value> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|i| {
                let env = &env;
                s.spawn(move || {
                    let kind = ClientKind::ALL[i % 3];
                    Client::run(
                        kind,
                        &[
                            "threads",
                            "--threads",
                            "16",
                            "--size",
                            "100MiB",
                            "--iterations",
                            "2000",
                        ],
                        env,
                    )
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    // The card's own high-water mark: exact, however short the peak was.
    let peak = gpu.truth().peak_memory(0);
    eprintln!(
        "race: physical peak {} MiB, cap {} MiB",
        peak / MIB,
        limit / MIB
    );
    assert!(peak <= limit, "physical peak {peak} passed the {limit} cap");
    let mut refused = 0;
    for out in &outputs {
        // A worker may already be refused its context (the cap is that close): also an OOM.
        let Some(allocs) = out["alloc_results"].as_object() else {
            assert_eq!(out["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{out}");
            refused += 1;
            continue;
        };
        for key in allocs.keys() {
            assert!(
                key == "CUDA_SUCCESS" || key == "CUDA_ERROR_OUT_OF_MEMORY",
                "unexpected {key}: {out}"
            );
        }
        refused += allocs
            .get("CUDA_ERROR_OUT_OF_MEMORY")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        assert_eq!(out["free_results"].as_object().unwrap().len(), 1, "{out}");
    }
    assert!(refused > 0, "no contention: {outputs:?}");
    holder.release();
    assert_eq!(gpu.truth().used_memory(0), 0);
    let probe = Client::run(ClientKind::Linked, &["meminfo"], &env);
    assert_eq!(probe["free"], limit - CONTEXT, "accounting lost: {probe}");
}

#[test]
fn pool_caching_cannot_carry_physical_usage_past_the_cap() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        for path in ["async", "pool", "vmm"] {
            let out = Client::run(
                kind,
                &["alloc", "100MiB", "--count", "9", "--path", path],
                &env,
            );
            let results: Vec<&str> = out["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            // 724 MiB of room: seven 100 MiB (rounded to 100) allocations fit.
            assert_eq!(
                results.iter().filter(|r| **r == "CUDA_SUCCESS").count(),
                7,
                "{kind:?} {path}: {out}"
            );
            assert!(results[7..]
                .iter()
                .all(|r| *r == "CUDA_ERROR_OUT_OF_MEMORY"));
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_pool_destroyed_with_allocations_outstanding_stays_charged_until_they_are_freed() {
    // cuMemPoolDestroy with pointers outstanding returns at once; the driver releases the
    // pool once they are freed, and its handle names nothing meanwhile (the fake refuses to
    // read it). The shim used to read the dead handle, fail, and refund the whole pool while
    // its memory was still held: create, allocate, destroy, repeat went past the cap.
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        gpu.truth().reset_peak_memory(0);
        let run = Client::spawn(kind, &["pool-destroy-held", "100MiB", "--max", "20"], &env);
        let line = &run.first;
        // 724 MiB of room: seven 100 MiB allocations, each from a pool destroyed under it.
        assert_eq!(line["count"], 7, "{kind:?}: {line}");
        assert_eq!(
            line["error"], "CUDA_ERROR_OUT_OF_MEMORY",
            "{kind:?}: {line}"
        );
        assert_eq!(
            line["destroy_results"],
            serde_json::json!({"CUDA_SUCCESS": 7}),
            "{kind:?}: {line}"
        );
        assert_eq!(line["mem_free_at_oom"], 24 * MIB, "{kind:?}: {line}");
        let peak = gpu.truth().peak_memory(0);
        assert!(peak <= GIB, "{kind:?}: physical peak {peak} passed the cap");
        // Each free was its pool's last allocation: the driver released the pools, and the
        // ledger with them.
        assert_eq!(
            line["free_results"],
            serde_json::json!({"CUDA_SUCCESS": 7}),
            "{kind:?}: {line}"
        );
        assert_eq!(line["mem_free_after"], GIB - CONTEXT, "{kind:?}: {line}");
        assert_card_and_region(&gpu, &slice, CONTEXT, format!("{kind:?}"));
        run.release();
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_pool_growing_past_the_cap_by_more_than_the_request_is_undone_and_refused() {
    // A pool takes memory in OS allocations coarser than the request (64 MiB here): a 2 MiB
    // allocation can grow it by 64 MiB. When that does not fit, the shim gives the allocation
    // back (cuMemFreeAsync on its stream, cuMemPoolTrimTo) and answers out of memory. It used
    // to keep it, physically past the cap, charged only the 2 MiB it had reserved.
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let mut env = slice.env(&gpu);
    let chunk = 64 * MIB;
    env.push(("FAKEGPU_POOL_CHUNK".into(), chunk.to_string()));
    // 724 MiB of room = eleven 64 MiB chunks (704 MiB): eleven pools of one allocation each,
    // or one default pool of 11 x 32 allocations.
    // The procaddr client also through the `_ptsz` entry points (the undo frees on the
    // per-thread stream then).
    let clients = ClientKind::ALL
        .map(|kind| (kind, None))
        .into_iter()
        .chain([(ClientKind::ProcAddr, Some("--per-thread"))]);
    for (path, fits) in [("pool", 11), ("async", 352)] {
        for (kind, flag) in clients.clone() {
            gpu.truth().reset_peak_memory(0);
            let mut args: Vec<&str> = flag.into_iter().collect();
            args.extend(["alloc-until-oom", "2MiB", "--path", path, "--max", "400"]);
            let out = Client::run(kind, &args, &env);
            let kind = (kind, flag);
            assert_eq!(
                out["error"], "CUDA_ERROR_OUT_OF_MEMORY",
                "{kind:?} {path}: {out}"
            );
            assert_eq!(out["count"], fits, "{kind:?} {path}: {out}");
            assert_eq!(out["mem_free_at_oom"], 20 * MIB, "{kind:?} {path}: {out}");
            let frees = out["free_results"].as_object().unwrap();
            assert_eq!(frees.keys().collect::<Vec<_>>(), ["CUDA_SUCCESS"], "{out}");
            // The refused allocation's chunk existed for the instant between the driver's
            // allocation and the undo (as a context dearer than measured does), never longer.
            let peak = gpu.truth().peak_memory(0);
            assert!(
                peak <= GIB + chunk,
                "{kind:?} {path}: physical peak {peak} passed the cap by more than a chunk"
            );
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
    let probe = Client::run(ClientKind::Linked, &["meminfo"], &env);
    assert_eq!(probe["free"], GIB - CONTEXT, "accounting lost: {probe}");
}

#[test]
fn reports_inside_the_slice_show_the_slice_and_smi_matches_the_ledger() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "8GiB", None).build();
    let mut env = slice.env(&gpu);
    // NVML reports host PIDs (PID + offset), as for a container in its own PID namespace.
    env.push(("FAKEGPU_PID_OFFSET".into(), "100000".into()));
    let other_tenant = Client::spawn(ClientKind::Linked, &["hold", "3GiB"], &gpu.env());
    let holder = Client::spawn(ClientKind::Linked, &["hold", "1GiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS");
    assert_eq!(holder.first["mem_free"], 8 * GIB - CONTEXT - GIB);
    let info = Client::run(ClientKind::Cudarc, &["meminfo"], &env);
    assert_eq!(info["total"], 8 * GIB);
    assert_eq!(info["device_total"], 8 * GIB);
    assert_eq!(info["free"], 8 * GIB - 2 * CONTEXT - GIB, "{info}");
    // Host view: physical truth equals the region's ledger for the live holder.
    let smi = gpu.smi_json();
    let used = smi["devices"][0]["memory_used"].as_u64().unwrap();
    assert_eq!(used, 2 * CONTEXT + 4 * GIB, "both tenants, physically");
    let holder_physical = gpu
        .truth()
        .processes(0)
        .iter()
        .find(|p| p.pid == holder.pid())
        .map(|p| p.used_memory);
    assert_eq!(holder_physical, Some(CONTEXT + GIB));
    assert_eq!(
        region_used(&slice),
        CONTEXT + GIB,
        "ledger == the slice's physical use"
    );
    // pynvml inside the slice (with host PIDs: FAKEGPU_PID_OFFSET).
    let mut py_env = env.clone();
    py_env.push(("HOLDER_PID".into(), holder.pid().to_string()));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py/memory_slice_probe.py");
    let mut cmd = cuda_e2e::command(std::path::Path::new("python3"), &[], &py_env);
    cmd.arg(&script);
    let out = cuda_e2e::run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let probe: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(probe["total"], 8 * GIB, "{probe}");
    assert_eq!(probe["used"], CONTEXT + GIB, "{probe}");
    assert_eq!(probe["free"], 8 * GIB - CONTEXT - GIB, "{probe}");
    assert_eq!(probe["v2_used"], CONTEXT + GIB, "{probe}");
    // Only the slice's process, under the PID the container knows, with its usage.
    assert_eq!(
        probe["processes"],
        serde_json::json!([[holder.pid(), CONTEXT + GIB]]),
        "{probe}"
    );
    holder.release();
    other_tenant.release();
}

#[test]
fn the_caching_allocator_ends_with_exactly_the_cap_used() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "4GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        let out = Client::run(kind, &["caching-allocator"], &env);
        assert_eq!(out["total_held"], 4 * GIB - CONTEXT, "{kind:?}: {out}");
        assert_eq!(out["mem_free_at_oom"], 0, "{out}");
        for error in out["errors"].as_array().unwrap() {
            assert_eq!(error["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{out}");
        }
    }
}

#[test]
fn corrupt_regions_and_absurd_limits_give_clear_errors() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    std::fs::write(slice.region_path(), vec![b'x'; 4096]).unwrap();
    let out = Client::output(ClientKind::Linked, &["meminfo"], &slice.env(&gpu));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[gpuslice]") && stderr.contains("region"),
        "{stderr}"
    );
    // The one line says what to run for a region (not `gpuslice check`).
    assert!(
        stderr.contains(&format!(
            "gpuslice reset --region {}",
            slice.region_path().display()
        )),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("CUDA_ERROR_NOT_INITIALIZED"));
    for bad in ["0", "\"lots\""] {
        let slice = Slice::builder()
            .raw(&format!(
                r#"{{"version":1,"region":"{{region}}","devices":[{{"index":0,"memory":{bad}}}]}}"#
            ))
            .build();
        let out = Client::output(ClientKind::Linked, &["meminfo"], &slice.env(&gpu));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("invalid configuration"),
            "{bad}"
        );
    }
    // Larger than the card: the card is what is reported.
    let slice = Slice::builder().device(0, "64GiB", None).build();
    let info = Client::run(ClientKind::Linked, &["meminfo"], &slice.env(&gpu));
    assert_eq!(info["total"], 32 * GIB);
}

#[test]
fn sixty_four_processes_register_within_a_second() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "31GiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), (64 * MIB).to_string()));
    // All 64 start at once (one thread each), as when a container's processes start
    // together; the clock stops when the last one has registered and allocated.
    let started = Instant::now();
    let holders: Vec<_> = std::thread::scope(|s| {
        let spawns: Vec<_> = (0..64)
            .map(|_| s.spawn(|| Client::spawn(ClientKind::Linked, &["hold", "2MiB"], &env)))
            .collect();
        spawns.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();
    for h in &holders {
        assert_eq!(h.first["result"], "CUDA_SUCCESS");
    }
    wait_until("64 holders visible", DEFAULT_TIMEOUT, || {
        gpu.truth().processes(0).len() == 64
    });
    eprintln!("64 processes started, registered and allocated in {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

/// Contexts of 700 MiB: more than the shim's default 512 MiB bound for a first context.
fn big_context_env(slice: &Slice, gpu: &FakeGpu) -> cuda_e2e::Env {
    let mut env = slice.env(gpu);
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), (700 * MIB).to_string()));
    env
}

#[test]
fn a_context_dearer_than_the_slice_measured_that_does_not_fit_is_undone_and_refused() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    // The holder's contexts cost 300 MiB (the figure the slice learns); the later processes'
    // cost 700 MiB, as when containers of one slice run different CUDA versions.
    let holder_env = slice.env(&gpu);
    let env = big_context_env(&slice, &gpu);
    let holder = Client::spawn(ClientKind::Linked, &["hold", "1100MiB"], &holder_env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    let held = CONTEXT + 1100 * MIB;
    assert_eq!(gpu.truth().used_memory(0), held);
    // 648 MiB left: the measured 300 MiB fits, the real 700 MiB context does not. The context
    // is undone and refused, and stays refused while the process lives on.
    let refused = Client::spawn(ClientKind::Cudarc, &["hold", "64MiB"], &env);
    assert_eq!(
        refused.first["error"], "CUDA_ERROR_OUT_OF_MEMORY",
        "{}",
        refused.first
    );
    assert_eq!(refused.first["failed_step"], "context", "{}", refused.first);
    assert_card_and_region(&gpu, &slice, held, "nothing of it is left");
    refused.release();
    for kind in ClientKind::ALL {
        let out = Client::run(kind, &["meminfo"], &env);
        assert_eq!(out["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{kind:?}: {out}");
        assert_eq!(out["failed_step"], "context", "{kind:?}: {out}");
    }
    assert_eq!(gpu.truth().used_memory(0), held);
    // The card held each refused 700 MiB context for the instant between its creation and
    // its undo (a context's cost is unknowable before it exists), one at a time, and never
    // more: the undo really ran and nothing else slipped past.
    assert_eq!(gpu.truth().peak_memory(0), held + 700 * MIB);
    holder.release();
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_later_process_reserves_the_context_cost_the_slice_measured_not_the_bound() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    let holder = Client::spawn(ClientKind::Linked, &["hold", "1400MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    // 348 MiB left: less than the 512 MiB bound a first context reserves, more than the
    // 300 MiB the holder measured its context to cost.
    for kind in ClientKind::ALL {
        let out = Client::run(kind, &["meminfo"], &env);
        assert_eq!(out["free"], 48 * MIB, "{kind:?}: {out}");
    }
    let second = Client::spawn(ClientKind::ProcAddr, &["hold", "48MiB"], &env);
    assert_eq!(second.first["result"], "CUDA_SUCCESS", "{}", second.first);
    assert_eq!(
        gpu.truth().used_memory(0),
        2 * GIB,
        "the slice is full, exactly"
    );
    assert_eq!(region_used(&slice), 2 * GIB);
    assert_eq!(gpu.truth().peak_memory(0), 2 * GIB, "never past it");
    second.release();
    holder.release();
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_context_bigger_than_the_bound_that_fits_is_charged_what_it_costs() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = big_context_env(&slice, &gpu);
    let out = Client::run(ClientKind::Linked, &["meminfo"], &env);
    assert_eq!(out["free"], 2 * GIB - 700 * MIB, "{out}");
    for kind in ClientKind::ALL {
        fills_a_2_gib_slice_after_a_700_mib_context(&gpu, kind, &env);
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

/// alloc-until-oom in 64 MiB chunks in a 2 GiB slice whose contexts cost 700 MiB: the slice
/// is filled exactly, judged by the card's high-water mark.
fn fills_a_2_gib_slice_after_a_700_mib_context(
    gpu: &FakeGpu,
    kind: ClientKind,
    env: &cuda_e2e::Env,
) {
    gpu.truth().reset_peak_memory(0);
    let out = Client::run(kind, &["alloc-until-oom", "64MiB"], env);
    assert_eq!(out["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{kind:?}: {out}");
    // 2048 - 700 = 1348 MiB: twenty-one 64 MiB chunks fit, the twenty-second does not.
    assert_eq!(out["count"], 21, "{kind:?}: {out}");
    assert_eq!(out["mem_free_at_oom"], 4 * MIB, "{kind:?}: {out}");
    // The card itself held the 700 MiB context and the 21 chunks at once, never more: the
    // context was charged what it really cost, not the 512 MiB bound.
    assert_eq!(
        gpu.truth().peak_memory(0),
        700 * MIB + 21 * 64 * MIB,
        "{kind:?}: the card's high-water mark is the cap, filled"
    );
}

/// `env` with the clients in created (non-primary) contexts: `CLIENT_CONTEXT=created`.
/// linked-client and procaddr-client make them with cuCtxCreate_v2 (driver.rs),
/// cudarc-client with cuCtxCreate_v4 (`CudaContext::new_non_primary`).
fn created_context_env(mut env: cuda_e2e::Env) -> cuda_e2e::Env {
    env.push(("CLIENT_CONTEXT".into(), "created".into()));
    env
}

/// What the card holds for process `pid` on device 0 (0 when it holds nothing).
fn physical_use_of(gpu: &FakeGpu, pid: u32) -> u64 {
    gpu.truth()
        .processes(0)
        .iter()
        .find(|p| p.pid == pid)
        .map_or(0, |p| p.used_memory)
}

#[test]
fn a_created_context_bigger_than_the_bound_that_does_not_fit_is_destroyed_and_refused() {
    // One slice per client: a slice that saw a 700 MiB context may reserve that much for the
    // next one up front, which would refuse it without ever calling the driver.
    for kind in ClientKind::ALL {
        let gpu = FakeGpu::start("v100");
        let slice = Slice::builder().device(0, "2GiB", None).build();
        // The holder's primary context costs 300 MiB; the created context below costs
        // 700 MiB, more than the 512 MiB the shim reserves for a first context before it
        // can measure it.
        let holder = Client::spawn(ClientKind::Linked, &["hold", "1100MiB"], &slice.env(&gpu));
        assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
        let held = CONTEXT + 1100 * MIB;
        assert_eq!(gpu.truth().used_memory(0), held);
        gpu.truth().reset_peak_memory(0);
        // 648 MiB left: what the shim reserves before the driver call fits, the real 700 MiB
        // context does not. cuCtxCreate is answered CUDA_ERROR_OUT_OF_MEMORY and the context
        // given back to the driver (the real cuCtxDestroy_v2), while the process lives on.
        let env = created_context_env(big_context_env(&slice, &gpu));
        let refused = Client::spawn(kind, &["context-cycle", "64MiB"], &env);
        assert_eq!(
            refused.first["error"], "CUDA_ERROR_OUT_OF_MEMORY",
            "{kind:?}: {}",
            refused.first
        );
        assert_eq!(refused.first["failed_step"], "context", "{}", refused.first);
        // The context really existed (the card held it for an instant), and nothing of it is
        // left on the card or charged in the region while its process is still alive.
        assert_eq!(
            gpu.truth().peak_memory(0),
            held + 700 * MIB,
            "{kind:?}: the refused context was created, then undone"
        );
        assert_eq!(physical_use_of(&gpu, refused.pid()), 0, "{kind:?}");
        assert_card_and_region(&gpu, &slice, held, format!("{kind:?}: nothing left"));
        refused.release();
        assert_eq!(gpu.truth().used_memory(0), held);
        holder.release();
        assert_eq!(gpu.truth().used_memory(0), 0);
    }
}

#[test]
fn a_created_context_bigger_than_the_bound_that_fits_is_charged_what_it_costs() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = created_context_env(big_context_env(&slice, &gpu));
    for kind in ClientKind::ALL {
        // The card and the region agree on the 700 MiB context, not the 512 MiB bound.
        let holder = Client::spawn(kind, &["hold", "1GiB"], &env);
        assert_eq!(
            holder.first["result"], "CUDA_SUCCESS",
            "{kind:?}: {}",
            holder.first
        );
        assert_eq!(holder.first["mem_free"], GIB - 700 * MIB, "{kind:?}");
        assert_eq!(
            physical_use_of(&gpu, holder.pid()),
            700 * MIB + GIB,
            "{kind:?}"
        );
        assert_eq!(region_used(&slice), 700 * MIB + GIB, "{kind:?}");
        holder.release();

        let out = Client::run(kind, &["meminfo"], &env);
        assert_eq!(out["free"], 2 * GIB - 700 * MIB, "{kind:?}: {out}");
        fills_a_2_gib_slice_after_a_700_mib_context(&gpu, kind, &env);
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn destroying_a_created_context_gives_back_its_cost_and_what_it_owned() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = created_context_env(slice.env(&gpu));
    // The paths whose objects belong to the context (pools and VMM handles outlive it).
    for path in ["alloc", "pitch", "managed", "array", "array3d", "mipmap"] {
        for kind in ClientKind::ALL {
            gpu.truth().reset_peak_memory(0);
            // A context, 512 MiB in it, cuCtxDestroy (the allocation never freed), a new
            // context; the process then stays alive holding only that new context.
            let cycle = Client::spawn(kind, &["context-cycle", "512MiB", "--path", path], &env);
            let line = &cycle.first;
            assert_eq!(line["result"], "CUDA_SUCCESS", "{kind:?} {path}: {line}");
            assert_eq!(
                line["destroy_result"], "CUDA_SUCCESS",
                "{kind:?} {path}: {line}"
            );
            assert_eq!(
                line["context_result"], "CUDA_SUCCESS",
                "{kind:?} {path}: {line}"
            );
            assert_eq!(
                line["mem_free_held"],
                2 * GIB - CONTEXT - 512 * MIB,
                "{line}"
            );
            assert_eq!(
                line["mem_free"],
                2 * GIB - CONTEXT,
                "{kind:?} {path}: {line}"
            );
            // The card: the first context and its 512 MiB were gone before the second
            // context came, and now only that one is held. The ledger says the same.
            assert_eq!(
                gpu.truth().peak_memory(0),
                CONTEXT + 512 * MIB,
                "{kind:?} {path}"
            );
            assert_eq!(
                physical_use_of(&gpu, cycle.pid()),
                CONTEXT,
                "{kind:?} {path}"
            );
            assert_card_and_region(&gpu, &slice, CONTEXT, format!("{kind:?} {path}"));
            cycle.release();
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn after_a_created_context_is_destroyed_pool_and_vmm_memory_is_charged_as_the_card_holds_it() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = created_context_env(slice.env(&gpu));
    // Pools and VMM handles are not objects of the context: what of them the driver keeps
    // or frees when the context goes is its business; the ledger must follow the card.
    for path in ["async", "pool", "vmm"] {
        for kind in ClientKind::ALL {
            let cycle = Client::spawn(kind, &["context-cycle", "512MiB", "--path", path], &env);
            let line = &cycle.first;
            assert_eq!(line["result"], "CUDA_SUCCESS", "{kind:?} {path}: {line}");
            assert_eq!(
                line["destroy_result"], "CUDA_SUCCESS",
                "{kind:?} {path}: {line}"
            );
            assert_eq!(
                line["context_result"], "CUDA_SUCCESS",
                "{kind:?} {path}: {line}"
            );
            let physical = physical_use_of(&gpu, cycle.pid());
            assert!(physical >= CONTEXT, "{kind:?} {path}: {physical}");
            assert_card_and_region(&gpu, &slice, physical, format!("{kind:?} {path}"));
            cycle.release();
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

/// Spawns `context-cycle 512MiB --path PATH` plus `extra` in the primary context and checks
/// that every step of the cycle succeeded.
fn primary_cycle(
    kind: ClientKind,
    path: &str,
    extra: &[&str],
    env: &cuda_e2e::Env,
) -> cuda_e2e::Running {
    let mut args = vec!["context-cycle", "512MiB", "--path", path];
    args.extend_from_slice(extra);
    let cycle = Client::spawn(kind, &args, env);
    let line = &cycle.first;
    for step in ["result", "destroy_result", "context_result"] {
        assert_eq!(
            line[step], "CUDA_SUCCESS",
            "{kind:?} {args:?}: {step}: {line}"
        );
    }
    assert_eq!(
        line["mem_free_held"],
        2 * GIB - CONTEXT - 512 * MIB,
        "{kind:?} {args:?}: {line}"
    );
    cycle
}

/// The card and the region after a cycle whose end took the primary context down: the
/// context and its 512 MiB were gone before the context was retained again, and now only
/// that new context is held and charged.
fn assert_only_the_new_context_is_held(
    gpu: &FakeGpu,
    slice: &Slice,
    cycle: &cuda_e2e::Running,
    what: &str,
) {
    assert_eq!(gpu.truth().peak_memory(0), CONTEXT + 512 * MIB, "{what}");
    assert_eq!(physical_use_of(gpu, cycle.pid()), CONTEXT, "{what}");
    assert_eq!(gpu.truth().used_memory(0), CONTEXT, "{what}");
    assert_eq!(region_used(slice), CONTEXT, "{what}: the region");
    assert_eq!(
        cycle.first["mem_free"],
        2 * GIB - CONTEXT,
        "{what}: {}",
        cycle.first
    );
}

#[test]
fn the_last_primary_release_gives_back_the_context_and_what_it_owned() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    // The paths whose objects belong to the context (pools and VMM handles outlive it).
    for path in ["alloc", "pitch", "managed", "array", "array3d", "mipmap"] {
        for kind in ClientKind::ALL {
            gpu.truth().reset_peak_memory(0);
            // The primary context retained once, 512 MiB in it, its one release (the
            // allocation never freed), a retain again; the process then stays alive.
            let cycle = primary_cycle(kind, path, &["--end", "release"], &env);
            assert_eq!(cycle.first["end"], "release", "{}", cycle.first);
            assert_only_the_new_context_is_held(&gpu, &slice, &cycle, &format!("{kind:?} {path}"));
            cycle.release();
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_primary_release_that_is_not_the_last_gives_back_nothing() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        gpu.truth().reset_peak_memory(0);
        // Two references, one released: the context and its 512 MiB live on, and the
        // retain after the release is the same context again (one context cost, not two).
        let cycle = primary_cycle(kind, "alloc", &["--retains", "2"], &env);
        let held = CONTEXT + 512 * MIB;
        assert_eq!(cycle.first["end"], "release", "{kind:?}: {}", cycle.first);
        assert_eq!(gpu.truth().peak_memory(0), held, "{kind:?}");
        assert_eq!(physical_use_of(&gpu, cycle.pid()), held, "{kind:?}");
        assert_card_and_region(&gpu, &slice, held, format!("{kind:?}"));
        assert_eq!(
            cycle.first["mem_free"],
            2 * GIB - held,
            "{kind:?}: {}",
            cycle.first
        );
        cycle.release();
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_primary_reset_gives_back_the_context_and_what_it_owned_whatever_its_references() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    for retains in ["1", "2"] {
        for path in ["alloc", "pitch", "managed", "array", "array3d", "mipmap"] {
            for kind in ClientKind::ALL {
                gpu.truth().reset_peak_memory(0);
                // cuDevicePrimaryCtxReset with `retains` references held: the context and
                // its 512 MiB are gone at once; the next retain makes a new context.
                let extra = ["--end", "reset", "--retains", retains];
                let cycle = primary_cycle(kind, path, &extra, &env);
                assert_eq!(cycle.first["end"], "reset", "{}", cycle.first);
                let what = format!("{kind:?} {path}, {retains} references");
                assert_only_the_new_context_is_held(&gpu, &slice, &cycle, &what);
                cycle.release();
            }
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn references_a_reset_kept_are_released_without_losing_the_new_context() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    // "Resetting the primary context does not release it": with 2 references, a reset, a
    // retain (which makes the context anew: 3 references) and late releases of the old ones.
    // While one reference is left the new context lives and must stay charged; the last
    // release ends it. (A ledger that zeroed its count at the reset refunded the live context
    // at the first late release.)
    for (late, left) in [("1", CONTEXT), ("2", CONTEXT), ("3", 0)] {
        for kind in ClientKind::ALL {
            let extra = ["--end", "reset", "--retains", "2", "--release-after", late];
            let cycle = primary_cycle(kind, "alloc", &extra, &env);
            let what = format!("{kind:?}, {late} late releases");
            let releases = cycle.first["late_releases"].as_array().unwrap().clone();
            assert_eq!(releases.len(), late.parse::<usize>().unwrap(), "{what}");
            assert!(
                releases.iter().all(|r| r == "CUDA_SUCCESS"),
                "{what}: {}",
                cycle.first
            );
            assert_eq!(physical_use_of(&gpu, cycle.pid()), left, "{what}");
            assert_card_and_region(&gpu, &slice, left, &what);
            cycle.release();
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn after_a_primary_reset_pool_and_vmm_memory_is_charged_as_the_card_holds_it() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    for end in ["release", "reset"] {
        for path in ["async", "pool", "vmm"] {
            for kind in ClientKind::ALL {
                let cycle = primary_cycle(kind, path, &["--end", end], &env);
                let physical = physical_use_of(&gpu, cycle.pid());
                let what = format!("{kind:?} {path} {end}");
                assert!(physical >= CONTEXT, "{what}: {physical}");
                assert_card_and_region(&gpu, &slice, physical, &what);
                cycle.release();
            }
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn context_cycle_refuses_an_end_of_the_other_context_mode() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let primary = slice.env(&gpu);
    let created = created_context_env(slice.env(&gpu));
    let refused: [(&cuda_e2e::Env, &[&str]); 6] = [
        (&primary, &["--end", "destroy"]),
        (&primary, &["--end", "twice"]),
        (&primary, &["--retains", "0"]),
        (&created, &["--end", "reset"]),
        (&created, &["--end", "release"]),
        (&created, &["--retains", "2"]),
    ];
    for kind in ClientKind::ALL {
        for (env, extra) in refused {
            let mut args = vec!["context-cycle", "64MiB"];
            args.extend_from_slice(extra);
            let out = Client::output(kind, &args, env);
            assert_eq!(out.status.code(), Some(2), "{kind:?} {args:?}: {out:?}");
        }
    }
    assert_eq!(
        gpu.truth().used_memory(0),
        0,
        "no usage error reached the driver"
    );
}

#[test]
fn cuda_graph_memory_is_charged_as_the_graph_pool_holds_it() {
    // A captured cuMemAllocAsync is an allocation node: its memory is the device's graph pool's,
    // reserved when the graph is uploaded or first launched, not the memory pool's. The shim
    // used to refund what it reserved at capture and never see the graph pool, so a graph
    // took memory past the cap and later allocations were still granted.
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        for upload in ["false", "true"] {
            gpu.truth().reset_peak_memory(0);
            let run = Client::spawn(kind, &["graph-memory", "400MiB", "--upload", upload], &env);
            let line = &run.first;
            let what = format!("{kind:?} upload={upload}: {line}");
            assert_eq!(line["launch_result"], "CUDA_SUCCESS", "{what}");
            // 724 MiB of room, 400 MiB of them the graph's: three 100 MiB allocations.
            assert_eq!(line["mem_free_after_launch"], 324 * MIB, "{what}");
            assert_eq!(line["count"], 3, "{what}");
            assert_eq!(line["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
            let held = CONTEXT + 400 * MIB + 300 * MIB;
            assert_card_and_region(&gpu, &slice, held, &what);
            assert!(gpu.truth().peak_memory(0) <= GIB, "{what}: past the cap");
            run.release();
        }
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn cuda_graph_memory_past_the_cap_is_charged_and_refuses_what_follows() {
    // The graph pool grows inside the driver's launch, which cannot be undone: the growth is
    // charged past the limit (one error line), so the ledger matches the card and the slice's
    // next allocation is refused.
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        // Two 450 MiB nodes: each fits the slice when captured (capture takes nothing), the
        // 900 MiB the graph needs at once does not.
        let args = ["graph-memory", "450MiB", "--allocs", "2", "--chunk", "2MiB"];
        let run = Client::spawn(kind, &args, &env);
        let line = &run.first;
        assert_eq!(line["launch_result"], "CUDA_SUCCESS", "{kind:?}: {line}");
        assert_eq!(line["count"], 0, "{kind:?}: {line}");
        assert_eq!(
            line["error"], "CUDA_ERROR_OUT_OF_MEMORY",
            "{kind:?}: {line}"
        );
        assert_eq!(line["mem_free_at_oom"], 0, "{kind:?}: {line}");
        let held = CONTEXT + 900 * MIB;
        assert_card_and_region(&gpu, &slice, held, format!("{kind:?}"));
        run.release();
    }
    assert_eq!(gpu.truth().used_memory(0), 0);
}

#[test]
fn a_pool_of_another_device_is_charged_to_that_device() {
    // cuMemAllocFromPoolAsync: "the pool may be from a device different than that of the
    // specified hStream". The process's context is on device 0; its pools are on device 1.
    // The shim used to charge the current context's device: with device 0 unlimited, device
    // 1's cap did not hold at all; with both limited, device 0 paid for device 1's memory.
    let gpu = FakeGpu::start("v100,v100");
    for device0 in [None, Some("1GiB")] {
        let mut builder = Slice::builder().device(1, "1GiB", None);
        if let Some(limit) = device0 {
            builder = builder.device(0, limit, None);
        }
        let slice = builder.build();
        let env = slice.env(&gpu);
        for kind in ClientKind::ALL {
            gpu.truth().reset_peak_memory(1);
            let args = [
                "alloc-until-oom",
                "100MiB",
                "--path",
                "pool",
                "--pool-device",
                "1",
                "--max",
                "40",
            ];
            let out = Client::run(kind, &args, &env);
            let what = format!("{kind:?}, device 0 limit {device0:?}: {out}");
            // No context on device 1: its whole 1 GiB is room for ten 100 MiB allocations.
            assert_eq!(out["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{what}");
            assert_eq!(out["count"], 10, "{what}");
            let peak = gpu.truth().peak_memory(1);
            assert!(
                peak <= GIB,
                "{what}: physical peak {peak} on device 1 passed its cap"
            );
            // Device 0's slice (reported for the current context) paid nothing for it.
            if device0.is_some() {
                assert_eq!(out["mem_free_at_oom"], GIB - CONTEXT, "{what}");
            }
            let frees = out["free_results"].as_object().unwrap();
            assert_eq!(frees.keys().collect::<Vec<_>>(), ["CUDA_SUCCESS"], "{what}");
        }
        assert_eq!(gpu.truth().used_memory(1), 0);
        assert_eq!(gpu.truth().used_memory(0), 0);
    }
}

/// The driver's default device-malloc heap, inside the measured context cost.
const DEFAULT_HEAP: u64 = 8 * MIB;

#[test]
fn the_device_malloc_heap_is_charged_and_cannot_pass_the_cap() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        gpu.truth().reset_peak_memory(0);
        // A 2 GiB heap does not fit in the slice: refused, the card never holds it.
        let refused = Client::spawn(kind, &["heap", "2GiB"], &env);
        let line = &refused.first;
        assert_eq!(
            line["result"], "CUDA_ERROR_OUT_OF_MEMORY",
            "{kind:?}: {line}"
        );
        assert_eq!(line["mem_free"], GIB - CONTEXT, "{kind:?}: {line}");
        assert_eq!(gpu.truth().used_memory(0), CONTEXT, "{kind:?}");
        assert!(gpu.truth().peak_memory(0) <= GIB, "{kind:?}: past the cap");
        refused.release();
        // A 300 MiB heap fits: charged (past the default, which the context cost holds)
        // while the process holds it, on the card and in the region alike.
        let heap = 300 * MIB - DEFAULT_HEAP;
        let held = Client::spawn(kind, &["heap", "300MiB"], &env);
        let line = &held.first;
        assert_eq!(line["result"], "CUDA_SUCCESS", "{kind:?}: {line}");
        assert_eq!(line["mem_free"], GIB - CONTEXT - heap, "{kind:?}: {line}");
        assert_card_and_region(&gpu, &slice, CONTEXT + heap, format!("{kind:?}"));
        // Nothing else fits past it.
        let next = Client::run(kind, &["alloc", "700MiB"], &env);
        assert_eq!(
            next["results"][0], "CUDA_ERROR_OUT_OF_MEMORY",
            "{kind:?}: {next}"
        );
        assert!(gpu.truth().peak_memory(0) <= GIB, "{kind:?}: past the cap");
        held.release();
        assert_card_and_region(&gpu, &slice, 0, format!("{kind:?}: the process ended"));
    }
}

/// `args` run by `n` clients (the three kinds in turn) released together by a start barrier
/// right before they make their contexts; returns them once each printed its first line.
fn start_together(n: usize, args: &[&str], env: &cuda_e2e::Env) -> Vec<cuda_e2e::Running> {
    let mut barrier = cuda_e2e::StartBarrier::new();
    let mut env = env.clone();
    env.push(barrier.env());
    std::thread::scope(|s| {
        let clients: Vec<_> = (0..n)
            .map(|i| {
                let env = &env;
                s.spawn(move || Client::spawn(ClientKind::ALL[i % 3], args, env))
            })
            .collect();
        barrier.release(n);
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    })
}

#[test]
fn processes_starting_together_whose_contexts_fit_are_never_refused_and_leave_no_drift() {
    // Every run uses a fresh slice, so no process of it knows what a context costs yet: the
    // first must measure it while the others start in the same instant. In the 2 GiB slice
    // even three 512 MiB provisional bounds fit: what goes wrong there is a context that
    // stays charged at the bound (NVML's list shows several new entries: which is ours?).
    // Primary contexts (cuDevicePrimaryCtxRetain), and once created ones (cuCtxCreate*).
    let gpu = FakeGpu::start("v100");
    let each = 16 * MIB;
    let cases = [
        (3, 2 * GIB, false),
        (2, 700 * MIB, false),
        (3, GIB, false),
        (8, 2560 * MIB, false),
        (3, GIB, true),
    ];
    for (n, limit, created) in cases {
        for run in 0..20 {
            let what = format!(
                "{n} processes in a {} MiB slice (created contexts: {created}), run {run}",
                limit / MIB
            );
            let slice = Slice::builder()
                .device(0, &format!("{}MiB", limit / MIB), None)
                .build();
            let env = if created {
                created_context_env(slice.env(&gpu))
            } else {
                slice.env(&gpu)
            };
            gpu.truth().reset_peak_memory(0);
            let clients = start_together(n, &["hold", "16MiB"], &env);
            for client in &clients {
                assert_eq!(
                    client.first["result"], "CUDA_SUCCESS",
                    "{what}: {}",
                    client.first
                );
            }
            // Zero drift: each context was settled to what the card really holds for it,
            // none stays charged at the bound.
            assert_card_and_region(&gpu, &slice, n as u64 * (CONTEXT + each), &what);
            let peak = gpu.truth().peak_memory(0);
            assert!(
                peak <= limit,
                "{what}: the card held {peak} bytes, past the cap"
            );
            for client in clients {
                client.release();
            }
            wait_until("the card is empty again", DEFAULT_TIMEOUT, || {
                gpu.truth().used_memory(0) == 0
            });
        }
    }
}

/// The `[gpuslice]` lines a client printed on stderr.
fn shim_lines(output: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|l| l.starts_with("[gpuslice]"))
        .map(str::to_string)
        .collect()
}

/// The client's JSON line from a raw output.
fn json_line(output: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

#[test]
fn a_slice_smaller_than_the_context_bound_holds_a_context_that_fits() {
    // 400 MiB: less than the shim's 512 MiB provisional bound, more than the 300 MiB a
    // context costs on the card. A fresh slice per client, so each measures the cost itself.
    let gpu = FakeGpu::start("v100");
    for kind in ClientKind::ALL {
        let slice = Slice::builder().device(0, "400MiB", None).build();
        // (Reading the card's use reaps the previous client, whose bytes the mark would keep.)
        assert_eq!(gpu.truth().used_memory(0), 0, "{kind:?}");
        gpu.truth().reset_peak_memory(0);
        let out = Client::run(kind, &["alloc-until-oom", "16MiB"], &slice.env(&gpu));
        assert_eq!(out["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{kind:?}: {out}");
        // 400 - 300 = 100 MiB: six 16 MiB chunks fit, the seventh does not.
        assert_eq!(out["count"], 6, "{kind:?}: {out}");
        assert_eq!(out["mem_free_at_oom"], 4 * MIB, "{kind:?}: {out}");
        assert_eq!(
            gpu.truth().peak_memory(0),
            CONTEXT + 6 * 16 * MIB,
            "{kind:?}: the card's high-water mark is the slice, filled"
        );
    }
}

#[test]
fn a_slice_too_small_for_a_context_says_what_a_context_costs_and_what_the_slice_holds() {
    let gpu = FakeGpu::start("v100");
    for kind in ClientKind::ALL {
        let slice = Slice::builder().device(0, "256MiB", None).build();
        let env = slice.env(&gpu);
        // The first context measures the cost: the card holds it for the instant between
        // its creation and its undo (the bound of this design: the cap plus what the context
        // costs beyond the room it was given, here 300 - 256 MiB), then nothing.
        assert_eq!(gpu.truth().used_memory(0), 0, "{kind:?}");
        gpu.truth().reset_peak_memory(0);
        let first = Client::output(kind, &["meminfo"], &env);
        let peak = gpu.truth().peak_memory(0);
        assert!(peak <= CONTEXT, "{kind:?}: the card held {peak} bytes");
        // Then the slice knows: refused before the driver is even asked.
        gpu.truth().reset_peak_memory(0);
        let second = Client::output(kind, &["meminfo"], &env);
        assert_eq!(
            gpu.truth().peak_memory(0),
            0,
            "{kind:?}: a context was made"
        );
        for output in [&first, &second] {
            let line = json_line(output);
            assert_eq!(
                line["error"], "CUDA_ERROR_OUT_OF_MEMORY",
                "{kind:?}: {line}"
            );
            assert_eq!(line["failed_step"], "context", "{kind:?}: {line}");
            // One line at the default log level says why: what a context costs on this card,
            // what the slice holds, and the way out (the limit file: the context is bigger
            // than the whole slice). The bound is not the reason, so it goes unnamed.
            let lines = shim_lines(output);
            assert_eq!(lines.len(), 1, "{kind:?}: {lines:?}");
            let why = &lines[0];
            assert!(why.contains("300 MiB"), "{kind:?}: {why}");
            assert!(why.contains("256 MiB"), "{kind:?}: {why}");
            assert!(
                why.contains(&slice.config_path().display().to_string()),
                "{kind:?}: {why}"
            );
            assert!(
                !why.contains("GPUSLICE_CONTEXT_OVERHEAD"),
                "{kind:?}: {why}"
            );
            assert!(why.len() < 400, "{kind:?}: {why}");
        }
        assert_card_and_region(&gpu, &slice, 0, format!("{kind:?}"));
    }
}

#[test]
fn without_nvml_a_small_slice_names_the_bound_as_the_way_out() {
    // No NVML on the machine: nothing can measure what a context costs, so the shim charges
    // the configured bound, which a 400 MiB slice cannot hold; the line says so and names
    // the setting that helps. (linked-client links NVML and could not start without it.)
    let gpu = FakeGpu::start("v100");
    for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        std::fs::remove_file(gpu.lib_dir().join(name)).expect("remove the fake NVML");
    }
    for kind in [ClientKind::Cudarc, ClientKind::ProcAddr] {
        let slice = Slice::builder().device(0, "400MiB", None).build();
        let mut env = slice.env(&gpu);
        // (Reading the card's use reaps the previous client, whose bytes the mark would keep.)
        assert_eq!(gpu.truth().used_memory(0), 0, "{kind:?}");
        gpu.truth().reset_peak_memory(0);
        let refused = Client::output(kind, &["meminfo"], &env);
        let line = json_line(&refused);
        assert_eq!(
            line["error"], "CUDA_ERROR_OUT_OF_MEMORY",
            "{kind:?}: {line}"
        );
        assert_eq!(line["failed_step"], "context", "{kind:?}: {line}");
        let lines = shim_lines(&refused);
        assert_eq!(lines.len(), 1, "{kind:?}: {lines:?}");
        assert!(
            lines[0].contains("GPUSLICE_CONTEXT_OVERHEAD"),
            "{kind:?}: {lines:?}"
        );
        assert!(lines[0].contains("512 MiB"), "{kind:?}: {lines:?}");
        // Nothing could settle a smaller reservation: the driver was never asked.
        assert_eq!(
            gpu.truth().peak_memory(0),
            0,
            "{kind:?}: a context was made"
        );
        // The way out works: the bound set to what a context costs on this card.
        env.push(("GPUSLICE_CONTEXT_OVERHEAD".into(), "300MiB".into()));
        let out = Client::run(kind, &["meminfo"], &env);
        assert_eq!(out["free"], 100 * MIB, "{kind:?}: {out}");
    }
    // The limit file's "context_overhead" is the same setting (the only one an anchored file
    // leaves), named as such when it is the way out.
    for (bound, fits) in [("300MiB", true), ("600MiB", false)] {
        let slice = Slice::builder()
            .raw(&format!(
                r#"{{"version": 1, "region": "{{region}}", "context_overhead": "{bound}", "devices": [{{"index": 0, "memory": "400MiB"}}]}}"#
            ))
            .build();
        let env = slice.env(&gpu);
        let out = Client::output(ClientKind::Cudarc, &["meminfo"], &env);
        let line = json_line(&out);
        if fits {
            assert_eq!(line["free"], 100 * MIB, "{bound}: {line}");
            continue;
        }
        assert_eq!(line["error"], "CUDA_ERROR_OUT_OF_MEMORY", "{bound}: {line}");
        let lines = shim_lines(&out);
        assert!(
            lines[0].contains("600 MiB")
                && lines[0].contains("\"context_overhead\" in the limit file"),
            "{bound}: {lines:?}"
        );
    }
}
