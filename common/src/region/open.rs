//! Opening, creating, validating and resetting a region file, and the marks that keep a
//! deleted, replaced or emptied file from starting a second ledger next to the live one.
//!
//! Everything here goes through the region's directory: the file is opened with `openat` +
//! `O_NOFOLLOW` (a symbolic link at the region's name is refused, never followed), created
//! unnamed and linked in only once initialised (`linkat` never replaces what is there), and
//! reset by renaming a fresh file over the name (the name is replaced, never written through).
//!
//! **Marks.** Every process that maps a region holds two write locks, each on a byte of its
//! own in [`MARKS`]: one on the region file it mapped ("a process maps THIS file") and one on
//! the region's guard file, `.NAME.guard` beside it ("a process maps a region of this name"),
//! the file's first, so whoever sees the name mark also sees the file mark. Probes look for
//! write locks only ([`lock::write_locked_in`]). A write lock needs the file open for writing,
//! so only those who can write the region (the slice's own processes, as the directory's
//! permissions decide) can mark it; a reader (the node agent, `gpuslice status`, anyone with a
//! read-only view of the directory) can hold every read lock there is and changes no verdict.
//! The guard file is created beside the region where the directory allows it; where it
//! cannot be created or opened for writing, a replaced file is not detected (an emptied one
//! still is: that mark is on the region file itself).

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::layout::{
    magic_word, HEADER_SIZE, INIT_EMPTY, INIT_LOCK_OFFSET, INIT_READY, LAYOUT_VERSION, LIMIT_UNSET,
    MARKS, PERCENT_UNSET, REGION_SIZE,
};
use super::lock::{self, OwnedFd};
use super::{
    slots, HeldSlot, Liveness, Mapping, Region, RegionError, DEVICE_ENTRY_SIZE, MAX_DEVICES,
    MAX_PROCESSES, SLOT_SIZE,
};

/// How long an opener waits for another process to finish initialising an EMPTY file that
/// somebody other than gpuslice created (the only wait in the region; gpuslice itself never
/// exposes an uninitialised file).
pub const INIT_WAIT: Duration = Duration::from_secs(2);

/// A region path split into its directory and the file's name in it.
struct Place {
    dir: PathBuf,
    name: CString,
}

fn place(path: &Path) -> Result<Place, RegionError> {
    let invalid = |why: &str| {
        RegionError::io(
            path,
            "open",
            io::Error::new(io::ErrorKind::InvalidInput, why.to_string()),
        )
    };
    let name = path
        .file_name()
        .ok_or_else(|| invalid("the path names no file"))?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = lock::c_path(Path::new(name)).map_err(|e| RegionError::io(path, "open", e))?;
    Ok(Place { dir, name })
}

/// The region's directory, opened only as a path to open files relative to (no permission
/// on the directory itself is needed for that).
fn open_dir(path: &Path, place: &Place) -> Result<OwnedFd, RegionError> {
    lock::open(&place.dir, libc::O_PATH | libc::O_DIRECTORY)
        .map_err(|e| RegionError::io(path, "open the directory of", e))
}

/// The name of the guard file of the region named `name`: hidden, beside it.
fn guard_name(name: &CString) -> CString {
    let mut bytes = b".".to_vec();
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(b".guard");
    CString::new(bytes).expect("a CString's bytes and ASCII have no NUL")
}

/// The region's guard file, opened for writing (created, mode 0666, when missing and the
/// directory allows it); `None` when it cannot be (then no name mark can be held or seen).
fn open_guard(dir: &OwnedFd, name: &CString) -> Option<OwnedFd> {
    let fd = lock::open_or_create_at(dir, &guard_name(name), lock::REGION_FILE_MODE).ok()?;
    lock::fstat(&fd).ok()?.regular.then_some(fd)
}

/// The guard file for probing only (read access is enough); `None` when there is none.
fn open_guard_to_probe(dir: &OwnedFd, name: &CString) -> Option<OwnedFd> {
    let fd = lock::open_at_nofollow(dir, &guard_name(name), libc::O_RDONLY).ok()?;
    lock::fstat(&fd).ok()?.regular.then_some(fd)
}

/// Whether a description other than `fd`'s holds a mark (a write lock in [`MARKS`]).
fn marked_by_other(fd: &OwnedFd) -> io::Result<bool> {
    lock::write_locked_in(fd, MARKS.0, MARKS.1)
}

