//! The shared state of the simulated GPU: one file mapped `MAP_SHARED` by every process that
//! uses the fake (path `FAKEGPU_STATE`, default `/tmp/fakegpu-$UID.state`).
//!
//! It holds the device specs (fixed when the file is created), per-device physical memory in
//! use, per-process slots (host pid, start time, physical bytes and contexts per device), and the
//! kernel timeline: per device `busy_until_ns` plus utilisation rings (see `timeline`) for the
//! device and for every process slot.
//!
//! PIDs: a slot holds the PID the kernel driver would report, the process's PID in the card's
//! PID namespace (the creator's, kept in the header), learnt through the host-PID broker by a
//! process in another namespace (a container); see `host_pid`.
//!
//! Release delay: a real driver may free a dead process's device memory a little after the
//! process is gone. The state keeps one delay for the whole machine (`release_delay_ns` in the
//! header, from `FAKEGPU_RELEASE_DELAY_MS`, default 0 = at once): a dead process's slot keeps
//! its bytes, charged to the device and listed with its usage, until it has been seen dead
//! for that long. The first observer to see it dead stamps the slot (`dead_since`), so every
//! process reading the state agrees on when the memory comes back.
//!
//! Locking: creation and process registration take an fcntl OFD write lock on byte 0
//! (`F_OFD_SETLKW`), which the kernel drops when the holder dies, so a killed process never
//! blocks others. Reaping dead processes takes no lock (one compare-and-swap per slot), so a
//! process stopped while it reaps stalls nobody's view of the card. Every registered process additionally holds an OFD lock on its own slot's
//! lock byte through a private descriptor for as long as it lives; a slot whose byte nobody
//! holds belongs to a dead process. That test works across PID namespaces and is immune to pid
//! reuse (the pid and `/proc/<pid>/stat` start time are kept for reporting, and are the
//! fallback liveness test on kernels without OFD locks). Everything on the hot paths (charging
//! memory, enqueueing kernels) is lock-free atomics on the mapping.

use crate::spec::{self, DeviceSpec};
use crate::timeline::{self, HISTORY_NS, RING};
use std::ffi::CString;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};

pub const MAX_DEVICES: usize = 8;
/// Process slots per machine: as many as a gpuslice region has (a real driver has no small
/// limit; the fake must not hide what happens past 64 processes).
pub const MAX_PROCS: usize = 1024;
/// How many sums of the slots [`SharedState::record_peak`] reads at most for one charge.
const PEAK_SUM_ATTEMPTS: u32 = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"FAKEGPU1");
/// 4: a device's use is the sum of its processes' slots (`used` holds only slot-less charges).
/// 5: the header names the card's PID namespace; slots hold PIDs in it (host PIDs).
/// 6: a device counts the changes of its use, so its high-water mark is read as one instant.
/// 7: 1,024 process slots, their utilisation rings apart, and a slot high-water mark.
const VERSION: u32 = 8;
/// Byte locked (exclusively) while creating the file or changing the slot table.
const REG_LOCK: i64 = 0;
/// Slot `i` is alive while someone holds a lock on byte `SLOT_LOCK_BASE + i`.
const SLOT_LOCK_BASE: i64 = 4096;

const SLOT_FREE: u32 = 0;
const SLOT_LIVE: u32 = 1;
/// A dead process's slot while one reaper frees it.
const SLOT_REAPING: u32 = 2;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: u32,
    device_count: u32,
    layout_size: u64,
    created_ns: u64,
    /// How long a dead process's memory stays charged after it is first seen dead (ns).
    release_delay_ns: AtomicU64,
    /// Inode of the creator's PID namespace, the "host" whose PIDs the driver reports (0:
    /// unknown).
    pid_ns: u64,
    /// One past the highest slot ever claimed: loops over the slots stop there, so a machine
    /// that never had many processes pays for few (set before a slot is published live).
    slot_high: AtomicU32,
    /// When (monotonic ns) a driver last began a pass over the slots' liveness locks: the
    /// driver in a process begins one at most every [`SharedState::liveness_lag_ns`].
    liveness_pass_ns: AtomicU64,
    /// Where the next drivers' pass begins: each looks at [`LIVENESS_WINDOW`] slots from here.
    liveness_cursor: AtomicU64,
}

#[repr(C)]
struct DeviceRecord {
    name: [u8; 96],
    uuid: [u8; 48],
    pci: [u8; 32],
    total_memory: u64,
    sm_count: u32,
    max_threads_per_sm: u32,
    cc_major: u32,
    cc_minor: u32,
    /// Bytes charged without a process slot. The device's use is this plus every slot's
    /// bytes (`device_used`): there is no second total that a process killed between two
    /// writes could leave wrong (it was, and the card then "held" phantom memory for good).
    used: AtomicU64,
    /// The most the device has ever held (the hardware's high-water mark): tests read it
    /// instead of sampling the use, which can miss a short-lived peak on a loaded machine.
    peak_used: AtomicU64,
    /// Counts changes of the device's use (every slot's bytes, a slot leaving the sum), each
    /// counted just after it is made. A sum of the slots is a snapshot of one instant only if
    /// this did not move while it was read; see [`SharedState::record_peak`].
    changes: AtomicU64,
    busy_until: AtomicU64,
    ring: [AtomicU64; RING],
}

#[repr(C)]
struct ProcSlot {
    state: AtomicU32,
    /// The PID the driver reports: in the card's PID namespace (see `host_pid`).
    pid: AtomicU32,
    start_time: AtomicU64,
    /// When (monotonic ns) an observer first saw this slot's process dead; 0 = not yet.
    dead_since: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
    contexts: [AtomicU32; MAX_DEVICES],
    /// Bit `d`: the slot's utilisation ring of device `d` may hold history (cleared for the
    /// next holder only then, so a registration touches no ring pages it need not).
    rings_used: AtomicU32,
}

/// One process slot's utilisation history per device.
type SlotRings = [[AtomicU64; RING]; MAX_DEVICES];

#[repr(C)]
struct Layout {
    header: Header,
    devices: [DeviceRecord; MAX_DEVICES],
    slots: [ProcSlot; MAX_PROCS],
    /// Apart from the slots, so that summing the slots reads a few compact pages.
    rings: [SlotRings; MAX_PROCS],
}

/// Size of the state file. Most of it (the rings) stays sparse until used.
pub const LAYOUT_SIZE: usize = std::mem::size_of::<Layout>();

/// One process's use of a device.
#[derive(Clone, Debug)]
pub struct ProcessUsage {
    pub pid: u32,
    pub used_memory: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    Io(String),
    Config(String),
    /// The file exists but is not a state file of this layout version.
    Incompatible(String),
    /// All `MAX_PROCS` process slots are taken by live processes.
    NoFreeSlot,
    /// Opened read-only; the operation needs write access.
    ReadOnly,
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Io(m) => write!(f, "fakegpu state: {m}"),
            StateError::Config(m) => write!(f, "fakegpu config: {m}"),
            StateError::Incompatible(m) => write!(f, "fakegpu state incompatible: {m}"),
            StateError::NoFreeSlot => write!(f, "fakegpu state: all process slots in use"),
            StateError::ReadOnly => write!(f, "fakegpu state: opened read-only"),
        }
    }
}

impl std::error::Error for StateError {}

fn io_err(what: &str, path: &Path) -> StateError {
    StateError::Io(format!(
        "{what} {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    ))
}

/// `CLOCK_MONOTONIC` in ns (vDSO, no syscall).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static PID: AtomicU32 = AtomicU32::new(0);
/// Slot-lock descriptors of this process; closed in a forked child (see `after_fork_child`).
static LOCK_FDS: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];
static ATFORK: Once = Once::new();

extern "C" fn after_fork_child() {
    // SAFETY: getpid and close are async-signal-safe, which is all a fork child may call.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
    for fd in &LOCK_FDS {
        let fd = fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // Closing the child's copy does not release the parent's lock (the open file
            // description lives on in the parent); it makes the parent's slot die with the
            // parent instead of with the child.
            // SAFETY: `fd` is a descriptor this process opened and nobody else uses.
            unsafe { libc::close(fd) };
        }
    }
}

