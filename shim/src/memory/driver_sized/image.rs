//! What a module image will cost on the device, read from the image before the driver loads
//! it (pure; the caller hands over the bytes). The driver's loader places a module's code,
//! its constant banks and its static `__device__` data in device memory:
//!
//! * cubin (ELF, `\x7fELF`): the sizes of the sections the loader places (`SHF_ALLOC`), code
//!   `.text.*`, constant banks `.nv.constant*`, initialised and zero-initialised static data
//!   (`.nv.global.init`, and `.nv.global`, `SHT_NOBITS`: no bytes in the file, all on the
//!   device); `.nv.shared.*` is on-chip shared memory and costs no device memory;
//! * PTX (NUL-terminated text): what the JIT makes of it: at most the text's length of code,
//!   plus every module-scope `.global` / `.const` variable's declared size;
//! * fatbin (`0xBA55ED50`; or its `__fatBinC_Wrapper_t`, `0x466243B1`, read through the
//!   caller): one entry per architecture, of which the loader takes the cubin for the device
//!   (the same compute capability, else the newest of its major version not above the
//!   device's), else the newest PTX not above it (JIT-compiled). A compressed entry is priced
//!   at its uncompressed size: its section table cannot be read without decompressing it.
//!
//! [`Costs`] keeps what every entry costs, so one load can be priced for any device (a
//! library is placed in each context that uses it).

/// What an image costs per architecture it carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Costs {
    /// (kind, compute capability as `10 * major + minor`, device bytes); a plain cubin or PTX
    /// image has one entry, of architecture [`ANY`].
    entries: Vec<(Kind, u32, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cubin,
    Ptx,
}

/// The architecture of an image that does not say (a bare cubin or PTX text).
const ANY: u32 = 0;

impl Costs {
    /// Device bytes the loader places for the device of compute capability `sm`
    /// (`10 * major + minor`); `None` when the image has nothing the device can load (the
    /// driver refuses it).
    pub fn for_device(&self, sm: u32) -> Option<u64> {
        let exact = |kind| {
            self.entries
                .iter()
                .filter(|&&(k, arch, _)| k == kind && (arch == sm || arch == ANY))
                .map(|&(_, _, bytes)| bytes)
                .next()
        };
        let newest = |kind, ok: &dyn Fn(u32) -> bool| {
            self.entries
                .iter()
                .filter(|&&(k, arch, _)| k == kind && ok(arch))
                .max_by_key(|&&(_, arch, _)| arch)
                .map(|&(_, _, bytes)| bytes)
        };
        exact(Kind::Cubin)
            .or_else(|| newest(Kind::Cubin, &|arch| arch / 10 == sm / 10 && arch <= sm))
            .or_else(|| exact(Kind::Ptx))
            .or_else(|| newest(Kind::Ptx, &|arch| arch <= sm))
    }
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// Larger images than this are not believed (a pointer to something else, read on).
pub const MAX_IMAGE: usize = 1 << 30;
const SHF_ALLOC: u64 = 0x2;
const SHT_NOBITS: u32 = 8;
/// Fatbin entry flags of a compressed payload (the older and the zstd scheme).
const COMPRESSED: u64 = 0x2000 | 0x8000;

fn u16_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(at..at.checked_add(2)?)?.try_into().ok()?) as u64)
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// What `image` costs (see the module doc); `None` for bytes of no known format.
pub fn costs(image: &[u8]) -> Option<Costs> {
    if image.starts_with(ELF_MAGIC) {
        let bytes = cubin_bytes(image)?;
        return Some(Costs {
            entries: vec![(Kind::Cubin, ANY, bytes)],
        });
    }
    if u32_at(image, 0) == Some(FATBIN_MAGIC) {
        return fatbin_costs(image);
    }
    let text = image.split(|&b| b == 0).next().unwrap_or(&[]);
    let text = std::str::from_utf8(text).ok()?;
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("//"))?;
    first.starts_with(".version").then(|| Costs {
        entries: vec![(Kind::Ptx, ANY, ptx_bytes(text))],
    })
}

