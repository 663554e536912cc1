//! `[gpuslice]` lines on stderr. Silent by default except errors; the level comes from the
//! configuration (`GPUSLICE_LOG`, the file's `log`, `LIBCUDA_LOG_LEVEL`). Each line is one
//! `write(2)` so lines from several processes of a container do not interleave mid-line.

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
    let line = format!("[gpuslice] {message}\n");
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

#[macro_export]
macro_rules! log_at {
    ($level:expr, $($arg:tt)*) => {
        if $crate::log::enabled($level) {
            $crate::log::write_line(format_args!($($arg)*));
        }
    };
}
#[macro_export]
macro_rules! log_error { ($($arg:tt)*) => { $crate::log_at!(::gpuslice_common::config::LogLevel::Error, $($arg)*) }; }
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
}
