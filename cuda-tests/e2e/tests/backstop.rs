//! The node agent's backstop against what a tenant can do from inside its slice, on the
//! simulated card: bytes taken through the real driver behind the shim, laundered or not,
//! and the region's words rewritten (its limit, its total, a slot naming another process).
//! Each test runs the real
//! `gpuslice-node --enforce` and real client processes, and asserts the fake card's truth
//! (how far and for how long the slice's processes held more than the cap) and the agent's
//! verdict (which process ended, when, and what it counted).
//!
//! Timing-dependent (how long a condition lasts before a process is ended): a serial test
//! binary (`xtask` `SERIAL_TEST_BINARIES`); margins of 2 s for a loaded 2-core machine.

#[path = "common/agent.rs"]
mod agent;

use agent::{is_running, scraped, Daemon};
use cuda_e2e::{wait_until, Client, ClientKind, FakeGpu, Running, Slice, TempDir, GIB, MIB};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);
/// What a loaded machine may add to a decision the agent times (one look, the kill).
const MARGIN: Duration = Duration::from_secs(2);
/// How long a registered process may hold bytes beyond its ledger entry plus the bound
/// (`agent/src/backstop.rs`).
const UNACCOUNTED_FOR: Duration = Duration::from_secs(3);
/// A context on the simulated V100.
const CONTEXT: u64 = 300 * MIB;

/// A slice of `memory` on device 0 whose limit file is in the agent's `--slices-dir`.
struct Bed {
    gpu: FakeGpu,
    slice: Slice,
    work: TempDir,
}

impl Bed {
    fn new(memory: &str) -> Bed {
        let gpu = FakeGpu::start("v100");
        let work = TempDir::new("backstop");
        let slices = work.path().join("slices");
        std::fs::create_dir_all(&slices).unwrap();
        let slice = Slice::builder().device(0, memory, None).build();
        std::fs::copy(slice.config_path(), slices.join("s.json")).unwrap();
        Bed { gpu, slice, work }
    }

    fn agent(&self, extra: &[&str]) -> (Daemon, String) {
        agent::start(
            &self.gpu.env(),
            self.work.path(),
            &self.work.path().join("slices"),
            extra,
        )
    }

    fn spawn(&self, args: &[&str]) -> Running {
        Client::spawn(ClientKind::Linked, args, &self.slice.env(&self.gpu))
    }

    /// The card's bytes for `pid`, by the fake's truth.
    fn card_bytes(&self, pid: u32) -> u64 {
        self.gpu
            .truth()
            .processes(0)
            .iter()
            .filter(|p| p.pid == pid)
            .map(|p| p.used_memory)
            .sum()
    }

    /// Every byte on the card (only the slice's processes run on it).
    fn card_total(&self) -> u64 {
        self.gpu.truth().used_memory(0)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.work.path().join("agent.log")).unwrap_or_default()
    }
}

/// Waits (polling the fake's truth every 10 ms) until the card holds at most `cap`; returns
/// how long that took.
fn card_back_under(bed: &Bed, cap: u64) -> Duration {
    let start = Instant::now();
    wait_until("the card is back under the cap", TIMEOUT, || {
        std::thread::sleep(Duration::from_millis(10));
        bed.card_total() <= cap
    });
    start.elapsed()
}

