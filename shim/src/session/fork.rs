//! The fork reset, by construction: every piece of per-process state is declared with
//! [`per_process!`], which puts a reset function for it into one linker section; the child
//! side of `fork()` ([`after_fork_in_child`]) runs every function of that section. A new piece
//! of per-process state therefore cannot be left out of the reset: declaring it is what
//! registers it. State that must survive a fork (the region mapping, the real driver's
//! symbols, handles of libraries mapped in both processes) is a plain `static`, and says so.
//!
//! Why a fork child needs it: the child is a new process (another PID, no other threads)
//! with a copy of the parent's memory. What the parent's slot charged, which threads it
//! started, which captures it had open and which host PID it was are not the child's; the
//! child starts clean and re-initialises at its next hooked call (`session::state`,
//! `hooks::lifecycle`).
//!
//! Only atomic stores run in the child's handler (async-signal-safe, as a child-side atfork
//! handler must be): a reset stores the value the declaration names, field by field.
//!
//! The section: `per_process!` places one [`Entry`] (a function pointer) per declaration in
//! `gpuslice_per_process`; the linker bounds it with `__start_`/`__stop_` symbols (the
//! name is a C identifier for that) and keeps it whole, since those symbols are referenced.
//! ld gives them protected visibility, so they bind inside this library whatever else the
//! process maps.

use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

/// A value a fork child can put back to a fresh one with atomic stores only.
pub trait ForkReset {
    /// Stores `fresh`'s value into `self` (relaxed: the child has one thread).
    fn reset_to(&self, fresh: Self);
}

macro_rules! atomic_reset {
    ($($atomic:ty),*) => {$(
        impl ForkReset for $atomic {
            #[inline]
            fn reset_to(&self, fresh: Self) {
                self.store(fresh.into_inner(), Ordering::Relaxed);
            }
        }
    )*};
}
atomic_reset!(
    AtomicBool,
    AtomicU8,
    AtomicU32,
    AtomicI32,
    AtomicU64,
    AtomicUsize
);

/// A turn held at the fork was held by a parent's thread, which the child does not have.
impl ForkReset for gpuslice_common::turn::Turn {
    #[inline]
    fn reset_to(&self, _fresh: Self) {
        self.reset();
    }
}

impl<T> ForkReset for AtomicPtr<T> {
    #[inline]
    fn reset_to(&self, fresh: Self) {
        self.store(fresh.into_inner(), Ordering::Relaxed);
    }
}

impl<T: ForkReset, const N: usize> ForkReset for [T; N] {
    fn reset_to(&self, fresh: Self) {
        for (cell, value) in self.iter().zip(fresh) {
            cell.reset_to(value);
        }
    }
}

/// One reset function in the section.
#[repr(transparent)]
pub struct Entry(pub extern "C" fn());

