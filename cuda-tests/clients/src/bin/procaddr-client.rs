//! `procaddr-client`: reaches the driver the way the CUDA runtime (libcudart 12/13) does:
//! `dlopen("libcuda.so.1")`, `dlsym` of `cuGetProcAddress_v2` and nothing else, the runtime's
//! start-up probes, then every entry point through `cuGetProcAddress_v2` with the runtime's
//! version (`--cuda-version`, default 12080) and flags (`--per-thread` selects
//! CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, i.e. the `_ptsz` variants). Entry points
//! the table pins (`cuCtxCreate`) are asked for at the version of their signature instead,
//! as a runtime program does with `cudaGetDriverEntryPointByVersion`.
//!
//! `--dlmopen` loads the driver with `dlmopen(LM_ID_NEWLM)` instead, into a link-map namespace
//! no preloaded library reaches, and looks `cuGetProcAddress_v2` up with that namespace's own
//! `dlsym`: a process that BYPASSES the shim even under `/etc/ld.so.preload` (what the node
//! agent's backstop must catch). Its reports name the client `dlmopen`.
//!
//! Besides the shared scenarios, `resolve` prints what the lookups answered: the probes, each
//! entry point's result and status, and whether per-thread lookups returned a different
//! function than default ones for the entry points that have a `_ptsz` variant.

use cuda_clients::driver::{self, Driver, GetProcAddressV2, ProcAnswer, ENTRY_POINTS};
use gpuslice_abi::cuda::proc_address::*;
use serde_json::{json, Map, Value};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut cuda_version = 12080;
    let mut flags = CU_GET_PROC_ADDRESS_DEFAULT;
    if let Some(i) = args.iter().position(|a| a == "--cuda-version") {
        let parsed = args.get(i + 1).and_then(|v| v.parse().ok());
        match parsed {
            Some(v) => cuda_version = v,
            None => {
                eprintln!("procaddr-client: --cuda-version needs a number like 12080");
                std::process::exit(2);
            }
        }
        args.drain(i..i + 2);
    }
    if let Some(i) = args.iter().position(|a| a == "--per-thread") {
        flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
        args.remove(i);
    }
    let isolated = match args.iter().position(|a| a == "--dlmopen") {
        Some(i) => {
            args.remove(i);
            true
        }
        None => false,
    };

    let opened = if isolated {
        driver::dlmopen_isolated("libcuda.so.1")
    } else {
        driver::dlopen("libcuda.so.1").map(|h| (h, libc::dlsym as driver::DlsymFn))
    };
    let (handle, dlsym) = match opened {
        Ok(h) => h,
        Err(e) => {
            eprintln!("procaddr-client: {e}");
            std::process::exit(3);
        }
    };
    // SAFETY: handle is the live handle just opened, `dlsym` one that can search it; the
    // name is NUL-terminated.
    let address = unsafe { dlsym(handle, c"cuGetProcAddress_v2".as_ptr()) };
    if address.is_null() {
        eprintln!("procaddr-client: libcuda.so.1 has no cuGetProcAddress_v2");
        std::process::exit(3);
    }
    // SAFETY: cuGetProcAddress_v2 has this signature in every driver that exports it.
    let get: GetProcAddressV2 = unsafe { std::mem::transmute(address) };

    let probes = probes(get, address);
    eprintln!("procaddr-client: probes {probes}");
    let mut answers = Map::new();
    // SAFETY: cuGetProcAddress_v2 answers, for each name, the function of that name with the
    // ABI of the version asked for: `cuda_version`, whose signatures the table's are for the
    // versions the client supports (12.x, 13.0), or the table's own version for the pinned
    // entry points (cuCtxCreate at 3020 is cuCtxCreate_v2, not 12.x's _v4).
    let driver = unsafe {
        Driver::from_lookup(if isolated { "dlmopen" } else { "procaddr" }, |entry| {
            let version = entry.lookup_version(cuda_version);
            let a = driver::get_proc_address(get, entry.name, version, flags);
            answers.insert(entry.name.to_string(), answer_json(&a));
            if a.result == 0 && a.status == CU_GET_PROC_ADDRESS_SUCCESS {
                a.address
            } else {
                std::ptr::null_mut()
            }
        })
    };
    let missing = driver.missing();
    if !missing.is_empty() {
        eprintln!("procaddr-client: cuGetProcAddress_v2 found no {missing:?}");
    }

    if args.first().map(String::as_str) == Some("resolve") {
        let distinct: Map<String, Value> = ENTRY_POINTS
            .iter()
            .filter(|e| e.per_thread)
            .map(|e| {
                let legacy = driver::get_proc_address(
                    get,
                    e.name,
                    cuda_version,
                    CU_GET_PROC_ADDRESS_DEFAULT,
                );
                let ptsz = driver::get_proc_address(
                    get,
                    e.name,
                    cuda_version,
                    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                );
                let differs = !legacy.address.is_null()
                    && !ptsz.address.is_null()
                    && legacy.address != ptsz.address;
                (e.name.to_string(), json!(differs))
            })
            .collect();
        let out = json!({
            "scenario": "resolve",
            "client": "procaddr",
            "cuda_version": cuda_version,
            "flags": flags,
            "probes": probes,
            "entry_points": answers,
            "missing": missing,
            "per_thread_distinct": distinct,
        });
        println!("{out}");
        return;
    }
    std::process::exit(cuda_clients::scenario::main_with(&driver, &args));
}

fn answer_json(a: &ProcAnswer) -> Value {
    json!({"result": a.result, "status": a.status, "found": !a.address.is_null()})
}

/// The runtime's first calls: an empty name (must fail cleanly, not crash), then
/// `cuGetProcAddress` itself at 11030 (the v1 ABI) and 12000 (the v2 ABI).
fn probes(get: GetProcAddressV2, dlsym_address: *mut std::ffi::c_void) -> Value {
    let empty = driver::get_proc_address(get, "", 0, 0);
    let v1 = driver::get_proc_address(get, "cuGetProcAddress", 11030, 0);
    let v2 = driver::get_proc_address(get, "cuGetProcAddress", 12000, 0);
    json!({
        "empty": answer_json(&empty),
        "cuGetProcAddress_11030": answer_json(&v1),
        "cuGetProcAddress_12000": answer_json(&v2),
        "v2_is_dlsym_symbol": v2.address == dlsym_address,
    })
}
