//! The host-PID broker: how a process in a container learns the PID NVIDIA's driver lists it
//! under, at once and without measuring.
//!
//! The driver names every process by its PID in the host's (initial) PID namespace; a process
//! in a container's namespace cannot see that PID (its `/proc/self/status` shows only its own
//! namespace's). Without help it is found by diffing NVML's process list around the process's
//! first context, one process of a slice at a time: a storm of starts in a pod then waits in
//! line for a context creation each. The kernel translates a unix-socket peer's PID into the
//! RECEIVER's namespace (`SO_PEERCRED`), so a broker running in the host's namespace (the node
//! agent, or `gpuslice host-pid-broker`) reads the connecting process's host PID and writes it
//! back: one connection, answered in microseconds, exact, in parallel for every process.
//!
//! Protocol: the client connects to the socket; the broker writes the peer's PID in decimal
//! and a newline, then closes. Nothing is read from the client, so a client that stops or
//! never reads costs the broker nothing (the answer fits any socket buffer). The broker never
//! blocks on a client: it accepts, asks the kernel, writes without waiting and closes.
//!
//! The answer is only true when the broker runs in the driver's PID namespace; a broker
//! refuses to serve from any other unless told that namespace is the driver's (a test bed
//! whose simulated driver lives in a nested namespace).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the shim looks for the broker's socket unless [`SOCKET_ENV`] says otherwise: the
/// node agent's socket, which the DRA driver mounts into every container it prepares (its
/// host directory [`SOCKET_DIR`] at the same path).
pub const DEFAULT_SOCKET: &str = "/run/gpuslice/node/host-pid.sock";

/// The directory of [`DEFAULT_SOCKET`]: mounted whole (a socket bind-mounted alone would keep
/// naming the old one after the agent restarts).
pub const SOCKET_DIR: &str = "/run/gpuslice/node";

/// Names the broker's socket for the shim (empty: ask no broker).
pub const SOCKET_ENV: &str = "GPUSLICE_HOST_PID_SOCKET";

/// How long the shim waits for the broker's answer before it learns its host PID the slow way.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(250);

/// The inode of the initial (host) PID namespace: fixed by the kernel (`PROC_PID_INIT_INO`).
pub const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// Why no host PID came from the broker.
#[derive(Debug, PartialEq, Eq)]
pub enum AskError {
    /// No broker listens there (no socket, or nobody accepts).
    Absent,
    /// The broker did not answer within the timeout, or the connection failed.
    NoAnswer(String),
    /// It answered something that is not a PID.
    BadAnswer(String),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Absent => write!(f, "no host-PID broker listens"),
            AskError::NoAnswer(why) => write!(f, "the host-PID broker did not answer: {why}"),
            AskError::BadAnswer(text) => {
                write!(f, "the host-PID broker answered {text:?}, not a PID")
            }
        }
    }
}

/// The socket the shim asks: [`SOCKET_ENV`] when set (empty: none), else [`DEFAULT_SOCKET`].
pub fn socket_from_env() -> Option<PathBuf> {
    match std::env::var_os(SOCKET_ENV) {
        Some(path) if path.is_empty() => None,
        Some(path) => Some(PathBuf::from(path)),
        None => Some(PathBuf::from(DEFAULT_SOCKET)),
    }
}

/// Asks the broker at `socket` for the calling process's host PID, waiting at most `timeout`.
/// Never blocks longer: the connection is made without waiting (a broker whose queue is full
/// is [`AskError::Absent`]) and the answer is awaited with `poll`.
pub fn ask(socket: &Path, timeout: Duration) -> Result<u32, AskError> {
    let stream = connect_without_waiting(socket)?;
    let deadline = Instant::now() + timeout;
    let mut answer = [0u8; 16];
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !readable_within(&stream, left) {
            return Err(AskError::NoAnswer(format!(
                "nothing within {} ms",
                timeout.as_millis()
            )));
        }
        match (&stream).read(&mut answer[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if answer[..len].contains(&b'\n') || len == answer.len() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(AskError::NoAnswer(e.to_string())),
        }
    }
    parse_answer(&answer[..len])
}

/// The PID in a broker's answer: decimal digits and a newline, greater than 0.
pub fn parse_answer(bytes: &[u8]) -> Result<u32, AskError> {
    let text = String::from_utf8_lossy(bytes);
    let Some(line) = text.strip_suffix('\n') else {
        return Err(AskError::BadAnswer(text.into_owned()));
    };
    match line.parse::<u32>() {
        Ok(pid) if pid > 0 && line.bytes().all(|b| b.is_ascii_digit()) => Ok(pid),
        _ => Err(AskError::BadAnswer(text.into_owned())),
    }
}