/// The current pid, cached (glibc does not cache getpid) and refreshed after fork.
#[inline]
pub fn current_pid() -> u32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    ATFORK.call_once(|| {
        // SAFETY: registers a plain extern "C" fn that only uses async-signal-safe calls.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    });
    // SAFETY: getpid has no preconditions.
    let p = unsafe { libc::getpid() } as u32;
    PID.store(p, Ordering::Relaxed);
    p
}

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks since boot).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn copy_str(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len() - 1);
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
    dst[n..].fill(0);
}

fn read_str(src: &[u8]) -> String {
    let n = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..n]).into_owned()
}

/// An OFD lock held until dropped.
struct FileLock {
    fd: i32,
    start: i64,
}

fn ofd_lock(fd: i32, cmd: i32, kind: i32, start: i64) -> Result<libc::flock, std::io::Error> {
    // SAFETY: flock is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = 1;
    // l_pid must be 0 for OFD locks.
    loop {
        // SAFETY: `fl` is a valid flock for the duration of the call.
        let r = unsafe { libc::fcntl(fd, cmd, &mut fl) };
        if r == 0 {
            return Ok(fl);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

impl FileLock {
    fn acquire(fd: i32, kind: i32, start: i64) -> Result<FileLock, std::io::Error> {
        ofd_lock(fd, libc::F_OFD_SETLKW, kind, start)?;
        Ok(FileLock { fd, start })
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = ofd_lock(self.fd, libc::F_OFD_SETLK, libc::F_UNLCK, self.start);
    }
}

/// A mapped state file.
pub struct SharedState {
    path: PathBuf,
    base: NonNull<Layout>,
    /// Descriptor used for the registration lock and for probing slot locks.
    fd: i32,
    writable: bool,
    /// Serialises registration/reaping among this process's threads (OFD locks taken through
    /// one descriptor do not exclude each other).
    reg: Mutex<()>,
    my_slot: AtomicUsize,
    my_pid: AtomicU32,
    /// This instance's slot-lock descriptor (-1: none), the pid that opened it, and whether
    /// it is also listed in `LOCK_FDS` (then a fork child has closed its copy already).
    lock_fd: AtomicI32,
    lock_pid: AtomicU32,
    lock_listed: AtomicBool,
    /// How often at most the driver in this process looks for dead processes (0: at every
    /// look), machine-wide through the header's `liveness_pass_ns`. Only the process-wide
    /// state of a driver ([`state`]) sets it, from [`LIVENESS_LAG_ENV`]: observers (the tests'
    /// truth, `fakegpu smi`) look every time.
    liveness_lag_ns: AtomicU64,
}

// SAFETY: the mapping is only accessed through atomics (or fields written once before the
// magic is published), so sharing it between threads is sound.
unsafe impl Send for SharedState {}
// SAFETY: as above.
unsafe impl Sync for SharedState {}

impl Drop for SharedState {
    fn drop(&mut self) {
        self.close_lock_fd();
        // SAFETY: base/len describe the mapping created in `open_state_at`; fd is ours.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), LAYOUT_SIZE);
            libc::close(self.fd);
        }
    }
}

/// The largest `FAKEGPU_RELEASE_DELAY_MS` accepted (one hour): a driver that has not freed a
/// dead process's memory after that is broken, and a typo must not park memory forever.
pub const MAX_RELEASE_DELAY_MS: u64 = 3_600_000;

/// A whole-number setting of the fake: its variable's name, its unit (for the error) and the
/// largest value accepted.
pub struct WholeSetting {
    pub name: &'static str,
    pub unit: &'static str,
    pub max: u64,
}

/// `FAKEGPU_RELEASE_DELAY_MS`: milliseconds, at most one hour.
pub const RELEASE_DELAY_SETTING: WholeSetting = WholeSetting {
    name: "FAKEGPU_RELEASE_DELAY_MS",
    unit: "milliseconds",
    max: MAX_RELEASE_DELAY_MS,
};

/// `FAKEGPU_LIVENESS_LAG_US`: microseconds, at most one second.
pub const LIVENESS_LAG_SETTING: WholeSetting = WholeSetting {
    name: LIVENESS_LAG_ENV,
    unit: "microseconds",
    max: MAX_LIVENESS_LAG_US,
};

impl WholeSetting {
    /// Parses a value: a whole number (spaces around it allowed), 0..=`max`.
    pub fn parse(&self, text: &str) -> Result<u64, StateError> {
        let (name, unit, max) = (self.name, self.unit, self.max);
        let value: u64 = text.trim().parse().map_err(|_| {
            StateError::Config(format!("{name}={text:?}: not a whole number of {unit}"))
        })?;
        if value > max {
            return Err(StateError::Config(format!(
                "{name}={value}: more than {max} {unit}"
            )));
        }
        Ok(value)
    }

    /// This process's value, if set (and not empty).
    fn read_env(&self) -> Result<Option<u64>, StateError> {
        match std::env::var(self.name) {
            Ok(v) if !v.trim().is_empty() => self.parse(&v).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(StateError::Config(format!(
                "{} is not valid UTF-8",
                self.name
            ))),
        }
    }
}

/// The default state path: `FAKEGPU_STATE` or `/tmp/fakegpu-$UID.state`.
pub fn default_path() -> PathBuf {
    match std::env::var_os("FAKEGPU_STATE").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        // SAFETY: getuid has no preconditions.
        None => PathBuf::from(format!("/tmp/fakegpu-{}.state", unsafe { libc::getuid() })),
    }
}

static GLOBAL: OnceLock<Result<SharedState, StateError>> = OnceLock::new();

/// Microseconds between two looks for dead processes by the drivers of the machine (default
/// [`DEFAULT_LIVENESS_LAG_US`]; 0 = every process looks at every call; at most
/// [`MAX_LIVENESS_LAG_US`]): each look takes the next [`LIVENESS_WINDOW`] slots, so a death
/// reaches the drivers' views within (slots in use / window) looks. A
/// real driver learns of a death when the process's descriptors close and tears its memory
/// down asynchronously, so its process list and free memory lag a death a little; and its
/// list costs one kernel call, not one probe per process. The fake probes each process's lock
/// instead (each probe walks every lock of the state file), so without the lag a crowd of N
/// processes each listing or viewing the card made N x N probes.
pub const LIVENESS_LAG_ENV: &str = "FAKEGPU_LIVENESS_LAG_US";
pub const DEFAULT_LIVENESS_LAG_US: u64 = 10_000;
pub const MAX_LIVENESS_LAG_US: u64 = 1_000_000;
/// How many slots one drivers' pass looks at: each probe walks every lock of the state file,
/// so a pass over 1,024 slots took about 0.1 s; passes one after another walk them all, and
/// a death is seen within (slots in use / this) x the lag.
const LIVENESS_WINDOW: usize = 64;

/// The process-wide state, opened (and created if needed) from the environment on first use:
/// the driver's, so it looks for dead processes at most once per [`LIVENESS_LAG_ENV`].
pub fn state() -> Result<&'static SharedState, StateError> {
    GLOBAL
        .get_or_init(|| {
            let state = open_state_at(&default_path())?;
            let lag_us = LIVENESS_LAG_SETTING
                .read_env()?
                .unwrap_or(DEFAULT_LIVENESS_LAG_US);
            state
                .liveness_lag_ns
                .store(lag_us * 1000, Ordering::Relaxed);
            Ok(state)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Opens (creating and initialising from the environment if absent or empty) the state file at
/// `path`. Falls back to a read-only mapping when the file cannot be opened for writing.
pub fn open_state_at(path: &Path) -> Result<SharedState, StateError> {
    open_with(path, spec::from_env)
}

/// Like `open_state_at`, with the devices to create the file with given explicitly.
pub fn open_state_with(path: &Path, devices: &[DeviceSpec]) -> Result<SharedState, StateError> {
    let devices = devices.to_vec();
    open_with(path, move || Ok(devices))
}

fn open_with(
    path: &Path,
    devices: impl FnOnce() -> Result<Vec<DeviceSpec>, String>,
) -> Result<SharedState, StateError> {
    let release_delay = RELEASE_DELAY_SETTING.read_env()?;
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| StateError::Io("path contains NUL".into()))?;
    let mut writable = true;
    // SAFETY: cpath is a valid NUL-terminated string.
    let mut fd = unsafe {
        libc::open(
            cpath.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o666,
        )
    };
    if fd < 0 {
        writable = false;
        // SAFETY: as above.
        fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io_err("cannot open", path));
        }
    }
    let close_on_err = |e: StateError| {
        // SAFETY: fd is the descriptor opened above and not yet owned by anything.
        unsafe { libc::close(fd) };
        e
    };
    let kind = if writable {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    };
    let guard = FileLock::acquire(fd, kind, REG_LOCK)
        .map_err(|e| close_on_err(StateError::Io(format!("lock {}: {e}", path.display()))))?;
    // SAFETY: stat is plain data; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, st is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(close_on_err(io_err("fstat", path)));
    }
    let size = st.st_size as usize;
    // Checking the size before mapping avoids SIGBUS on a short file.
    if size != 0 && size != LAYOUT_SIZE {
        return Err(close_on_err(StateError::Incompatible(format!(
            "{} is {size} bytes, expected {LAYOUT_SIZE}",
            path.display()
        ))));
    }
    if size == 0 {
        if !writable {
            return Err(close_on_err(StateError::Incompatible(format!(
                "{} is empty and read-only",
                path.display()
            ))));
        }
        // SAFETY: fd is open for writing.
        if unsafe { libc::ftruncate(fd, LAYOUT_SIZE as libc::off_t) } != 0 {
            return Err(close_on_err(io_err("ftruncate", path)));
        }
    }
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: the file is exactly LAYOUT_SIZE bytes long (checked/truncated above).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LAYOUT_SIZE,
            prot,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(close_on_err(io_err("mmap", path)));
    }
    let state = SharedState {
        path: path.to_path_buf(),
        base: NonNull::new(p.cast()).expect("mmap never returns null on success"),
        fd,
        writable,
        reg: Mutex::new(()),
        my_slot: AtomicUsize::new(usize::MAX),
        my_pid: AtomicU32::new(0),
        lock_fd: AtomicI32::new(-1),
        lock_pid: AtomicU32::new(0),
        lock_listed: AtomicBool::new(false),
        liveness_lag_ns: AtomicU64::new(0),
    };
    let magic = state.layout().header.magic.load(Ordering::Acquire);
    if magic == 0 {
        // New file, or its creator died half-way (we hold the lock, so nobody else is
        // initialising it now).
        if !writable {
            return Err(StateError::Incompatible(format!(
                "{} is not initialised",
                path.display()
            )));
        }
        let devices = devices().map_err(StateError::Config)?;
        state.initialise(&devices)?;
    } else if magic != MAGIC {
        return Err(StateError::Incompatible(format!(
            "{}: bad magic",
            path.display()
        )));
    }
    let h = &state.layout().header;
    if h.version != VERSION || h.layout_size != LAYOUT_SIZE as u64 {
        return Err(StateError::Incompatible(format!(
            "{}: layout version {} size {}",
            path.display(),
            h.version,
            h.layout_size
        )));
    }
    // The delay is the machine's: a process that opens the state with the variable set
    // sets it for every process (the creator's, or 0, otherwise).
    if let (Some(ms), true) = (release_delay, writable) {
        state.set_release_delay_ms(ms);
    }
    drop(guard);
    Ok(state)
}

