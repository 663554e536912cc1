//! Kernel-released locks on single bytes of the region file: open-file-description (OFD)
//! fcntl locks. The kernel drops them when the last descriptor of the open file description
//! closes, which includes the death of the holder by SIGKILL, so no holder can wedge the
//! slice (the sem_t + owner-pid design of peers deadlocked exactly there).
//!
//! Each lock here uses its own freshly opened description: OFD locks of one description do not
//! exclude each other, so two threads sharing a descriptor would both "get" the lock.
//!
//! Also here: opening a region file without ever following a symbolic link at its name
//! (`openat` with `O_NOFOLLOW` relative to its directory) and creating one that appears at
//! its name fully initialised (an unnamed `O_TMPFILE` linked in, or a private temporary name
//! linked in; `link` never replaces and never follows what is at the name).

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

/// Mode of a region file: every user who can reach the slice's directory may join the slice
/// (processes of one container can run as different users); the directory's own permissions
/// decide who can reach it. Set with fchmod, so no umask narrows it.
pub const REGION_FILE_MODE: libc::mode_t = 0o666;

pub fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn retry_eintr(mut call: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        let result = call();
        if result >= 0 {
            return Ok(result);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Opens `path` with close-on-exec (an exec'd image starts a new CUDA life and must not keep
/// the old image's locks). Follows symbolic links: only for paths that are not region names
/// (directories, /proc/self/fd links).
pub fn open(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let c_path = c_path(path)?;
    // SAFETY: c_path is a valid NUL-terminated string; no O_CREAT, so no mode is read.
    retry_eintr(|| unsafe { libc::open(c_path.as_ptr(), flags | libc::O_CLOEXEC) }).map(OwnedFd)
}

/// Opens `name` inside the directory `dir` without following a symbolic link AT `name`
/// (`ELOOP` then); links among the directory's own components were resolved when `dir` was
/// opened, as they must be (`/var/run` is one on most systems).
pub fn open_at_nofollow(dir: &OwnedFd, name: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: dir is an open directory descriptor and name a NUL-terminated string; no
    // O_CREAT, so no mode is read.
    retry_eintr(|| unsafe {
        libc::openat(
            dir.raw(),
            name.as_ptr(),
            // O_NONBLOCK: a FIFO at the name must be refused (not a regular file), not waited
            // on for a writer; it changes nothing for a regular file.
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        )
    })
    .map(OwnedFd)
}

/// Creates an unnamed file in `dir` (O_TMPFILE), or, where the filesystem has no O_TMPFILE, a
/// file under a private temporary name (returned, to be unlinked once linked elsewhere).
pub fn create_unnamed(dir: &OwnedFd, hint: &str) -> io::Result<(OwnedFd, Option<CString>)> {
    let dot = CString::new(".").expect("no NUL");
    // SAFETY: dir is an open directory, "." a valid string, the mode is passed as the c_uint
    // the variadic openat expects with O_TMPFILE.
    let unnamed = retry_eintr(|| unsafe {
        libc::openat(
            dir.raw(),
            dot.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            REGION_FILE_MODE as libc::c_uint,
        )
    });
    match unnamed {
        Ok(fd) => return Ok((OwnedFd(fd), None)),
        Err(e)
            if !matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR)
            ) =>
        {
            return Err(e)
        }
        Err(_) => {}
    }
    for attempt in 0u32..16 {
        let name = CString::new(format!(
            ".{hint}.creating-{}-{}-{attempt}",
            std::process::id(),
            monotonic_nanos()
        ))
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains NUL"))?;
        // SAFETY: as above; O_EXCL|O_NOFOLLOW never opens or follows anything already there.
        let made = retry_eintr(|| unsafe {
            libc::openat(
                dir.raw(),
                name.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_RDWR | libc::O_CLOEXEC,
                REGION_FILE_MODE as libc::c_uint,
            )
        });
        match made {
            Ok(fd) => return Ok((OwnedFd(fd), Some(name))),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary name",
    ))
}

/// Gives the file `fd` (from `create_unnamed`) the name `name` in `dir`, never replacing
/// anything there (`EEXIST` when the name is taken, a dangling symbolic link included).
pub fn link_into(
    fd: &OwnedFd,
    temp_name: Option<&CString>,
    dir: &OwnedFd,
    name: &CString,
) -> io::Result<()> {
    let result = match temp_name {
        // SAFETY: valid directory descriptors and NUL-terminated names; flags 0 = no follow.
        Some(temp) => retry_eintr(|| unsafe {
            libc::linkat(dir.raw(), temp.as_ptr(), dir.raw(), name.as_ptr(), 0)
        }),
        None => {
            let proc_path = CString::new(format!("/proc/self/fd/{}", fd.raw())).expect("no NUL");
            // SAFETY: as above; AT_SYMLINK_FOLLOW resolves the /proc magic link to the
            // unnamed file itself (the documented way to name an O_TMPFILE without privilege).
            retry_eintr(|| unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr(),
                    dir.raw(),
                    name.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })
        }
    };
    result.map(|_| ())
}

