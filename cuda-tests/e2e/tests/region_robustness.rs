//! The slice's shared region against what real processes, users and operators do to it,
//! through real clients and judged by the fake card: a process stopped in the middle of
//! registering blocks nobody; a deleted or replaced region file never starts a second ledger,
//! and no reader's read locks make a newcomer refuse one that was not;
//! a symbolic link at the region's path is never followed; an exited process's memory shows
//! back in the others' views once the driver released it; processes of different users
//! share one slice.

use cuda_e2e::{wait_until, Client, ClientKind, FakeGpu, Slice, DEFAULT_TIMEOUT, GIB, MIB};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const CONTEXT: u64 = 300 * MIB;

fn signal(pid: u32, signal: i32) {
    // SAFETY: sending a signal to a process this test started.
    unsafe { libc::kill(pid as i32, signal) };
}

fn last_json(out: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or(Value::Null)
}

fn gpuslice_lines(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("[gpuslice]"))
        .map(str::to_string)
        .collect()
}

/// A client that could not start because the slice fails closed: no allocation result is a
/// success, and the one `[gpuslice]` line names `needle`.
fn assert_refused_naming(out: &std::process::Output, needle: &str, what: &str) {
    let json = last_json(out);
    assert!(
        !json.to_string().contains("CUDA_SUCCESS\"]") && json["results"][0] != "CUDA_SUCCESS",
        "{what}: a client allocated: {json}"
    );
    let lines = gpuslice_lines(out);
    assert!(
        lines.iter().any(|l| l.contains(needle)),
        "{what}: no line names {needle}: {lines:?} ({json})"
    );
}

#[test]
fn a_process_stopped_while_registering_blocks_no_other_process() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    gpu.truth().reset_peak_memory(0);
    // The shim's test hook: create the marker, then pause in the middle of registering with
    // a slot claimed (where the old design held its registration lock). We stop it there.
    let marker = slice.region_path().with_extension("paused");
    let mut paused_env = env.clone();
    paused_env.push((
        "GPUSLICE_TEST_PAUSE_IN_REGISTRATION".into(),
        marker.display().to_string(),
    ));
    let mut cmd = cuda_e2e::command(
        &ClientKind::Linked.binary(),
        &["alloc", "64MiB"],
        &paused_env,
    );
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut paused = cmd.spawn().expect("start the pausing client");
    wait_until("the client is registering", DEFAULT_TIMEOUT, || {
        marker.exists()
    });
    signal(paused.id(), libc::SIGSTOP);
    // While it stays stopped: others start, allocate, are refused past the cap, exit.
    let granted = Client::run(ClientKind::Cudarc, &["alloc", "1GiB"], &env);
    assert_eq!(granted["results"][0], "CUDA_SUCCESS", "{granted}");
    let refused = Client::run(ClientKind::ProcAddr, &["alloc", "1800MiB"], &env);
    assert_eq!(
        refused["results"][0], "CUDA_ERROR_OUT_OF_MEMORY",
        "past the cap is refused, not waited for: {refused}"
    );
    signal(paused.id(), libc::SIGCONT);
    paused.kill().unwrap();
    paused.wait().unwrap();
    assert!(gpu.truth().peak_memory(0) <= 2 * GIB);
    // The killed registrant held nothing: the whole slice is there for the next process.
    let info = Client::run(ClientKind::Linked, &["meminfo"], &env);
    assert_eq!(info["free"], 2 * GIB - CONTEXT, "{info}");
}

