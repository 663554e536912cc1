//! The import-direction rule, checked (a test, compiled only under `cfg(test)`): a module may
//! use its own layer and the layers below it, never one above, and never a sibling: two
//! modules of one layer (`memory` and `throttle`) do not import each other, so each can be
//! read, changed and tested without the other.
//!
//! 1. hooks: `hooks/` (what a client reaches, and the process lifecycle that drives the
//!    session's state);
//! 2. policy: `memory/` and `throttle/` (siblings);
//! 3. session: `session/` (this process's slice: region and slot, host PID, clock, mode,
//!    the fork reset);
//! 4. ground: `ground/`.
//!
//! Below them all, outside this crate, the pure policy models (the token bucket, the share
//! controller, the launch-cost probe; the memory ledger, its books, the object table and the
//! reporting math) are the crate `gpuslice-policy` (`shim/policy/`), which the shim depends
//! on and which cannot name it: Cargo, not this test, keeps the models from reaching up. The
//! shim's units call its facade; its own test keeps its memory and throttle models siblings.
//!
//! Each file's module is its place under `src/`; each `crate::X` (and `$crate::X`) in its
//! code (comments left out) is looked up by `X`. A file or module the table below does not
//! know fails the test too, so a new one must be given a layer. `super::` stays inside a
//! folder, so one module; `super::super` is refused. The one declaration the ground expands
//! from above is the registry's `hook_table!` (by name, not by path): `ground::driver` takes
//! the signatures from it and ignores the handlers it names.

use std::path::Path;

/// The layers, from the top down (`Ord`: a smaller layer is a higher one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Hooks,
    Policy,
    Session,
    Ground,
}

/// A top-level module as the rule sees it: its layer, and the unit of that layer it belongs
/// to (modules of one unit may import each other; siblings, other units of the layer, not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unit {
    layer: Layer,
    name: &'static str,
}

/// The unit of the top-level module (or crate-root macro) `name`.
fn unit_of(name: &str) -> Option<Unit> {
    let unit = |layer, name| Some(Unit { layer, name });
    match name {
        "hooks" => unit(Layer::Hooks, "hooks"),
        "memory" => unit(Layer::Policy, "memory"),
        "throttle" => unit(Layer::Policy, "throttle"),
        "session" => unit(Layer::Session, "session"),
        "ground" => unit(Layer::Ground, "ground"),
        // `#[macro_export]` macros of `ground::log` and `ground::ffi_boundary` (crate root).
        "log_at" | "log_error" | "log_warn" | "log_info" | "log_debug" | "ffi_panic_boundary" => {
            unit(Layer::Ground, "ground")
        }
        _ => None,
    }
}

/// The unit of a file by its path under `src/` (`hooks/memory.rs` -> hooks).
fn file_unit(relative: &Path) -> Option<Unit> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    unit_of(first.strip_suffix(".rs").unwrap_or(first))
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

