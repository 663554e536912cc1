//! The limit-file contract: what a slice is (per-device memory cap and compute share, the
//! shared-region path, the compute policy) and where it comes from.
//!
//! Sources, in order:
//! 1. the **anchored** limit file [`DEFAULT_CONFIG_PATH`] (`/etc/gpuslice/limits.json`, compiled
//!    in). When it exists, it is the whole configuration: nothing in the environment can select
//!    another file (`GPUSLICE_CONFIG` is ignored) or change what is enforced (the HAMi
//!    variables are ignored); each ignored variable that is set becomes a warning
//!    ([`LoadOutcome::warnings`]). A tenant can set any variable but cannot replace a
//!    read-only mounted file, so only this rule makes the operator's file win.
//! 2. where no anchored file exists (a developer's machine, `gpuslice run`): the file named by
//!    `GPUSLICE_CONFIG`;
//! 3. else HAMi-compatible env (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`, ...).
//!
//! A file that exists but is malformed fails closed (`Loaded::Invalid`); nothing at all is
//! `Loaded::Unconfigured` (pure pass-through). A limit file larger than [`MAX_FILE_BYTES`] or
//! with more than [`MAX_DEVICE_ENTRIES`] device entries is malformed; parsing is linear in
//! the file's size.
//!
//! The types below are shared by the shim and the CLI (and a limit file written by one
//! version is read by another): add items, never rename or remove them.
//!
//! ## Limit file (schema version 1)
//! ```json
//! {"version": 1,
//!  "region": "/var/run/gpuslice/slice-a.region",
//!  "policy": "cap",
//!  "priority": "normal",
//!  "log": "error",
//!  "context_overhead": "768MiB",
//!  "devices": [
//!     {"uuid": "GPU-8a5d...", "memory": "8GiB", "compute": 25},
//!     {"index": 1, "memory": 17179869184, "virtual": "24GiB"}
//!  ]}
//! ```
//! `version` and `devices` are required (`devices` may be empty); `region` must be an
//! absolute path (a relative one would differ per process working directory and split the
//! slice); `policy` is `cap|burst|off` (default `cap`); `priority` is `high|normal|low` (default
//! `normal`: who gets idle time first under `burst`); `log` is `off|error|warn|info|debug|trace`;
//! `context_overhead` (a size, not 0, at most 1 TiB; default 512 MiB) is the most one CUDA
//! context may cost on the slice's cards: what a first context reserves before its cost is
//! measured, and what contexts made alongside each other reserve (set it near the dearest
//! context the cards make).
//! Each device names exactly one of `uuid` or `index` (0..=15), and may give `memory` (size
//! string or integer bytes, not 0), `compute` (1..=100) and `virtual` (opt-in
//! oversubscription: a size at least `memory`, given only beside it; the slice's processes are
//! told and may allocate this much, the card holds at most `memory` for them and the rest is
//! placed in the container's host memory). A `uuid` is spelled as
//! `nvidia-smi -L` prints it: `GPU-` and 32 hex digits grouped 8-4-4-4-12, or a MIG device's
//! `MIG-<same grouping>` / `MIG-GPU-<uuid>/<gi>/<ci>` (any case); anything else is a syntax
//! error, so a truncated or prefix-less UUID cannot be accepted. `region` is at most
//! `PATH_MAX - 1` bytes with no component over `NAME_MAX` (255) bytes. Unknown fields,
//! duplicate keys and duplicate selectors are errors: a typo must never quietly mean
//! "unlimited". An entry that is well formed but names no device of the node is refused by
//! the shim and by `gpuslice check` once they know the devices (see [`crate::visible`]).
//!
//! ## HAMi env (fallback when no file exists)
//! * `CUDA_DEVICE_MEMORY_LIMIT` is the default for every device; HAMi's un-indexed limit is
//!   turned into one `Index` entry for each of the first [`MAX_DEVICES`] (16) indices, because
//!   the pinned types have no wildcard selector. `CUDA_DEVICE_MEMORY_LIMIT_<i>` overrides index
//!   `i`. Values use the size grammar of [`crate::size`] ("3000m", "8g", bytes); `0` means
//!   unlimited, as in HAMi.
//! * `CUDA_DEVICE_SM_LIMIT[_<i>]`: percent, same default/override rule; `0` and `100` mean not
//!   throttled (HAMi's meaning), above 100 is an error.
//! * `CUDA_DEVICE_MEMORY_SHARED_CACHE`: the region path (absolute).
//! * `GPU_CORE_UTILIZATION_POLICY`: `default` and `force` -> `Cap` (HAMi's default already caps),
//!   `disable` -> `Off`.
//! * `CUDA_TASK_PRIORITY`: `0` -> `High`, `1` -> `Low` (unset: `Normal`). It orders who gets
//!   idle time under `burst`, which only a limit file selects: with HAMi's policies it is
//!   accepted and has no effect.
//! * `CUDA_OVERSUBSCRIBE=true` (HAMi's `deviceMemoryScaling` above 1) is not honoured: HAMi
//!   puts the oversubscribed size in the limit variables and the physical share in none, so
//!   there is nothing to keep the card within. The limit stays a hard cap; a warning says so.
//! * `LIBCUDA_LOG_LEVEL`: HAMi's 0..4 -> `0` Error, `1`/`2` Warn, `3` Info, `4` Debug, `5+` Trace
//!   (HAMi has no "off": it always prints errors); level names are accepted too.
//!
//! A variable set to the empty string counts as unset (Kubernetes manifests often render
//! missing values that way). A set variable with a bad value is `Loaded::Invalid` naming the
//! variable, never ignored.
//!
//! ## Log level precedence
//! `GPUSLICE_LOG` (names only) over the file's `log` over `LIBCUDA_LOG_LEVEL`. The log level
//! is the one input a tenant keeps under an anchored file: it changes what is printed, never
//! what is enforced.

