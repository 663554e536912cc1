//! What a loaded module image costs on the device, read from the image itself: how many bytes
//! of it the driver places in device memory (its code, and its data: constant banks and static
//! `__device__` variables), and each kernel's per-thread local memory.
//!
//! Rules (the fake runs no code, so these stand for what the driver's loader does):
//! * cubin (an ELF file, `\x7fELF`): the sizes of its sections the loader places in memory
//!   (`SHF_ALLOC`): code (`.text.<kernel>`), and data: constant banks (`.nv.constant<N>`),
//!   initialised and zero-initialised static `__device__` data (`.nv.global.init`,
//!   `.nv.global`, the latter `SHT_NOBITS`: no bytes in the file, all of them on the device).
//!   `.nv.shared.*` is on-chip shared memory and does not count. Per-kernel local memory is
//!   not read from a cubin's `.nv.info` attributes; it comes from `FAKEGPU_KERNEL_LOCAL_BYTES`.
//! * PTX (text): the JIT's output is the code plus the module's static data. Counted: the
//!   text's length as code (an upper bound of the code it compiles to), every module-scope
//!   `.global` / `.const` variable's declared size as data (`.global .align 8 .b8
//!   buf[1048576];` is 1 MiB). A kernel's per-thread local memory is its `.local` declarations
//!   (nvcc's `__local_depot<N>[bytes]`, the stack frame), summed per `.entry`.
//! * fatbin (`0xBA55ED50`: a header, then entries of kind 1 PTX or 2 ELF, each with its
//!   architecture at byte 0x1C, flags at 0x28 and uncompressed size at 0x38): the entry the
//!   loader takes for the device, a cubin of its compute capability, else the newest cubin of
//!   its major version not above it, else the newest PTX not above it (JIT-compiled), sized by
//!   the rules above. A compressed entry (flag 0x2000 or 0x8000) counts its uncompressed size
//!   as data: the fake has no decompressor, so static data in its `NOBITS` sections is not
//!   seen.
//!
//! `FAKEGPU_KERNEL_LOCAL_BYTES=name=bytes[,name=bytes...]` overrides or adds a kernel's local
//! bytes by name (for cubins, fatbins, and images that are not real code).
//!
//! An image also says which cards it has code for ([`Code`]): a fatbin lists its entries
//! (machine code for `sm_XY`, or PTX for `compute_XY` of a PTX ISA version), a cubin names its
//! architecture in its ELF header, PTX in its `.target` and `.version` directives.
//! [`code_for_card`] decides, as the driver's loader does, whether one of them runs on a card.

use std::collections::HashMap;
use std::ffi::c_void;

/// What an image costs: bytes on the device (its code, its data), per-thread local bytes per
/// kernel; and the code it carries, for which cards (empty: the image does not say, as the
/// test clients' raw images).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageInfo {
    pub code_bytes: u64,
    pub data_bytes: u64,
    pub local_bytes: HashMap<String, u64>,
    pub code: Vec<Code>,
}

/// Code an image carries for one architecture, numbered as nvcc names them (`sm_90` is 90:
/// compute capability 9.0; `sm_120` is 12.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Machine code (SASS) for `sm_<arch>`.
    Sass { arch: u32 },
    /// PTX for `compute_<arch>`, of PTX ISA `isa` (major x 10 + minor: 84 is 8.4).
    Ptx { arch: u32, isa: u32 },
}

/// The newest PTX ISA a driver of this CUDA version (`cuDriverGetVersion`, 13000 = 13.0)
/// compiles: the PTX ISA's release history (PTX ISA 7.x came with CUDA 11.x, 8.0-8.5 with
/// 12.0-12.5, 8.6 with 12.7, 8.7 with 12.8, 8.8 with 12.9, 9.x with 13.x).
pub fn max_ptx_isa(driver_version: i32) -> u32 {
    let (major, minor) = (
        (driver_version / 1000) as u32,
        ((driver_version % 1000) / 10) as u32,
    );
    match major {
        0..=10 => 65,
        11 => 70 + minor.min(8),
        12 => match minor {
            0..=5 => 80 + minor,
            6 => 85,
            7 => 86,
            8 => 87,
            _ => 88,
        },
        _ => (major - 4) * 10 + minor.min(9),
    }
}