impl SharedState {
    #[inline]
    fn layout(&self) -> &Layout {
        // SAFETY: base points to a live LAYOUT_SIZE mapping for self's lifetime; all shared
        // mutation goes through atomics.
        unsafe { self.base.as_ref() }
    }

    fn initialise(&self, devices: &[DeviceSpec]) -> Result<(), StateError> {
        if devices.is_empty() || devices.len() > MAX_DEVICES {
            return Err(StateError::Config(format!(
                "{} devices (1..={MAX_DEVICES} supported)",
                devices.len()
            )));
        }
        let base = self.base.as_ptr();
        for (i, d) in devices.iter().enumerate() {
            // SAFETY: we hold the exclusive registration lock and the magic is unpublished, so
            // no other process reads these plain fields; the pointer is in bounds.
            let rec = unsafe { &mut *std::ptr::addr_of_mut!((*base).devices[i]) };
            copy_str(&mut rec.name, &d.name);
            copy_str(&mut rec.uuid, &d.uuid);
            copy_str(&mut rec.pci, &d.pci_bus_id);
            rec.total_memory = d.total_memory;
            rec.sm_count = d.sm_count.max(1);
            rec.max_threads_per_sm = d.max_threads_per_sm.max(1);
            rec.cc_major = d.cc_major;
            rec.cc_minor = d.cc_minor;
            *rec.used.get_mut() = 0;
            *rec.peak_used.get_mut() = 0;
            *rec.busy_until.get_mut() = 0;
        }
        // SAFETY: as above, for the header's plain fields.
        unsafe {
            let h = std::ptr::addr_of_mut!((*base).header);
            (*h).version = VERSION;
            (*h).device_count = devices.len() as u32;
            (*h).layout_size = LAYOUT_SIZE as u64;
            (*h).created_ns = now_ns();
            *(*h).release_delay_ns.get_mut() = 0;
            (*h).pid_ns = crate::host_pid::pid_namespace();
        }
        self.layout().header.magic.store(MAGIC, Ordering::Release);
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// How long a dead process's memory stays charged after it is first seen dead.
    pub fn release_delay_ms(&self) -> u64 {
        self.layout()
            .header
            .release_delay_ns
            .load(Ordering::Acquire)
            / 1_000_000
    }

    /// Sets the machine's release delay (as `FAKEGPU_RELEASE_DELAY_MS` does at open), capped
    /// at `MAX_RELEASE_DELAY_MS`; a no-op on a read-only mapping.
    pub fn set_release_delay_ms(&self, ms: u64) {
        if self.writable {
            let ns = ms.min(MAX_RELEASE_DELAY_MS) * 1_000_000;
            self.layout()
                .header
                .release_delay_ns
                .store(ns, Ordering::Release);
        }
    }

    /// For the slot of a process known to be dead: whether its memory is due to be released
    /// at `now`. The first writable observer to ask stamps the time of death it will be
    /// counted from; a read-only one cannot, and counts an unstamped slot as not due.
    fn release_due(&self, i: usize, now: u64) -> bool {
        let delay = self
            .layout()
            .header
            .release_delay_ns
            .load(Ordering::Acquire);
        if delay == 0 {
            return true;
        }
        let s = self.slot(i);
        let mut since = s.dead_since.load(Ordering::Acquire);
        if since == 0 {
            if !self.writable {
                return false;
            }
            since = match s.dead_since.compare_exchange(
                0,
                now.max(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => now.max(1),
                Err(earlier) => earlier,
            };
        }
        now.saturating_sub(since) >= delay
    }

    /// Live slot `i` holds memory on the device: its process lives, or died and its memory is
    /// not released yet (reaping has not run, or the release delay has not passed).
    fn slot_holds(&self, i: usize, now: u64) -> bool {
        self.slot(i).state.load(Ordering::Acquire) == SLOT_LIVE
            && (self.slot_alive(i) || !self.release_due(i, now))
    }

    pub fn device_count(&self) -> u32 {
        self.layout().header.device_count
    }

    fn dev(&self, index: u32) -> Option<&DeviceRecord> {
        (index < self.device_count()).then(|| &self.layout().devices[index as usize])
    }

    pub fn device(&self, index: u32) -> Option<DeviceSpec> {
        let r = self.dev(index)?;
        Some(DeviceSpec {
            name: read_str(&r.name),
            uuid: read_str(&r.uuid),
            pci_bus_id: read_str(&r.pci),
            total_memory: r.total_memory,
            sm_count: r.sm_count,
            max_threads_per_sm: r.max_threads_per_sm,
            cc_major: r.cc_major,
            cc_minor: r.cc_minor,
        })
    }

    /// Total memory of a device without allocating (hot path).
    #[inline]
    pub fn total_memory(&self, index: u32) -> u64 {
        self.dev(index).map_or(0, |r| r.total_memory)
    }

    /// (sm_count, max_threads_per_sm) without allocating (hot path).
    #[inline]
    pub fn sm_shape(&self, index: u32) -> (u32, u32) {
        self.dev(index)
            .map_or((1, 1), |r| (r.sm_count, r.max_threads_per_sm))
    }

    /// Physical bytes in use on the device by all processes, after reaping dead ones.
    pub fn used_memory(&self, index: u32) -> u64 {
        if self.dev(index).is_none() {
            return 0;
        }
        if self.writable {
            self.reap_dead_processes();
            return self.device_used(index);
        }
        // Read-only: cannot reap, so leave out the bytes of dead processes that are due for
        // release.
        let now = now_ns();
        let dead: u64 = self
            .claimed_slots()
            .filter(|&i| self.slot(i).state.load(Ordering::Acquire) == SLOT_LIVE)
            .filter(|&i| !self.slot_holds(i, now))
            .map(|i| self.slot(i).used[index as usize].load(Ordering::Relaxed))
            .sum();
        self.device_used(index).saturating_sub(dead)
    }

    /// What the device holds: slot-less charges plus the bytes of every live slot (dead
    /// processes not yet released included).
    ///
    /// A slot's memory leaves the device at the instant a reaper takes the slot from live to
    /// reaping, the same instant it leaves the process lists ([`Self::processes`]): a real
    /// driver frees a process's memory and unlists it together. Counting a reaping slot until
    /// its counters are zeroed would let a reaper that is preempted or stopped between the two
    /// hold memory that no list shows, so that a shim which trusts the list (rightly) would
    /// seem to pass its cap.
    fn device_used(&self, index: u32) -> u64 {
        let Some(r) = self.dev(index) else { return 0 };
        self.claimed_slots()
            .inspect(|&_i| {
                #[cfg(test)]
                tests::while_summing(_i);
            })
            .filter(|&i| self.slot(i).state.load(Ordering::SeqCst) == SLOT_LIVE)
            .fold(r.used.load(Ordering::SeqCst), |sum, i| {
                sum.saturating_add(self.slot(i).used[index as usize].load(Ordering::SeqCst))
            })
    }

    /// The most physical memory the device has ever held at once since the state file was
    /// created (or since the last `reset_peak_memory`): exact, unlike sampling `used_memory`.
    pub fn peak_memory(&self, index: u32) -> u64 {
        self.dev(index)
            .map_or(0, |r| r.peak_used.load(Ordering::Acquire))
    }

    /// Restarts the high-water mark from what the device holds now; returns the old mark.
    pub fn reset_peak_memory(&self, index: u32) -> u64 {
        let Some(r) = self.dev(index) else { return 0 };
        let old = r.peak_used.swap(0, Ordering::AcqRel);
        // What is held now (and a charge that landed meanwhile) is the new mark.
        self.record_peak(r, index);
        old
    }

    /// Raw physical counter, no reaping (hot path).
    #[inline]
    pub fn used_memory_raw(&self, index: u32) -> u64 {
        self.device_used(index)
    }

    /// Processes holding memory or contexts on the device: the live ones, and dead ones whose
    /// memory is not released yet (see the release delay), as the driver's lists show them.
    pub fn processes(&self, index: u32) -> Vec<ProcessUsage> {
        if index >= self.device_count() {
            return Vec::new();
        }
        self.reap_dead_processes();
        let d = index as usize;
        let now = now_ns();
        self.claimed_slots()
            .filter(|&i| self.slot(i).state.load(Ordering::Acquire) == SLOT_LIVE)
            .filter(|&i| {
                let s = self.slot(i);
                s.used[d].load(Ordering::Relaxed) > 0 || s.contexts[d].load(Ordering::Relaxed) > 0
            })
            // Writable: reaping just left only slots that hold memory.
            .filter(|&i| self.writable || self.slot_holds(i, now))
            .map(|i| ProcessUsage {
                pid: self.slot(i).pid.load(Ordering::Relaxed),
                used_memory: self.slot(i).used[d].load(Ordering::Relaxed),
            })
            .collect()
    }

    fn pid_slot(&self, pid: u32) -> Option<usize> {
        self.claimed_slots().find(|&i| {
            let s = self.slot(i);
            s.state.load(Ordering::Acquire) == SLOT_LIVE && s.pid.load(Ordering::Relaxed) == pid
        })
    }

    /// Busy ns of the device (or of one process on it) within `[from_ns, to_ns)`; visible
    /// history is the last ~4 s.
    pub fn busy_ns(&self, index: u32, pid: Option<u32>, from_ns: u64, to_ns: u64) -> u64 {
        let Some(r) = self.dev(index) else { return 0 };
        let now = now_ns();
        match pid {
            None => timeline::busy_between(&r.ring, from_ns, to_ns, now),
            Some(pid) => match self.pid_slot(pid) {
                Some(i) => {
                    timeline::busy_between(&self.rings(i)[index as usize], from_ns, to_ns, now)
                }
                None => 0,
            },
        }
    }

    /// Busy share of `[now - window, now]` in percent (window capped at the ~4 s history).
    pub fn utilization_percent(&self, index: u32, window_ns: u64) -> u32 {
        let window = window_ns.clamp(1, HISTORY_NS - timeline::BUCKET_NS);
        let now = now_ns();
        let busy = self.busy_ns(index, None, now.saturating_sub(window), now);
        (((busy as u128 * 100 + window as u128 / 2) / window as u128) as u32).min(100)
    }

    /// When the device finishes all work enqueued so far (monotonic ns).
    #[inline]
    pub fn busy_until(&self, index: u32) -> u64 {
        self.dev(index)
            .map_or(0, |r| r.busy_until.load(Ordering::Acquire))
    }

    /// Appends `duration_ns` of work to the device timeline: it starts when the device is
    /// free (or now) and runs alone. Returns (start, end).
    #[inline]
    pub fn enqueue_busy(&self, index: u32, duration_ns: u64) -> (u64, u64) {
        let Some(r) = self.dev(index) else {
            return (0, 0);
        };
        let now = now_ns();
        let mut cur = r.busy_until.load(Ordering::Acquire);
        loop {
            let start = cur.max(now);
            let end = start + duration_ns;
            match r
                .busy_until
                .compare_exchange_weak(cur, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (start, end),
                Err(v) => cur = v,
            }
        }
    }

    /// Records a busy interval in the device's and the slot's utilisation history.
    #[inline]
    pub fn record_busy(&self, index: u32, slot: Option<usize>, start: u64, end: u64) {
        let Some(r) = self.dev(index) else { return };
        let now = now_ns();
        timeline::record(&r.ring, start, end, now);
        if let Some(s) = slot.filter(|&s| s < MAX_PROCS && (index as usize) < MAX_DEVICES) {
            let bit = 1u32 << index;
            if self.slot(s).rings_used.load(Ordering::Relaxed) & bit == 0 {
                self.slot(s).rings_used.fetch_or(bit, Ordering::Relaxed);
            }
            timeline::record(&self.rings(s)[index as usize], start, end, now);
        }
    }

    /// Charges `bytes` of physical memory to the device and the process slot; on a full
    /// device, reaps dead processes once and retries before reporting out-of-memory.
    pub fn try_charge(&self, index: u32, slot: usize, bytes: u64) -> bool {
        let Some(r) = self.dev(index) else {
            return false;
        };
        if bytes > r.total_memory {
            return false;
        }
        let counter = self.charge_counter(r, index, slot);
        for attempt in 0..2 {
            // Add to the process's own count first, then check the device's sum (both
            // SeqCst): of two racing charges the later check sees both, and a process killed
            // between the add and the take-back leaves only its own slot high, which its
            // reaping drops whole.
            counter.fetch_add(bytes, Ordering::SeqCst);
            r.changes.fetch_add(1, Ordering::SeqCst);
            let before = r.changes.load(Ordering::SeqCst);
            let held = self.device_used(index);
            if held <= r.total_memory {
                if r.changes.load(Ordering::SeqCst) == before {
                    // Nothing moved while we summed: `held` is one instant's use.
                    r.peak_used.fetch_max(held, Ordering::AcqRel);
                } else {
                    self.record_peak(r, index);
                }
                return true;
            }
            sub_saturating(counter, bytes);
            r.changes.fetch_add(1, Ordering::SeqCst);
            if attempt == 0 && self.reap_dead_processes() == 0 {
                return false;
            }
        }
        false
    }

    /// The counter a charge of `slot` lands on (slot-less charges: the device's own).
    fn charge_counter<'a>(&'a self, r: &'a DeviceRecord, index: u32, slot: usize) -> &'a AtomicU64 {
        if slot < MAX_PROCS {
            &self.slot(slot).used[index as usize]
        } else {
            &r.used
        }
    }

    /// Returns physical memory charged with `try_charge`.
    #[inline]
    pub fn uncharge(&self, index: u32, slot: usize, bytes: u64) {
        let Some(r) = self.dev(index) else { return };
        sub_saturating(self.charge_counter(r, index, slot), bytes);
        r.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Raises the device's high-water mark to what it holds now, read as one instant.
    ///
    /// The sum of the slots is read one slot after the other; a reader descheduled halfway
    /// (a loaded machine) can count one process's bytes from before it freed them and
    /// another's from after it charged them in their place: more than the card ever held at
    /// once. With a shim admitting the second charge only after the first free, such a
    /// phantom would read as a cap violation that never happened. Every change is counted
    /// right after it is made, so a sum during which the count stayed still saw no change
    /// that a later one waited for: it is the use of one instant. After
    /// [`PEAK_SUM_ATTEMPTS`] moving sums (a storm of changes), the smallest is kept: the
    /// best bound the reads gave.
    fn record_peak(&self, r: &DeviceRecord, index: u32) {
        let mut smallest = u64::MAX;
        for attempt in 0..PEAK_SUM_ATTEMPTS {
            let before = r.changes.load(Ordering::SeqCst);
            let held = self.device_used(index);
            if r.changes.load(Ordering::SeqCst) == before {
                r.peak_used.fetch_max(held, Ordering::AcqRel);
                return;
            }
            smallest = smallest.min(held);
            if attempt >= 8 {
                std::thread::yield_now();
            }
        }
        r.peak_used.fetch_max(smallest, Ordering::AcqRel);
    }

    /// Counts a context of the slot's process on a device (for process listings).
    pub fn add_context(&self, index: u32, slot: usize, delta: i32) {
        if (index as usize) < MAX_DEVICES && slot < MAX_PROCS {
            let c = &self.slot(slot).contexts[index as usize];
            if delta >= 0 {
                c.fetch_add(delta as u32, Ordering::AcqRel);
            } else {
                let _ = c.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(delta.unsigned_abs()))
                });
            }
        }
    }

