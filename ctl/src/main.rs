//! `gpuslice`, the command-line tool: writes and checks limit files, shows a slice's live
//! usage, runs a command under a slice, shows the nvidia-smi-style view, runs the demo and
//! emits CDI wiring. One module per subcommand; shared pieces are `slice` (the slice flags),
//! `sandbox` (a private slice on this machine), `region_view` and `error` (exit codes).
//!
//! The CLI never depends on gpuslice-shim: the shim's exported hooks (`dlsym`, `cu*`) would
//! interpose on this binary itself.

// First, so that its `println!`/`print!` (closed pipe = quiet exit) are the ones every module
// below sees.
#[macro_use]
mod output;

mod broker;
mod cdi;
mod check;
mod demo;
mod error;
mod region_check;
mod region_view;
mod reset;
mod run;
mod sandbox;
mod slice;
mod smi;
mod status;
mod write;

use clap::{Parser, Subcommand};

use crate::error::{CliError, EXIT_CODES_HELP};

#[derive(Debug, Parser)]
#[command(
    name = "gpuslice",
    version,
    about = "Turn one NVIDIA GPU into enforced slices: hard memory cap and compute share",
    long_about = "Turn one NVIDIA GPU into enforced slices. libgpuslice.so (preloaded into every \
        process of a container) enforces a hard memory cap and a compute share per slice; this \
        tool writes and checks the slice's limit file, watches it live, runs commands under a \
        slice locally (on a simulated GPU when there is no NVIDIA driver) and wires slices into \
        container runtimes (CDI).",
    after_help = EXIT_CODES_HELP,
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Write a limit file from flags or HAMi env (validated; on standard output, or with -o
    /// FILE atomically with mode 0644).
    #[command(
        after_help = "Examples:\n  gpuslice write --device 0:memory=8GiB,compute=25 --region /var/run/gpuslice/a.region > limits.json\n  \
            gpuslice write -d GPU-8a5d...:memory=16g -d 1 --memory 4g -o ./limits.json\n  \
            CUDA_DEVICE_MEMORY_LIMIT=8g gpuslice write --from-env -o ./limits.json\n\n\
            Limits larger than the card are accepted (the card is not known here); \
            `gpuslice check` warns about them when NVML is available. The anchored file \
            /etc/gpuslice/limits.json (which caps every shim process of the machine) is written \
            only when named with -o.\n\n\
            Exit codes: 0 written or identical, 2 bad flags, 3 invalid env or a different file \
            exists (use --force), 4 cannot write."
    )]
    Write(write::WriteArgs),

    /// Validate a limit file (default: what the shim would load) and describe the slice.
    #[command(
        after_help = "Exit codes: 0 valid, 3 invalid/unreadable/nothing configured (the message \
            names the field)."
    )]
    Check(check::CheckArgs),

    /// Live view of a slice's shared region: per device and per process usage.
    #[command(
        after_help = "Examples:\n  gpuslice status --region /tmp/gpuslice-run-Ab12Cd/slice.region --watch\n  \
            gpuslice status --config /etc/gpuslice/limits.json --json\n\n\
            Exit codes: 0 shown, 2 no region given or configured, 3 region missing, unreadable \
            or not a gpuslice region, 141 output closed by its reader (`| head`), quietly."
    )]
    Status(status::StatusArgs),

    /// nvidia-smi-style table from NVML: the slice under the shim, the card without it.
    #[command(after_help = "Exit codes: 0 shown, 4 no NVML library or driver, \
        141 output closed by its reader (`| head`), quietly.")]
    Smi(smi::SmiArgs),

    /// Run a command under a private slice (simulated GPU when there is no NVIDIA driver).
    #[command(
        after_help = "Examples:\n  gpuslice run --memory 8GiB --compute 25 -- python train.py\n  \
            gpuslice run --fake-gpu -m 1GiB -- gpuslice smi\n\n\
            Without --device, --memory/--compute apply to every device. The region path is \
            printed on stderr for `gpuslice status --region`. SIGINT/SIGTERM/SIGHUP/SIGQUIT are \
            forwarded to the command.\n\n\
            Exit codes: the command's own (128+N if killed by signal N); 2 bad flags; 3 a limit \
            larger than the card or a device that does not exist; 4 shim/fakegpu missing."
    )]
    Run(run::RunArgs),

    /// The guided demo: an 8 GiB / 25% slice of a (simulated) V100, step by step.
    #[command(after_help = "Exit codes: 0 every step behaved, 4 a step's outcome was wrong.")]
    Demo(demo::DemoArgs),

    /// Write a CDI spec that puts containers under gpuslice slices.
    Cdi(cdi::CdiArgs),

    /// Rebuild a corrupt, truncated or foreign region file (refused while processes use it).
    #[command(
        after_help = "Exit codes: 0 rebuilt, 2 no region given or configured, 3 still used by \
            live processes, 4 cannot open or write the file."
    )]
    Reset(reset::ResetArgs),

    /// Tell each process that connects its host PID (for containers without the node agent).
    #[command(
        name = "host-pid-broker",
        after_help = "Processes in a container cannot see the PID NVIDIA's driver lists them \
            under; the shim asks this socket once per process (GPUSLICE_HOST_PID_SOCKET, default \
            /run/gpuslice/node/host-pid.sock) and starts its contexts without measuring. Run it \
            in the host's PID namespace and mount the socket's directory into the containers \
            at the same path.\n\nExit codes: 3 not in the host's PID namespace, 4 cannot bind \
            or accept."
    )]
    HostPidBroker(broker::BrokerArgs),
}