/// Whether `code` runs on a card of compute capability `cc` (major x 10 + minor) under a driver
/// of `driver_version`, as the driver's loader decides (CUDA C++ Programming Guide, "Binary
/// Compatibility" and "PTX Compatibility"): machine code for `sm_XY` runs on `X.z` for
/// `z >= Y` (the same major version); PTX for `compute_XY` is compiled for any card of
/// capability `X.Y` or higher, by a driver whose JIT knows its ISA version. An image that
/// says nothing about its code runs anywhere.
///
/// Errors as the driver API's loaders: `CUDA_ERROR_NO_BINARY_FOR_GPU` ("no kernel image is
/// available for execution on the device" in the runtime) when nothing fits the card,
/// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` when only PTX of a newer ISA than the driver's would.
pub fn code_for_card(code: &[Code], cc: u32, driver_version: i32) -> Result<(), u32> {
    use gpuslice_abi::cuda::result::{
        CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    };
    if code.is_empty() {
        return Ok(());
    }
    let sass_runs = |arch: u32| arch / 10 == cc / 10 && arch % 10 <= cc % 10;
    let mut ptx_too_new = false;
    for c in code {
        match *c {
            Code::Sass { arch } if sass_runs(arch) => return Ok(()),
            Code::Ptx { arch, isa } if arch <= cc => {
                if isa <= max_ptx_isa(driver_version) {
                    return Ok(());
                }
                ptx_too_new = true;
            }
            _ => {}
        }
    }
    Err(if ptx_too_new {
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    } else {
        CUDA_ERROR_NO_BINARY_FOR_GPU
    })
}

impl ImageInfo {
    pub fn device_bytes(&self) -> u64 {
        self.code_bytes.saturating_add(self.data_bytes)
    }
}

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Larger images than this are not believed (a pointer to something else, read on).
const MAX_IMAGE: usize = 1 << 30;
const SHF_ALLOC: u64 = 0x2;

/// What `image` costs on a device of compute capability `sm` (`10 * major + minor`), by the
/// rules in the module doc.
pub fn parse(image: &[u8], sm: u32) -> ImageInfo {
    if image.starts_with(ELF_MAGIC) {
        return parse_elf(image).unwrap_or(ImageInfo {
            data_bytes: image.len() as u64,
            ..ImageInfo::default()
        });
    }
    if image.len() >= 16 && u32_at(image, 0) == Some(FATBIN_MAGIC) {
        return parse_fatbin(image, sm).unwrap_or_default();
    }
    let text = String::from_utf8_lossy(image.split(|&b| b == 0).next().unwrap_or(&[]));
    parse_ptx(&text)
}

/// The fatbin entry a device of `sm` loads (see the module doc), sized.
fn parse_fatbin(b: &[u8], sm: u32) -> Option<ImageInfo> {
    let first = u16_at(b, 6)? as usize;
    let end = first.checked_add(u64_at(b, 8)? as usize)?;
    // (kind, arch, offset of the payload, its length, compressed size if compressed)
    let mut entries = Vec::new();
    // Every entry's code (for `code_for_card`), whichever the device loads.
    let mut code = Vec::new();
    let mut at = first;
    while at + 64 <= end {
        let (kind, header) = (u16_at(b, at)?, u32_at(b, at + 4)? as usize);
        let payload = u64_at(b, at + 8)? as usize;
        if header < 64 {
            break;
        }
        let compressed = (u64_at(b, at + 0x28)? & 0xA000 != 0).then(|| u64_at(b, at + 0x38));
        let arch = u32_at(b, at + 0x1C)?;
        match kind {
            // PTX: its ISA version as minor u16 @0x18 and major u16 @0x1A.
            1 => code.push(Code::Ptx {
                arch,
                isa: (u16_at(b, at + 0x1A)? * 10 + u16_at(b, at + 0x18)?) as u32,
            }),
            2 => code.push(Code::Sass { arch }),
            _ => {}
        }
        entries.push((kind, arch, at + header, payload, compressed));
        at = at.checked_add(header)?.checked_add(payload)?;
    }
    let with_code = |info: ImageInfo| {
        Some(ImageInfo {
            code: code.clone(),
            ..info
        })
    };
    let newest = |kind: u64, ok: &dyn Fn(u32) -> bool| {
        entries
            .iter()
            .filter(|e| e.0 == kind && ok(e.1))
            .max_by_key(|e| e.1)
    };
    let Some((kind, _, data, len, compressed)) = newest(2, &|arch| arch == sm)
        .or_else(|| newest(2, &|arch| arch / 10 == sm / 10 && arch <= sm))
        .or_else(|| newest(1, &|arch| arch <= sm))
    else {
        // Nothing for this device: the load fails (`code_for_card`), nothing is placed.
        return with_code(ImageInfo::default());
    };
    if let Some(size) = compressed {
        return with_code(ImageInfo {
            data_bytes: size.unwrap_or(0),
            ..ImageInfo::default()
        });
    }
    let body = b.get(*data..data.checked_add(*len)?)?;
    with_code(if *kind == 2 {
        parse_elf(body).unwrap_or_default()
    } else {
        parse_ptx(&String::from_utf8_lossy(
            body.split(|&c| c == 0).next().unwrap_or(&[]),
        ))
    })
}