    /// Physical bytes charged to a process slot on a device.
    pub fn slot_used(&self, index: u32, slot: usize) -> u64 {
        if (index as usize) < MAX_DEVICES && slot < MAX_PROCS {
            self.slot(slot).used[index as usize].load(Ordering::Acquire)
        } else {
            0
        }
    }

    #[inline]
    fn slot(&self, i: usize) -> &ProcSlot {
        &self.layout().slots[i]
    }

    #[inline]
    fn rings(&self, i: usize) -> &SlotRings {
        &self.layout().rings[i]
    }

    /// The slots ever claimed (`0..slot_high`): every loop over the slots stops there.
    #[inline]
    fn claimed_slots(&self) -> std::ops::Range<usize> {
        0..(self.layout().header.slot_high.load(Ordering::Acquire) as usize).min(MAX_PROCS)
    }

    /// This process's slot, if registered (and not inherited across fork).
    #[inline]
    pub fn my_slot(&self) -> Option<usize> {
        // The pid first: registration publishes the slot before the pid, so seeing this
        // process's pid guarantees seeing its slot (not a forked parent's).
        let p = self.my_pid.load(Ordering::Acquire);
        let s = self.my_slot.load(Ordering::Acquire);
        (s != usize::MAX && p == current_pid()).then_some(s)
    }

