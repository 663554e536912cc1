//! `[gpuslice]` lines on stderr. Silent by default except errors and the warnings that mean
//! "this slice is not what you think" (`log_warn!`: a limit larger than the card, an
//! environment variable ignored because the limit file is anchored), which print at the
//! default level too; the level comes from the configuration (`GPUSLICE_LOG`, the file's
//! `log`, `LIBCUDA_LOG_LEVEL`), and `off` silences everything. Each line is one `write(2)` so
//! lines from several processes of a container do not interleave mid-line, and at most
//! [`MAX_LINE`] bytes (a long path in a message is cut in its middle, never the line's end).

use std::sync::atomic::{AtomicU8, Ordering};

use gpuslice_common::config::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Error as u8);

pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: LogLevel) -> bool {
    level != LogLevel::Off && (level as u8) <= LEVEL.load(Ordering::Relaxed)
}

/// Writes one already formatted line (without prefix) to fd 2; errors are ignored because the
/// host's stderr may be closed and that must not change its behaviour.
pub fn write_line(message: std::fmt::Arguments<'_>) {
    let line = bounded_line(&message.to_string());
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // SAFETY: `rest` is a live byte slice; write(2) reads at most `rest.len()` bytes.
        let written = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if written <= 0 {
            return;
        }
        rest = &rest[written as usize..];
    }
}

pub use gpuslice_common::text::MAX_LINE;

/// `[gpuslice] message\n`, at most [`MAX_LINE`] bytes.
fn bounded_line(message: &str) -> String {
    let body = gpuslice_common::text::shorten(message, MAX_LINE - "[gpuslice] \n".len());
    format!("[gpuslice] {body}\n")
}

#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        if $crate::ground::log::enabled($level) {
            $crate::ground::log::write_line(format_args!($($arg)*));
        }
    };
}
#[macro_export]
macro_rules! log_error { ($($arg:tt)*) => { $crate::log_at!(::gpuslice_common::config::LogLevel::Error, $($arg)*) }; }
/// A warning that changes what the slice means: printed at the default level (not only at
/// `warn`), prefixed "warning:"; callers print each once per process.
#[macro_export]
macro_rules! log_warn { ($($arg:tt)*) => { $crate::log_at!(::gpuslice_common::config::LogLevel::Error, "warning: {}", format_args!($($arg)*)) }; }
#[macro_export]
macro_rules! log_info { ($($arg:tt)*) => { $crate::log_at!(::gpuslice_common::config::LogLevel::Info, $($arg)*) }; }
#[macro_export]
macro_rules! log_debug { ($($arg:tt)*) => { $crate::log_at!(::gpuslice_common::config::LogLevel::Debug, $($arg)*) }; }

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_order_from_error_to_trace_and_off_silences() {
        set_level(LogLevel::Warn);
        assert!(enabled(LogLevel::Error));
        assert!(enabled(LogLevel::Warn));
        assert!(!enabled(LogLevel::Info));
        assert!(!enabled(LogLevel::Off));
        set_level(LogLevel::Off);
        assert!(!enabled(LogLevel::Error));
        set_level(LogLevel::Error);
    }

    #[test]
    fn a_line_is_bounded_and_keeps_its_end() {
        let message = format!(
            "shared region /{}/a.region: cannot open; CUDA calls are refused",
            "d".repeat(10 << 20)
        );
        let line = bounded_line(&message);
        assert!(line.len() <= MAX_LINE, "{}", line.len());
        assert!(line.starts_with("[gpuslice] shared region /ddd"));
        assert!(line.ends_with("CUDA calls are refused\n"));
    }
}
