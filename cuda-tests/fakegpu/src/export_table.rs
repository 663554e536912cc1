//! Private export tables, the one model behind both libraries' private interfaces: the CUDA
//! runtime's `cuGetExportTable` tables (`fakegpu-cuda`'s `export_tables`) and nvidia-smi's
//! `nvmlInternalGetExportTable` table (`fakegpu-nvml`'s `export_table`).
//!
//! A private table is an array of pointer-sized slots named by a 16-byte id. A slot holds
//! the table's size in bytes (most tables start with it), a served function, nothing (a
//! null slot the real library leaves empty), or a trampoline the library supplies for a slot
//! it does not serve, which names the slot when called and answers NOT_SUPPORTED. Each
//! library declares its tables as [`TableDef`]s and its served functions beside them; this
//! module lays the tables out ([`layout`]), finds them by id ([`find`]) and prints ids
//! ([`fmt_id`]).

use std::ffi::c_void;

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The table's size in bytes (slot count x 8).
    SizeOf,
    /// A served function.
    Fn(*const c_void),
    /// Null, as the real library leaves it.
    Null,
    /// Not known: the library's trampoline for this slot.
    Unknown,
}

/// One private table: its name (for traces), id (CUuuid byte order), slot count and the
/// slots that are not [`Slot::Unknown`].
pub struct TableDef {
    pub name: &'static str,
    pub id: [u8; 16],
    pub slots: usize,
    pub known: &'static [(usize, Slot)],
}

// SAFETY: the pointers are addresses of functions with 'static lifetime; never written.
unsafe impl Sync for TableDef {}
// SAFETY: as for Sync: nothing in it belongs to a thread.
unsafe impl Send for TableDef {}

/// The slots of a table of `slots` slots: `known` where listed, else `trampoline(slot)`.
pub fn layout(
    slots: usize,
    known: impl Fn(usize) -> Option<Slot>,
    trampoline: impl Fn(usize) -> *const c_void,
) -> Box<[*const c_void]> {
    (0..slots)
        .map(|s| match known(s).unwrap_or(Slot::Unknown) {
            Slot::SizeOf => (slots * 8) as *const c_void,
            Slot::Fn(p) => p,
            Slot::Null => std::ptr::null(),
            Slot::Unknown => trampoline(s),
        })
        .collect()
}

/// The slots of a declared table, with `trampoline(slot)` for the unknown ones.
pub fn layout_def(
    t: &TableDef,
    trampoline: impl Fn(usize) -> *const c_void,
) -> Box<[*const c_void]> {
    layout(
        t.slots,
        |s| t.known.iter().find(|(i, _)| *i == s).map(|(_, k)| *k),
        trampoline,
    )
}

/// The index of the table with this id.
pub fn find(tables: &[TableDef], id: &[u8; 16]) -> Option<usize> {
    tables.iter().position(|t| t.id == *id)
}

/// Parses "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9" (bytes in CUuuid order) at compile time.
pub const fn id(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        out[n / 2] = (out[n / 2] << 4) | hex(b[i]);
        n += 1;
        i += 1;
    }
    assert!(n == 32, "a table id has 32 hex digits");
    out
}

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("not a hex digit"),
    }
}

/// An id as [`id`] reads it.
pub fn fmt_id(b: &[u8; 16]) -> String {
    let hexs: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hexs[0..8],
        &hexs[8..12],
        &hexs[12..16],
        &hexs[16..20],
        &hexs[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_read_and_print_alike() {
        let s = "6c3efec4-8fc9-4e6c-a327-ee696e12f7c4";
        assert_eq!(fmt_id(&id(s)), s);
        assert_eq!(id(s)[0], 0x6c);
    }

    #[test]
    fn a_layout_has_its_size_served_null_and_trampoline_slots() {
        static SERVED: u8 = 0;
        let served = &SERVED as *const u8 as *const c_void;
        let t = TableDef {
            name: "T",
            id: [0; 16],
            slots: 4,
            known: &[],
        };
        let known = [(0, Slot::SizeOf), (1, Slot::Null), (2, Slot::Fn(served))];
        let slots = layout(
            t.slots,
            |s| known.iter().find(|(i, _)| *i == s).map(|(_, k)| *k),
            |s| (0x1000 + s) as *const c_void,
        );
        assert_eq!(slots[0] as usize, 32);
        assert!(slots[1].is_null());
        assert_eq!(slots[2], served);
        assert_eq!(slots[3] as usize, 0x1003);
        assert_eq!(find(&[t], &[0; 16]), Some(0));
    }
}
