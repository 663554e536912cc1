//! Start storms on one slice: 200 and 1,024 processes (the region's slot count, which the
//! fake now serves per card) stand at a start barrier after `cuInit`, are released in the same
//! instant, make their contexts and allocate 2 MiB each. No start may fail because of the
//! shim; the card's high-water mark stays under the cap; once they have all exited normally
//! the slice's ledger, as `gpuslice status` reads it with the driver's word, is back to 0 with
//! no process of the slice having reaped a slot, and one more process then starts and gets
//! the whole slice (the 1,025th start used to fail closed: "every slot belongs to a live
//! process"). Start-up latency (release to the first line) is printed as a table row for
//! docs/performance.md. A storm of 64 whose members each run in a PID namespace of their own
//! (`unshare --pid`, as a pod's processes) must end with every slot recording the host PID the
//! card lists, with the shim's host-PID broker and without it. Starts whose contexts cost more
//! than the slice's figure, released together, pass the cap by one context's excess at most;
//! with a bound far above the contexts a storm still fails none; an allocation made while
//! starts hold the bound waits for them instead of being refused.
//!
//! Declared `test = false` and run serially by `cargo xtask test` (on the 2-core machine the
//! 1,024 storm takes about a minute; it must not share the machine with other tests).
//!
//! `measure_storms` (ignored; `benches/start-storm.sh` runs it) measures storms with and
//! without the shim side by side and prints the figures of docs/performance.md: it asserts
//! nothing about time.

use cuda_e2e::{
    wait_until, Client, ClientKind, FakeGpu, HostPidBroker, Slice, StartBarrier, GIB, MIB,
};
use gpuslice_common::host_pid_broker;
use std::io::Write;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Time allowed for every process of a storm to reach the barrier, and then to start.
const STORM_TIMEOUT: Duration = Duration::from_secs(300);

struct Member {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    spawned: Instant,
}

fn storm(n: usize) {
    let figures = storm_with(n, true, Start::AtBarrier, Pids::Host);
    eprintln!("{}", figures.row());
}

/// How the members of a storm start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// All started, registered and past `cuInit`, then released at one instant: what is
    /// measured is from the release to each member's first line (contexts and allocations).
    AtBarrier,
    /// Spawned one after another as fast as the test can: from each member's spawn to its
    /// first line (exec, loading, the shim's start, `cuInit`, the context, the allocation).
    AtSpawn,
}

/// Which PIDs the members of a storm have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pids {
    /// The test's own PID namespace: the driver lists them under the PIDs they know.
    Host,
    /// Each in a PID namespace of its own (`unshare --pid`), where it is PID 1, as a pod's
    /// processes are: the driver lists them under host PIDs they cannot see; `broker` says
    /// what the shim finds at its host-PID broker's socket.
    OwnNamespaces { broker: Broker },
}

/// The shim's host-PID broker in a storm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broker {
    /// `gpuslice host-pid-broker`, as the node agent serves it in a cluster.
    Serving,
    /// None: each process measures its host PID at its first context, one at a time.
    Absent,
    /// One that accepts and never answers (SIGSTOPped): each process waits its bounded
    /// while, then measures.
    Stopped,
    /// One that answers something that is not a PID: each process measures.
    Garbage,
}

/// How a storm went: spawn to barrier (or, spawned without one, the storm's length: first
/// spawn to last line), and each member's latency (sorted).
struct Figures {
    n: usize,
    start: Start,
    at_barrier: Duration,
    latencies: Vec<Duration>,
    live: usize,
    peak: u64,
    cap: u64,
}

impl Figures {
    fn percentile(&self, p: usize) -> Duration {
        self.latencies[(self.latencies.len() * p / 100).min(self.latencies.len() - 1)]
    }

    fn max(&self) -> Duration {
        *self.latencies.last().unwrap()
    }