    /// Registers the calling process (once per process; again in a forked child).
    pub fn register_current_process(&self) -> Result<usize, StateError> {
        if let Some(s) = self.my_slot() {
            return Ok(s);
        }
        if !self.writable {
            return Err(StateError::ReadOnly);
        }
        let _g = self.reg.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.my_slot() {
            return Ok(s);
        }
        let pid = current_pid();
        // Asked before the registration lock: the broker may be slow, the lock is everybody's.
        let host_pid = crate::host_pid::of_current(pid, self.layout().header.pid_ns, &self.path)
            .map_err(StateError::Config)?;
        // A forked child may still carry the parent's slot descriptor in this instance.
        self.close_lock_fd();
        let _lock = FileLock::acquire(self.fd, libc::F_WRLCK, REG_LOCK)
            .map_err(|e| StateError::Io(format!("lock: {e}")))?;
        self.reap_slots(self.claimed_slots());
        // Re-opening through /proc gives a new open file description (its own lock owner)
        // of the very file we mapped, even if the path was since unlinked or replaced.
        let cpath = CString::new(format!("/proc/self/fd/{}", self.fd)).expect("no NUL");
        for i in 0..MAX_PROCS {
            let s = self.slot(i);
            if s.state.load(Ordering::Acquire) != SLOT_FREE {
                continue;
            }
            // SAFETY: cpath is a valid C string.
            let lfd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if lfd < 0 {
                return Err(io_err("open", &self.path));
            }
            if ofd_lock(
                lfd,
                libc::F_OFD_SETLK,
                libc::F_WRLCK,
                SLOT_LOCK_BASE + i as i64,
            )
            .is_err()
            {
                // Held by a process that still lives (e.g. a stale instance): not free.
                // SAFETY: lfd was opened above.
                unsafe { libc::close(lfd) };
                continue;
            }
            let dirty = s.rings_used.swap(0, Ordering::Relaxed);
            for d in 0..MAX_DEVICES {
                s.used[d].store(0, Ordering::Relaxed);
                s.contexts[d].store(0, Ordering::Relaxed);
                // A previous holder's history must not be attributed to this process.
                if dirty & (1 << d) != 0 {
                    for b in self.rings(i)[d].iter() {
                        if b.load(Ordering::Relaxed) != 0 {
                            b.store(0, Ordering::Relaxed);
                        }
                    }
                }
            }
            s.dead_since.store(0, Ordering::Relaxed);
            s.pid.store(host_pid, Ordering::Relaxed);
            s.start_time
                .store(process_start_time(pid).unwrap_or(0), Ordering::Relaxed);
            // Before the slot is live: every sum of the slots includes it.
            self.layout()
                .header
                .slot_high
                .fetch_max(i as u32 + 1, Ordering::SeqCst);
            s.state.store(SLOT_LIVE, Ordering::Release);
            let listed = LOCK_FDS.iter().any(|e| {
                e.compare_exchange(-1, lfd, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            });
            self.lock_listed.store(listed, Ordering::Release);
            self.lock_pid.store(pid, Ordering::Release);
            self.lock_fd.store(lfd, Ordering::Release);
            self.my_slot.store(i, Ordering::Release);
            self.my_pid.store(pid, Ordering::Release);
            return Ok(i);
        }
        Err(StateError::NoFreeSlot)
    }

    fn close_lock_fd(&self) {
        let fd = self.lock_fd.swap(-1, Ordering::AcqRel);
        if fd < 0 {
            return;
        }
        let listed = self.lock_listed.load(Ordering::Acquire);
        if self.lock_pid.load(Ordering::Acquire) == current_pid() {
            if listed {
                for e in &LOCK_FDS {
                    let _ = e.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
                }
            }
        } else if listed {
            // A fork child: `after_fork_child` closed it already and the number may have been
            // reused since.
            return;
        }
        // SAFETY: fd is this instance's slot-lock descriptor, still open in this process.
        unsafe { libc::close(fd) };
    }

    /// Whether the process owning live slot `i` still exists.
    fn slot_alive(&self, i: usize) -> bool {
        match ofd_lock(
            self.fd,
            libc::F_OFD_GETLK,
            libc::F_WRLCK,
            SLOT_LOCK_BASE + i as i64,
        ) {
            Ok(fl) => fl.l_type != libc::F_UNLCK as i16,
            Err(_) => {
                // No OFD locks: fall back to pid + start time (right only in the card's PID
                // namespace, where the slot's PID is the /proc one; kernels before 3.15).
                let s = self.slot(i);
                let pid = s.pid.load(Ordering::Relaxed);
                let start = s.start_time.load(Ordering::Relaxed);
                process_start_time(pid).is_some_and(|t| start == 0 || t == start)
            }
        }
    }

    /// Releases the slots (and thus the device memory) of processes that have exited, as the
    /// driver does on process exit, once the release delay has passed since each was first
    /// seen dead. Returns how many were reaped.
    pub fn reap_dead_processes(&self) -> usize {
        if !self.writable {
            return 0;
        }
        // Cheap pre-check without the lock: most calls find everybody alive. It also stamps
        // when a dead process was first seen, which starts its release delay. Every dead slot
        // of the slots looked at is seen (no short-circuit), so each gets its stamp at its first look.
        let now = now_ns();
        let lag = self.liveness_lag_ns.load(Ordering::Relaxed);
        let header = &self.layout().header;
        let high = self.claimed_slots().end;
        let (start, len) = if lag > 0 {
            // One driver of the machine looks per lag, at the next window of slots; the
            // others take its word.
            let last = header.liveness_pass_ns.load(Ordering::Acquire);
            if now.saturating_sub(last) < lag
                || header
                    .liveness_pass_ns
                    .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                return 0;
            }
            let cursor = header
                .liveness_cursor
                .fetch_add(LIVENESS_WINDOW as u64, Ordering::Relaxed);
            (
                (cursor % high.max(1) as u64) as usize,
                LIVENESS_WINDOW.min(high),
            )
        } else {
            (0, high)
        };
        let dead: Vec<usize> = (start..start + len)
            .map(|at| if at < high { at } else { at - high })
            .filter(|&i| {
                self.slot(i).state.load(Ordering::Acquire) == SLOT_LIVE
                    && !self.slot_alive(i)
                    && self.release_due(i, now)
            })
            .collect();
        if dead.is_empty() {
            return 0;
        }
        self.reap_slots(dead.into_iter())
    }