/// A 64-bit little-endian cubin's placed sections.
fn cubin_bytes(b: &[u8]) -> Option<u64> {
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return None;
    }
    let shoff = usize::try_from(u64_at(b, 0x28)?).ok()?;
    let shentsize = u16_at(b, 0x3A)? as usize;
    let shnum = u16_at(b, 0x3C)? as usize;
    let shstrndx = u16_at(b, 0x3E)? as usize;
    if shentsize < 64 {
        return None;
    }
    let header = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let names_at = header(shstrndx)?;
    let names_off = usize::try_from(u64_at(b, names_at + 0x18)?).ok()?;
    let names = b.get(names_off..)?;
    let mut total = 0u64;
    for i in 0..shnum {
        let at = header(i)?;
        let (name, flags, size) = (u32_at(b, at)?, u64_at(b, at + 8)?, u64_at(b, at + 0x20)?);
        let shared = names
            .get(name as usize..)
            .is_some_and(|n| n.starts_with(b".nv.shared"));
        if flags & SHF_ALLOC != 0 && !shared {
            total = total.saturating_add(size);
        }
    }
    Some(total)
}

/// A fatbin's entries: 16-byte header (magic, version, header size, size of the entries),
/// then entries of (kind 1 PTX / 2 ELF, version, header size, payload size, ...,
/// architecture at 0x1C, flags at 0x28, uncompressed size at 0x38) each followed by its
/// payload.
fn fatbin_costs(b: &[u8]) -> Option<Costs> {
    let first = u16_at(b, 6)? as usize;
    let end = first.checked_add(usize::try_from(u64_at(b, 8)?).ok()?)?;
    let mut at = first;
    let mut entries = Vec::new();
    while at.checked_add(64)? <= end {
        let header = u32_at(b, at + 4)? as usize;
        let payload = usize::try_from(u64_at(b, at + 8)?).ok()?;
        if header < 64 {
            break;
        }
        let kind = match u16_at(b, at)? {
            1 => Some(Kind::Ptx),
            2 => Some(Kind::Cubin),
            _ => None,
        };
        let arch = u32_at(b, at + 0x1C)?;
        let flags = u64_at(b, at + 0x28)?;
        let data = at + header;
        if let Some(kind) = kind {
            let bytes = if flags & COMPRESSED != 0 {
                u64_at(b, at + 0x38)?
            } else {
                let body = b.get(data..data.checked_add(payload)?)?;
                match kind {
                    Kind::Cubin => cubin_bytes(body)?,
                    Kind::Ptx => ptx_bytes(&String::from_utf8_lossy(
                        body.split(|&c| c == 0).next().unwrap_or(&[]),
                    )),
                }
            };
            entries.push((kind, arch, bytes));
        }
        at = data.checked_add(payload)?;
    }
    Some(Costs { entries })
}

/// Bytes of a PTX scalar type (`.b8`, `.u32`, `.f64`, ...).
fn type_bytes(word: &str) -> Option<u64> {
    let bits: u64 = ["b", "u", "s", "f"]
        .iter()
        .find_map(|p| word.strip_prefix('.')?.strip_prefix(p))?
        .parse()
        .ok()?;
    matches!(bits, 8 | 16 | 32 | 64).then_some(bits / 8)
}

/// The size a module-scope declaration (`.global .align 4 .b8 name[64][2] = {...};`) gives
/// its variable.
fn declared_bytes(statement: &str) -> u64 {
    let mut words = statement.split_whitespace();
    let Some((element, rest)) = words.by_ref().find_map(|w| {
        let bytes = type_bytes(w)?;
        let at = statement.find(w)? + w.len();
        Some((bytes, &statement[at..]))
    }) else {
        return 0;
    };
    let declarator = rest.split('=').next().unwrap_or("");
    declarator
        .split('[')
        .skip(1)
        .map(|d| {
            d.split(']')
                .next()
                .unwrap_or("")
                .trim()
                .parse()
                .unwrap_or(1)
        })
        .fold(element, u64::saturating_mul)
}

/// PTX text: its length plus the module-scope `.global` and `.const` declarations (those
/// outside every `{}` block, `.extern` ones excepted; comments dropped).
fn ptx_bytes(text: &str) -> u64 {
    let mut total = text.len() as u64;
    // Block depth, and the depth of an initialiser's braces (`= {1, 2}`), which are no block.
    let (mut depth, mut init) = (0usize, 0usize);
    let mut statement = String::new();
    for line in text.lines() {
        for c in line.split("//").next().unwrap_or("").chars() {
            if init > 0 {
                match c {
                    '{' => init += 1,
                    '}' => init -= 1,
                    _ => {}
                }
                continue;
            }
            match c {
                '{' if depth == 0 && statement.trim_end().ends_with('=') => init = 1,
                '{' | '}' => {
                    depth = if c == '{' {
                        depth + 1
                    } else {
                        depth.saturating_sub(1)
                    };
                    statement.clear();
                }
                ';' => {
                    if depth == 0 && !statement.contains(".extern") {
                        let at = [".global", ".const"]
                            .iter()
                            .filter_map(|k| statement.rfind(k))
                            .max();
                        if let Some(at) = at {
                            total = total.saturating_add(declared_bytes(&statement[at..]));
                        }
                    }
                    statement.clear();
                }
                _ => statement.push(c),
            }
        }
        statement.push(' ');
    }
    total
}