fn connect_without_waiting(socket: &Path) -> Result<UnixStream, AskError> {
    use std::os::unix::ffi::OsStrExt;
    let path = socket.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) address.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if path.is_empty() || path.len() >= address.sun_path.len() || path.contains(&0) {
        return Err(AskError::NoAnswer(format!(
            "{}: not a usable socket path",
            socket.display()
        )));
    }
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (to, &from) in address.sun_path.iter_mut().zip(path) {
        *to = from as libc::c_char;
    }
    // SAFETY: creates a descriptor we own at once below.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(AskError::NoAnswer(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `address` is a valid sockaddr_un of the size given.
    let rc = unsafe {
        libc::connect(
            owned.as_raw_fd(),
            (&address as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let error = std::io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            // No socket, a socket nobody listens on, or a queue that is full: no broker now.
            Some(libc::ENOENT | libc::ECONNREFUSED | libc::EAGAIN | libc::ENOTDIR) => {
                AskError::Absent
            }
            _ => AskError::NoAnswer(format!("{}: {error}", socket.display())),
        });
    }
    Ok(UnixStream::from(owned))
}

fn readable_within(stream: &UnixStream, wait: Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = wait.as_millis().clamp(1, i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut poll, 1, ms) };
        if rc >= 0 {
            return rc > 0;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// The PID the kernel gives for the peer of `stream`, in the caller's PID namespace.
pub fn peer_pid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `credentials` is a ucred of the length given.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // 0: the peer is in a namespace this one cannot name.
    u32::try_from(credentials.pid)
        .ok()
        .filter(|&pid| pid > 0)
        .ok_or_else(|| std::io::Error::other("the peer's PID has no name in this namespace"))
}

/// Answers one connection: the peer's PID and a newline, written without waiting, then closed.
pub fn answer(stream: UnixStream) -> std::io::Result<u32> {
    let pid = peer_pid(&stream)?;
    stream.set_nonblocking(true)?;
    (&stream).write_all(format!("{pid}\n").as_bytes())?;
    Ok(pid)
}

/// Whether a broker may serve from here: in the host's PID namespace, or where told that
/// this namespace is the driver's (`any_namespace`).
pub fn may_serve(any_namespace: bool) -> Result<(), String> {
    let here = crate::region::own_pid_namespace();
    if any_namespace || here == INITIAL_PID_NAMESPACE {
        return Ok(());
    }
    Err(format!(
        "this process runs in PID namespace {here}, not the host's ({INITIAL_PID_NAMESPACE}): \
         the PIDs it would hand out are not the driver's (run it in the host's PID namespace, \
         e.g. a pod with hostPID: true)"
    ))
}

/// Binds the broker's socket at `path` (a stale socket file there is replaced; its directory
/// is created), readable and writable by every user: any process of any container asks.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) => {
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// Serves `listener` until it fails: each connection is answered and closed at once, and
/// `answered` hears how it went (the PID told, or why none could be: a peer already gone, or
/// one in a namespace this one cannot name).
pub fn serve(
    listener: &UnixListener,
    mut answered: impl FnMut(std::io::Result<u32>),
) -> std::io::Error {
    loop {
        match listener.accept() {
            Ok((stream, _)) => answered(answer(stream)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
            Err(e) => return e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_socket(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpuslice-broker-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("host-pid.sock")
    }

    #[test]
    fn a_broker_in_our_namespace_answers_our_own_pid() {
        let path = temp_socket("own");
        let listener = bind(&path).unwrap();
        std::thread::spawn(move || serve(&listener, |_| {}));
        for _ in 0..3 {
            assert_eq!(ask(&path, Duration::from_secs(5)), Ok(std::process::id()));
        }
        // A stale socket is replaced by the next broker.
        let listener = bind(&path).unwrap();
        let (told, heard) = std::sync::mpsc::channel();
        std::thread::spawn(move || serve(&listener, |pid| told.send(pid.ok()).unwrap()));
        assert_eq!(ask(&path, Duration::from_secs(5)), Ok(std::process::id()));
        assert_eq!(heard.recv().unwrap(), Some(std::process::id()));
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn no_broker_is_absent_and_a_silent_one_times_out() {
        let path = temp_socket("absent");
        assert_eq!(ask(&path, Duration::from_secs(1)), Err(AskError::Absent));
        // Bound but never accepting nor answering: the wait is bounded.
        let _listener = bind(&path).unwrap();
        let started = Instant::now();
        let got = ask(&path, Duration::from_millis(50));
        assert!(matches!(got, Err(AskError::NoAnswer(_))), "{got:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // A regular file where the socket should be is not overwritten by a broker.
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, b"not a socket").unwrap();
        assert!(bind(&path).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn only_a_decimal_pid_and_a_newline_is_an_answer() {
        assert_eq!(parse_answer(b"4242\n"), Ok(4242));
        for bad in [
            &b""[..],
            b"4242",
            b"0\n",
            b"-1\n",
            b"+5\n",
            b" 5\n",
            b"99999999999\n",
            b"12ab\n",
        ] {
            assert!(
                matches!(parse_answer(bad), Err(AskError::BadAnswer(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_socket_path_that_cannot_be_one_is_refused_plainly() {
        let long = PathBuf::from(format!("/tmp/{}", "x".repeat(200)));
        assert!(matches!(
            ask(&long, Duration::from_millis(10)),
            Err(AskError::NoAnswer(_))
        ));
    }
}