/// Declares a process-wide `static` whose value is per process: a fork child gets the
/// initial value back (or the one after `; after fork:`, where the child must differ from a
/// fresh process). Costs nothing on access: the static is the plain atomic.
///
/// ```ignore
/// crate::session::fork::per_process! {
///     /// Captures begun by this process and not seen ended.
///     static OPEN: AtomicU32 = AtomicU32::new(0);
/// }
/// ```
macro_rules! per_process {
    ($(#[$attr:meta])* $vis:vis static $name:ident: $ty:ty = $init:expr;) => {
        $crate::session::fork::per_process! {
            $(#[$attr])* $vis static $name: $ty = $init; after fork: $init;
        }
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $ty:ty = $init:expr; after fork: $fresh:expr;) => {
        $(#[$attr])*
        $vis static $name: $ty = $init;
        const _: () = {
            extern "C" fn reset() {
                $crate::session::fork::ForkReset::reset_to(&$name, $fresh);
            }
            // The reset's entry in the section: a constant, so it survives fork.
            #[used]
            #[link_section = "gpuslice_per_process"]
            static ENTRY: $crate::session::fork::Entry = $crate::session::fork::Entry(reset);
        };
    };
}
pub(crate) use per_process;

extern "C" {
    /// The section's first entry (linker-defined, a constant: survives fork).
    #[link_name = "__start_gpuslice_per_process"]
    static SECTION_START: Entry;
    /// Just past the section's last entry (likewise survives fork).
    #[link_name = "__stop_gpuslice_per_process"]
    static SECTION_STOP: Entry;
}

/// Every reset function `per_process!` registered.
fn entries() -> &'static [Entry] {
    // SAFETY: the linker defines both symbols around the one section that holds nothing but
    // `Entry` values (each placed by `per_process!`, `#[repr(transparent)]` function
    // pointers, so aligned and packed like a slice); the section is never written.
    unsafe {
        let start = std::ptr::addr_of!(SECTION_START);
        let stop = std::ptr::addr_of!(SECTION_STOP);
        let len = (stop as usize - start as usize) / std::mem::size_of::<Entry>();
        std::slice::from_raw_parts(start, len)
    }
}

/// How many pieces of per-process state are registered (for tests and the debug log).
pub fn registered() -> usize {
    entries().len()
}

/// The child side of `fork()`: the inherited slot descriptors are closed, then every piece of
/// per-process state is put back to its fresh value. Atomics and close(2) only.
pub extern "C" fn after_fork_in_child() {
    super::slice::close_inherited();
    for entry in entries() {
        (entry.0)();
    }
}

/// Survives fork, as the `pthread_atfork` registration it records does.
static HANDLER_REGISTERED: AtomicBool = AtomicBool::new(false);

/// Registers [`after_fork_in_child`] with `pthread_atfork`, once per process image (the
/// registration is inherited by fork children, so this flag survives the fork on purpose).
pub fn register_handler() {
    if HANDLER_REGISTERED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: `after_fork_in_child` is an `extern "C" fn()` that only stores atomics and
    // closes descriptors, which is async-signal-safe as a child-side atfork handler must be.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
    }
}

/// Test helper: forks (with the handler registered); the child runs `check` once the atfork
/// handler has run, and exits with its verdict. `check` may only read atomics (the child of
/// a multi-threaded test binary). True when the child answered true.
#[cfg(test)]
pub(crate) fn in_fork_child(check: impl FnOnce() -> bool) -> bool {
    register_handler();
    // SAFETY: the child only runs `check` (atomic loads) and `_exit`, which are
    // async-signal-safe; the parent waits for it.
    unsafe {
        match libc::fork() {
            0 => libc::_exit(if check() { 0 } else { 1 }),
            -1 => panic!("fork: {}", std::io::Error::last_os_error()),
            child => {
                let mut status = 0;
                assert_eq!(libc::waitpid(child, &mut status, 0), child);
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    per_process! {
        static PLAIN: AtomicU32 = AtomicU32::new(7);
    }
    per_process! {
        static CHANGED: [AtomicBool; 3] = [const { AtomicBool::new(false) }; 3];
        after fork: [const { AtomicBool::new(true) }; 3];
    }
    /// Survives the fork: a plain static is not reset.
    static KEPT: AtomicU32 = AtomicU32::new(0);

    /// Every declaration in the crate's sources is in the section (the linker kept them all).
    #[test]
    fn every_per_process_declaration_is_registered() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut declared = 0;
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    declared += text
                        .lines()
                        .map(str::trim_start)
                        .filter(|l| !l.starts_with("//") && !l.contains("$crate"))
                        .filter(|l| l.ends_with("per_process! {"))
                        .count();
                }
            }
        }
        assert!(declared >= 15, "found only {declared} declarations");
        assert_eq!(registered(), declared);
    }

    /// Where per-process state lives (the policies, the session), every
    /// `static` is either declared with `per_process!` or says why it survives fork: a plain
    /// `static` there without that line is a piece of state the fork reset would miss.
    #[test]
    fn every_static_of_the_policies_and_the_session_is_reset_or_says_it_survives_fork() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        let mut dirs: Vec<_> = ["memory", "throttle", "session"]
            .iter()
            .map(|d| src.join(d))
            .collect();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        assert!(files.len() > 20, "found only {} files", files.len());
        let mut unowned = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
            for (i, line) in lines.iter().enumerate() {
                let declares = ["static ", "pub static ", "pub(crate) static "]
                    .iter()
                    .any(|p| line.starts_with(p));
                if !declares {
                    continue;
                }
                // The comments above it, and the line that opens the block it is in.
                let mut j = i;
                let mut comment = String::new();
                while j > 0 && (lines[j - 1].starts_with("//") || lines[j - 1].starts_with("#[")) {
                    j -= 1;
                    comment.push_str(lines[j]);
                }
                let opener = if j > 0 { lines[j - 1] } else { "" };
                let per_process = opener.ends_with("per_process! {");
                let thread_local = opener.starts_with("thread_local!");
                let says = comment.to_lowercase().contains("survives fork")
                    || comment.to_lowercase().contains("survives the fork");
                if !(per_process || thread_local || says) {
                    unowned.push(format!("{}:{}: {line}", file.display(), i + 1));
                }
            }
        }
        assert!(
            unowned.is_empty(),
            "declare these with session::fork::per_process!, or say in their doc comment why each survives fork:\n{}",
            unowned.join("\n")
        );
    }

    #[test]
    fn a_fork_child_gets_each_declared_fresh_value_back_and_the_parent_keeps_its_own() {
        assert!(registered() >= 2, "only {} registered", registered());
        PLAIN.store(99, Ordering::Relaxed);
        KEPT.store(5, Ordering::Relaxed);
        assert!(in_fork_child(|| {
            PLAIN.load(Ordering::Relaxed) == 7
                && CHANGED.iter().all(|c| c.load(Ordering::Relaxed))
                && KEPT.load(Ordering::Relaxed) == 5
        }));
        assert_eq!(PLAIN.load(Ordering::Relaxed), 99, "the parent is untouched");
        assert!(!CHANGED[0].load(Ordering::Relaxed));
        // The mutation: a child that still saw the parent's value fails the check.
        assert!(!in_fork_child(|| KEPT.load(Ordering::Relaxed) == 0));
    }
}
