//! Who a process is, durably enough to tell it apart from a later process that reuses its
//! PID: PID, start time (/proc/<pid>/stat field 22, clock ticks after boot), PID namespace.

use std::os::unix::fs::MetadataExt;

/// The identity a process registers in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// PID in the process's own PID namespace.
    pub pid: u32,
    /// PID in the host namespace when known (from the `NSpid` line), else 0.
    pub host_pid: u32,
    /// Clock ticks after boot at which the process started.
    pub start_time: u64,
    /// Inode of the PID namespace, 0 when it cannot be read.
    pub pid_ns: u64,
}

impl ProcessIdentity {
    /// The calling process. `None` only when /proc is unavailable.
    pub fn current() -> Option<ProcessIdentity> {
        let pid = std::process::id();
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let fields = parse_stat(&stat)?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Some(ProcessIdentity {
            pid,
            host_pid: outermost_nspid(&status).filter(|&p| p != pid).unwrap_or(0),
            start_time: fields.start_time,
            pid_ns: pid_namespace_of("self"),
        })
    }

    /// Whether the process this identity names still runs: its PID exists in our /proc, has
    /// the same start time (a reused PID has a later one), and is not a zombie (a zombie has
    /// already closed its driver handles, so its memory is gone). Only meaningful for an
    /// identity from the caller's own PID namespace; see `same_namespace_as_current`.
    pub fn is_alive(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            Ok(text) => match parse_stat(&text) {
                Some(fields) => fields.start_time == self.start_time && !fields.is_exited(),
                // Unparseable stat for an existing PID: do not declare it dead.
                None => true,
            },
            Err(_) => false,
        }
    }

    /// Whether its PID now names another running process (a later start time): the host
    /// reused it. Only meaningful where `same_namespace_as_current`.
    pub fn pid_reused(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|text| parse_stat(&text))
            .is_some_and(|f| f.start_time != self.start_time && !f.is_exited())
    }

    /// Whether this identity's PID can be checked in our /proc.
    pub fn same_namespace_as_current(&self) -> bool {
        self.pid_ns != 0 && self.pid_ns == pid_namespace_of("self")
    }
}

/// Whether `pid` (in our PID namespace) is stopped or traced (state T or t).
pub fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|text| parse_stat(&text))
        .is_some_and(|fields| matches!(fields.state, 'T' | 't'))
}

/// Inode of this process's PID namespace (0 when it cannot be read).
pub fn own_pid_namespace() -> u64 {
    pid_namespace_of("self")
}

fn pid_namespace_of(pid: &str) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// The fields of /proc/<pid>/stat that liveness needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFields {
    pub state: char,
    pub start_time: u64,
}

impl StatFields {
    fn is_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parses `pid (comm) state ... starttime ...`. The comm may contain spaces and ')' (it is
/// any 16 bytes the program chose), so fields are counted after the LAST ')'.
pub fn parse_stat(text: &str) -> Option<StatFields> {
    let after_comm = &text[text.rfind(')')? + 1..];
    let mut fields = after_comm.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 is state; field 22 is starttime, i.e. 19 fields after state.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some(StatFields { state, start_time })
}

/// First PID of the `NSpid:` line (outermost namespace this /proc can see).
fn outermost_nspid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_line(comm: &str, state: char, start: u64) -> String {
        let mut fields = vec![state.to_string()];
        fields.extend((4..22).map(|i| i.to_string()));
        fields.push(start.to_string());
        fields.extend((23..=52).map(|i| i.to_string()));
        format!("4242 ({comm}) {}", fields.join(" "))
    }

    #[test]
    fn parses_start_time_whatever_the_comm() {
        for comm in ["python3", "my prog", "a) b (c", ")", "x) S 1 2 3", ""] {
            let text = stat_line(comm, 'S', 987_654);
            assert_eq!(
                parse_stat(&text),
                Some(StatFields {
                    state: 'S',
                    start_time: 987_654
                }),
                "{comm:?}"
            );
        }
    }

    #[test]
    fn refuses_truncated_or_garbage_stat() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("4242 (x"), None);
        assert_eq!(parse_stat("4242 (x) S 1 2 3"), None);
        let mut bad = stat_line("x", 'S', 5);
        bad = bad.replace(" 5 23 ", " five 23 ");
        assert_eq!(parse_stat(&bad), None);
    }

    #[test]
    fn current_process_is_alive_and_a_reused_pid_is_not() {
        let me = ProcessIdentity::current().expect("/proc available");
        assert_eq!(me.pid, std::process::id());
        assert!(me.start_time > 0);
        assert!(me.is_alive());
        assert!(me.same_namespace_as_current());
        let reused = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!reused.is_alive());
    }

    #[test]
    fn exited_child_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id()));
        child.wait().unwrap();
        // After wait the PID is gone (or, improbably, reused with a new start time).
        if let Ok(text) = stat {
            if let Some(fields) = parse_stat(&text) {
                let gone = ProcessIdentity {
                    pid: child.id(),
                    host_pid: 0,
                    start_time: fields.start_time,
                    pid_ns: 0,
                };
                assert!(!gone.is_alive());
            }
        }
    }

    #[test]
    fn nspid_takes_the_outermost() {
        assert_eq!(outermost_nspid("Name:\tx\nNSpid:\t9000\t12\n"), Some(9000));
        assert_eq!(outermost_nspid("NSpid:\t12\n"), Some(12));
        assert_eq!(outermost_nspid("Name: x\n"), None);
    }
}