/// Takes this process's mark on `fd`'s file: a write lock on a byte of [`MARKS`] nobody
/// else holds, picked at random (two marks on one byte would make one of them fail).
fn hold_mark(fd: &OwnedFd) -> io::Result<()> {
    for attempt in 0u64..64 {
        let offset = MARKS.0 + random_u64(attempt) % MARKS.1;
        if lock::try_lock(fd, offset)? {
            return Ok(());
        }
    }
    Err(io::Error::other("no free mark byte"))
}

/// A random number from the kernel; where it cannot give one, one mixed from the clock, the
/// PID and `salt` (marks only need to differ between live processes).
fn random_u64(salt: u64) -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is 8 writable bytes; GRND_NONBLOCK never waits.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), 8, libc::GRND_NONBLOCK) };
    if got == 8 {
        return u64::from_le_bytes(bytes);
    }
    let mut mix = Fnv::new();
    mix.write(&super::monotonic_ns().to_le_bytes());
    mix.write(&std::process::id().to_le_bytes());
    mix.write(&salt.to_le_bytes());
    mix.finish()
}

fn open_error(path: &Path, error: io::Error) -> RegionError {
    match error.raw_os_error() {
        Some(libc::ELOOP) => RegionError::Symlink {
            path: path.to_path_buf(),
        },
        _ => RegionError::io(path, "open", error),
    }
}

