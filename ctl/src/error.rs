//! The CLI's error type and its exit codes: every failure is one line saying what is wrong
//! and what to do, and a code scripts can branch on.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | (`run` only) the command's own exit code is passed through unchanged |
//! | 2 | usage: unknown flag, malformed flag value (device syntax, size, percent) |
//! | 3 | invalid input: a limit file, region file or HAMi env that is malformed, unreadable or does not fit the card; refusing to overwrite a different limit file |
//! | 4 | runtime failure: cannot write, a component (shim, fakegpu, NVML) is missing, a demo step's outcome is wrong |
//! | 141 | standard output was closed by its reader (`\| head -1`): the program ended quietly, as a Unix tool that SIGPIPE ends (see `output`) |

use std::fmt;

/// Malformed command line (clap uses the same code for its own errors).
pub const EXIT_USAGE: i32 = 2;
/// A file, region or env value given to the CLI is invalid or unreadable.
pub const EXIT_INVALID: i32 = 3;
/// Something that should have worked did not (I/O, missing library, failed demo step).
pub const EXIT_RUNTIME: i32 = 4;

/// The exit-code table shown at the end of `gpuslice --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  2  usage error (unknown flag, bad device syntax, bad size or percent)
  3  invalid input (limit file, region file or HAMi env malformed or unreadable; limit larger
     than the card; refusing to overwrite a different limit file without --force)
  4  runtime failure (cannot write, shim/fakegpu/NVML missing, a demo step went wrong)
  141  standard output closed by its reader (`| head`): ends quietly, as with SIGPIPE
  `gpuslice run` exits with the command's own code (128+N when it died of signal N).";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_INVALID,
            message: message.into(),
        }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_RUNTIME,
            message: message.into(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<gpuslice_common::config::ConfigError> for CliError {
    fn from(error: gpuslice_common::config::ConfigError) -> Self {
        CliError::invalid(error.to_string())
    }
}

pub type CliResult<T> = Result<T, CliError>;