#[test]
fn a_registered_surplus_is_ended_three_seconds_after_it_appears_whatever_interval_and_grace() {
    // The slice's 4 GiB cap is never passed: only the bytes the ledger does not account for
    // can end the process (2 GiB through the real cuMemAlloc_v2 behind the shim).
    for (flags, interval) in [
        (&[][..], 1.0),
        (&["--interval", "0.7", "--grace", "0.3"][..], 0.7),
        (&["--interval", "2.5", "--grace", "9"][..], 2.5),
    ] {
        let bed = Bed::new("4GiB");
        let mut args = vec!["--enforce"];
        args.extend_from_slice(flags);
        let (_agent, addr) = bed.agent(&args);
        // A well-behaved neighbour whose bytes the ledger accounts for.
        let member = bed.spawn(&["hold", "500MiB"]);
        assert_eq!(member.first["result"], "CUDA_SUCCESS", "{}", member.first);
        let hider = bed.spawn(&["behind", "2GiB"]);
        let hidden_at = Instant::now();
        assert_eq!(hider.first["alloc"], "CUDA_SUCCESS", "{}", hider.first);
        let pid = hider.pid();
        let held = bed.card_bytes(pid);
        assert!(
            held >= 2 * GIB + CONTEXT,
            "the card holds its bytes: {held}"
        );
        assert!(
            bed.card_total() < 4 * GIB,
            "within the cap: {}",
            bed.card_total()
        );
        wait_until("the backstop ends the process", TIMEOUT, || {
            !is_running(pid)
        });
        let after = hidden_at.elapsed();
        let latest = UNACCOUNTED_FOR + Duration::from_secs_f64(interval) + MARGIN;
        eprintln!("{flags:?}: ended {after:?} after its bytes appeared (at most {latest:?})");
        assert!(
            after >= UNACCOUNTED_FOR - Duration::from_millis(200),
            "{flags:?}: ended after {after:?}, before the surplus lasted {UNACCOUNTED_FOR:?}"
        );
        assert!(after <= latest, "{flags:?}: ended only after {after:?}");
        wait_until("the card frees its memory", TIMEOUT, || {
            bed.card_bytes(pid) == 0
        });
        assert_eq!(
            scraped(&addr, "gpuslice_backstop_kills_total{slice=\"s\","),
            Some(1.0),
            "{flags:?}: exactly the hider"
        );
        assert_eq!(
            scraped(
                &addr,
                "gpuslice_backstop_unaccounted_events_total{slice=\"s\","
            ),
            Some(1.0),
            "{flags:?}"
        );
        assert!(is_running(member.pid()), "{flags:?}: the member was ended");
        assert!(
            bed.log().contains(&format!("process {pid} has held")),
            "{flags:?}: {}",
            bed.log()
        );
        drop(hider);
        assert!(member.release().success());
    }
}

#[test]
fn a_process_that_hides_bytes_behind_the_shim_then_sets_a_harmless_limit_is_reported_then_ended() {
    // The laundering attempt: 2 GiB through the real cuMemAlloc_v2 in a 1 GiB slice, then
    // cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 1 MiB) through the shim, after which a shim
    // that took NVML's surplus for memory the driver placed by itself would charge the
    // hidden bytes as that.
    let bed = Bed::new("1GiB");
    let member = bed.spawn(&["hold", "100MiB"]);
    assert_eq!(member.first["result"], "CUDA_SUCCESS", "{}", member.first);
    let launderer = bed.spawn(&["behind", "2GiB", "--printf-fifo", "1MiB"]);
    let laundered_at = Instant::now();
    assert_eq!(
        (&launderer.first["alloc"], &launderer.first["limit"]),
        (&"CUDA_SUCCESS".into(), &"CUDA_SUCCESS".into()),
        "{}",
        launderer.first
    );
    let pid = launderer.pid();
    let over = bed.card_total().saturating_sub(GIB);
    eprintln!("the card holds {} MiB above the cap", over / MIB);
    assert!(over >= GIB, "{over}");

    // Report only (the defaults: --interval 1 --grace 5): reported, not ended.
    {
        let (agent, addr) = bed.agent(&["--interval", "1"]);
        wait_until("the report-only backstop reports it", TIMEOUT, || {
            scraped(
                &addr,
                "gpuslice_backstop_over_cap_events_total{slice=\"s\",",
            )
            .is_some_and(|n| n >= 1.0)
        });
        assert!(is_running(pid), "report only ended it");
        assert_eq!(scraped(&addr, "gpuslice_backstop_kills_total{"), None);
        let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
        assert!(log.contains("report only"), "{log}");
    }

    // Enforcing at the defaults: ended within the bound, whichever rule names it first (its
    // bytes beyond its entry for 3 s, or the slice over its cap for the 5 s grace).
    let (_agent, addr) = bed.agent(&["--interval", "1", "--enforce"]);
    let started = Instant::now();
    wait_until("the backstop ends the launderer", TIMEOUT, || {
        !is_running(pid)
    });
    let within = Duration::from_secs(5) + Duration::from_secs(1) + MARGIN;
    eprintln!(
        "ended {:?} after the enforcing agent started ({:?} after laundering)",
        started.elapsed(),
        laundered_at.elapsed()
    );
    assert!(started.elapsed() <= within, "{:?}", started.elapsed());
    let back_under = card_back_under(&bed, GIB);
    assert!(back_under <= MARGIN, "{back_under:?}");
    assert_eq!(
        scraped(&addr, "gpuslice_backstop_kills_total{slice=\"s\","),
        Some(1.0)
    );
    assert!(
        is_running(member.pid()),
        "the member, whose bytes the ledger accounts for, was ended"
    );
    drop(launderer);
    assert!(member.release().success());
}