fn u16_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as u64)
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A cubin's architecture from its ELF header (`e_flags` @0x30): CUDA's ELF ABI 7 (OS ABI
/// byte 0x33) keeps `sm_XY` in the low byte, ABI 8 (OS ABI 0x41, CUDA 12.8 on) in the second
/// (seen in ggml's sm_86 and PyTorch's sm_100 cubins: `0x560556`, `0x6006402`).
fn cubin_code(b: &[u8]) -> Vec<Code> {
    let flags = u32_at(b, 0x30).unwrap_or(0);
    let arch = match b.get(7) {
        Some(0x33) => flags & 0xff,
        Some(0x41) => (flags >> 8) & 0xff,
        _ => return Vec::new(),
    };
    if arch == 0 {
        return Vec::new();
    }
    vec![Code::Sass { arch }]
}

/// PTX's own `.version M.m` and `.target sm_XY[a|f]` directives.
fn ptx_code(text: &str) -> Vec<Code> {
    let directive = |name: &str| {
        text.lines()
            .map(|l| l.split("//").next().unwrap_or("").trim())
            .find_map(|l| l.strip_prefix(name).map(str::trim))
    };
    let isa = directive(".version").and_then(|v| {
        let (major, minor) = v.split_once('.')?;
        Some(major.trim().parse::<u32>().ok()? * 10 + minor.trim().parse::<u32>().ok()?)
    });
    let arch = directive(".target").and_then(|t| {
        let sm = t.split([',', ' ']).find_map(|w| w.strip_prefix("sm_"))?;
        sm.trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .parse()
            .ok()
    });
    match (arch, isa) {
        (Some(arch), Some(isa)) => vec![Code::Ptx { arch, isa }],
        _ => Vec::new(),
    }
}

/// A 64-bit little-endian ELF's allocated sections (cubins are ELF64 LE).
fn parse_elf(b: &[u8]) -> Option<ImageInfo> {
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return None;
    }
    let shoff = u64_at(b, 0x28)? as usize;
    let shentsize = u16_at(b, 0x3A)? as usize;
    let shnum = u16_at(b, 0x3C)? as usize;
    let shstrndx = u16_at(b, 0x3E)? as usize;
    if shentsize < 64 {
        return None;
    }
    let section = |i: usize| -> Option<(u32, u32, u64, u64, u64)> {
        let at = shoff.checked_add(i.checked_mul(shentsize)?)?;
        // (name, type, flags, offset, size)
        Some((
            u32_at(b, at)?,
            u32_at(b, at + 4)?,
            u64_at(b, at + 8)?,
            u64_at(b, at + 0x18)?,
            u64_at(b, at + 0x20)?,
        ))
    };
    let (_, _, _, str_off, str_size) = section(shstrndx)?;
    let names = b.get(str_off as usize..(str_off + str_size) as usize)?;
    let name_of = |at: u32| -> String {
        let rest = names.get(at as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        String::from_utf8_lossy(&rest[..end]).into_owned()
    };
    let mut info = ImageInfo::default();
    for i in 0..shnum {
        let (name, _, flags, _, size) = section(i)?;
        let name = name_of(name);
        if flags & SHF_ALLOC == 0 || name.starts_with(".nv.shared") {
            continue;
        }
        let into = if name.starts_with(".text") {
            &mut info.code_bytes
        } else {
            &mut info.data_bytes
        };
        *into = into.saturating_add(size);
    }
    info.code = cubin_code(b);
    Some(info)
}

/// Bytes of a PTX scalar type (`.b8`, `.u32`, `.f64`, ...); `None` for anything else.
fn type_bytes(word: &str) -> Option<u64> {
    let bits: u64 = word
        .strip_prefix(".b")
        .or_else(|| word.strip_prefix(".u"))
        .or_else(|| word.strip_prefix(".s"))
        .or_else(|| word.strip_prefix(".f"))?
        .parse()
        .ok()?;
    matches!(bits, 8 | 16 | 32 | 64).then_some(bits / 8)
}

/// The size a declaration (`.global .align 4 .b8 name[64][2];`) gives its variable.
fn declared_bytes(statement: &str) -> u64 {
    let mut words = statement.split_whitespace();
    let mut element = None;
    let mut rest = "";
    for w in words.by_ref() {
        if let Some(b) = type_bytes(w) {
            element = Some(b);
            rest = statement[statement.find(w).unwrap_or(0) + w.len()..].trim();
            break;
        }
    }
    let Some(element) = element else { return 0 };
    // `name[a][b] = {...}`: the dimensions before any initialiser.
    let decl = rest.split('=').next().unwrap_or("");
    let mut count = 1u64;
    for dim in decl.split('[').skip(1) {
        let n = dim.split(']').next().unwrap_or("").trim();
        count = count.saturating_mul(n.parse().unwrap_or(1));
    }
    element.saturating_mul(count)
}

fn parse_ptx(text: &str) -> ImageInfo {
    let mut data_bytes = 0u64;
    let mut local_bytes = HashMap::new();
    let mut depth = 0usize;
    let mut entry: Option<String> = None;
    // Comments are dropped first. Directives such as `.version` end without ';', so a
    // statement is read from its last declaration keyword on.
    let clean: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let from_last = |s: &str, word: &str| s.rfind(word).map(|at| s[at..].to_string());
    let mut statement = String::new();
    // Depth of an initialiser's braces (`= {1, 2}`), which are no block.
    let mut init = 0usize;
    for c in clean.chars() {
        if init > 0 {
            match c {
                '{' => init += 1,
                '}' => init -= 1,
                _ => {}
            }
            continue;
        }
        if c == '{' && statement.trim_end().ends_with('=') {
            init = 1;
            continue;
        }
        match c {
            '{' | '}' | ';' => {
                let s = statement.trim();
                if depth == 0 {
                    if let Some(decl) = from_last(s, ".entry") {
                        let name = decl[6..]
                            .trim_start()
                            .split(|c: char| c == '(' || c.is_whitespace())
                            .next()
                            .unwrap_or("");
                        entry = Some(name.to_string());
                    } else if c == ';' {
                        let decl = from_last(s, ".global").or_else(|| from_last(s, ".const"));
                        if let Some(decl) = decl {
                            data_bytes = data_bytes.saturating_add(declared_bytes(&decl));
                        }
                    }
                } else if c == ';' {
                    if let (Some(name), Some(decl)) = (&entry, from_last(s, ".local")) {
                        *local_bytes.entry(name.clone()).or_insert(0u64) += declared_bytes(&decl);
                    }
                }
                statement.clear();
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            entry = None;
                        }
                    }
                    _ => {}
                }
            }
            _ => statement.push(c),
        }
    }
    ImageInfo {
        code_bytes: text.len() as u64,
        data_bytes,
        local_bytes,
        code: ptx_code(text),
    }
}