/// Removes `name` from `dir` (a temporary name), ignoring errors.
pub fn unlink_at(dir: &OwnedFd, name: &CString) {
    // SAFETY: valid directory descriptor and NUL-terminated name.
    unsafe { libc::unlinkat(dir.raw(), name.as_ptr(), 0) };
}

/// Renames `from` to `to` inside `dir`, replacing what `to` names (the name itself, never
/// what a symbolic link there points at).
pub fn rename_at(dir: &OwnedFd, from: &CString, to: &CString) -> io::Result<()> {
    // SAFETY: valid directory descriptor and NUL-terminated names.
    retry_eintr(|| unsafe { libc::renameat(dir.raw(), from.as_ptr(), dir.raw(), to.as_ptr()) })
        .map(|_| ())
}

/// Sets the file's mode regardless of umask.
pub fn fchmod(fd: &OwnedFd, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: fd is open.
    retry_eintr(|| unsafe { libc::fchmod(fd.raw(), mode) }).map(|_| ())
}

/// File type bits of what `name` in `dir` is, without following a link (`None` = missing).
pub fn lstat_at(dir: &OwnedFd, name: &CString) -> io::Result<Option<libc::mode_t>> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid directory descriptor, NUL-terminated name, writable stat buffer.
    match retry_eintr(|| unsafe {
        libc::fstatat(dir.raw(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW)
    }) {
        Ok(_) => Ok(Some(st.st_mode & libc::S_IFMT)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn monotonic_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// What `fstat` says of an open region file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileFacts {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub regular: bool,
}

/// (device, inode, size, regular file?) of an open descriptor.
pub fn fstat(fd: &OwnedFd) -> io::Result<FileFacts> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open and `st` is a writable stat buffer.
    if unsafe { libc::fstat(fd.raw(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FileFacts {
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
        size: st.st_size as u64,
        regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
    })
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

/// Takes the write lock on byte `offset` if nobody else holds it; `Ok(false)` when held.
pub fn try_lock(fd: &OwnedFd, offset: u64) -> io::Result<bool> {
    try_set(fd, libc::F_WRLCK, offset)
}

fn try_set(fd: &OwnedFd, kind: libc::c_int, offset: u64) -> io::Result<bool> {
    let mut lock = byte_lock(kind, offset);
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

/// Drops this description's lock on byte `offset`.
pub fn unlock(fd: &OwnedFd, offset: u64) {
    let mut lock = byte_lock(libc::F_UNLCK, offset);
    // SAFETY: fd is open; `lock` is a valid flock for the duration of the call.
    unsafe { libc::fcntl(fd.raw(), libc::F_OFD_SETLK, &mut lock) };
}

/// Whether a description other than `fd`'s holds a WRITE lock on any byte of
/// `[start, start + len)`. Read locks are not seen: anyone who can open the file for reading
/// can take one, while a write lock needs a descriptor open for writing. Works on a
/// read-only descriptor.
pub fn write_locked_in(fd: &OwnedFd, start: u64, len: u64) -> io::Result<bool> {
    let mut lock = byte_lock(libc::F_RDLCK, start);
    lock.l_len = len as libc::off_t;
    // SAFETY: fd is open; `lock` is a valid flock the kernel overwrites with the answer.
    if unsafe { libc::fcntl(fd.raw(), libc::F_OFD_GETLK, &mut lock) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

/// Opens `name` in `dir` for reading and writing without following a link at it, creating
/// it (mode `mode`, set with fchmod regardless of umask) when it does not exist.
pub fn open_or_create_at(dir: &OwnedFd, name: &CString, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: dir is an open directory descriptor and name a NUL-terminated string; the mode
    // is passed as the c_uint the variadic openat expects with O_CREAT; O_EXCL|O_NOFOLLOW
    // never opens or follows anything already there.
    let created = retry_eintr(|| unsafe {
        libc::openat(
            dir.raw(),
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_RDWR | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    });
    match created {
        Ok(fd) => {
            let fd = OwnedFd(fd);
            fchmod(&fd, mode)?;
            Ok(fd)
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            open_at_nofollow(dir, name, libc::O_RDWR)
        }
        Err(e) => Err(e),
    }
}

/// Whether another open file description holds a WRITE lock on byte `offset` (every lock
/// the region's processes hold is one; a reader's read locks are not seen, so no reader can
/// make a dead owner look alive). Works on a read-only descriptor (F_GETLK checks no access
/// mode), so the CLI can judge liveness.
pub fn is_locked_by_other(fd: &OwnedFd, offset: u64) -> io::Result<bool> {
    write_locked_in(fd, offset, 1)
}
