//! `gpuslice-node`, the node agent: exports every slice's ledger and the driver's own numbers
//! as Prometheus metrics, and checks the caps against the driver (the backstop).
//!
//! Its own binary rather than a `gpuslice` subcommand: the CLI is also what runs inside
//! containers (`gpuslice smi`, `status`), and a daemon's HTTP server and threads do not
//! belong there. Like the CLI it never links the shim.
//!
//! Two threads: the HTTP server (one request at a time; each `/metrics` scrape looks at the
//! node afresh, so new and removed slices show without a restart) and the watch loop (every
//! `--interval`: logs slices' problems when they change and runs the backstop).
//!
//! Modules: `discovery` (which slices exist), `driver` (NVML), `host` (what `/proc` says of
//! other processes), `collect` (one view of the node, membership), `metrics` + `exposition`
//! (the text format), `backstop`, `problems` (one line per problem seen), `cleanup`.

mod backstop;
mod cleanup;
mod collect;
mod discovery;
mod driver;
mod exposition;
mod host;
mod metrics;
mod problems;

use backstop::{Backstop, Counters, Settings};
use clap::Parser;
use discovery::Sources;
use metrics::BrokerCounts;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The agent's port when none is given (unassigned in Prometheus's port list).
const DEFAULT_LISTEN: &str = "127.0.0.1:9863";

#[derive(Debug, Parser)]
#[command(
    name = "gpuslice-node",
    version,
    about = "gpuslice node agent: Prometheus metrics of every slice on this node, and the cap checked against the driver's own numbers"
)]
struct Args {
    /// Address to serve /metrics and /healthz on (loopback by default; port 0 = any free
    /// port, printed on standard output).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: String,
    /// The state directory `gpuslice cdi --state-dir` prepares (region directories under
    /// regions/<vendor>/<class>/<slice>).
    #[arg(long, default_value = "/var/lib/gpuslice")]
    state_dir: PathBuf,
    /// A directory of limit files, every DIR/NAME.json being slice NAME (as `gpuslice cdi
    /// --slices-dir`); may be repeated.
    #[arg(long = "slices-dir", value_name = "DIR")]
    slices_dirs: Vec<PathBuf>,
    /// Seconds between two passes of the watch loop (problem log and backstop); the backstop
    /// looks again sooner when one of its clocks is due.
    #[arg(long, default_value_t = 1.0, value_parser = parse_seconds)]
    interval: f64,
    /// How far the driver's count of a slice may pass its cap before it is an over-cap event
    /// (allocation rounding, a context being created), e.g. 64MiB.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    tolerance: u64,
    /// Seconds a slice must stay over cap + tolerance before the event (and, enforcing, each
    /// further kill). A registered process holding bytes its ledger does not account for is
    /// ended after 3 s whatever this is.
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    grace: f64,
    /// End (SIGKILL) a process holding bytes its slice's ledger does not account for, and the
    /// most to blame of a slice that stays over its cap. Without it the backstop only
    /// reports.
    #[arg(long)]
    enforce: bool,
    /// A device (NVML index or UUID) where every process must belong to a slice: a process of
    /// no slice holding more than the tolerance there is an event too (and, enforcing, ended).
    /// May be repeated.
    #[arg(long = "slices-only", value_name = "DEVICE")]
    slices_only: Vec<String>,
    /// Remove the region directories (under --state-dir) of slices whose limit file is gone
    /// from every --slices-dir and that no process uses or mounts (see docs/architecture.md).
    #[arg(long = "clean-up")]
    clean_up: bool,
    /// Seconds a slice must stay removable before --clean-up removes it.
    #[arg(long = "clean-up-after", default_value_t = 60.0, value_parser = parse_seconds)]
    clean_up_after: f64,
    /// Print one exposition on standard output and exit (no server).
    #[arg(long)]
    once: bool,
    /// Serve the host-PID broker on this socket: each process that connects is told its PID
    /// in the host's PID namespace, so the shim in a container knows the PID the driver
    /// lists it under without measuring (a storm of starts in a pod does not queue). The DRA
    /// driver mounts the socket's directory into its containers; the shim's default is
    /// /run/gpuslice/node/host-pid.sock. The agent must run in the host's PID namespace.
    #[arg(long = "host-pid-socket", value_name = "PATH")]
    host_pid_socket: Option<PathBuf>,
    /// Serve --host-pid-socket although this is not the host's PID namespace (only where
    /// this namespace is the driver's: a test bed with a simulated driver).
    #[arg(long = "host-pid-any-namespace")]
    host_pid_any_namespace: bool,
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0 to 86400"
        )),
    }
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    gpuslice_common::size::parse_size(text).map_err(|e| e.to_string())
}

