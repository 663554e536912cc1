//! Multi-process behaviour of the shared region: real processes share one cap, a SIGKILLed
//! process's memory comes back, a process stopped in the middle of registering blocks
//! nobody, children forked while other threads register and reserve never inherit anything
//! that blocks, a forked child gets its own slot, and 64 processes registering at once all
//! get distinct slots, and processes SIGKILLed (some while SIGSTOPped) at random points of
//! their ledger traffic leave totals that equal what the living hold once they are reaped.
//!
//! Children are this test binary re-run with the ignored `child_process_entry` selected
//! (`--ignored --exact`) and `GPUSLICE_TEST_CHILD` naming the role; a normal run lists that
//! entry point as ignored, never as a pass. They talk to the parent in `CHILD:` lines on stdout
//! and wait on stdin, so every step is awaited, never slept on.

use gpuslice_common::region::{
    DeadSlot, DeviceLimits, Liveness, ProcessIdentity, Region, RegionError,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const ROLE_ENV: &str = "GPUSLICE_TEST_CHILD";
const PATH_ENV: &str = "GPUSLICE_TEST_REGION";
const BYTES_ENV: &str = "GPUSLICE_TEST_BYTES";
/// A failure here means a child or lock hung; it is a failure detector, not synchronisation.
const HANG: Duration = Duration::from_secs(30);

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("gpuslice-procs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn file(&self) -> PathBuf {
        self.0.join("slice.region")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gpu0(limit: Option<u64>) -> Vec<DeviceLimits> {
    vec![DeviceLimits {
        uuid: "GPU-0".into(),
        memory_limit: limit,
        compute_percent: None,
    }]
}

/// A child process and its `CHILD:` lines.
struct Kid {
    child: Child,
    lines: BufReader<ChildStdout>,
}

impl Kid {
    fn spawn(role: &str, region: &Path, bytes: u64) -> Kid {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "child_process_entry",
                "--ignored",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_ENV, role)
            .env(PATH_ENV, region)
            .env(BYTES_ENV, bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap());
        Kid { child, lines }
    }

    /// The next `CHILD:` line, without the prefix; panics if the child ends first.
    fn next(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.lines.read_line(&mut line).unwrap();
            assert!(n > 0, "child exited before reporting");
            // libtest may print "test child_process_entry ... " on the same line first.
            if let Some(at) = line.find("CHILD: ") {
                return line[at + "CHILD: ".len()..].trim_end().to_string();
            }
        }
    }

    fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Closes stdin (the child then exits normally) and waits for it.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        let _ = self.lines.read_to_string(&mut rest);
        assert!(self.child.wait().unwrap().success(), "child failed: {rest}");
    }

    fn kill(mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }
}

fn field(report: &str, key: &str) -> u64 {
    report
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {report:?}"))
        .parse()
        .unwrap()
}

