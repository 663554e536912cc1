//! Host PIDs, as the kernel driver reports them. NVIDIA's driver lives in the host kernel and
//! names every process by its PID in the host's (initial) PID namespace, whatever namespace
//! the process runs in; a containerised process therefore finds a PID in NVML's lists that
//! its own `getpid()` never returns. The fake runs inside the process, so it must learn that
//! PID from someone who sees the host's namespace:
//!
//! - The card's namespace is the one the state file was created in (recorded in its header).
//!   A process in that namespace is named by `getpid()`.
//! - A process in any other PID namespace asks the **host-PID broker** (`fakegpu pid-broker`,
//!   run in the card's namespace) over the unix socket `<state file>.hostpid`: the broker
//!   reads the connecting process's credentials (`SO_PEERCRED`), which the kernel translates
//!   into the BROKER's namespace, and writes that PID back. The kernel does the translation,
//!   as it does for the driver. The container tests mount the socket next to the state file.
//! - Without a broker such a process cannot be named truthfully, so registration fails
//!   (`cuInit` answers `CUDA_ERROR_NO_DEVICE`, with the reason on stderr) rather than
//!   reporting a namespace PID no host tool could match.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a process waits for the broker's answer before giving up.
const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// Inode of this process's PID namespace (`/proc/self/ns/pid`), 0 when it cannot be read.
pub fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// The broker's socket for the state file at `state`.
pub fn broker_socket(state: &Path) -> PathBuf {
    let mut name = state.as_os_str().to_owned();
    name.push(".hostpid");
    PathBuf::from(name)
}

/// The PID the driver reports for the calling process (`pid` is its `getpid()`), on a card
/// created in PID namespace `card_ns` whose state file is `state`.
pub fn of_current(pid: u32, card_ns: u64, state: &Path) -> Result<u32, String> {
    let own = pid_namespace();
    // Unknown on either side (a state file of a /proc-less creator, no /proc here): nothing
    // tells the namespaces apart, so the process is taken to be where the card is.
    if own == card_ns || own == 0 || card_ns == 0 {
        return Ok(pid);
    }
    let socket = broker_socket(state);
    ask(&socket).map_err(|e| {
        format!(
            "this process is in PID namespace {own}, not the card's ({card_ns}), so the driver \
             would report its host PID, and the host-PID broker at {} did not tell it ({e}); \
             run `fakegpu pid-broker --state STATE` in the card's namespace and make its socket \
             visible next to the state file",
            socket.display()
        )
    })
}

fn ask(socket: &Path) -> Result<u32, String> {
    let stream = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(BROKER_TIMEOUT))
        .map_err(|e| format!("timeout: {e}"))?;
    let mut answer = String::new();
    stream
        .take(32)
        .read_to_string(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    match answer.trim().parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(format!("answered {answer:?}, not a PID")),
    }
}

/// The broker: answers every connection on `socket` with the connecting process's PID in
/// this process's namespace, until the listener fails. A stale socket file is replaced.
pub fn serve(socket: &Path, ready: impl FnOnce()) -> Result<(), String> {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot replace {}: {e}", socket.display())),
    }
    let listener =
        UnixListener::bind(socket).map_err(|e| format!("bind {}: {e}", socket.display()))?;
    ready();
    for stream in listener.incoming() {
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("accept: {e}")),
        };
        // A client that went away or cannot be read is its own problem, not the broker's.
        if let Some(pid) = peer_pid(&stream) {
            let _ = stream.set_write_timeout(Some(BROKER_TIMEOUT));
            let _ = writeln!(stream, "{pid}");
        }
    }
    Ok(())
}

/// The peer's PID as the kernel translates it into this process's PID namespace.
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given; the descriptor is the
    // stream's, open for the call.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    // 0: the peer is in a namespace this one cannot see (never for a broker in the card's).
    (r == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_names_its_caller() {
        let dir = std::env::temp_dir().join(format!("fakegpu-hostpid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("s.state");
        let socket = broker_socket(&state);
        assert_eq!(socket, dir.join("s.state.hostpid"));
        let (tx, rx) = std::sync::mpsc::channel();
        let served = socket.clone();
        std::thread::spawn(move || serve(&served, || tx.send(()).unwrap()));
        rx.recv().unwrap();
        // Same namespace here, so the broker's answer is our own PID.
        assert_eq!(ask(&socket), Ok(std::process::id()));
        // A namespace other than the card's goes to the broker.
        assert_eq!(
            of_current(1, pid_namespace() + 1, &state),
            Ok(std::process::id())
        );
        // No broker: a clear error, never a made-up PID.
        let err = of_current(1, pid_namespace() + 1, &dir.join("none.state")).unwrap_err();
        assert!(err.contains("none.state.hostpid"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_cards_own_namespace_uses_getpid() {
        assert_eq!(
            of_current(42, pid_namespace(), Path::new("/nonexistent")),
            Ok(42)
        );
    }
}