/// Writes `value` into word `offset` of the region's first device entry, as a tenant can:
/// its processes map the region read-write. Offsets from `common/src/region/layout.rs`
/// (the header is 128 bytes; in a device entry, the memory limit is at 64, the total at 120).
fn tenant_writes(region: &Path, offset: u64, value: u64) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(region)
        .expect("the region is writable by the slice's processes");
    file.write_all_at(&value.to_le_bytes(), 128 + offset)
        .expect("write the word");
}
const LIMIT_WORD: u64 = 64;
const TOTAL_WORD: u64 = 120;

/// The tenant's second process, started on a thread of its own: allocates `size`, retrying
/// while refused, so it binds the device (which reconciles the limit word with its
/// configuration) before the tenant writes the word.
fn retrying_after_refusal(bed: &Bed, size: &str) -> std::thread::JoinHandle<Running> {
    let env = bed.slice.env(&bed.gpu);
    let size = size.to_string();
    std::thread::spawn(move || {
        Client::spawn(
            ClientKind::Linked,
            &["alloc-retry", &size, "--max-ms", "60000"],
            &env,
        )
    })
}

#[test]
fn a_tenant_that_raises_its_limit_word_or_zeroes_its_total_is_ended_within_the_grace_time() {
    for word in ["limit", "total"] {
        let bed = Bed::new("1GiB");
        let grace = 1.0;
        let (_agent, addr) = bed.agent(&["--enforce", "--grace", "1"]);
        // 400 MiB on the card, then 300 MiB for the second's context: 600 MiB more do not
        // fit, unless the tenant lifts the limit; or 900 MiB, whose total the tenant zeroes.
        let first = bed.spawn(&["hold", if word == "limit" { "100MiB" } else { "600MiB" }]);
        assert_eq!(first.first["result"], "CUDA_SUCCESS", "{}", first.first);
        let region = bed.slice.region_path();
        let second = match word {
            "limit" => {
                // The second process binds (the limit stays 1 GiB: the stricter stays while
                // others live) and is refused; then the tenant lifts the word to 8 GiB.
                let waiting = retrying_after_refusal(&bed, "600MiB");
                wait_until("the second process is refused once", TIMEOUT, || {
                    refusals(&region) >= 1
                });
                tenant_writes(&region, LIMIT_WORD, 8 * GIB);
                waiting.join().unwrap()
            }
            _ => {
                // The total forgets the first process's 900 MiB.
                tenant_writes(&region, TOTAL_WORD, 0);
                bed.spawn(&["hold", "600MiB"])
            }
        };
        assert_eq!(
            second.first["result"], "CUDA_SUCCESS",
            "{word}: {}",
            second.first
        );
        let peak = bed.card_total();
        eprintln!(
            "{word}: the card holds {} MiB above the cap",
            (peak - GIB) / MIB
        );
        assert!(peak > GIB + 64 * MIB, "{word}: {peak}");
        let back_under = card_back_under(&bed, GIB);
        let bound = Duration::from_secs_f64(grace + 0.2) + MARGIN;
        eprintln!("{word}: back under the cap after {back_under:?} (bound {bound:?})");
        assert!(
            back_under <= bound,
            "{word}: over the cap for {back_under:?}"
        );
        // The process holding the most (of two equal ones, the newer) is ended.
        assert!(!is_running(second.pid()), "{word}");
        assert!(
            is_running(first.pid()),
            "{word}: the first process was ended"
        );
        assert_eq!(
            scraped(&addr, "gpuslice_backstop_kills_total{slice=\"s\","),
            Some(1.0),
            "{word}"
        );
        assert_eq!(
            scraped(
                &addr,
                "gpuslice_backstop_accounted_over_cap_events_total{slice=\"s\","
            ),
            Some(1.0),
            "{word}: every byte was in the ledger"
        );
        let log = bed.log();
        assert!(
            log.contains("its ledger accounts for every byte"),
            "{word}: {log}"
        );
        if word == "limit" {
            assert!(log.contains("its region's limit word"), "{log}");
        }
        drop(second);
        assert!(first.release().success());
    }
}