/// Entry point of child processes. Ignored in a normal run, so that it never counts as a pass;
/// run alone (`--ignored`) without a role from its parent, it fails saying so.
#[test]
#[ignore = "child process entry of the multi-process tests (Kid::spawn sets its role)"]
fn child_process_entry() {
    let role = std::env::var(ROLE_ENV).unwrap_or_else(|_| {
        panic!("child_process_entry is the child program of the tests that set {ROLE_ENV}; it tests nothing alone")
    });
    let path = PathBuf::from(std::env::var(PATH_ENV).unwrap());
    let bytes: u64 = std::env::var(BYTES_ENV).unwrap().parse().unwrap();
    let stdin = std::io::stdin();
    let mut input = stdin.lock().lines();
    let say = |line: String| {
        println!("CHILD: {line}");
        std::io::stdout().flush().unwrap();
    };
    match role.as_str() {
        // Reserve on the shared cap, report, then hold it until stdin closes.
        "reserve-and-hold" => {
            let region = Region::open_or_create(&path).unwrap();
            let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
            let slot = region
                .register(&ProcessIdentity::current().unwrap())
                .unwrap();
            match region.reserve(slot, device, bytes) {
                Ok(()) => say(format!("reserved slot={}", slot.index())),
                Err(over) => say(format!("refused used={} limit={}", over.used, over.limit)),
            }
            while input.next().is_some() {}
        }
        // Stop ourselves (SIGSTOP) with a slot claimed, in the middle of registering: where
        // the old design held its registration lock.
        "stop-while-registering" => {
            let region = Region::open_or_create(&path).unwrap();
            let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
            let identity = ProcessIdentity::current().unwrap();
            let slot = region
                .register_with(
                    &identity,
                    |slot| {
                        say(format!("claimed slot={}", slot.index()));
                        // SAFETY: raise only sends a signal to ourselves.
                        unsafe { libc::raise(libc::SIGSTOP) };
                    },
                    DeadSlot::holds_nothing,
                )
                .unwrap();
            region.reserve(slot, device, bytes).unwrap();
            say("continued".into());
            while input.next().is_some() {}
        }
        // Threads register and reserve without pause while the main thread forks children
        // that register, reserve and exit: nothing a child inherits may block anyone.
        "fork-during-traffic" => {
            let region = std::sync::Arc::new(Region::open_or_create(&path).unwrap());
            let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let busy: Vec<_> = (0..4)
                .map(|_| {
                    let (region, stop) = (region.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let identity = ProcessIdentity::current().unwrap();
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            let slot = region.register(&identity).unwrap();
                            for _ in 0..50 {
                                if region.reserve(slot, device, MIB).is_ok() {
                                    region.release(slot, device, MIB);
                                }
                            }
                            region.reap_dead().unwrap();
                            region.unregister(slot).unwrap();
                        }
                    })
                })
                .collect();
            let children = bytes as usize;
            let mut failures = 0;
            for _ in 0..children {
                // SAFETY: fork in a test child; the forked child only uses the region (no
                // locks anywhere in it) and _exits.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    let code = match ProcessIdentity::current()
                        .ok_or(())
                        .and_then(|id| region.register(&id).map_err(|_| ()))
                    {
                        Ok(own) => match region.reserve(own, device, MIB) {
                            Ok(()) => 0,
                            Err(_) => 2,
                        },
                        Err(()) => 1,
                    };
                    // SAFETY: leave the forked copy without running destructors.
                    unsafe { libc::_exit(code) };
                }
                let mut status = 0;
                // SAFETY: pid is our child; status is writable.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                    failures += 1;
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for thread in busy {
                thread.join().unwrap();
            }
            say(format!("forked={children} failures={failures}"));
            while input.next().is_some() {}
        }
        // Open, then register when told "go", report the slot, hold it until stdin closes.
        "register-on-go" => {
            let region = Region::open_or_create(&path).unwrap();
            say("opened".into());
            assert_eq!(input.next().unwrap().unwrap(), "go");
            let identity = ProcessIdentity::current().unwrap();
            let started = std::time::Instant::now();
            let slot = region.register(&identity).unwrap();
            say(format!(
                "slot={} micros={}",
                slot.index(),
                started.elapsed().as_micros()
            ));
            while input.next().is_some() {}
        }
        // Register, reserve, fork; the grandchild registers again and reserves too.
        "fork" => {
            let region = Region::open_or_create(&path).unwrap();
            let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
            let slot = region
                .register(&ProcessIdentity::current().unwrap())
                .unwrap();
            region.reserve(slot, device, bytes).unwrap();
            let mut pipe = [0i32; 2];
            // SAFETY: `pipe` has room for the two descriptors.
            assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
            // SAFETY: fork in a test child; the grandchild only registers, reserves, writes
            // one number to the pipe and _exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let code = match ProcessIdentity::current()
                    .ok_or(())
                    .and_then(|id| region.register(&id).map_err(|_| ()))
                {
                    Ok(own) => {
                        let ok = region.reserve(own, device, bytes / 2).is_ok();
                        let message = (own.index() as u32).to_le_bytes();
                        // SAFETY: pipe[1] is open; message is 4 readable bytes.
                        unsafe { libc::write(pipe[1], message.as_ptr().cast(), 4) };
                        if ok {
                            0
                        } else {
                            2
                        }
                    }
                    Err(()) => 1,
                };
                // SAFETY: leave the forked copy without running the parent's destructors.
                unsafe { libc::_exit(code) };
            }
            let mut message = [0u8; 4];
            // SAFETY: pipe[0] is open; message has room for 4 bytes.
            let n = unsafe { libc::read(pipe[0], message.as_mut_ptr().cast(), 4) };
            assert_eq!(n, 4);
            let mut status = 0;
            // SAFETY: pid is our child; status is writable.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
            say(format!(
                "parent_slot={} child_slot={} child_pid={pid}",
                slot.index(),
                u32::from_le_bytes(message)
            ));
            while input.next().is_some() {}
        }
        // Four threads sharing one slot reserve and release on the shared cap without end,
        // until killed (or stopped and killed): the ledger's operations are cut at whatever
        // instruction the signal lands on.
        "churn" => {
            let region = Region::open_or_create(&path).unwrap();
            let device = region.bind_devices(&gpu0(Some(bytes))).unwrap().ids[0];
            let slot = region
                .register(&ProcessIdentity::current().unwrap())
                .unwrap();
            say(format!("ready slot={}", slot.index()));
            let region: &'static Region = Box::leak(Box::new(region));
            for t in 0..4u64 {
                std::thread::spawn(move || {
                    let mut held = std::collections::VecDeque::new();
                    for i in 0u64.. {
                        let size = MIB * (1 + (t * 7 + i * 13) % 8);
                        let kept = region.reserve(slot, device, size).is_ok();
                        if kept {
                            held.push_back(size);
                        }
                        // Refused (the cap is full) or holding enough: give one back, so the
                        // slice never stalls with every thread waiting for room.
                        if held.len() > 3 || (!kept && !held.is_empty()) {
                            let size = held.pop_front().unwrap();
                            assert_eq!(region.release(slot, device, size), size);
                        }
                    }
                });
            }
            // A parent that died without killing us closes our stdin: stop then.
            while input.next().is_some() {}
            std::process::exit(0);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn two_processes_share_one_cap() {
    let dir = TempDir::new("share");
    let region = Region::open_or_create(&dir.file()).unwrap();
    let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
    let slot = region
        .register(&ProcessIdentity::current().unwrap())
        .unwrap();
    region.reserve(slot, device, 60 * MIB).unwrap();

    // 60 + 60 > 100: the other process is refused and sees our 60.
    let mut greedy = Kid::spawn("reserve-and-hold", &dir.file(), 60 * MIB);
    let report = greedy.next();
    assert!(report.starts_with("refused"), "{report}");
    assert_eq!(field(&report, "used"), 60 * MIB);
    assert_eq!(field(&report, "limit"), 100 * MIB);
    greedy.finish();

    // 60 + 40 fits; then we are refused, seeing its 40.
    let mut modest = Kid::spawn("reserve-and-hold", &dir.file(), 40 * MIB);
    let report = modest.next();
    assert!(report.starts_with("reserved"), "{report}");
    let over = region.reserve(slot, device, 1).unwrap_err();
    assert_eq!((over.used, over.limit), (100 * MIB, 100 * MIB));
    modest.finish();

    // The child exited without unregistering: its 40 come back once it has exited.
    let report = region.reap_dead_if(DeadSlot::exited_or_timed_out).unwrap();
    assert_eq!(report.bytes_reclaimed(), 40 * MIB);
    assert_eq!(region.usage(device).used, 60 * MIB);
}

#[test]
fn sigkilled_process_reservation_is_reclaimed() {
    let dir = TempDir::new("sigkill");
    let region = Region::open_or_create(&dir.file()).unwrap();
    let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
    let mut victim = Kid::spawn("reserve-and-hold", &dir.file(), 70 * MIB);
    let report = victim.next();
    let victim_slot = field(&report, "slot") as usize;
    let victim_pid = victim.child.id();
    assert_eq!(region.usage(device).used, 70 * MIB);
    let alive = region.snapshot();
    assert_eq!(alive.processes.len(), 1);
    assert_eq!(alive.processes[0].pid, victim_pid);
    assert_eq!(alive.processes[0].liveness, Liveness::Alive);

    victim.kill();
    let stale = Region::open_existing(&dir.file()).unwrap().snapshot();
    assert_eq!(stale.processes[0].liveness, Liveness::Stale);
    // The default reap keeps a dead slot that holds memory (the driver may still hold it)...
    assert!(region.reap_dead().unwrap().reclaimed.is_empty());
    assert_eq!(region.usage(device).used, 70 * MIB);
    // ...the caller's evidence frees it.
    let report = region.reap_dead_if(DeadSlot::exited_or_timed_out).unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].slot.index(), victim_slot);
    assert_eq!(report.reclaimed[0].pid, victim_pid);
    assert_eq!(report.reclaimed[0].bytes, 70 * MIB);
    assert_eq!(region.usage(device).used, 0);
    let slot = region
        .register(&ProcessIdentity::current().unwrap())
        .unwrap();
    assert_eq!(region.reserve(slot, device, 100 * MIB), Ok(()));
}