fn main() {
    // Clap exits 2 on usage errors and 0 for --help/--version.
    let cli = Cli::parse();
    let result: Result<i32, CliError> = match &cli.command {
        Cmd::Write(args) => write::run(args).map(|()| 0),
        Cmd::Check(args) => check::run(args).map(|()| 0),
        Cmd::Status(args) => status::run(args).map(|()| 0),
        Cmd::Smi(args) => smi::run(args).map(|()| 0),
        Cmd::Run(args) => run::run(args),
        Cmd::Demo(args) => demo::run(args).map(|()| 0),
        Cmd::Reset(args) => reset::run(args).map(|()| 0),
        Cmd::HostPidBroker(args) => broker::run(args).map(|()| 0),
        Cmd::Cdi(args) => cdi::run(args).map(|()| 0).map_err(|e| CliError {
            code: e.code(),
            message: e.message,
        }),
    };
    // `process::exit` does not flush; a closed pipe here is still a quiet exit.
    output::flush();
    match result {
        Ok(code) => std::process::exit(code),
        Err(error) => {
            eprintln!("gpuslice: {}", error.message);
            std::process::exit(error.code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for argv in [
            &["gpuslice", "write", "--device", "gpu0"][..],
            &["gpuslice", "write", "--memory", "-1g", "-d", "0"],
            &["gpuslice", "run", "--compute", "200", "--", "true"],
            &["gpuslice", "run", "--memory", "1g"],
            &["gpuslice", "status", "--watch", "0"],
        ] {
            let err = Cli::try_parse_from(argv).unwrap_err();
            assert_eq!(err.exit_code(), error::EXIT_USAGE, "{argv:?}");
        }
    }

    #[test]
    fn run_takes_the_command_after_the_double_dash() {
        let cli = Cli::try_parse_from([
            "gpuslice",
            "run",
            "-m",
            "1g",
            "--fake-gpu",
            "--",
            "client",
            "--memory",
            "x",
        ])
        .unwrap();
        let Cmd::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.command, ["client", "--memory", "x"]);
        assert!(args.fake_gpu);
        assert_eq!(args.slice.memory, Some(1 << 30));
    }
}