    /// Frees the slots of dead processes whose release is due. Takes no lock (a real driver's
    /// teardown waits for no process, and a reaper stopped by SIGSTOP must not stall the
    /// card): each slot is taken by one compare-and-swap from live to reaping, so two reapers
    /// never free it twice; registration only claims free slots.
    fn reap_slots(&self, slots: impl Iterator<Item = usize>) -> usize {
        let mut reaped = 0;
        let now = now_ns();
        for i in slots {
            let s = self.slot(i);
            if s.state.load(Ordering::Acquire) != SLOT_LIVE
                || self.slot_alive(i)
                || !self.release_due(i, now)
                || s.state
                    .compare_exchange(SLOT_LIVE, SLOT_REAPING, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            // Its bytes left the devices' sums with the swap to reaping.
            for r in &self.layout().devices[..self.device_count() as usize] {
                r.changes.fetch_add(1, Ordering::SeqCst);
            }
            for d in 0..MAX_DEVICES {
                s.used[d].store(0, Ordering::SeqCst);
                s.contexts[d].store(0, Ordering::Relaxed);
            }
            s.dead_since.store(0, Ordering::Relaxed);
            s.state.store(SLOT_FREE, Ordering::Release);
            reaped += 1;
        }
        reaped
    }
}

fn sub_saturating(a: &AtomicU64, v: u64) {
    let _ = a.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |x| {
        Some(x.saturating_sub(v))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "fakegpu-state-test-{}-{name}-{}",
            std::process::id(),
            now_ns()
        ));
        let _ = std::fs::remove_file(&p);
        p
    }

    fn small() -> Vec<DeviceSpec> {
        let mut d = spec::preset("v100", 0).unwrap();
        d.total_memory = 64 << 20;
        vec![d, spec::preset("h200", 1).unwrap()]
    }

    #[test]
    fn creates_and_reopens() {
        let p = tmp("create");
        let a = open_state_with(&p, &small()).unwrap();
        assert_eq!(a.device_count(), 2);
        assert_eq!(a.device(0).unwrap().total_memory, 64 << 20);
        assert_eq!(a.device(1).unwrap().name, "NVIDIA H200");
        assert!(a.device(2).is_none());
        // A second opener keeps the creator's devices whatever it would have created.
        let b = open_state_with(&p, &[spec::preset("v100", 0).unwrap()]).unwrap();
        assert_eq!(b.device_count(), 2);
        assert_eq!(b.device(0).unwrap(), a.device(0).unwrap());
        drop((a, b));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn rejects_wrong_sized_files() {
        let p = tmp("short");
        std::fs::write(&p, b"not a state file").unwrap();
        assert!(matches!(
            open_state_with(&p, &small()),
            Err(StateError::Incompatible(_))
        ));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn charges_are_shared_and_dead_instances_are_reaped() {
        let p = tmp("charge");
        let a = open_state_with(&p, &small()).unwrap();
        let b = open_state_with(&p, &small()).unwrap();
        let sa = a.register_current_process().unwrap();
        assert!(a.try_charge(0, sa, 48 << 20));
        assert_eq!(b.used_memory(0), 48 << 20);
        // b plays a second process: same pid, but its own slot through its own instance.
        let sb = b.register_current_process().unwrap();
        assert_ne!(sa, sb);
        assert!(!b.try_charge(0, sb, 32 << 20), "over the 64 MiB card");
        assert!(b.try_charge(0, sb, 16 << 20));
        assert_eq!(a.used_memory(0), 64 << 20);
        assert_eq!(a.processes(0).len(), 2);
        // "Process" a dies: its lock goes with its descriptor; b's next OOM reaps it.
        drop(a);
        assert!(b.try_charge(0, sb, 32 << 20));
        assert_eq!(b.used_memory(0), 48 << 20);
        assert_eq!(b.processes(0).len(), 1);
        b.uncharge(0, sb, 48 << 20);
        assert_eq!(b.used_memory(0), 0);
        drop(b);
        std::fs::remove_file(&p).unwrap();
    }

    /// Waits (polling, up to 20 s) for `cond`; the delay tests await a release, never time it.
    fn await_true(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = now_ns() + 20_000_000_000;
        while !cond() {
            assert!(now_ns() < deadline, "timed out waiting for {what}");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    #[test]
    fn a_dead_process_keeps_its_memory_until_the_release_delay_has_passed() {
        let p = tmp("delay");
        let a = open_state_with(&p, &small()).unwrap();
        let b = open_state_with(&p, &small()).unwrap();
        assert_eq!(b.release_delay_ms(), 0, "default: at once");
        // Long enough that nothing below races it; shortened once the holding is checked.
        b.set_release_delay_ms(3_600_000);
        assert_eq!(a.release_delay_ms(), 3_600_000, "one delay for the machine");
        let sa = a.register_current_process().unwrap();
        let sb = b.register_current_process().unwrap();
        assert!(a.try_charge(0, sa, 48 << 20));
        assert!(b.try_charge(0, sb, 8 << 20));
        b.reset_peak_memory(0);
        drop(a); // "process" a dies
                 // Not released: the card still holds it, the process lists still show it...
        assert_eq!(b.used_memory(0), 56 << 20);
        let procs = b.processes(0);
        assert_eq!(procs.len(), 2);
        assert!(procs.iter().any(|p| p.used_memory == 48 << 20));
        // ...and the card cannot be overcommitted: the next 16 MiB do not fit (64 MiB card).
        assert!(
            !b.try_charge(0, sb, 16 << 20),
            "OOM while a's memory is held"
        );
        assert!(b.try_charge(0, sb, 8 << 20), "what is really free still is");
        assert_eq!(b.peak_memory(0), 64 << 20);
        // The first look stamped the death in the state: every reader sees the same stamp.
        let c = open_state_with(&p, &small()).unwrap();
        let since = c.slot(sa).dead_since.load(Ordering::Acquire);
        assert!(since != 0 && since <= now_ns());
        assert_eq!(b.slot(sa).dead_since.load(Ordering::Acquire), since);
        assert_eq!(c.used_memory(0), 64 << 20, "a third reader agrees");
        // A shorter delay counts from that same stamp; the memory comes back only after it.
        c.set_release_delay_ms(50);
        await_true("a's memory to be released", || b.used_memory(0) == 16 << 20);
        assert!(
            now_ns() - since >= 50_000_000,
            "released before the delay passed"
        );
        assert_eq!(b.processes(0).len(), 1);
        assert_eq!(c.used_memory(0), 16 << 20);
        assert_eq!(b.peak_memory(0), 64 << 20, "never more than the card");
        drop((b, c));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn drivers_look_for_the_dead_once_per_liveness_lag_and_an_observer_at_every_look() {
        let p = tmp("liveness-lag");
        let a = open_state_with(&p, &small()).unwrap();
        let driver = open_state_with(&p, &small()).unwrap();
        let observer = open_state_with(&p, &small()).unwrap();
        // An hour: the drivers' last pass is younger than that, nothing below races it.
        driver
            .liveness_lag_ns
            .store(3_600_000_000_000, Ordering::Relaxed);
        driver
            .layout()
            .header
            .liveness_pass_ns
            .store(now_ns(), Ordering::Relaxed);
        let sa = a.register_current_process().unwrap();
        assert!(a.try_charge(0, sa, 48 << 20));
        assert_eq!(driver.used_memory(0), 48 << 20);
        drop(a); // "process" a dies
                 // Within the lag no driver looks again: a is still listed and holding...
        assert_eq!(driver.used_memory(0), 48 << 20);
        assert_eq!(driver.processes(0).len(), 1);
        // ...while an observer (no lag) looks at once, and reaps for everybody.
        assert_eq!(observer.used_memory(0), 0);
        assert_eq!(driver.used_memory(0), 0);
        assert!(driver.processes(0).is_empty());
        // With a short lag a driver finds a death by itself once the lag has passed.
        driver.liveness_lag_ns.store(1_000_000, Ordering::Relaxed);
        let b = open_state_with(&p, &small()).unwrap();
        let sb = b.register_current_process().unwrap();
        assert!(b.try_charge(0, sb, 8 << 20));
        assert_eq!(driver.used_memory(0), 8 << 20);
        drop(b);
        await_true("the driver to find b's death", || {
            driver.used_memory(0) == 0
        });
        drop((driver, observer));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn drivers_passes_one_after_another_walk_every_slot() {
        let p = tmp("liveness-window");
        let driver = open_state_with(&p, &small()).unwrap();
        // 1 ns: every call is a pass of its own, over the next window.
        driver.liveness_lag_ns.store(1, Ordering::Relaxed);
        let mut crowd: Vec<SharedState> = (0..2 * LIVENESS_WINDOW + 1)
            .map(|_| {
                let s = open_state_with(&p, &small()).unwrap();
                s.register_current_process().unwrap();
                s
            })
            .collect();
        let high = driver.claimed_slots().end;
        assert!(high > 2 * LIVENESS_WINDOW, "{high} slots in use");
        let dead = crowd.pop().unwrap();
        let slot = dead.my_slot().unwrap();
        assert!(dead.try_charge(0, slot, 2 << 20));
        drop(dead);
        // Three windows cover the slots in use, wherever the cursor stood.
        let passes = (1..=4)
            .find(|_| {
                driver.reap_dead_processes();
                driver.device_used(0) == 0
            })
            .expect("four passes of 64 found no death among 129 slots");
        assert!(passes <= 3, "{passes} passes");
        drop((driver, crowd));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn memory_leaves_the_card_when_it_leaves_the_process_list_even_if_the_reaper_stalls() {
        // A reaper preempted or SIGSTOPped after taking a dead slot (live -> reaping) but
        // before zeroing its counters: the process is no longer listed, so its memory must
        // not be counted either, or a shim that trusts the list would seem to pass its cap.
        let p = tmp("stalled-reaper");
        let a = open_state_with(&p, &small()).unwrap();
        let b = open_state_with(&p, &small()).unwrap();
        let sa = a.register_current_process().unwrap();
        let sb = b.register_current_process().unwrap();
        assert!(a.try_charge(0, sa, 48 << 20));
        b.reset_peak_memory(0);
        // The stalled reaper's step: taken, counters not yet zeroed.
        b.slot(sa).state.store(SLOT_REAPING, Ordering::SeqCst);
        assert_eq!(
            b.slot_used(0, sa),
            48 << 20,
            "counters still hold the bytes"
        );
        assert!(b.processes(0).iter().all(|p| p.used_memory != 48 << 20));
        assert_eq!(b.used_memory(0), 0, "unlisted means released");
        assert!(b.try_charge(0, sb, 64 << 20), "the whole card is free");
        assert_eq!(b.peak_memory(0), 64 << 20, "the stalled slot never counted");
        drop((a, b));
        std::fs::remove_file(&p).unwrap();
    }

    /// What happens "elsewhere" while this thread's sum of the slots reaches a slot: the
    /// other processes' moves during a descheduled reader, made deterministic. Returns true
    /// once it has done its part (then it is removed).
    type SumHook = Box<dyn FnMut(usize) -> bool>;

    thread_local! {
        static WHILE_SUMMING: std::cell::RefCell<Option<SumHook>> =
            const { std::cell::RefCell::new(None) };
    }

    pub(super) fn while_summing(slot: usize) {
        // Taken out while it runs: the sums it makes itself do not call it again.
        let Some(mut hook) = WHILE_SUMMING.with(|h| h.borrow_mut().take()) else {
            return;
        };
        if !hook(slot) {
            WHILE_SUMMING.with(|h| *h.borrow_mut() = Some(hook));
        }
    }

    #[test]
    fn the_high_water_mark_never_counts_memory_handed_over_during_its_sum() {
        // A shim's budget of two chunks among four processes: A charges one while B holds
        // the other, which then moves B -> C -> D, each charge made only after the previous
        // holder freed (a shim gives the budget on after the driver's free). The card never holds more than two chunks.
        // The sums of A's charge are read slot by slot; each handover happens while one of
        // them is halfway (A descheduled, as on a loaded machine), between the freeing and
        // the charging process's slots, so that sum counts the moving chunk twice. Neither
        // the charge's own sum nor the first one taken for the mark may set the mark.
        const CHUNK: u64 = 1 << 20;
        let p = tmp("handoff");
        // Leaked: the hook that plays B, C and D must be 'static.
        let [a, b, c, d]: [&'static SharedState; 4] =
            [(); 4].map(|_| &*Box::leak(Box::new(open_state_with(&p, &small()).unwrap())));
        let [sa, sb, sc, sd] = [a, b, c, d].map(|s| s.register_current_process().unwrap());
        assert!(sb < sc && sc < sd, "slots are taken in order");
        assert!(b.try_charge(0, sb, CHUNK));
        a.reset_peak_memory(0);
        let mut sums = 0;
        WHILE_SUMMING.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move |slot| {
                if slot == 0 {
                    sums += 1;
                }
                let (from, to) = match (sums, slot) {
                    (1, s) if s == sb + 1 => ((b, sb), (c, sc)),
                    (2, s) if s == sc + 1 => ((c, sc), (d, sd)),
                    _ => return false,
                };
                from.0.uncharge(0, from.1, CHUNK);
                assert!(to.0.try_charge(0, to.1, CHUNK));
                sums == 2
            }))
        });
        assert!(a.try_charge(0, sa, CHUNK));
        assert!(
            WHILE_SUMMING.with(|hook| hook.borrow().is_none()),
            "both handovers happened during A's sums"
        );
        assert_eq!(a.slot_used(0, sd), CHUNK);
        assert_eq!(a.used_memory(0), 2 * CHUNK);
        assert_eq!(
            a.peak_memory(0),
            2 * CHUNK,
            "the card never held more than two chunks"
        );
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_full_card_stays_full_until_a_dead_process_is_released() {
        // try_charge itself reaps on OOM: with a delay the dead process's bytes still count.
        let p = tmp("delay-oom");
        let a = open_state_with(&p, &small()).unwrap();
        let b = open_state_with(&p, &small()).unwrap();
        b.set_release_delay_ms(3_600_000);
        let sa = a.register_current_process().unwrap();
        let sb = b.register_current_process().unwrap();
        assert!(a.try_charge(0, sa, 64 << 20));
        drop(a);
        assert!(!b.try_charge(0, sb, 2 << 20));
        assert_eq!(b.used_memory_raw(0), 64 << 20);
        assert_eq!(b.slot_used(0, sb), 0);
        b.set_release_delay_ms(0);
        assert!(
            b.try_charge(0, sb, 2 << 20),
            "released at once without a delay"
        );
        assert_eq!(b.used_memory(0), 2 << 20);
        drop(b);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn the_whole_number_settings_are_checked() {
        let delay = |text| RELEASE_DELAY_SETTING.parse(text);
        assert_eq!(delay("0"), Ok(0));
        assert_eq!(delay(" 1500 "), Ok(1500));
        assert_eq!(delay("3600000"), Ok(MAX_RELEASE_DELAY_MS));
        let lag = |text| LIVENESS_LAG_SETTING.parse(text);
        assert_eq!(lag("0"), Ok(0));
        assert_eq!(lag("1000000"), Ok(MAX_LIVENESS_LAG_US));
        for bad in ["", "-1", "1.5", "1s", "99999999999999999999"] {
            for setting in [&RELEASE_DELAY_SETTING, &LIVENESS_LAG_SETTING] {
                assert!(
                    matches!(setting.parse(bad), Err(StateError::Config(_))),
                    "{} {bad:?} accepted",
                    setting.name
                );
            }
        }
        for (setting, over) in [
            (&RELEASE_DELAY_SETTING, "3600001"),
            (&LIVENESS_LAG_SETTING, "1000001"),
        ] {
            let Err(StateError::Config(message)) = setting.parse(over) else {
                panic!("{} {over} accepted", setting.name);
            };
            assert!(
                message.contains(setting.name) && message.contains("more than"),
                "{message}"
            );
        }
    }

    #[test]
    fn the_high_water_mark_keeps_the_largest_use_until_reset() {
        let p = tmp("peak");
        let a = open_state_with(&p, &small()).unwrap();
        let b = open_state_with(&p, &small()).unwrap();
        let s = a.register_current_process().unwrap();
        assert_eq!(b.peak_memory(0), 0);
        assert!(a.try_charge(0, s, 40 << 20));
        a.uncharge(0, s, 30 << 20);
        assert!(a.try_charge(0, s, 4 << 20));
        // Other processes see it; a refused charge leaves it alone.
        assert_eq!(b.peak_memory(0), 40 << 20);
        assert!(!a.try_charge(0, s, 60 << 20));
        assert_eq!(b.peak_memory(0), 40 << 20);
        assert_eq!(b.peak_memory(1), 0, "per device");
        assert_eq!(b.reset_peak_memory(0), 40 << 20);
        assert_eq!(b.peak_memory(0), 14 << 20, "restarts from what is held now");
        drop((a, b));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn read_only_opener_sees_state() {
        let p = tmp("ro");
        let a = open_state_with(&p, &small()).unwrap();
        let s = a.register_current_process().unwrap();
        assert!(a.try_charge(1, s, 1 << 30));
        let mut perm = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o444);
        std::fs::set_permissions(&p, perm).unwrap();
        let ro = open_state_with(&p, &[]).unwrap();
        // root may still open a 0444 file for writing; either way the reads must work.
        assert_eq!(ro.used_memory(1), 1 << 30);
        assert_eq!(ro.processes(1).len(), 1);
        assert_eq!(ro.processes(1)[0].pid, std::process::id());
        drop((a, ro));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn timeline_serialises_and_reports_utilisation() {
        let p = tmp("timeline");
        let a = open_state_with(&p, &small()).unwrap();
        let s = a.register_current_process().unwrap();
        let t0 = now_ns();
        let (s1, e1) = a.enqueue_busy(0, 2_000_000);
        let (s2, e2) = a.enqueue_busy(0, 3_000_000);
        assert!(s1 >= t0 && e1 == s1 + 2_000_000);
        assert_eq!(s2, e1, "kernels run one after another");
        assert_eq!(e2, s2 + 3_000_000);
        a.record_busy(0, Some(s), s1, e1);
        a.record_busy(0, Some(s), s2, e2);
        assert_eq!(a.busy_until(0), e2);
        // Bucket-aligned windows are exact; edges of unaligned ones count pro rata.
        let b = timeline::BUCKET_NS;
        let (from, to) = (s1 / b * b, e2.div_ceil(b) * b);
        assert_eq!(a.busy_ns(0, None, from, to), 5_000_000);
        assert_eq!(a.busy_ns(0, Some(std::process::id()), from, to), 5_000_000);
        assert!(a.busy_ns(0, None, s1, e2).abs_diff(5_000_000) <= 2 * b);
        assert_eq!(a.busy_ns(0, Some(u32::MAX), from, to), 0);
        assert_eq!(a.busy_ns(1, None, from, to), 0);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn start_time_is_read() {
        assert!(process_start_time(std::process::id()).is_some());
        assert!(process_start_time(u32::MAX).is_none());
    }
}