/// The image at `ptr`, as long as its own format says (see the module doc); `None` for null.
///
/// # Safety
/// `ptr` is null or points to a module image the CUDA API accepts (cubin, fatbin, or
/// NUL-terminated PTX), readable for the length its header states.
pub unsafe fn image_at<'a>(ptr: *const c_void) -> Option<&'a [u8]> {
    if ptr.is_null() {
        return None;
    }
    let p = ptr as *const u8;
    // SAFETY: called only for lengths the image's format guarantees (checked magic first).
    let head = |n: usize| unsafe { std::slice::from_raw_parts(p, n) };
    // Byte by byte, so that short text stops at its NUL (no magic byte is 0).
    let starts = |magic: &[u8]| {
        magic
            .iter()
            .enumerate()
            // SAFETY: byte i is read only when bytes 0..i matched non-NUL magic bytes.
            .all(|(i, &m)| unsafe { *p.add(i) } == m)
    };
    let len = if starts(ELF_MAGIC) {
        let h = head(64);
        let shoff = u64_at(h, 0x28).unwrap_or(0) as usize;
        let table =
            shoff + u16_at(h, 0x3A).unwrap_or(0) as usize * u16_at(h, 0x3C).unwrap_or(0) as usize;
        if !(64..=MAX_IMAGE).contains(&table) {
            return None;
        }
        // The sections' contents may come after the table.
        let all = head(table);
        let mut end = table;
        let shentsize = u16_at(h, 0x3A).unwrap_or(0) as usize;
        for i in 0..u16_at(h, 0x3C).unwrap_or(0) as usize {
            let at = shoff + i * shentsize;
            let kind = u32_at(all, at + 4).unwrap_or(0);
            let (off, size) = (
                u64_at(all, at + 0x18).unwrap_or(0) as usize,
                u64_at(all, at + 0x20).unwrap_or(0) as usize,
            );
            // SHT_NOBITS (8) has no bytes in the file.
            if kind != 8 {
                end = end.max(off.saturating_add(size));
            }
        }
        end
    } else if starts(&FATBIN_MAGIC.to_le_bytes()) {
        let h = head(16);
        u16_at(h, 6).unwrap_or(16) as usize + u64_at(h, 8).unwrap_or(0) as usize
    } else {
        let mut n = 0;
        // SAFETY: NUL-terminated text: every byte up to the NUL is readable.
        while n < MAX_IMAGE && unsafe { *p.add(n) } != 0 {
            n += 1;
        }
        n
    };
    if len > MAX_IMAGE {
        return None;
    }
    // SAFETY: the length the image's own header (or NUL) gives, per the contract.
    Some(unsafe { std::slice::from_raw_parts(p, len) })
}