/// How many bytes of the image at `ptr` its own format says it has (ELF: up to the end of
/// its section table and contents; fatbin: header plus entries; text: up to its NUL),
/// reading only bytes that format guarantees. `None` for null or more than [`MAX_IMAGE`].
///
/// # Safety
/// `ptr` is null or points to a module image the CUDA API accepts (cubin, fatbin, or
/// NUL-terminated PTX), readable for the length its header states.
pub unsafe fn image_len(ptr: *const u8) -> Option<usize> {
    if ptr.is_null() {
        return None;
    }
    // Byte by byte, so that short text stops at its NUL (no magic byte is 0).
    let starts = |magic: &[u8]| {
        magic.iter().enumerate().all(|(i, &m)| {
            // SAFETY: byte i is read only when bytes 0..i matched non-NUL magic bytes.
            let byte = unsafe { *ptr.add(i) };
            byte == m
        })
    };
    // SAFETY: called only for lengths the image's format guarantees (checked magic first).
    let head = |n: usize| unsafe { std::slice::from_raw_parts(ptr, n) };
    let len = if starts(ELF_MAGIC) {
        let h = head(64);
        let shoff = u64_at(h, 0x28)? as usize;
        let shentsize = u16_at(h, 0x3A)? as usize;
        let shnum = u16_at(h, 0x3C)? as usize;
        let table = shoff.checked_add(shentsize.checked_mul(shnum)?)?;
        if !(64..=MAX_IMAGE).contains(&table) {
            return None;
        }
        let all = head(table);
        let mut end = table;
        for i in 0..shnum {
            let at = shoff + i * shentsize;
            if u32_at(all, at + 4)? != SHT_NOBITS {
                let (off, size) = (u64_at(all, at + 0x18)?, u64_at(all, at + 0x20)?);
                end = end.max(usize::try_from(off.saturating_add(size)).ok()?);
            }
        }
        end
    } else if starts(&FATBIN_MAGIC.to_le_bytes()) {
        let h = head(16);
        (u16_at(h, 6)? as usize).checked_add(usize::try_from(u64_at(h, 8)?).ok()?)?
    } else {
        let mut n = 0;
        // SAFETY: NUL-terminated text: every byte up to the NUL is readable.
        while n < MAX_IMAGE && unsafe { *ptr.add(n) } != 0 {
            n += 1;
        }
        n
    };
    (len <= MAX_IMAGE).then_some(len)
}