#[test]
fn a_process_stopped_while_registering_blocks_nobody() {
    let dir = TempDir::new("stopped");
    let region = Region::open_or_create(&dir.file()).unwrap();
    let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
    let mut stopped = Kid::spawn("stop-while-registering", &dir.file(), 30 * MIB);
    let claimed = stopped.next();
    let stopped_slot = field(&claimed, "slot");
    // Wait until it really is stopped (state T in /proc).
    let pid = stopped.child.id();
    let stat = format!("/proc/{pid}/stat");
    let deadline = std::time::Instant::now() + HANG;
    while !std::fs::read_to_string(&stat)
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('T')
        })
        .unwrap_or(false)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the child never stopped"
        );
        std::thread::yield_now();
    }
    // Everything another process does completes while it stays stopped.
    let path = dir.file();
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let outcome = (|| -> Result<u64, RegionError> {
            let other = Region::open_or_create(&path)?;
            let device = other.bind_devices(&gpu0(Some(100 * MIB)))?.ids[0];
            let slot = other.register(&ProcessIdentity::current().unwrap())?;
            other.reserve(slot, device, 100 * MIB).unwrap();
            let refused = other.reserve(slot, device, MIB).is_err();
            other.release(slot, device, 100 * MIB);
            other.reap_dead()?;
            other.unregister(slot)?;
            Ok(slot.index() as u64 + if refused { 1000 } else { 0 })
        })();
        done.send(outcome).unwrap();
    });
    let outcome = result
        .recv_timeout(HANG)
        .expect("blocked by a stopped process");
    let other_slot = outcome.unwrap();
    assert!(other_slot >= 1000, "past the cap was not refused");
    assert_ne!(other_slot - 1000, stopped_slot);
    // The stopped process's slot is alive (stopped is not dead) and resumes normally.
    assert_eq!(region.snapshot().processes.len(), 1);
    // SAFETY: sending SIGCONT to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    assert_eq!(stopped.next(), "continued");
    assert_eq!(region.usage(device).used, 30 * MIB);
    stopped.finish();
}