mod hami;
mod load;
mod parse;
mod schema;
mod serialise;
mod strict_json;

pub use crate::MAX_DEVICES;
pub use hami::{from_hami_env, hami_indexed_variables};
pub use load::{load, load_anchored, LoadOutcome};
pub use parse::{check_uuid, parse_context_bound_text, parse_limit_file};
pub use schema::*;
pub use serialise::to_json;

/// The anchored limit file: its location is compiled in, so no input of the tenant's can move
/// it. When it exists it wins over every environment variable (see the module doc).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpuslice/limits.json";
/// Env variable naming the limit file where no anchored file exists.
pub const CONFIG_ENV: &str = "GPUSLICE_CONFIG";
/// Largest limit file read: far above any real one (a few hundred bytes per device), small
/// enough that every process's first CUDA call parses it in well under a millisecond.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Most device entries in one limit file: a node has at most a few dozen GPUs and MIG
/// devices, and an entry naming no device of the node is refused anyway.
pub const MAX_DEVICE_ENTRIES: usize = 128;
/// Longest region path (Linux `PATH_MAX` less its NUL) and longest component (`NAME_MAX`).
pub(crate) const MAX_REGION_PATH: usize = 4095;
pub(crate) const MAX_REGION_NAME: usize = 255;
/// Current schema version written by `gpuslice write`.
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// Env variable that overrides the log level (names only: off|error|warn|info|debug|trace).
pub(crate) const LOG_ENV: &str = "GPUSLICE_LOG";
/// HAMi: default memory limit for every device (`_<i>` suffix: one device index).
pub const HAMI_MEMORY_LIMIT_ENV: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// HAMi: default compute share in percent (`_<i>` suffix: one device index).
pub(crate) const HAMI_SM_LIMIT_ENV: &str = "CUDA_DEVICE_SM_LIMIT";
/// HAMi: shared-region path.
pub(crate) const HAMI_SHARED_CACHE_ENV: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// HAMi: compute policy (`default|force|disable`).
pub(crate) const HAMI_POLICY_ENV: &str = "GPU_CORE_UTILIZATION_POLICY";
/// HAMi: task priority (`0` high, `1` low).
pub(crate) const HAMI_PRIORITY_ENV: &str = "CUDA_TASK_PRIORITY";
/// HAMi: log level 0..4.
pub(crate) const HAMI_LOG_LEVEL_ENV: &str = "LIBCUDA_LOG_LEVEL";
/// HAMi: memory oversubscription on (`true`); not honoured (see `hami`), only reported.
pub(crate) const HAMI_OVERSUBSCRIBE_ENV: &str = "CUDA_OVERSUBSCRIBE";
/// Longest UUID the region header can store (it keeps a NUL-terminated `[u8; 64]`).
pub(crate) const MAX_UUID_LEN: usize = 63;

/// The region file when the configuration names none (`/tmp` is private to a container, so
/// all its processes meet there).
pub const DEFAULT_REGION_PATH: &str = "/tmp/gpuslice.region";

#[cfg(test)]
mod tests;