/// A tenant's forged slot: slot `index` of the region claimed for `victim` (its host PID and
/// start time, as `/proc` shows them), holding nothing, and kept alive by a write lock on the
/// slot's liveness byte (held by the returned descriptor). Offsets from
/// `common/src/region/layout.rs`: slots from 5,248, 256 bytes each (state at 0, PID 4, host
/// PID 8, start time 16); the header's slot high-water mark at 36.
fn forge_slot(region: &Path, index: u64, victim: u32) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let stat = std::fs::read_to_string(format!("/proc/{victim}/stat")).unwrap();
    let start: u64 = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(region)
        .unwrap();
    let slot = 5248 + index * 256;
    file.write_all_at(&victim.to_le_bytes(), slot + 4).unwrap();
    file.write_all_at(&victim.to_le_bytes(), slot + 8).unwrap();
    file.write_all_at(&start.to_le_bytes(), slot + 16).unwrap();
    file.write_all_at(&(index as u32 + 1).to_le_bytes(), 36)
        .unwrap();
    // SAFETY: flock is plain data; zero is valid for every field.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = slot as libc::off_t;
    lock.l_len = 1;
    // SAFETY: the descriptor is open; `lock` is a valid flock for the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut lock) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    file.write_all_at(&1u32.to_le_bytes(), slot).unwrap();
    file
}

#[test]
fn a_slot_naming_another_process_makes_the_agent_end_nobody_but_the_slices_own() {
    // A process of no slice holds 2 GiB; a tenant of a 4 GiB slice writes a slot naming it.
    // Taken on its word, the slot would make those bytes the slice's and unaccounted.
    let bed = Bed::new("4GiB");
    let (_agent, addr) = bed.agent(&["--enforce", "--grace", "1"]);
    let victim = Client::spawn(ClientKind::Cudarc, &["hold", "2GiB"], &bed.gpu.env());
    assert_eq!(victim.first["result"], "CUDA_SUCCESS", "{}", victim.first);
    let member = bed.spawn(&["hold", "100MiB"]);
    assert_eq!(member.first["result"], "CUDA_SUCCESS", "{}", member.first);
    let _forged = forge_slot(&bed.slice.region_path(), 9, victim.pid());
    // The slice's own hider, ended once its bytes lasted 3 s: the agent judged meanwhile.
    let hider = bed.spawn(&["behind", "1GiB"]);
    let hider_pid = hider.pid();
    wait_until("the backstop ends the hider", TIMEOUT, || {
        !is_running(hider_pid)
    });
    assert!(
        is_running(victim.pid()),
        "the forged slot's process was ended"
    );
    let named = format!("slot 9 of its region names process {}", victim.pid());
    assert!(bed.log().contains(&named), "{}", bed.log());
    assert!(bed.card_bytes(victim.pid()) >= 2 * GIB);
    assert!(is_running(member.pid()));
    assert_eq!(
        scraped(&addr, "gpuslice_backstop_kills_total{slice=\"s\","),
        Some(1.0)
    );
    drop(hider);
    drop(victim);
    assert!(member.release().success());
}

/// Refusals the slice's processes counted in the region (its first device entry's
/// `refused_allocations`, at 136 in the entry).
fn refusals(region: &Path) -> u64 {
    let Ok(file) = std::fs::File::open(region) else {
        return 0;
    };
    let mut word = [0u8; 8];
    match file.read_exact_at(&mut word, 128 + 136) {
        Ok(()) => u64::from_le_bytes(word),
        Err(_) => 0,
    }
}