    fn row(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let what = match self.start {
            Start::AtBarrier => "spawn to barrier; release to first line",
            Start::AtSpawn => "first spawn to last line; spawn to first line",
        };
        format!(
            "| {} | {:.1} s | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms |  ({what}: p50, p90, p99, max; {} live on the card, peak {} MiB of {} MiB)",
            self.n,
            self.at_barrier.as_secs_f64(),
            ms(self.percentile(50)),
            ms(self.percentile(90)),
            ms(self.percentile(99)),
            ms(self.max()),
            self.live,
            self.peak / MIB,
            self.cap / MIB
        )
    }
}

/// `sliced == false`: the same storm without the shim (the fake's own cost, for the table).
/// The bound on a context's cost is `STORM_CONTEXT_BOUND`, else 8 MiB.
fn storm_with(n: usize, sliced: bool, start: Start, pids: Pids) -> Figures {
    let bound = std::env::var("STORM_CONTEXT_BOUND").unwrap_or_else(|_| (8 * MIB).to_string());
    storm_with_bound(n, sliced, start, pids, bound)
}

fn storm_with_bound(n: usize, sliced: bool, start: Start, pids: Pids, bound: String) -> Figures {
    let gpu = FakeGpu::start("v100");
    let cap = 16 * GIB;
    let slice = Slice::builder().device(0, "16GiB", None).build();
    let mut barrier = StartBarrier::new();
    let mut env = if sliced { slice.env(&gpu) } else { gpu.env() };
    // Small contexts: 1,024 of the fake's default 300 MiB would not fit any card. The bound
    // on a context's cost is set as an operator sets it for a card, near its contexts (the
    // default 512 MiB is 1.7 times a V100's 300 MiB); it decides how many first contexts a
    // slice makes at once (at most its room over twice the bound).
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), (4 * MIB).to_string()));
    env.push(("GPUSLICE_CONTEXT_OVERHEAD".into(), bound));
    if start == Start::AtBarrier {
        env.push(barrier.env());
    }
    // Members in PID namespaces of their own (as in pods) are named by the fake through its
    // broker, by the host PIDs the kernel gives; the shim asks its own broker, if any.
    let _fake_broker = (pids != Pids::Host).then(|| HostPidBroker::start(&gpu.state_path()));
    let broker_dir = cuda_e2e::TempDir::new("storm-broker");
    let socket = broker_dir.path().join("host-pid.sock");
    let broker = match pids {
        Pids::Host => Broker::Absent,
        Pids::OwnNamespaces { broker } => broker,
    };
    let _shim_broker = match broker {
        Broker::Serving | Broker::Stopped => {
            let serving = HostPidBroker::for_shim(&socket);
            if broker == Broker::Stopped {
                serving.signal(libc::SIGSTOP);
            }
            Some(serving)
        }
        Broker::Garbage => {
            let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let _ = (&stream).write_all(b"not a pid\n");
                }
            });
            None
        }
        Broker::Absent => None,
    };
    let asked = if broker == Broker::Absent {
        String::new()
    } else {
        socket.display().to_string()
    };
    env.push((host_pid_broker::SOCKET_ENV.into(), asked));
    gpu.truth().reset_peak_memory(0);
    let logs = cuda_e2e::TempDir::new("storm-logs");
    let spawned = Instant::now();
    let mut members: Vec<Member> = (0..n)
        .map(|i| {
            let kind = ClientKind::ALL[i % ClientKind::ALL.len()];
            let binary = kind.binary();
            let mut cmd = match pids {
                Pids::Host => cuda_e2e::command(&binary, &["hold", "2MiB"], &env),
                Pids::OwnNamespaces { .. } => cuda_e2e::command(
                    Path::new("unshare"),
                    &[
                        "--pid",
                        "--fork",
                        "--mount-proc",
                        binary.to_str().unwrap(),
                        "hold",
                        "2MiB",
                    ],
                    &env,
                ),
            };
            let log = std::fs::File::create(logs.path().join(format!("{i}.err"))).unwrap();
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log));
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("start member {i}: {e}"));
            let stdin = child.stdin.take();
            Member {
                child,
                stdin,
                spawned: Instant::now(),
            }
        })
        .collect();
    let mut at_barrier = Duration::ZERO;
    if start == Start::AtBarrier {
        // Every member stands at the barrier (registered in the region, cuInit done).
        let dir = barrier_dir(&barrier);
        wait_until(
            &format!("{n} members at the barrier"),
            STORM_TIMEOUT,
            || ready_count(&dir) >= n,
        );
        at_barrier = spawned.elapsed();
        gpu.truth().reset_peak_memory(0);
        barrier.release(n);
    }
    let released = Instant::now();
    // One reader per member: when its first line came, and what it said.
    let (sender, receiver) = std::sync::mpsc::channel();
    for (i, member) in members.iter_mut().enumerate() {
        let stdout = member.child.stdout.take().unwrap();
        let sender = sender.clone();
        let from = match start {
            Start::AtBarrier => released,
            Start::AtSpawn => member.spawned,
        };
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = sender.send((i, from.elapsed(), line));
            })
            .unwrap();
    }
    drop(sender);
    let mut latencies = Vec::with_capacity(n);
    let mut failures = Vec::new();
    for _ in 0..n {
        let (i, latency, line) = receiver
            .recv_timeout(STORM_TIMEOUT)
            .expect("a member never printed its line");
        let value: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
        if value["result"] != "CUDA_SUCCESS" {
            let err =
                std::fs::read_to_string(logs.path().join(format!("{i}.err"))).unwrap_or_default();
            failures.push(format!("member {i}: {} {err}", line.trim()));
        }
        latencies.push(latency);
    }
    if start == Start::AtSpawn {
        at_barrier = spawned.elapsed();
    }
    let peak = gpu.truth().peak_memory(0);
    let live = gpu.truth().processes(0).len();
    latencies.sort();
    let figures = Figures {
        n,
        start,
        at_barrier,
        latencies,
        live,
        peak,
        cap,
    };
    assert!(
        failures.is_empty(),
        "{} of {n} starts failed:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    assert_eq!(live, n, "every member holds memory on the card at once");
    assert!(peak <= cap, "the card passed the cap: {peak} > {cap}");
    if sliced && pids != Pids::Host {
        // Every member knows the host PID the driver lists it under: the slots record
        // exactly the PIDs on the card.
        let recorded = cuda_e2e::recorded_host_pids(&slice.region_path(), &gpu.env());
        let mut on_card: Vec<u64> = gpu
            .truth()
            .processes(0)
            .iter()
            .map(|p| u64::from(p.pid))
            .collect();
        on_card.sort_unstable();
        assert_eq!(recorded, on_card, "host PIDs the slots record ({pids:?})");
    }
    if !sliced {
        for member in &mut members {
            drop(member.stdin.take());
            let _ = member.child.wait();
        }
        return figures;
    }

    // All exit normally; nobody of the slice starts meanwhile.
    for member in &mut members {
        drop(member.stdin.take());
    }
    for member in &mut members {
        let status = member.child.wait().unwrap();
        assert!(status.success(), "a member exited with {status}");
    }
    wait_until("the card freed the storm", STORM_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
    let status = cuda_e2e::region_status_with(&slice.region_path(), &gpu.env());
    assert_eq!(
        status["devices"][0]["used"],
        0,
        "the ledger of exited processes, as status shows it: {}; counted: {:?}",
        status["devices"],
        status["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["used_total"] != 0)
            .take(5)
            .collect::<Vec<_>>()
    );
    // The next start gets a slot (reaping the exited ones on the driver's word) and the
    // whole slice but its context.
    let mut after = slice.env(&gpu);
    after.push(("FAKEGPU_CTX_OVERHEAD".into(), (4 * MIB).to_string()));
    let out = Client::run(ClientKind::Linked, &["meminfo"], &after);
    assert_eq!(out["free"], cap - 4 * MIB, "start {}: {out}", n + 1);
    figures
}

/// What a `hold` client's first line says: its result, or the error of a start refused
/// before its allocation (or the line itself when it is neither).
fn first_result(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let value: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_default();
    [&value["result"], &value["error"]]
        .iter()
        .find_map(|v| v.as_str())
        .unwrap_or(line.trim())
        .to_string()
}

fn barrier_dir(barrier: &StartBarrier) -> std::path::PathBuf {
    let (_, fifo) = barrier.env();
    std::path::Path::new(&fifo).parent().unwrap().to_path_buf()
}

fn ready_count(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("start.ready."))
            .count()
    })
}