#[test]
fn children_forked_during_registration_traffic_never_block() {
    let dir = TempDir::new("fork-traffic");
    Region::open_or_create(&dir.file()).unwrap();
    let mut forker = Kid::spawn("fork-during-traffic", &dir.file(), 60);
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let report = forker.next();
        done.send((report, forker)).ok();
    });
    let (report, forker) = result
        .recv_timeout(HANG)
        .expect("a forked child or the forking process blocked");
    assert_eq!(report, "forked=60 failures=0");
    forker.finish();
}

#[test]
fn forked_child_registers_its_own_slot() {
    let dir = TempDir::new("fork");
    let region = Region::open_or_create(&dir.file()).unwrap();
    let device = region.bind_devices(&gpu0(Some(100 * MIB))).unwrap().ids[0];
    let mut parent = Kid::spawn("fork", &dir.file(), 20 * MIB);
    let report = parent.next();
    let parent_slot = field(&report, "parent_slot");
    let child_slot = field(&report, "child_slot");
    assert_ne!(parent_slot, child_slot);
    assert_eq!(region.usage(device).used, 30 * MIB);

    // The grandchild has exited: its slot is stale, the forking process's is alive.
    let snapshot = region.snapshot();
    let liveness = |slot: u64| {
        snapshot
            .processes
            .iter()
            .find(|p| p.slot.index() as u64 == slot)
            .unwrap()
            .liveness
    };
    assert_eq!(liveness(parent_slot), Liveness::Alive);
    assert_eq!(liveness(child_slot), Liveness::Stale);
    let report = region.reap_dead_if(DeadSlot::exited_or_timed_out).unwrap();
    assert_eq!(report.reclaimed.len(), 1);
    assert_eq!(report.reclaimed[0].bytes, 10 * MIB);
    assert_eq!(region.usage(device).used, 20 * MIB);

    parent.kill();
    assert_eq!(
        region
            .reap_dead_if(DeadSlot::exited_or_timed_out)
            .unwrap()
            .bytes_reclaimed(),
        20 * MIB
    );
    assert_eq!(region.usage(device).used, 0);
}

#[test]
fn sixty_four_processes_registering_at_once_get_distinct_slots() {
    let dir = TempDir::new("sixty-four");
    Region::open_or_create(&dir.file()).unwrap();
    let mut kids: Vec<Kid> = (0..64)
        .map(|_| Kid::spawn("register-on-go", &dir.file(), 0))
        .collect();
    for kid in &mut kids {
        assert_eq!(kid.next(), "opened");
    }
    for kid in &mut kids {
        kid.say("go");
    }
    let reports: Vec<String> = kids.iter_mut().map(Kid::next).collect();
    let mut slots: Vec<u64> = reports.iter().map(|r| field(r, "slot")).collect();
    let slowest = reports.iter().map(|r| field(r, "micros")).max().unwrap();
    eprintln!("64 concurrent registrations: slowest took {slowest} us");
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), 64, "two processes got the same slot");

    let snapshot = Region::open_existing(&dir.file()).unwrap().snapshot();
    let mut pids: Vec<u32> = snapshot.processes.iter().map(|p| p.pid).collect();
    let mut kid_pids: Vec<u32> = kids.iter().map(|k| k.child.id()).collect();
    pids.sort_unstable();
    kid_pids.sort_unstable();
    assert_eq!(pids, kid_pids);
    assert!(snapshot
        .processes
        .iter()
        .all(|p| p.liveness == Liveness::Alive));
    for kid in kids {
        kid.finish();
    }
}

