//! Standard output for every subcommand. `println!` panics when the reader has gone away
//! (`gpuslice status --watch | head -1`: "failed printing to stdout: Broken pipe", exit 101),
//! because Rust ignores SIGPIPE. Every line goes through [`write`] instead (the crate's own
//! `println!`/`print!` below shadow std's), which ends the
//! program quietly with [`EXIT_CLOSED_PIPE`] on a closed pipe, the status a shell reports for
//! a Unix tool that SIGPIPE ended, and nothing on stderr.
//!
//! A helper rather than restoring SIGPIPE's default action: the signal would kill the process
//! at whatever write hits a closed pipe, including the pipes `run` and `demo` keep with their
//! children, before `run` has forwarded the command's exit code or removed its sandbox
//! directory. Here only standard output ends the program, and only at a clean point.

use std::io::Write;

/// Exit status when standard output was closed by its reader (128 + SIGPIPE).
pub const EXIT_CLOSED_PIPE: i32 = 128 + libc::SIGPIPE;

/// Writes `args` to standard output and flushes; a closed pipe ends the program quietly,
/// another write error ends it with one line and [`crate::error::EXIT_RUNTIME`].
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        drop(stdout);
        fail(&error);
    }
}

/// Flushes standard output (before `process::exit`, which does not).
pub fn flush() {
    if let Err(error) = std::io::stdout().flush() {
        fail(&error);
    }
}

fn fail(error: &std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(EXIT_CLOSED_PIPE);
    }
    eprintln!("gpuslice: cannot write to standard output: {error}");
    std::process::exit(crate::error::EXIT_RUNTIME);
}

// The crate's `println!` and `print!` are these (`#[macro_use] mod output` comes first in
// main.rs, and a crate-local macro shadows the prelude's): every subcommand, present and
// future, writes through [`write`] without having to remember to.

/// `println!` through [`write`].
macro_rules! println {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`write`].
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*))
    };
}
