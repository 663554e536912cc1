//! Generates the prototype's exports: as many naked trampolines as the shim has hooked names
//! (96) plus `dlsym`, each `jmp [slot]` into a table that starts out pointing at the loader.

use std::fmt::Write;

fn main() {
    let mut names: Vec<String> = (0..96).map(|i| format!("cuProto{i}")).collect();
    names.push("dlsym".into());
    let mut out = String::new();
    writeln!(out, "pub const EXPORTS: usize = {};", names.len()).unwrap();
    for (i, name) in names.iter().enumerate() {
        writeln!(
            out,
            "#[unsafe(naked)] #[no_mangle] pub unsafe extern \"C\" fn {name}() {{ \
             core::arch::naked_asm!(\"mov r11d, {i}\", \"jmp qword ptr [rip + {{slots}} + {}]\", \
             slots = sym crate::SLOTS) }}",
            8 * i
        )
        .unwrap();
    }
    let path = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).join("exports.rs");
    std::fs::write(path, out).unwrap();
}