fn log(line: &str) {
    eprintln!("gpuslice-node: {line}");
}

fn main() {
    let args = Args::parse();
    let sources = Sources {
        slices_dirs: args.slices_dirs.clone(),
        state_dir: args.state_dir.clone(),
    };
    if args.once {
        let mut driver = driver::Driver::default();
        let started = Instant::now();
        let view = collect::collect(
            &sources,
            &mut driver,
            &mut collect::Evidence::default(),
            &mut |w| log(&w),
        );
        // Every problem, one line each, on standard error (the exposition has their metrics).
        for slice in &view.slices {
            for p in &slice.found.problems {
                log(&format!("slice {}: {p}", slice.found.name));
            }
        }
        for p in problems::problems(&view, args.tolerance) {
            log(&p.line);
        }
        let text = metrics::render(
            &view,
            &Counters::default(),
            None,
            started.elapsed().as_secs_f64(),
        );
        // A reader that hangs up early (`| head`) ends the output, not with a panic.
        let _ = std::io::stdout().write_all(text.as_bytes());
        return;
    }
    let broker = args
        .host_pid_socket
        .as_ref()
        .map(|socket| serve_host_pids(socket, args.host_pid_any_namespace));
    let server = match tiny_http::Server::http(&args.listen) {
        Ok(server) => server,
        Err(e) => {
            log(&format!("cannot listen on {}: {e}", args.listen));
            std::process::exit(1);
        }
    };
    let address = server
        .server_addr()
        .to_ip()
        .map_or(args.listen.clone(), |a| a.to_string());
    // The one line on standard output: where it listens (tests and scripts read it).
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "listening on {address}").and_then(|()| stdout.flush());
    log(&format!(
        "serving http://{address}/metrics; backstop {} (tolerance {} bytes, grace {} s)",
        if args.enforce {
            "ENFORCING"
        } else {
            "report-only"
        },
        args.tolerance,
        args.grace
    ));

    let counters = Arc::new(Mutex::new(Counters::default()));
    let settings = Settings {
        tolerance_bytes: args.tolerance,
        grace: Duration::from_secs_f64(args.grace),
        enforce: args.enforce,
        slices_only: args.slices_only.clone(),
    };
    if args.clean_up && args.slices_dirs.is_empty() {
        log("--clean-up does nothing without --slices-dir: a slice's limit file cannot be missing from no directory");
    }
    {
        let counters = Arc::clone(&counters);
        let sources = sources.clone();
        let interval = Duration::from_secs_f64(args.interval.max(0.05));
        let clean_up = args
            .clean_up
            .then(|| Duration::from_secs_f64(args.clean_up_after));
        std::thread::spawn(move || watch(&sources, &settings, interval, clean_up, &counters));
    }
    serve(&server, &sources, &counters, broker.as_deref());
}