/// The fatbin a `__fatBinC_Wrapper_t` at `ptr` points to (its data at byte 8), or `ptr`.
///
/// # Safety
/// `ptr` is null or readable for 4 bytes, and for 16 when it holds the wrapper's magic.
pub unsafe fn unwrap_fatbin(ptr: *const u8) -> *const u8 {
    if ptr.is_null() {
        return ptr;
    }
    // SAFETY: the contract: 4 readable bytes.
    let magic = unsafe { (ptr as *const u32).read_unaligned() };
    if magic == FATBIN_WRAPPER_MAGIC {
        // SAFETY: a wrapper holds the fatbin's address at byte 8.
        unsafe { (ptr.add(8) as *const *const u8).read_unaligned() }
    } else {
        ptr
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const PTX: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
        // .global .b8 commented[999];\n\
        .global .align 8 .b8 table[1048576];\n\
        .const .align 4 .u32 coeffs[256] = {1, 2};\n\
        .visible .entry deep(.param .u64 p)\n{\n .local .align 8 .b8 __local_depot0[4096];\n ret;\n}\n";

    #[test]
    fn ptx_costs_its_text_and_module_scope_data_not_a_kernels_locals() {
        let costs = costs(PTX.as_bytes()).unwrap();
        assert_eq!(
            costs.for_device(70),
            Some(PTX.len() as u64 + 1_048_576 + 1024)
        );
        assert_eq!(
            costs.for_device(90),
            costs.for_device(70),
            "PTX is for any device"
        );
        assert!(super::costs(b"not an image").is_none());
    }

    /// A cubin with these (name, type, flags, size) sections, no contents (all NOBITS-like).
    pub(crate) fn elf(sections: &[(&str, u32, u64, u64)]) -> Vec<u8> {
        let mut names = vec![0u8];
        let mut offsets = Vec::new();
        for (n, ..) in sections {
            offsets.push(names.len() as u32);
            names.extend_from_slice(n.as_bytes());
            names.push(0);
        }
        let shstr_name = names.len() as u32;
        names.extend_from_slice(b".shstrtab\0");
        let shoff = 64 + names.len();
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(ELF_MAGIC);
        b[4] = 2;
        b[5] = 1;
        b[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        b[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        b[0x3C..0x3E].copy_from_slice(&((sections.len() + 1) as u16).to_le_bytes());
        b[0x3E..0x40].copy_from_slice(&(sections.len() as u16).to_le_bytes());
        b.extend_from_slice(&names);
        let entry = |name: u32, kind: u32, flags: u64, off: u64, size: u64| {
            let mut e = vec![0u8; 64];
            e[..4].copy_from_slice(&name.to_le_bytes());
            e[4..8].copy_from_slice(&kind.to_le_bytes());
            e[8..16].copy_from_slice(&flags.to_le_bytes());
            e[0x18..0x20].copy_from_slice(&off.to_le_bytes());
            e[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            e
        };
        for (i, (_, kind, flags, size)) in sections.iter().enumerate() {
            b.extend(entry(offsets[i], *kind, *flags, 0, *size));
        }
        b.extend(entry(shstr_name, 3, 0, 64, names.len() as u64));
        b
    }

    /// A fatbin of (kind, arch, flags, payload) entries.
    pub(crate) fn fatbin(entries: &[(u16, u32, u64, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (kind, arch, flags, payload) in entries {
            let mut e = vec![0u8; 64];
            e[..2].copy_from_slice(&kind.to_le_bytes());
            e[4..8].copy_from_slice(&64u32.to_le_bytes());
            e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            e[0x1C..0x20].copy_from_slice(&arch.to_le_bytes());
            e[0x28..0x30].copy_from_slice(&flags.to_le_bytes());
            e[0x38..0x40].copy_from_slice(&(payload.len() as u64 * 4).to_le_bytes());
            body.extend(e);
            body.extend_from_slice(payload);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend(body);
        b
    }

    #[test]
    fn a_cubin_costs_its_placed_sections_but_not_shared_memory() {
        let image = elf(&[
            (".text.k", 8, 0x6, 4096),
            (".nv.constant0.k", 8, 0x2, 512),
            (".nv.global", 8, 0x3, 64 << 20),
            (".nv.shared.k", 8, 0x3, 48 << 10),
            (".nv.info.k", 0x7000_0000, 0, 100),
        ]);
        let costs = costs(&image).unwrap();
        assert_eq!(costs.for_device(80), Some(4096 + 512 + (64 << 20)));
        // SAFETY: a complete image in a live buffer.
        assert_eq!(unsafe { image_len(image.as_ptr()) }, Some(image.len()));
    }

    #[test]
    fn a_fatbin_costs_the_entry_the_device_loads() {
        let sm70 = elf(&[(".nv.global", 8, 0x3, 70 << 20)]);
        let sm80 = elf(&[(".nv.global", 8, 0x3, 80 << 20)]);
        let ptx = format!("{PTX}\0");
        let image = fatbin(&[
            (2, 70, 0, &sm70),
            (2, 80, 0, &sm80),
            (1, 80, 0, ptx.as_bytes()),
            (2, 90, 0x8000, b"zstd bytes"),
        ]);
        let costs = costs(&image).unwrap();
        assert_eq!(costs.for_device(70), Some(70 << 20), "its own cubin");
        assert_eq!(
            costs.for_device(75),
            Some(70 << 20),
            "the newest of its major"
        );
        assert_eq!(costs.for_device(86), Some(80 << 20));
        assert_eq!(
            costs.for_device(90),
            Some(40),
            "compressed: its uncompressed size"
        );
        assert_eq!(
            costs.for_device(100),
            Some(PTX.len() as u64 + 1_048_576 + 1024),
            "no cubin for it: the PTX"
        );
        assert_eq!(costs.for_device(60), None, "nothing it can load");
        // SAFETY: a complete image in a live buffer.
        assert_eq!(unsafe { image_len(image.as_ptr()) }, Some(image.len()));
        let text = b"abc\0def";
        // SAFETY: NUL-terminated.
        assert_eq!(unsafe { image_len(text.as_ptr()) }, Some(3));
    }
}