/// `FAKEGPU_KERNEL_LOCAL_BYTES`: `name=bytes` pairs, comma-separated; bad pairs are named on
/// stderr and skipped.
pub fn local_bytes_from_env() -> HashMap<String, u64> {
    let Ok(text) = std::env::var("FAKEGPU_KERNEL_LOCAL_BYTES") else {
        return HashMap::new();
    };
    parse_local_bytes(&text)
}

pub fn parse_local_bytes(text: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair
            .split_once('=')
            .map(|(n, b)| (n.trim(), b.trim().parse::<u64>()))
        {
            Some((name, Ok(bytes))) if !name.is_empty() => {
                out.insert(name.to_string(), bytes);
            }
            _ => eprintln!(
                "fakegpu: FAKEGPU_KERNEL_LOCAL_BYTES: {pair:?} is not name=bytes; ignored"
            ),
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64
// a comment with .global .b8 fake[999];
.global .align 8 .b8 table[1048576];
.const .align 4 .u32 coeffs[256] = {1, 2};
.visible .entry deep(
    .param .u64 deep_param_0
)
{
    .local .align 8 .b8 __local_depot0[4096];
    .reg .b64 %SP;
    ret;
}
.visible .entry flat()
{
    ret;
}
"#;

    #[test]
    fn ptx_counts_text_static_data_and_each_kernels_local_depot() {
        let info = parse(PTX.as_bytes(), 70);
        assert_eq!(info.code_bytes, PTX.len() as u64);
        assert_eq!(info.data_bytes, 1_048_576 + 1024);
        assert_eq!(info.local_bytes.get("deep"), Some(&4096));
        assert_eq!(info.local_bytes.get("flat"), None);
    }

    fn elf(sections: &[(&str, u32, u64, u64)]) -> Vec<u8> {
        // Header, then the names, then the section table.
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
        let mut table = Vec::new();
        for (i, (_, kind, flags, size)) in sections.iter().enumerate() {
            table.extend(entry(offsets[i], *kind, *flags, 0, *size));
        }
        table.extend(entry(shstr_name, 3, 0, 64, names.len() as u64));
        b.extend(table);
        b
    }

    #[test]
    fn a_cubin_counts_its_allocated_sections_but_not_shared_memory() {
        let image = elf(&[
            // NOBITS throughout, so that no section's bytes lie past this short file's end.
            (".text.k", 8, 0x6, 4096),
            (".nv.constant0.k", 8, 0x2, 512),
            (".nv.global", 8, 0x3, 64 << 20),
            (".nv.shared.k", 8, 0x3, 48 << 10),
            (".nv.info.k", 0x7000_0000, 0, 100),
        ]);
        let info = parse(&image, 70);
        assert_eq!(info.code_bytes, 4096);
        assert_eq!(info.data_bytes, 512 + (64 << 20));
        // SAFETY: a complete image in a live buffer.
        let read = unsafe { image_at(image.as_ptr().cast()) }.unwrap();
        assert_eq!(
            read.len(),
            image.len(),
            "the length is the section table's end"
        );
    }

    /// A fatbin of (kind, arch, flags, payload) entries.
    fn fatbin(entries: &[(u16, u32, u64, &[u8])]) -> Vec<u8> {
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
        let mut fat = Vec::new();
        fat.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fat.extend_from_slice(&1u16.to_le_bytes());
        fat.extend_from_slice(&16u16.to_le_bytes());
        fat.extend_from_slice(&(body.len() as u64).to_le_bytes());
        fat.extend(body);
        fat
    }

    #[test]
    fn a_fatbin_costs_the_entry_the_device_loads_and_text_ends_at_its_nul() {
        let sm70 = elf(&[(".nv.global", 8, 0x3, 70 << 20)]);
        let sm80 = elf(&[(".nv.global", 8, 0x3, 80 << 20)]);
        let ptx = format!("{PTX}\0");
        let fat = fatbin(&[
            (2, 70, 0, &sm70),
            (2, 80, 0, &sm80),
            (1, 80, 0, ptx.as_bytes()),
            (2, 90, 0x8000, b"zstd bytes"),
        ]);
        assert_eq!(parse(&fat, 70).data_bytes, 70 << 20);
        assert_eq!(
            parse(&fat, 75).data_bytes,
            70 << 20,
            "the newest of its major"
        );
        assert_eq!(parse(&fat, 86).data_bytes, 80 << 20);
        assert_eq!(
            parse(&fat, 90).data_bytes,
            40,
            "compressed: its uncompressed size"
        );
        assert_eq!(parse(&fat, 100).data_bytes, 1_048_576 + 1024, "the PTX");
        assert_eq!(parse(&fat, 60).device_bytes(), 0, "nothing it loads");
        // SAFETY: a complete image in a live buffer.
        let read = unsafe { image_at(fat.as_ptr().cast()) };
        assert_eq!(read.unwrap().len(), fat.len());
        let text = b"abc\0def";
        // SAFETY: NUL-terminated.
        assert_eq!(unsafe { image_at(text.as_ptr().cast()) }.unwrap(), b"abc");
        // SAFETY: null is allowed.
        assert!(unsafe { image_at(std::ptr::null()) }.is_none());
    }

    /// A fatbin of `entries` (kind, arch, PTX ISA), each with an 8-byte payload of zeros.
    pub(crate) fn code_fatbin(entries: &[(u16, u32, u32)]) -> Vec<u8> {
        const PAYLOAD: &[u8] = &[0; 8];
        let plain: Vec<_> = entries
            .iter()
            .map(|&(kind, arch, _)| (kind, arch, 0, PAYLOAD))
            .collect();
        let mut fat = fatbin(&plain);
        for (i, &(_, _, isa)) in entries.iter().enumerate() {
            let at = 16 + i * (64 + PAYLOAD.len());
            fat[at + 0x18..at + 0x1A].copy_from_slice(&((isa % 10) as u16).to_le_bytes());
            fat[at + 0x1A..at + 0x1C].copy_from_slice(&((isa / 10) as u16).to_le_bytes());
        }
        fat
    }

    #[test]
    fn an_image_names_the_cards_it_has_code_for() {
        // PyTorch 2.15's kind: machine code for 7.5 and up, no PTX.
        let torch = code_fatbin(&[(2, 75, 0), (2, 80, 0), (2, 90, 0), (2, 120, 0)]);
        let code = parse(&torch, 90).code;
        assert_eq!(code.len(), 4);
        assert_eq!(code[2], Code::Sass { arch: 90 });
        assert_eq!(code_for_card(&code, 90, 13000), Ok(()));
        assert_eq!(code_for_card(&code, 86, 13000), Ok(()), "sm_80 runs on 8.6");
        assert_eq!(
            code_for_card(&code, 70, 13000),
            Err(gpuslice_abi::cuda::result::CUDA_ERROR_NO_BINARY_FOR_GPU),
            "nothing for a V100"
        );
        assert_eq!(
            code_for_card(&code, 100, 13000),
            Err(gpuslice_abi::cuda::result::CUDA_ERROR_NO_BINARY_FOR_GPU),
            "machine code never crosses a major version"
        );
        // ggml's kind: PTX 8.4 for compute_50..90, machine code for 8.6 and 8.9.
        let ggml = code_fatbin(&[
            (1, 50, 84),
            (1, 70, 84),
            (1, 90, 84),
            (2, 86, 0),
            (2, 89, 0),
        ]);
        let code = parse(&ggml, 90).code;
        assert_eq!(code[0], Code::Ptx { arch: 50, isa: 84 });
        assert_eq!(code_for_card(&code, 70, 13000), Ok(()), "compute_70 JITs");
        assert_eq!(code_for_card(&code, 100, 13000), Ok(()), "compute_90 JITs");
        assert_eq!(
            code_for_card(&code, 70, 12020),
            Err(gpuslice_abi::cuda::result::CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
            "a 535 driver (12.2) has no JIT for PTX 8.4"
        );
        assert_eq!(
            code_for_card(&code, 86, 12020),
            Ok(()),
            "but sm_86 code runs"
        );
        // No entries, unknown kinds: nothing said, runs anywhere.
        assert_eq!(
            code_for_card(&parse(&code_fatbin(&[(4, 70, 0)]), 90).code, 90, 13000),
            Ok(())
        );

        let ptx = ".version 8.7\n.target sm_90a\n.address_size 64\n";
        assert_eq!(
            parse(ptx.as_bytes(), 90).code,
            vec![Code::Ptx { arch: 90, isa: 87 }]
        );
        let mut cubin = elf(&[(".text.k", 8, 0x6, 16)]);
        cubin[7] = 0x33;
        cubin[0x30..0x34].copy_from_slice(&0x0056_0556u32.to_le_bytes());
        assert_eq!(parse(&cubin, 90).code, vec![Code::Sass { arch: 86 }]);
        cubin[7] = 0x41;
        cubin[0x30..0x34].copy_from_slice(&0x0600_6402u32.to_le_bytes());
        assert_eq!(parse(&cubin, 90).code, vec![Code::Sass { arch: 100 }]);
    }

    #[test]
    fn the_newest_ptx_a_driver_compiles_follows_the_isa_history() {
        assert_eq!(max_ptx_isa(11040), 74);
        assert_eq!(max_ptx_isa(12020), 82);
        assert_eq!(max_ptx_isa(12060), 85);
        assert_eq!(max_ptx_isa(12080), 87);
        assert_eq!(max_ptx_isa(12090), 88);
        assert_eq!(max_ptx_isa(13000), 90);
        assert_eq!(max_ptx_isa(13020), 92);
    }

    #[test]
    fn the_local_bytes_knob_is_parsed() {
        let m = parse_local_bytes("a=10, b = 20,bad,c=x");
        assert_eq!(m.len(), 2);
        assert_eq!(m["a"], 10);
        assert_eq!(m["b"], 20);
    }
}
