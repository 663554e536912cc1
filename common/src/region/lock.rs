//! Kernel-released locks on single bytes of the region file: open-file-description (OFD)
//! fcntl locks. The kernel drops them when the last descriptor of the open file description
//! closes, which includes the death of the holder by SIGKILL, so no holder can wedge the
//! slice (the sem_t + owner-pid design of peers deadlocked exactly there).
//!
//! Each lock here uses its own freshly opened description: OFD locks of one description do not
//! exclude each other, so two threads sharing a descriptor would both "get" the lock.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// An open descriptor closed on drop (releasing its OFD locks).
#[derive(Debug)]
pub struct OwnedFd(libc::c_int);

impl OwnedFd {
    pub fn raw(&self) -> libc::c_int {
        self.0
    }

    /// Takes ownership of a descriptor previously given up with `into_raw`.
    pub fn from_raw(fd: libc::c_int) -> OwnedFd {
        OwnedFd(fd)
    }

    /// Hands the descriptor over without closing it.
    pub fn into_raw(self) -> libc::c_int {
        let fd = self.0;
        std::mem::forget(self);
        fd
    }
}

impl Drop for OwnedFd {
    fn drop(&mut self) {
        // SAFETY: we own this descriptor and nothing else closes it.
        unsafe { libc::close(self.0) };
    }
}

/// Opens `path` with close-on-exec (an exec'd image starts a new CUDA life and must not keep
/// the old image's locks). `create` adds O_CREAT with mode 0666 (minus umask).
pub fn open(path: &Path, flags: libc::c_int, create: bool) -> io::Result<OwnedFd> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let flags = flags | libc::O_CLOEXEC | if create { libc::O_CREAT } else { 0 };
    loop {
        // SAFETY: c_path is a valid NUL-terminated string; the mode argument is read only
        // with O_CREAT and is passed as the variadic c_uint open(2) expects.
        let fd = unsafe { libc::open(c_path.as_ptr(), flags, 0o666 as libc::c_uint) };
        if fd >= 0 {
            return Ok(OwnedFd(fd));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// (device, inode, size) of an open descriptor.
pub fn fstat(fd: &OwnedFd) -> io::Result<(u64, u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open and `st` is a writable stat buffer.
    if unsafe { libc::fstat(fd.raw(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev as u64, st.st_ino as u64, st.st_size as u64))
}

fn byte_lock(kind: libc::c_int, offset: u64) -> libc::flock {
    // SAFETY: flock is plain data; zero is valid for every field (and l_pid must be 0 for OFD).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = offset as libc::off_t;
    lock.l_len = 1;
    lock
}

/// Blocks until this description holds the write lock on byte `offset`.
pub fn lock_wait(fd: &OwnedFd, offset: u64) -> io::Result<()> {
    let mut lock = byte_lock(libc::F_WRLCK, offset);
    loop {
        // SAFETY: fd is open; `lock` is a valid flock for the duration of the call.
        if unsafe { libc::fcntl(fd.raw(), libc::F_OFD_SETLKW, &mut lock) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Takes the write lock on byte `offset` if nobody else holds it; `Ok(false)` when held.
pub fn try_lock(fd: &OwnedFd, offset: u64) -> io::Result<bool> {
    let mut lock = byte_lock(libc::F_WRLCK, offset);
    // SAFETY: fd is open; `lock` is a valid flock for the duration of the call.
    if unsafe { libc::fcntl(fd.raw(), libc::F_OFD_SETLK, &mut lock) } == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(err),
    }
}

/// Whether any other open file description holds a lock on byte `offset`. Works on a
/// read-only descriptor (F_GETLK checks no access mode), so the CLI can judge liveness.
pub fn is_locked_by_other(fd: &OwnedFd, offset: u64) -> io::Result<bool> {
    let mut lock = byte_lock(libc::F_WRLCK, offset);
    // SAFETY: fd is open; `lock` is a valid flock the kernel overwrites with the answer.
    if unsafe { libc::fcntl(fd.raw(), libc::F_OFD_GETLK, &mut lock) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}