#[test]
fn truncated_file_gives_an_error_in_a_fresh_process_view() {
    let dir = TempDir::new("truncate");
    Region::open_or_create(&dir.file()).unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.file())
        .unwrap();
    file.set_len(100).unwrap();
    assert!(matches!(
        Region::open_existing(&dir.file()),
        Err(RegionError::WrongSize { found: 100, .. })
    ));
    assert!(matches!(
        Region::open_or_create(&dir.file()),
        Err(RegionError::WrongSize { found: 100, .. })
    ));
}

/// A small xorshift generator: where the kills land changes from run to run (the seed is
/// printed, so a failing run can be replayed with `GPUSLICE_TEST_SEED`).
struct Random(u64);

impl Random {
    fn new() -> Random {
        let seed = std::env::var("GPUSLICE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
                    ^ u64::from(std::process::id())
            });
        println!("seed {seed}");
        Random(seed | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn processes_killed_at_random_points_of_their_ledger_traffic_leave_no_drift() {
    let dir = TempDir::new("kill-storm");
    let limit = 64 * MIB;
    let region = Region::open_or_create(&dir.file()).unwrap();
    let device = region.bind_devices(&gpu0(Some(limit))).unwrap().ids[0];
    let me = region
        .register(&ProcessIdentity::current().unwrap())
        .unwrap();
    let mut random = Random::new();
    let mut kids: Vec<Kid> = Vec::new();
    let mut killed = 0;
    let mut stopped_kills = 0;
    while killed < 60 {
        while kids.len() < 4 {
            let mut kid = Kid::spawn("churn", &dir.file(), limit);
            assert!(kid.next().starts_with("ready"));
            kids.push(kid);
        }
        // Let the survivors' traffic move the total a random number of times (awaited, so
        // each kill lands somewhere inside the traffic), never past the cap.
        let changes = 1 + random.below(64);
        let mut seen = 0;
        let mut last = region.usage(device).used;
        let started = std::time::Instant::now();
        while seen < changes {
            let used = region.usage(device).used;
            assert!(used <= limit, "the total passed the cap: {used}");
            if used != last {
                seen += 1;
                last = used;
            }
            assert!(
                started.elapsed() < HANG,
                "no traffic after {killed} kills: total {used}, slots {:?}",
                region
                    .snapshot()
                    .processes
                    .iter()
                    .map(|p| (p.slot.index(), p.pid, p.used_bytes[0], p.liveness))
                    .collect::<Vec<_>>()
            );
        }
        let victim = kids.swap_remove(random.below(kids.len() as u64) as usize);
        let pid = victim.child.id() as libc::pid_t;
        if random.below(3) == 0 {
            // Stopped mid-traffic first: while it is stopped, nobody waits for it.
            // SAFETY: signalling our own child, which has not been reaped.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
            assert_eq!(region.reserve(me, device, 0), Ok(()));
            if region.reserve(me, device, MIB).is_ok() {
                assert_eq!(region.release(me, device, MIB), MIB);
            }
            stopped_kills += 1;
        }
        victim.kill();
        killed += 1;
        // A dead slot keeps its bytes until reaped (the driver may hold them): reap it with
        // the kernel's word, amid the survivors' traffic, or the dead would fill the cap.
        let report = region.reap_dead_if(|_| true).unwrap();
        assert_eq!(report.reclaimed.len(), 1, "{report:?}");
    }
    for kid in kids {
        kid.kill();
    }
    // Every child is dead: reaped with the kernel's word, the totals must hold exactly what
    // the living (this process, holding nothing) hold, and the whole cap must be free.
    let report = region.reap_dead_if(|_| true).unwrap();
    assert!(report.pending.is_empty(), "{report:?}");
    assert_eq!(region.usage(device).used, 0, "drift after {killed} kills");
    let left: u64 = region
        .snapshot()
        .processes
        .iter()
        .map(|p| p.used_bytes[device.index()])
        .sum();
    assert_eq!(left, 0);
    assert_eq!(region.reserve(me, device, limit), Ok(()));
    assert!(region.reserve(me, device, 1).is_err());
    assert!(stopped_kills > 0 || killed > 0);
}