/// Starts the host-PID broker on `socket` in a thread of its own and returns its counts;
/// exits when it cannot (the operator asked for it, and containers would silently measure
/// instead).
fn serve_host_pids(socket: &std::path::Path, any_namespace: bool) -> Arc<BrokerCounts> {
    use gpuslice_common::host_pid_broker;
    if let Err(why) = host_pid_broker::may_serve(any_namespace) {
        log(&format!("--host-pid-socket: {why}"));
        std::process::exit(1);
    }
    let listener = match host_pid_broker::bind(socket) {
        Ok(listener) => listener,
        Err(e) => {
            log(&format!("--host-pid-socket {}: {e}", socket.display()));
            std::process::exit(1);
        }
    };
    log(&format!("host-PID broker on {}", socket.display()));
    let socket = socket.to_path_buf();
    let counts = Arc::new(BrokerCounts::default());
    let counting = Arc::clone(&counts);
    std::thread::spawn(move || {
        let error = host_pid_broker::serve(&listener, |told| {
            let count = if told.is_ok() {
                &counting.told
            } else {
                &counting.failed
            };
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        log(&format!(
            "host-PID broker on {} stopped: {error}",
            socket.display()
        ));
    });
    counts
}

/// The watch loop: problems logged when they change, and the backstop.
fn watch(
    sources: &Sources,
    settings: &Settings,
    interval: Duration,
    clean_up: Option<Duration>,
    counters: &Mutex<Counters>,
) {
    let mut cleanup = cleanup::Cleanup::default();
    let mut driver = driver::Driver::default();
    let mut backstop = Backstop::default();
    let mut evidence = collect::Evidence::default();
    let mut logged: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut driver_problem: Option<String> = None;
    let mut warned: Vec<String> = Vec::new();
    let mut open_problems: Vec<problems::Problem> = Vec::new();
    loop {
        let mut warnings = Vec::new();
        let view = collect::collect(sources, &mut driver, &mut evidence, &mut |w| {
            warnings.push(w)
        });
        for w in &warnings {
            if !warned.contains(w) {
                log(w);
            }
        }
        warned = warnings;
        let now_problem = view.cards.as_ref().err().cloned();
        if now_problem != driver_problem {
            match &now_problem {
                Some(p) => log(&format!("driver: {p}")),
                None => log("driver: readable"),
            }
            driver_problem = now_problem;
        }
        let mut current = BTreeMap::new();
        for slice in &view.slices {
            let name = &slice.found.name;
            if logged.get(name) != Some(&slice.found.problems) {
                if slice.found.problems.is_empty() {
                    log(&format!("slice {name}: found, readable"));
                } else {
                    for p in &slice.found.problems {
                        log(&format!("slice {name}: {p}"));
                    }
                }
            }
            current.insert(name.clone(), slice.found.problems.clone());
        }
        for name in logged.keys() {
            if !current.contains_key(name) {
                log(&format!("slice {name}: gone"));
            }
        }
        logged = current;
        let seen = problems::problems(&view, settings.tolerance_bytes);
        for p in &seen {
            if !open_problems
                .iter()
                .any(|o: &problems::Problem| o.key == p.key)
            {
                log(&p.line);
            }
        }
        for o in &open_problems {
            if !seen.iter().any(|p| p.key == o.key) {
                log(&format!("resolved: {}", o.line));
            }
        }
        open_problems = seen;
        let judged = Instant::now();
        let actions = backstop.judge(&view, settings, judged, &host::start_time);
        if !actions.is_empty() {
            let mut counters = counters.lock().unwrap_or_else(|p| p.into_inner());
            backstop::act(&actions, settings, &mut counters);
        }
        if let Some(after) = clean_up {
            let have_limit_dirs = !sources.slices_dirs.is_empty();
            for line in cleanup.pass(
                &view,
                have_limit_dirs,
                after,
                Instant::now(),
                &cleanup::Proc,
            ) {
                log(&line);
            }
        }
        // The next pass after `interval`, or when a backstop clock is due: its decisions
        // follow how long a condition lasts, not when passes fall.
        let next = backstop
            .wake_by(settings, judged)
            .map_or(judged + interval, |due| due.min(judged + interval));
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

fn serve(
    server: &tiny_http::Server,
    sources: &Sources,
    counters: &Mutex<Counters>,
    broker: Option<&BrokerCounts>,
) {
    let mut driver = driver::Driver::default();
    let mut evidence = collect::Evidence::default();
    for request in server.incoming_requests() {
        let method = request.method().clone();
        let path = request.url().split('?').next().unwrap_or("").to_string();
        let response = if !matches!(method, tiny_http::Method::Get | tiny_http::Method::Head) {
            text_response(405, "only GET and HEAD\n", "text/plain")
        } else {
            match path.as_str() {
                "/metrics" => {
                    let started = Instant::now();
                    let view = collect::collect(sources, &mut driver, &mut evidence, &mut |_| {});
                    let counters = counters.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let text =
                        metrics::render(&view, &counters, broker, started.elapsed().as_secs_f64());
                    text_response(200, &text, exposition::CONTENT_TYPE)
                }
                "/healthz" => text_response(200, "ok\n", "text/plain"),
                "/" => text_response(
                    200,
                    "gpuslice-node: see /metrics and /healthz\n",
                    "text/plain",
                ),
                _ => text_response(404, "not found: try /metrics\n", "text/plain"),
            }
        };
        // A scraper that hung up mid-answer is its own problem, not the agent's.
        let _ = request.respond(response);
    }
}

fn text_response(
    status: u16,
    body: &str,
    content_type: &str,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let header = tiny_http::Header::from_bytes("Content-Type", content_type)
        .expect("static header is valid");
    tiny_http::Response::from_string(body)
        .with_status_code(status)
        .with_header(header)
}