/// Read locks on `(start, length)` ranges of `path` (length 0: to the end), held until the
/// descriptor is dropped: what anyone who may open it for reading can take.
fn read_locks(path: &Path, ranges: &[(u64, u64)]) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for &(start, len) in ranges {
        // SAFETY: flock is plain data; zero is valid for every field.
        let mut range: libc::flock = unsafe { std::mem::zeroed() };
        range.l_type = libc::F_RDLCK as libc::c_short;
        range.l_whence = libc::SEEK_SET as libc::c_short;
        range.l_start = start as libc::off_t;
        range.l_len = len as libc::off_t;
        // SAFETY: the descriptor is open; `range` is a valid flock for the call.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut range) };
        assert_eq!(
            rc,
            0,
            "{}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    file
}

/// A reader of the region's directory (the node agent, a monitoring tool, anyone with a
/// read-only view of it) holding read locks on all of the directory, of the guard file
/// beside the region and of the bytes where processes mark the region: a newcomer of the
/// idle slice allocates, and next to a holder it shares the one ledger (refused at the cap),
/// never failing closed. (A read lock on the directory made every newcomer fail closed with
/// a false "replaced" before.)
#[test]
fn a_reader_holding_read_locks_on_the_region_directory_makes_no_process_fail_closed() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    let region = slice.region_path();
    let ran = Client::run(ClientKind::Linked, &["alloc", "100MiB"], &env);
    assert_eq!(ran["results"][0], "CUDA_SUCCESS", "{ran}");
    let dir = region.parent().unwrap();
    let guard = dir.join(".region.guard");
    // The marks' range of the region file (`common/src/region/layout.rs`, `MARKS`).
    let marks = (1u64 << 41, 1u64 << 40);
    // On the directory, the byte a lock on the region's name would be at (64-bit FNV-1a of
    // "name:" and the name, as the region hashes names): a read lock there alone says "a
    // process maps a region of this name" to a guard made of directory locks.
    let name_byte = b"name:region"
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
        & ((1 << 62) - 1);
    assert!(guard.is_file(), "the region's guard file");
    let _reader = [
        read_locks(dir, &[(name_byte, 1)]),
        read_locks(&guard, &[(0, 0)]),
        read_locks(&region, &[marks]),
    ];
    let idle = Client::output(ClientKind::Cudarc, &["alloc", "600MiB"], &env);
    assert_eq!(
        last_json(&idle)["results"][0],
        "CUDA_SUCCESS",
        "{:?}",
        gpuslice_lines(&idle)
    );
    // 700 MiB on the card: a newcomer's context fits, its 600 MiB do not.
    let holder = Client::spawn(ClientKind::Linked, &["hold", "400MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    gpu.truth().reset_peak_memory(0);
    let beside = Client::output(ClientKind::ProcAddr, &["alloc", "600MiB"], &env);
    assert_eq!(
        last_json(&beside)["results"][0],
        "CUDA_ERROR_OUT_OF_MEMORY",
        "one ledger: {:?}",
        gpuslice_lines(&beside)
    );
    assert!(
        !gpu_lines_mention(&beside, "replaced") && !gpu_lines_mention(&beside, "emptied"),
        "{:?}",
        gpuslice_lines(&beside)
    );
    assert!(gpu.truth().peak_memory(0) <= GIB);
    holder.release();
}

#[test]
fn a_deleted_or_replaced_region_never_starts_a_second_ledger() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    let region = slice.region_path();
    let holder = Client::spawn(ClientKind::Linked, &["hold", "600MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    gpu.truth().reset_peak_memory(0);

    // Deleted under the running holder: a newcomer refuses instead of a fresh ledger (which
    // let it take another 600 MiB: +904 MiB over the cap before).
    std::fs::remove_file(&region).unwrap();
    let out = Client::output(ClientKind::Cudarc, &["alloc", "600MiB"], &env);
    assert_refused_naming(&out, &region.display().to_string(), "deleted");
    assert!(
        gpu_lines_mention(&out, "replaced"),
        "the line says what happened: {:?}",
        gpuslice_lines(&out)
    );

    // Replaced by another valid region renamed over the path: refused the same way.
    let other = region.with_file_name("other.region");
    assert!(gpuslice_reset(&other).status.success());
    std::fs::rename(&other, &region).unwrap();
    let out = Client::output(ClientKind::ProcAddr, &["alloc", "600MiB"], &env);
    assert_refused_naming(&out, &region.display().to_string(), "renamed over");
    assert!(
        gpu.truth().peak_memory(0) <= GIB,
        "the card passed the cap: {}",
        gpu.truth().peak_memory(0)
    );

    // The holder keeps its ledger and its memory; once it is gone the file at the path is
    // the slice's.
    assert_eq!(gpu.truth().used_memory(0), CONTEXT + 600 * MIB);
    holder.release();
    wait_until("the holder's memory freed", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
    let after = Client::run(ClientKind::Linked, &["alloc", "600MiB"], &env);
    assert_eq!(after["results"][0], "CUDA_SUCCESS", "{after}");
}

/// Emptied in place (zeroed, truncated to 0) or made unreadable (chmod 000) while a process of
/// the slice holds 600 of its 1 GiB: a newcomer either fails closed naming the file or joins
/// the one ledger, never initialises the file afresh (which let it take another 600 MiB:
/// +404 MiB over the cap before).
#[test]
fn a_region_emptied_or_chmoded_under_live_processes_never_starts_a_second_ledger() {
    use std::os::unix::fs::PermissionsExt;
    for how in ["zeroed", "truncated", "chmod 000"] {
        let gpu = FakeGpu::start("v100");
        let slice = Slice::builder().device(0, "1GiB", None).build();
        let env = slice.env(&gpu);
        let region = slice.region_path();
        let holder = Client::spawn(ClientKind::Linked, &["hold", "600MiB"], &env);
        assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
        gpu.truth().reset_peak_memory(0);
        match how {
            "zeroed" => {
                let len = std::fs::metadata(&region).unwrap().len() as usize;
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&region)
                    .unwrap();
                std::io::Write::write_all(&mut file, &vec![0u8; len]).unwrap();
            }
            "truncated" => std::fs::OpenOptions::new()
                .write(true)
                .open(&region)
                .unwrap()
                .set_len(0)
                .unwrap(),
            _ => std::fs::set_permissions(&region, std::fs::Permissions::from_mode(0o000)).unwrap(),
        }
        let out = Client::output(ClientKind::Cudarc, &["alloc", "600MiB"], &env);
        let json = last_json(&out);
        let lines = gpuslice_lines(&out);
        eprintln!("{how}: newcomer {json}; {lines:?}");
        assert_ne!(
            json["results"][0], "CUDA_SUCCESS",
            "{how}: a second ledger let the newcomer past the cap: {json} {lines:?}"
        );
        if how == "chmod 000" {
            // Root opens it anyway and joins the one ledger (refused at the cap); anyone
            // else fails closed naming the file.
            let refused_at_the_cap = json["results"][0] == "CUDA_ERROR_OUT_OF_MEMORY"
                || json["error"] == "CUDA_ERROR_OUT_OF_MEMORY";
            if !refused_at_the_cap {
                assert_refused_naming(&out, &region.display().to_string(), how);
            }
        } else {
            assert_refused_naming(&out, &region.display().to_string(), how);
            assert!(
                gpu_lines_mention(&out, "emptied"),
                "{how}: the line says what happened: {lines:?}"
            );
        }
        let peak = gpu.truth().peak_memory(0);
        assert!(
            peak <= GIB,
            "{how}: the card reached {} MiB, past the 1 GiB cap",
            peak / MIB
        );
        // (Truncated, the holder dies of SIGBUS at its next touch of the region: documented.)
        holder.kill();
    }
}

fn gpu_lines_mention(out: &std::process::Output, word: &str) -> bool {
    gpuslice_lines(out).iter().any(|l| l.contains(word))
}

/// `gpuslice reset --region PATH`: creates (or rebuilds) an empty region there.
fn gpuslice_reset(path: &Path) -> std::process::Output {
    let mut cmd = Command::new(cuda_e2e::gpuslice_binary());
    cmd.args(["reset", "--region"]).arg(path);
    cuda_e2e::run_with_timeout(cmd, None, DEFAULT_TIMEOUT)
}

#[test]
fn a_symlink_at_the_region_path_is_never_followed_by_the_shim_or_reset() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    let region = slice.region_path();
    let victim = region.with_file_name("precious");
    std::fs::write(&victim, b"root:x:0:0:root:/root:/bin/bash\n").unwrap();
    std::os::unix::fs::symlink(&victim, &region).unwrap();

    let out = Client::output(ClientKind::Linked, &["alloc", "64MiB"], &env);
    assert_refused_naming(&out, "symbolic link", "link to a file");
    let reset = gpuslice_reset(&region);
    assert!(!reset.status.success(), "reset wrote through a link");
    assert!(
        String::from_utf8_lossy(&reset.stderr).contains("symbolic link"),
        "{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"root:x:0:0:root:/root:/bin/bash\n",
        "the link's target was changed"
    );

    // Dangling: the shim never creates the target.
    std::fs::remove_file(&victim).unwrap();
    let out = Client::output(ClientKind::Cudarc, &["alloc", "64MiB"], &env);
    assert_refused_naming(&out, "symbolic link", "dangling link");
    assert!(!victim.exists(), "the shim created the link's target");
    assert_eq!(gpu.truth().peak_memory(0), 0, "nothing reached the card");
}

#[test]
fn an_exited_process_memory_shows_back_in_the_others_views() {
    let gpu = FakeGpu::start("v100");
    let cap = 2 * GIB;
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    let mut viewer = Client::spawn(ClientKind::Linked, &["watch-free"], &env);
    assert_eq!(viewer.first["mem_free"], cap - CONTEXT, "{}", viewer.first);
    let holder = Client::spawn(ClientKind::Cudarc, &["hold", "500MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    // The viewer sees the holder.
    viewer.send(&format!("{}\n", 0));
    let seen = viewer.next_line();
    assert_eq!(seen["free"], cap - 2 * CONTEXT - 500 * MIB, "{seen}");
    // Killed: once the card has freed it, the viewer's own view shows it back, with no other
    // process starting (before: it kept counting the dead holder until one did).
    holder.kill();
    wait_until("the card freed the holder", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == CONTEXT
    });
    viewer.send(&format!("{}\n", cap - CONTEXT));
    let back = viewer.next_line();
    eprintln!(
        "the view showed the dead holder's memory back after {} ms",
        back["waited_ms"]
    );
    assert_eq!(
        back["free"],
        cap - CONTEXT,
        "the view still counts the dead: {back}"
    );
    viewer.release();
}

/// Processes that exit normally leave their slots (and context bytes) in the region until a
/// starting process reaps them; `gpuslice status` must not show those bytes as used once the
/// driver lists the processes no more (it showed 3 x 300 MiB "used" by nobody).
#[test]
fn status_never_shows_memory_of_processes_that_have_exited() {
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "2GiB", None).build();
    let env = slice.env(&gpu);
    for kind in ClientKind::ALL {
        let out = Client::run(kind, &["alloc", "100MiB"], &env);
        assert_eq!(out["results"][0], "CUDA_SUCCESS", "{out}");
    }
    wait_until("the card freed the exited", DEFAULT_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
    let status = cuda_e2e::region_status_with(&slice.region_path(), &gpu.env());
    eprintln!("status after three exits: {status}");
    assert_eq!(
        status["devices"][0]["used"], 0,
        "status counts memory of exited processes: {status}"
    );
    for p in status["processes"].as_array().unwrap() {
        assert_eq!(p["used_total"], 0, "{p}");
        assert_ne!(p["state"], "alive", "{p}");
    }
    // A live holder is still shown.
    let holder = Client::spawn(ClientKind::Linked, &["hold", "100MiB"], &env);
    let status = cuda_e2e::region_status_with(&slice.region_path(), &gpu.env());
    assert_eq!(
        status["devices"][0]["used"],
        CONTEXT + 100 * MIB,
        "{status}"
    );
    holder.release();
}

#[test]
fn processes_of_different_users_share_one_slice() {
    if !nix_is_root() {
        cuda_e2e::skip::skip_or_fail("needs root to run a client as another user");
        return;
    }
    let gpu = FakeGpu::start("v100");
    let slice = Slice::builder().device(0, "1GiB", None).build();
    let env = slice.env(&gpu);
    // The fake card's state is the "driver": open to every user, as /dev/nvidia* is.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(gpu.state_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    // root's holder: 300 MiB context + 100 MiB; a nobody process adds its 300 MiB context.
    let holder = Client::spawn(ClientKind::Linked, &["hold", "100MiB"], &env);
    assert_eq!(holder.first["result"], "CUDA_SUCCESS", "{}", holder.first);
    // Another user (nobody) joins the region root's process created: same cap together.
    let as_nobody = |args: &[&str]| {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(ClientKind::Cudarc.binary())
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let out = cuda_e2e::run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
        (last_json(&out), gpuslice_lines(&out))
    };
    let (granted, lines) = as_nobody(&["alloc", "200MiB"]);
    assert_eq!(granted["results"][0], "CUDA_SUCCESS", "{granted} {lines:?}");
    let (refused, lines) = as_nobody(&["alloc", "200MiB", "--count", "2"]);
    assert_eq!(
        refused["results"],
        serde_json::json!(["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]),
        "{refused} {lines:?}"
    );
    assert!(gpu.truth().peak_memory(0) <= GIB);
    holder.release();
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
