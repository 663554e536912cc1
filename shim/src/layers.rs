//! The import-direction rule, checked (a test, compiled only under `cfg(test)`): a module may
//! use its own layer and the layers below it, never one above.
//!
//! 1. hooks: `hooks/` and `lifecycle.rs` (what a client reaches, and the process lifecycle);
//! 2. policy: `memory/` and `throttle/`;
//! 3. ground: `ground/`.
//!
//! Each file's layer is its place under `src/`; each `crate::X` (and `$crate::X`) in its code
//! (comments left out) is looked up by `X`. A file or module the table below does not know
//! fails the test too, so a new one must be given a layer. `super::` stays inside a folder, so
//! one layer; `super::super` is refused. The one declaration the ground expands from above is
//! the registry's `hook_table!` (by name, not by path): `ground::driver` takes the signatures
//! from it and ignores the handlers it names.

use std::path::Path;

/// The layers, from the top down (`Ord`: a smaller layer is a higher one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Hooks,
    Policy,
    Ground,
}

/// The layer of the top-level module (or crate-root macro) `name`.
fn layer_of(name: &str) -> Option<Layer> {
    match name {
        "hooks" | "lifecycle" => Some(Layer::Hooks),
        "memory" | "throttle" => Some(Layer::Policy),
        "ground" => Some(Layer::Ground),
        // `#[macro_export]` macros of `ground::log` and `ground::ffi_boundary` (crate root).
        "log_at" | "log_error" | "log_warn" | "log_info" | "log_debug" | "ffi_panic_boundary" => {
            Some(Layer::Ground)
        }
        _ => None,
    }
}

/// The layer of a file by its path under `src/` (`hooks/memory.rs` -> hooks).
fn file_layer(relative: &Path) -> Option<Layer> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    layer_of(first.strip_suffix(".rs").unwrap_or(first))
}

/// `source` without `//` comments (a `//` inside a string literal cuts the rest of its line,
/// which can only hide a path, never invent one).
fn code_only(source: &str) -> String {
    source
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every place in `source` (a file of layer `layer`) that names a module of a higher layer,
/// or one no layer is known for: (line number, what it names).
fn violations(layer: Layer, source: &str) -> Vec<(usize, String)> {
    let code = code_only(source);
    let line_of = |offset: usize| code[..offset].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut check = |offset: usize, name: &str| match layer_of(name) {
        Some(named) if named >= layer => {}
        Some(named) => found.push((line_of(offset), format!("crate::{name} ({named:?})"))),
        None => found.push((line_of(offset), format!("crate::{name} (no layer known)"))),
    };
    for (offset, _) in code.match_indices("crate::") {
        let rest = code[offset + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::b, c};`: each top-level name of the group.
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let name = item.trim().split("::").next().unwrap_or("").trim();
                if !name.is_empty() {
                    check(offset, name);
                }
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            check(offset, &rest[..end]);
        }
    }
    for (offset, _) in code.match_indices("super::super") {
        found.push((line_of(offset), "super::super (leaves the folder)".into()));
    }
    found
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_imports_only_its_own_layer_or_the_ones_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        // The crate root declares the layers; this file names them in its own tests.
        if relative == Path::new("lib.rs") || relative == Path::new("layers.rs") {
            continue;
        }
        let Some(layer) = file_layer(relative) else {
            problems.push(format!(
                "{}: no layer known for this file",
                relative.display()
            ));
            continue;
        };
        let source = std::fs::read_to_string(file).unwrap();
        for (line, named) in violations(layer, &source) {
            problems.push(format!(
                "{}:{line}: {layer:?} layer names {named}",
                relative.display()
            ));
        }
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    assert!(
        problems.is_empty(),
        "imports must run downward (hooks -> policy -> ground), see docs/architecture.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn an_import_of_a_higher_layer_is_caught_and_one_of_a_lower_layer_passes() {
    let source = "use crate::memory::ledger;\n\
                  // crate::hooks in a comment names nothing\n\
                  use crate::{ground::log, lifecycle};\n\
                  let x = crate::ground::driver::real::cuInit();\n\
                  crate::log_error!(\"x\");\n\
                  use crate::something_new;\n\
                  use super::super::hooks;\n";
    assert_eq!(
        violations(Layer::Ground, source),
        vec![
            (1, "crate::memory (Policy)".to_string()),
            (3, "crate::lifecycle (Hooks)".to_string()),
            (6, "crate::something_new (no layer known)".to_string()),
            (7, "super::super (leaves the folder)".to_string()),
        ]
    );
    let policy = violations(Layer::Policy, source);
    assert_eq!(policy.len(), 3, "{policy:?}");
    assert_eq!(policy[0], (3, "crate::lifecycle (Hooks)".to_string()));
    assert_eq!(
        violations(Layer::Hooks, source).len(),
        2,
        "only the unknowns"
    );
    assert_eq!(file_layer(Path::new("hooks/memory.rs")), Some(Layer::Hooks));
    assert_eq!(file_layer(Path::new("lifecycle.rs")), Some(Layer::Hooks));
    assert_eq!(
        file_layer(Path::new("memory/ledger.rs")),
        Some(Layer::Policy)
    );
    assert_eq!(
        file_layer(Path::new("ground/state.rs")),
        Some(Layer::Ground)
    );
    assert_eq!(file_layer(Path::new("elsewhere.rs")), None);
}