/// Every place in `source` (a file of unit `unit`) that names a module of a higher layer, a
/// sibling of its own layer, or one no layer is known for: (line number, what it names).
fn violations(unit: Unit, source: &str) -> Vec<(usize, String)> {
    let code = code_only(source);
    let line_of = |offset: usize| code[..offset].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut check = |offset: usize, name: &str| match unit_of(name) {
        Some(named) if named.layer > unit.layer || named == unit => {}
        Some(named) if named.layer == unit.layer => found.push((
            line_of(offset),
            format!(
                "crate::{name} (sibling {} of {:?})",
                named.name, named.layer
            ),
        )),
        Some(named) => found.push((
            line_of(offset),
            format!("crate::{name} ({:?})", named.layer),
        )),
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
    found.sort();
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
        let Some(unit) = file_unit(relative) else {
            problems.push(format!(
                "{}: no layer known for this file",
                relative.display()
            ));
            continue;
        };
        let source = std::fs::read_to_string(file).unwrap();
        for (line, named) in violations(unit, &source) {
            problems.push(format!(
                "{}:{line}: {} ({:?}) names {named}",
                relative.display(),
                unit.name,
                unit.layer
            ));
        }
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    assert!(
        problems.is_empty(),
        "imports must run downward (hooks -> policy -> session -> ground), never between siblings, see docs/architecture.md:\n{}",
        problems.join("\n")
    );
}

/// The units the mutation tests check as.
const HOOKS: Unit = Unit {
    layer: Layer::Hooks,
    name: "hooks",
};
const MEMORY: Unit = Unit {
    layer: Layer::Policy,
    name: "memory",
};
const THROTTLE: Unit = Unit {
    layer: Layer::Policy,
    name: "throttle",
};
const SESSION: Unit = Unit {
    layer: Layer::Session,
    name: "session",
};
const GROUND: Unit = Unit {
    layer: Layer::Ground,
    name: "ground",
};

#[test]
fn an_import_of_a_higher_layer_is_caught_and_one_of_a_lower_layer_passes() {
    let source = "use crate::memory::ledger;\n\
                  // crate::hooks in a comment names nothing\n\
                  use crate::{ground::log, hooks};\n\
                  let x = crate::ground::driver::real::cuInit();\n\
                  crate::log_error!(\"x\");\n\
                  use crate::something_new;\n\
                  use super::super::hooks;\n\
                  let t = crate::session::clock::now_ns();\n";
    assert_eq!(
        violations(GROUND, source),
        vec![
            (1, "crate::memory (Policy)".to_string()),
            (3, "crate::hooks (Hooks)".to_string()),
            (6, "crate::something_new (no layer known)".to_string()),
            (7, "super::super (leaves the folder)".to_string()),
            (8, "crate::session (Session)".to_string()),
        ]
    );
    let session = violations(SESSION, source);
    assert_eq!(session.len(), 4, "{session:?}");
    assert_eq!(session[0], (1, "crate::memory (Policy)".to_string()));
    let policy = violations(MEMORY, source);
    assert_eq!(policy.len(), 3, "{policy:?}");
    assert_eq!(policy[0], (3, "crate::hooks (Hooks)".to_string()));
    assert_eq!(violations(HOOKS, source).len(), 2, "only the unknowns");
    assert_eq!(file_unit(Path::new("hooks/memory.rs")), Some(HOOKS));
    assert_eq!(file_unit(Path::new("hooks/lifecycle.rs")), Some(HOOKS));
    assert_eq!(
        file_unit(Path::new("lifecycle.rs")),
        None,
        "no module outside the layers"
    );
    assert_eq!(file_unit(Path::new("memory/ledger.rs")), Some(MEMORY));
    assert_eq!(file_unit(Path::new("throttle/watcher.rs")), Some(THROTTLE));
    assert_eq!(file_unit(Path::new("session/mode.rs")), Some(SESSION));
    assert_eq!(file_unit(Path::new("ground/real.rs")), Some(GROUND));
    assert_eq!(file_unit(Path::new("elsewhere.rs")), None);
}

/// Mutations the checker must fail on: a policy naming its sibling (either way, as a path or
/// inside a `use` group), and the session or the ground naming a policy above it.
#[test]
fn a_sibling_import_and_an_upward_import_are_caught() {
    let memory_names_throttle = "fn f() -> u64 { crate::throttle::now_ns() }\n";
    assert_eq!(
        violations(MEMORY, memory_names_throttle),
        vec![(
            1,
            "crate::throttle (sibling throttle of Policy)".to_string()
        )]
    );
    let throttle_names_memory = "use crate::{session::clock, memory::region};\n";
    assert_eq!(
        violations(THROTTLE, throttle_names_memory),
        vec![(1, "crate::memory (sibling memory of Policy)".to_string())]
    );
    // The unit's own name passes: `crate::memory` inside memory/ is no sibling.
    assert!(violations(MEMORY, "use crate::memory::ledger;\n").is_empty());
    assert!(violations(THROTTLE, "use crate::session::host_pid;\n").is_empty());
    let session_names_policy = "let r = crate::memory::region();\n";
    assert_eq!(
        violations(SESSION, session_names_policy),
        vec![(1, "crate::memory (Policy)".to_string())]
    );
    assert_eq!(
        violations(GROUND, "$crate::session::fork::reset();\n"),
        vec![(1, "crate::session (Session)".to_string())]
    );
}