/// 64 processes of one slice, each in a PID namespace of its own as in a pod, start at once:
/// each learns the host PID the driver lists it under from the host-PID broker and none
/// fails; then the same storm without a broker, where each measures its host PID in turn.
/// Both end with every slot recording exactly the PIDs on the card.
#[test]
fn a_storm_in_pid_namespaces_of_their_own_knows_every_host_pid() {
    for broker in [Broker::Serving, Broker::Absent] {
        let figures = storm_with(64, true, Start::AtBarrier, Pids::OwnNamespaces { broker });
        eprintln!("{broker:?}: {}", figures.row());
    }
}

/// A broker that accepts and never answers (stopped), or answers nonsense, delays no start by
/// more than the shim's bounded wait and fails none: 32 processes in PID namespaces of their
/// own all start, and each slot still records the host PID on the card (measured instead).
#[test]
fn a_stopped_or_lying_broker_costs_a_storm_only_its_bounded_wait() {
    for broker in [Broker::Stopped, Broker::Garbage] {
        let figures = storm_with(32, true, Start::AtBarrier, Pids::OwnNamespaces { broker });
        eprintln!("{broker:?}: {}", figures.row());
    }
}

/// A tenant's best move against a slice whose context cost is known: many processes at once
/// whose contexts cost four times the slice's figure (the driver places more for some flags
/// and environments, and a tenant chooses both), into a slice with room for the figure for
/// each of them. No context's cost is known before it exists, so the card may pass the cap,
/// for the instant before an undo, by what ONE context costs beyond the figure (the one made
/// in the slice's turn; those made alongside it reserve the configured bound, which the dear
/// contexts stay under), never by one such difference per process. The slice then holds
/// exactly as many as fit, each refused start refused for memory, and the ledger is the
/// card's.
#[test]
fn dear_contexts_started_at_once_pass_the_cap_by_one_context_at_most() {
    const MEMBERS: usize = 16;
    let gpu = FakeGpu::start("v100");
    let cap = 4 * GIB;
    let (cheap, dear, bound, held) = (100 * MIB, 400 * MIB, 512 * MIB, 2 * MIB);
    let slice = Slice::builder().device(0, "4GiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("GPUSLICE_CONTEXT_OVERHEAD".into(), bound.to_string()));
    // The slice learns its figure from a cheap context.
    let mut first = env.clone();
    first.push(("FAKEGPU_CTX_OVERHEAD".into(), cheap.to_string()));
    let out = Client::run(ClientKind::Linked, &["meminfo"], &first);
    assert_eq!(out["free"], cap - cheap, "the figure is learnt: {out}");

    let mut barrier = StartBarrier::new();
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), dear.to_string()));
    // As on a real card, a context is on the card a while before its creation returns: the
    // starts overlap.
    env.push(("FAKEGPU_CTX_INIT_MS".into(), "100".into()));
    env.push(barrier.env());
    let mut members: Vec<Child> = (0..MEMBERS)
        .map(|i| {
            let kind = ClientKind::ALL[i % ClientKind::ALL.len()];
            cuda_e2e::command(&kind.binary(), &["hold", "2MiB"], &env)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let dir = barrier_dir(&barrier);
    wait_until("the members at the barrier", STORM_TIMEOUT, || {
        ready_count(&dir) >= MEMBERS
    });
    gpu.truth().reset_peak_memory(0);
    barrier.release(MEMBERS);
    let results: Vec<String> = members.iter_mut().map(first_result).collect();
    let peak = gpu.truth().peak_memory(0);
    let started = results.iter().filter(|r| *r == "CUDA_SUCCESS").count();
    let fit = (cap / (dear + held)) as usize;
    eprintln!(
        "{started} of {MEMBERS} started; the card's peak {} MiB against a cap of {} MiB",
        peak / MIB,
        cap / MIB
    );
    assert!(
        peak <= cap + (dear - cheap),
        "the card passed the cap by more than one dear context's difference: peak {} MiB, cap {} MiB ({started} started)",
        peak / MIB,
        cap / MIB
    );
    assert!(
        results
            .iter()
            .all(|r| r == "CUDA_SUCCESS" || r == "CUDA_ERROR_OUT_OF_MEMORY"),
        "{results:?}"
    );
    assert_eq!(started, fit, "as many as fit start: {results:?}");
    let on_card = gpu.truth().used_memory(0);
    assert_eq!(
        on_card,
        started as u64 * (dear + held),
        "the card holds the started ones"
    );
    let status = cuda_e2e::region_status_with(&slice.region_path(), &gpu.env());
    assert_eq!(
        status["devices"][0]["used"], on_card,
        "the ledger is the card's"
    );
    for member in &mut members {
        drop(member.stdin.take());
        let _ = member.wait();
    }
    wait_until("the card freed the members", STORM_TIMEOUT, || {
        gpu.truth().used_memory(0) == 0
    });
}

/// A process of the slice allocating while others start: each start made alongside the others
/// holds the bound (512 MiB) for the moment its 100 MiB context takes to be made (1.5 s here,
/// `FAKEGPU_CTX_INIT_MS`), so 3 GiB does not fit in the 4 GiB slice then, and fits once the
/// starts settled. The allocation waits for them instead of being refused; the card never
/// passes the cap.
#[test]
fn an_allocation_waits_for_starts_that_hold_room_above_their_contexts() {
    let gpu = FakeGpu::start("v100");
    let cap = 4 * GIB;
    let context = 100 * MIB;
    let slice = Slice::builder().device(0, "4GiB", None).build();
    let mut env = slice.env(&gpu);
    env.push(("GPUSLICE_CONTEXT_OVERHEAD".into(), (512 * MIB).to_string()));
    env.push(("FAKEGPU_CTX_OVERHEAD".into(), context.to_string()));
    let out = Client::run(ClientKind::Linked, &["meminfo"], &env);
    assert_eq!(out["free"], cap - context, "the figure is learnt: {out}");
    gpu.truth().reset_peak_memory(0);
    let spawn = |env: &cuda_e2e::Env, size: &str| {
        cuda_e2e::command(&ClientKind::Linked.binary(), &["hold", size], env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut slow = env.clone();
    slow.push(("FAKEGPU_CTX_INIT_MS".into(), "1500".into()));
    let mut starters: Vec<Child> = (0..4).map(|_| spawn(&slow, "2MiB")).collect();
    // Their contexts are on the card, their creations not returned.
    wait_until("the starters' contexts on the card", STORM_TIMEOUT, || {
        gpu.truth().used_memory(0) >= 4 * context
    });
    let mut allocating = spawn(&env, "3GiB");
    let result = first_result(&mut allocating);
    let started: Vec<String> = starters.iter_mut().map(first_result).collect();
    let peak = gpu.truth().peak_memory(0);
    assert_eq!(
        result, "CUDA_SUCCESS",
        "the 3 GiB allocation (starters: {started:?})"
    );
    assert!(started.iter().all(|r| r == "CUDA_SUCCESS"), "{started:?}");
    assert!(peak <= cap, "the card passed the cap: {} MiB", peak / MIB);
    for child in starters.iter_mut().chain(std::iter::once(&mut allocating)) {
        drop(child.stdin.take());
        let _ = child.wait();
    }
}

#[test]
fn a_storm_of_200_starts_on_one_slice() {
    storm(200);
}

/// With the default bound on a context's cost, 128 times the storm's contexts, a 16 GiB slice
/// makes about 31 first contexts at once: the rest take the turn or wait for room, and every
/// allocation made meanwhile waits for the starts to settle instead of being refused. None
/// fails, and the card stays under the cap.
#[test]
fn a_storm_of_200_with_a_bound_far_above_its_contexts_fails_none() {
    let figures = storm_with_bound(200, true, Start::AtBarrier, Pids::Host, "512MiB".into());
    eprintln!("{}", figures.row());
}

#[test]
fn a_storm_of_1024_starts_on_one_slice_and_the_next_one_after_they_exit() {
    storm(1024);
}

/// The figures of docs/performance.md: storms of each size in `STORM_SIZES` (default 64,
/// 200 and 1,024), `STORM_ROUNDS` times (default 3), started both ways (`STORM_STARTS`:
/// `spawn`, `barrier` or both, the default), with the shim and without it (the fake alone) in
/// turn, then the medians of each and their ratios. Prints; asserts nothing about time
/// (`benches/start-storm.sh`).
#[test]
#[ignore]
fn measure_storms() {
    let sizes: Vec<usize> = std::env::var("STORM_SIZES")
        .unwrap_or_else(|_| "64,200,1024".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("STORM_SIZES: comma-separated counts")
        })
        .collect();
    let rounds: usize = std::env::var("STORM_ROUNDS")
        .map(|r| r.parse().expect("STORM_ROUNDS: a count"))
        .unwrap_or(3);
    let pids = match std::env::var("STORM_PIDS").as_deref() {
        Ok("namespaces") => Pids::OwnNamespaces {
            broker: Broker::Serving,
        },
        Ok("namespaces-measured") => Pids::OwnNamespaces {
            broker: Broker::Absent,
        },
        Ok("host") | Err(_) => Pids::Host,
        Ok(other) => panic!("STORM_PIDS={other:?}: host, namespaces or namespaces-measured"),
    };
    let starts: Vec<Start> = match std::env::var("STORM_STARTS").as_deref() {
        Ok("spawn") => vec![Start::AtSpawn],
        Ok("barrier") => vec![Start::AtBarrier],
        _ => vec![Start::AtSpawn, Start::AtBarrier],
    };
    let median = |mut values: Vec<Duration>| {
        values.sort();
        values[values.len() / 2]
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut table = Vec::new();
    for &start in &starts {
        for &n in &sizes {
            let (mut with, mut without) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                let sliced = storm_with(n, true, start, pids);
                eprintln!("shim:    {}", sliced.row());
                with.push(sliced);
                let alone = storm_with(n, false, start, pids);
                eprintln!("no shim: {}", alone.row());
                without.push(alone);
            }
            let p50 = |runs: &[Figures]| median(runs.iter().map(|f| f.percentile(50)).collect());
            let max = |runs: &[Figures]| median(runs.iter().map(Figures::max).collect());
            let whole = |runs: &[Figures]| median(runs.iter().map(|f| f.at_barrier).collect());
            let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
            table.push(format!(
                "| {} | {n} | {:.0} / {:.0} ms | {:.0} / {:.0} ms | {:.2}x / {:.2}x | {:.2} / {:.2} s ({:.2}x) |",
                match start {
                    Start::AtSpawn => "spawned at once",
                    Start::AtBarrier => "released at a barrier",
                },
                ms(p50(&with)),
                ms(max(&with)),
                ms(p50(&without)),
                ms(max(&without)),
                ratio(p50(&with), p50(&without)),
                ratio(max(&with), max(&without)),
                whole(&with).as_secs_f64(),
                whole(&without).as_secs_f64(),
                ratio(whole(&with), whole(&without)),
            ));
        }
    }
    eprintln!(
        "\n| start | processes | shim: p50 / max | no shim: p50 / max | ratio p50 / max | storm length (spawned) or spawn to barrier, shim / no shim |"
    );
    eprintln!("|---|---|---|---|---|---|");
    for row in table {
        eprintln!("{row}");
    }
    eprintln!("(spawned: spawn to first line; at a barrier: release to first line; medians of {rounds} rounds each)");
}