/// Opens the region file read-only without following a link at its name (the CLI's view).
pub(super) fn open_file_readonly(path: &Path) -> Result<OwnedFd, RegionError> {
    let place = place(path)?;
    let dir = open_dir(path, &place)?;
    let fd = lock::open_at_nofollow(&dir, &place.name, libc::O_RDONLY)
        .map_err(|e| open_error(path, e))?;
    if !lock::fstat(&fd)
        .map_err(|e| RegionError::io(path, "stat", e))?
        .regular
    {
        return Err(RegionError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    Ok(fd)
}

pub(super) fn open_or_create(path: &Path) -> Result<Region, RegionError> {
    let place = place(path)?;
    let dir = open_dir(path, &place)?;
    let mut file = None;
    // Each round either opens the file or creates it; losing a creation race to another
    // process means the file now exists, so a few rounds always settle.
    for _ in 0..8 {
        match lock::open_at_nofollow(&dir, &place.name, libc::O_RDWR) {
            Ok(fd) => {
                file = Some(fd);
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                if let Some(fd) = create(path, &dir, &place.name)? {
                    file = Some(fd);
                    break;
                }
            }
            Err(e) => return Err(open_error(path, e)),
        }
    }
    let file = file.ok_or_else(|| {
        RegionError::io(
            path,
            "open",
            io::Error::other("the file kept appearing and disappearing"),
        )
    })?;
    let facts = lock::fstat(&file).map_err(|e| RegionError::io(path, "stat", e))?;
    if !facts.regular {
        return Err(RegionError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if facts.size == 0 {
        refuse_if_emptied_under_others(path, &file)?;
        initialise_in_place(path, &file)?;
    }
    let map = Mapping::map(path, &file, true)?;
    match validate(&map, path) {
        Ok(()) => {}
        Err(RegionError::NotInitialised { .. }) if may_initialise(&map) => {
            refuse_if_emptied_under_others(path, &file)?;
            initialise_in_place(path, &file)?;
            validate(&map, path)?;
        }
        Err(e) => return Err(e),
    }
    let guard = take_marks(path, &dir, &place.name, &file)?;
    Ok(Region {
        map,
        path: path.to_path_buf(),
        file,
        dir,
        name: place.name,
        _guard: guard,
        held: (0..MAX_PROCESSES).map(|_| HeldSlot::none()).collect(),
        turns: (0..MAX_DEVICES).map(|_| HeldSlot::none()).collect(),
        members: super::deaths::MemberCache::new(),
    })
}

/// Creates the region file fully initialised and only then gives it its name. `None` when
/// another process named one first (open that one).
fn create(path: &Path, dir: &OwnedFd, name: &CString) -> Result<Option<OwnedFd>, RegionError> {
    let hint = name.to_string_lossy().into_owned();
    let (fd, temp) =
        lock::create_unnamed(dir, &hint).map_err(|e| RegionError::io(path, "create", e))?;
    let made =
        fill_fresh(path, &fd).and_then(|()| match lock::link_into(&fd, temp.as_ref(), dir, name) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
            Err(e) => Err(RegionError::io(path, "create", e)),
        });
    if let Some(temp) = &temp {
        lock::unlink_at(dir, temp);
    }
    // The guard file beside it, while whoever creates the region can: processes that may
    // not write the directory can still open it.
    drop(open_guard(dir, name));
    Ok(made?.then_some(fd))
}

/// An empty or blank file may be initialised in place only while no process maps it: one
/// that does had it initialised (every opener marks the file only after initialising), so
/// the file was truncated or zeroed under it, and a fresh header would start a second ledger
/// in the same file next to the live processes' one (they go on with their own counts).
/// `Emptied` then; a file another opener finished initialising meanwhile is fine.
fn refuse_if_emptied_under_others(path: &Path, file: &OwnedFd) -> Result<(), RegionError> {
    if marked_by_other(file).unwrap_or(false) && !header_ready(file) {
        return Err(RegionError::Emptied {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Sizes, opens up and initialises a new, still unnamed file.
fn fill_fresh(path: &Path, fd: &OwnedFd) -> Result<(), RegionError> {
    set_len(path, fd, REGION_SIZE as u64)?;
    lock::fchmod(fd, lock::REGION_FILE_MODE).map_err(|e| RegionError::io(path, "chmod", e))?;
    let map = Mapping::map(path, fd, true)?;
    initialise(&map);
    Ok(())
}

/// Initialises in place a file that exists but is empty or blank (created by something other
/// than gpuslice, or an interrupted initialisation). One process does it under the init lock;
/// the others wait for the header, at most [`INIT_WAIT`].
fn initialise_in_place(path: &Path, file: &OwnedFd) -> Result<(), RegionError> {
    // Its own description: a lock taken through `file` would live as long as the mapping.
    let lock_fd = lock::open(
        Path::new(&format!("/proc/self/fd/{}", file.raw())),
        libc::O_RDWR,
    )
    .map_err(|e| RegionError::io(path, "open", e))?;
    let deadline = Instant::now() + INIT_WAIT;
    loop {
        if lock::try_lock(&lock_fd, INIT_LOCK_OFFSET)
            .map_err(|e| RegionError::io(path, "lock", e))?
        {
            let result = initialise_locked(path, file);
            lock::unlock(&lock_fd, INIT_LOCK_OFFSET);
            return result;
        }
        if header_ready(file) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(RegionError::InitTimeout {
                path: path.to_path_buf(),
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn initialise_locked(path: &Path, file: &OwnedFd) -> Result<(), RegionError> {
    let facts = lock::fstat(file).map_err(|e| RegionError::io(path, "stat", e))?;
    if facts.size == 0 {
        set_len(path, file, REGION_SIZE as u64)?;
    }
    let map = Mapping::map(path, file, true)?;
    match validate(&map, path) {
        Err(RegionError::NotInitialised { .. }) if may_initialise(&map) => {
            initialise(&map);
            Ok(())
        }
        other => other,
    }
}

/// Whether the file is region-sized with a published header (read with pread: nothing mapped).
fn header_ready(file: &OwnedFd) -> bool {
    if lock::fstat(file).map(|f| f.size).ok() != Some(REGION_SIZE as u64) {
        return false;
    }
    let mut word = [0u8; 4];
    // SAFETY: reading 4 bytes into a 4-byte buffer from an open descriptor.
    let read = unsafe { libc::pread(file.raw(), word.as_mut_ptr().cast(), 4, 32) };
    read == 4 && u32::from_le_bytes(word) == INIT_READY
}

/// Takes this process's marks (module doc: "Marks"), the file's first, then refuses if
/// others map a region of this name but none maps the file we opened: the slice's live ledger
/// is another (deleted or renamed-over) file. Returns the guard file's description, kept for
/// its mark. Where locks are unsupported no mark is taken, and nothing is refused.
fn take_marks(
    path: &Path,
    dir: &OwnedFd,
    name: &CString,
    file: &OwnedFd,
) -> Result<Option<OwnedFd>, RegionError> {
    if hold_mark(file).is_err() {
        return Ok(None);
    }
    let Some(guard) = open_guard(dir, name) else {
        return Ok(None);
    };
    if hold_mark(&guard).is_err() {
        return Ok(None);
    }
    let others_map_the_name = marked_by_other(&guard).unwrap_or(false);
    let others_map_this_file = marked_by_other(file).unwrap_or(true);
    if others_map_the_name && !others_map_this_file {
        return Err(RegionError::Replaced {
            path: path.to_path_buf(),
        });
    }
    Ok(Some(guard))
}

/// 64-bit FNV-1a: small, stable across builds, good enough to spread lock offsets.
pub(super) struct Fnv(u64);

impl Fnv {
    pub(super) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    pub(super) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    pub(super) fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) fn reset(path: &Path) -> Result<(), RegionError> {
    let place = place(path)?;
    let dir = open_dir(path, &place)?;
    match lock::lstat_at(&dir, &place.name).map_err(|e| RegionError::io(path, "stat", e))? {
        Some(libc::S_IFLNK) => {
            return Err(RegionError::Symlink {
                path: path.to_path_buf(),
            })
        }
        Some(libc::S_IFREG) => refuse_if_in_use(path, &place, &dir)?,
        Some(_) => {
            return Err(RegionError::NotAFile {
                path: path.to_path_buf(),
            })
        }
        None => {}
    }
    let hint = place.name.to_string_lossy().into_owned();
    let (fd, temp) =
        lock::create_unnamed(&dir, &hint).map_err(|e| RegionError::io(path, "create", e))?;
    let temp = match temp {
        Some(temp) => temp,
        None => {
            // rename needs a name: give the unnamed file a private one first.
            let temp = CString::new(format!(
                ".{hint}.reset-{}-{}",
                std::process::id(),
                super::monotonic_ns()
            ))
            .map_err(|_| RegionError::io(path, "create", io::Error::other("name has NUL")))?;
            lock::link_into(&fd, None, &dir, &temp)
                .map_err(|e| RegionError::io(path, "create", e))?;
            temp
        }
    };
    let result = fill_fresh(path, &fd).and_then(|()| {
        lock::rename_at(&dir, &temp, &place.name).map_err(|e| RegionError::io(path, "replace", e))
    });
    if result.is_err() {
        lock::unlink_at(&dir, &temp);
    }
    drop(open_guard(&dir, &place.name));
    result
}

/// `Ok` when no process maps the region at `path` and no live process holds a slot of it (a
/// missing file is unused); `RegionError::InUse` otherwise. What the DRA driver checks before
/// removing a claim's region directory.
pub(super) fn check_unused(path: &Path) -> Result<(), RegionError> {
    let place = place(path)?;
    let dir = match open_dir(path, &place) {
        Ok(opened) => opened,
        // No directory: nothing can map a file in it.
        Err(_) if !place.dir.exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    match lock::lstat_at(&dir, &place.name).map_err(|e| RegionError::io(path, "stat", e))? {
        Some(libc::S_IFREG) => refuse_if_in_use(path, &place, &dir),
        Some(libc::S_IFLNK) => Err(RegionError::Symlink {
            path: path.to_path_buf(),
        }),
        Some(_) => Err(RegionError::NotAFile {
            path: path.to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// `reset` refuses while any process maps the region (a mark on the file or on its name) or
/// a live process holds a slot of it.
fn refuse_if_in_use(path: &Path, place: &Place, dir: &OwnedFd) -> Result<(), RegionError> {
    let mut live_pids = Vec::new();
    let mut mapped = false;
    if let Ok(fd) = lock::open_at_nofollow(dir, &place.name, libc::O_RDONLY) {
        mapped = marked_by_other(&fd).unwrap_or(false);
        if let Ok(map) = Mapping::map(path, &fd, false) {
            if validate(&map, path).is_ok() {
                live_pids = slots::claimed_slots(map.layout())
                    .filter(|(i, slot, _)| slots::judge(slot, *i, Some(&fd)) == Liveness::Alive)
                    .map(|(_, slot, _)| slot.pid.load(Ordering::Relaxed))
                    .collect();
            }
        }
    }
    mapped = mapped
        || open_guard_to_probe(dir, &place.name)
            .is_some_and(|guard| marked_by_other(&guard).unwrap_or(false));
    if live_pids.is_empty() && !mapped {
        return Ok(());
    }
    Err(RegionError::InUse {
        path: path.to_path_buf(),
        pids: live_pids,
    })
}

fn set_len(path: &Path, fd: &OwnedFd, len: u64) -> Result<(), RegionError> {
    // SAFETY: fd is an open, writable descriptor.
    if unsafe { libc::ftruncate(fd.raw(), len as libc::off_t) } != 0 {
        return Err(RegionError::io(path, "resize", io::Error::last_os_error()));
    }
    Ok(())
}

pub(super) fn validate(map: &Mapping, path: &Path) -> Result<(), RegionError> {
    let header = &map.layout().header;
    if header.init_state.load(Ordering::Acquire) != INIT_READY {
        let magic = header.magic.load(Ordering::Relaxed);
        if magic != 0 && magic != magic_word() {
            return Err(RegionError::Foreign {
                path: path.to_path_buf(),
                found_magic: magic.to_le_bytes(),
            });
        }
        return Err(RegionError::NotInitialised {
            path: path.to_path_buf(),
        });
    }
    let magic = header.magic.load(Ordering::Relaxed);
    if magic != magic_word() {
        return Err(RegionError::Foreign {
            path: path.to_path_buf(),
            found_magic: magic.to_le_bytes(),
        });
    }
    let checks: [(&'static str, u64, u64); 7] = [
        (
            "layout version",
            header.layout_version.load(Ordering::Relaxed).into(),
            LAYOUT_VERSION.into(),
        ),
        (
            "header size",
            header.header_size.load(Ordering::Relaxed).into(),
            HEADER_SIZE as u64,
        ),
        (
            "device entry size",
            header.device_entry_size.load(Ordering::Relaxed).into(),
            DEVICE_ENTRY_SIZE as u64,
        ),
        (
            "slot size",
            header.slot_size.load(Ordering::Relaxed).into(),
            SLOT_SIZE as u64,
        ),
        (
            "device count",
            header.max_devices.load(Ordering::Relaxed).into(),
            MAX_DEVICES as u64,
        ),
        (
            "process slot count",
            header.max_processes.load(Ordering::Relaxed).into(),
            MAX_PROCESSES as u64,
        ),
        (
            "total size",
            header.total_size.load(Ordering::Relaxed),
            REGION_SIZE as u64,
        ),
    ];
    for (what, found, expected) in checks {
        if found != expected {
            return Err(RegionError::Incompatible {
                path: path.to_path_buf(),
                what,
                found,
                expected,
            });
        }
    }
    Ok(())
}

/// An unready file may be initialised only if it is ours or blank (an interrupted init).
fn may_initialise(map: &Mapping) -> bool {
    let magic = map.layout().header.magic.load(Ordering::Relaxed);
    magic == 0 || magic == magic_word()
}

/// Writes a fresh, empty region (a file nobody else uses yet, or one under the init lock).
fn initialise(map: &Mapping) {
    let layout = map.layout();
    let header = &layout.header;
    let generation = header.generation.load(Ordering::Relaxed);
    header.init_state.store(INIT_EMPTY, Ordering::Release);
    for word in map.words() {
        word.store(0, Ordering::Relaxed);
    }
    for entry in &layout.devices {
        entry.memory_limit.store(LIMIT_UNSET, Ordering::Relaxed);
        entry
            .compute_percent
            .store(PERCENT_UNSET, Ordering::Relaxed);
    }
    header.magic.store(magic_word(), Ordering::Relaxed);
    header
        .layout_version
        .store(LAYOUT_VERSION, Ordering::Relaxed);
    header
        .header_size
        .store(HEADER_SIZE as u32, Ordering::Relaxed);
    header
        .device_entry_size
        .store(DEVICE_ENTRY_SIZE as u32, Ordering::Relaxed);
    header.slot_size.store(SLOT_SIZE as u32, Ordering::Relaxed);
    header
        .max_devices
        .store(MAX_DEVICES as u32, Ordering::Relaxed);
    header
        .max_processes
        .store(MAX_PROCESSES as u32, Ordering::Relaxed);
    header
        .total_size
        .store(REGION_SIZE as u64, Ordering::Relaxed);
    header
        .generation
        .store(generation.wrapping_add(1), Ordering::Relaxed);
    header.init_state.store(INIT_READY, Ordering::Release);
}
