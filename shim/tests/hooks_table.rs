//! `docs/hooks.md`, the table of every hooked function with the file and function that handle
//! it, is generated from the registry (`src/hooks/registry.rs`, which declares each hook once)
//! and must match it exactly. After changing the registry or moving a handler, rewrite it:
//!
//! ```text
//! GPUSLICE_WRITE_HOOKS_TABLE=1 cargo test -p gpuslice-shim --test hooks_table
//! ```

use std::path::{Path, PathBuf};

/// The variable that makes the test write the table instead of checking it.
const WRITE_ENV: &str = "GPUSLICE_WRITE_HOOKS_TABLE";

/// One `Cuda fn NAME(...) -> R => handler [flag];` line of the registry's `hooks { ... }`.
struct Hook {
    library: &'static str,
    name: String,
    /// `module::function` under `crate::hooks`, or `passthrough`.
    handler: String,
    flag: Option<String>,
}

fn shim_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The hooks of the registry, in its order (the order of the front's exports).
fn registry_hooks() -> Vec<Hook> {
    let path = shim_dir().join("src/hooks/registry.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text
        .find("        hooks {")
        .expect("registry.rs has a `hooks {` block");
    let end = start
        + text[start..]
            .find("        helpers {")
            .expect("registry.rs has a `helpers {` block");
    let block: String = text[start + "        hooks {".len()..end]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut hooks = Vec::new();
    // The last `;` is followed by the block's closing brace.
    for entry in block
        .split(';')
        .map(str::trim)
        .filter(|e| !e.is_empty() && *e != "}")
    {
        let (library, rest) = if let Some(rest) = entry.strip_prefix("Cuda fn ") {
            ("CUDA", rest)
        } else if let Some(rest) = entry.strip_prefix("Nvml fn ") {
            ("NVML", rest)
        } else {
            panic!(
                "registry.rs: an entry of `hooks {{` that is not `Cuda fn`/`Nvml fn`: {entry:?}"
            );
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let target = entry
            .rsplit_once("=>")
            .unwrap_or_else(|| panic!("registry.rs: {name} names no handler"))
            .1
            .trim();
        let (handler, flag) = match target.split_once('[') {
            Some((handler, flag)) => (
                handler.trim(),
                Some(flag.trim_end_matches(']').trim().to_string()),
            ),
            None => (target, None),
        };
        hooks.push(Hook {
            library,
            name,
            handler: handler.to_string(),
            flag,
        });
    }
    // Every declaration starts a line (what `shim/build.rs` counts for the front's exports).
    let declared = text[start..end]
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("Cuda fn ") || l.starts_with("Nvml fn "))
        .count();
    assert_eq!(
        hooks.len(),
        declared,
        "registry.rs: entries parsed != declarations"
    );
    hooks
}

/// The file under `shim/` that defines a handler: `hooks/<module>.rs` (or `hooks/<module>/`),
/// where `fn <function>` is written.
fn handler_file(handler: &str) -> String {
    if handler == "passthrough" {
        return "shim/src/hooks/registry.rs".into();
    }
    let (module, function) = handler
        .rsplit_once("::")
        .unwrap_or_else(|| panic!("handler {handler} is not `module::function`"));
    let base = format!("src/hooks/{}", module.replace("::", "/"));
    let candidates = [format!("{base}.rs"), format!("{base}/mod.rs")];
    let mut files: Vec<String> = candidates.to_vec();
    if let Ok(dir) = std::fs::read_dir(shim_dir().join(&base)) {
        let mut more: Vec<String> = dir
            .filter_map(|e| e.ok())
            .map(|e| format!("{base}/{}", e.file_name().to_string_lossy()))
            .filter(|f| f.ends_with(".rs"))
            .collect();
        more.sort();
        files.extend(more);
    }
    let defines = |file: &str| {
        std::fs::read_to_string(shim_dir().join(file)).is_ok_and(|text| {
            text.contains(&format!("fn {function}(")) || text.contains(&format!("fn {function}<"))
        })
    };
    let file = files
        .into_iter()
        .find(|f| defines(f))
        .unwrap_or_else(|| panic!("handler {handler}: no `fn {function}` under shim/{base}"));
    format!("shim/{file}")
}

fn table(hooks: &[Hook]) -> String {
    let mut out = String::from(
        "# Hooked functions\n\
         \n\
         Generated from `shim/src/hooks/registry.rs` (which declares each hooked function once) by\n\
         `shim/tests/hooks_table.rs`, which fails when this file and the registry differ. Do not\n\
         edit it by hand; after changing the registry or moving a handler, rewrite it with\n\
         `GPUSLICE_WRITE_HOOKS_TABLE=1 cargo test -p gpuslice-shim --test hooks_table`.\n\
         \n\
         Every function the shim exports and hooks, in the registry's order (the front's export\n\
         order), with the handler that runs for it (`crate::hooks::<handler>`) and the file that\n\
         defines it. `passthrough`: the export's shell (panic boundary, fail-closed\n\
         gate, real slot) calls the real function, no handler. `hot`: the launch fast path, a hot\n\
         export in front of the shell (`hooks::launch`). `open`: runs even in a process that\n\
         fails closed (`hooks::refusal`). How an export reaches its handler: `docs/architecture.md`,\n\
         \"One registry\".\n\
         \n\
         | # | function | library | handler | file | mark |\n\
         |---|---|---|---|---|---|\n",
    );
    for (index, hook) in hooks.iter().enumerate() {
        out.push_str(&format!(
            "| {} | `{}` | {} | `{}` | `{}` | {} |\n",
            index,
            hook.name,
            hook.library,
            hook.handler,
            handler_file(&hook.handler),
            hook.flag.as_deref().unwrap_or(""),
        ));
    }
    out
}

#[test]
fn docs_hooks_md_is_the_registry() {
    let wanted = table(&registry_hooks());
    let path: &Path = &shim_dir().join("../docs/hooks.md");
    if std::env::var_os(WRITE_ENV).is_some() {
        std::fs::write(path, &wanted).unwrap();
        return;
    }
    let found = std::fs::read_to_string(path).unwrap_or_default();
    if found != wanted {
        let first = found
            .lines()
            .zip(wanted.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(found.lines().count().min(wanted.lines().count()));
        panic!(
            "docs/hooks.md differs from the registry (first at line {}: found {:?}, wanted {:?}).\n\
             Rewrite it: {WRITE_ENV}=1 cargo test -p gpuslice-shim --test hooks_table",
            first + 1,
            found.lines().nth(first),
            wanted.lines().nth(first),
        );
    }
}
