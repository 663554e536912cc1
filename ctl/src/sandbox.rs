//! A private slice on this machine, shared by `run` and `demo`: a temporary directory with a
//! limit file and a region, the shim to preload, and (when there is no NVIDIA driver, or when
//! asked) the simulated GPU laid out by `fakegpu install`. Removing the directory is the
//! cleanup; `Drop` does it.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuslice_common::config::{self, SliceConfig};

use crate::error::{CliError, CliResult};
use crate::smi::Card;

/// Env variables that point the shim at a slice; removed for "host view" commands.
const SLICE_ENV: [&str; 2] = [config::CONFIG_ENV, "LD_PRELOAD"];

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> CliResult<TempDir> {
        let template = std::env::temp_dir().join(format!("{prefix}-XXXXXX"));
        let mut bytes = template.into_os_string().into_vec();
        bytes.push(0);
        // SAFETY: `bytes` is a writable NUL-terminated template ending in XXXXXX, as mkdtemp
        // requires; it rewrites the Xs in place.
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(CliError::runtime(format!(
                "cannot create a temporary directory in {} ({e}); set TMPDIR to a writable directory",
                std::env::temp_dir().display()
            )));
        }
        bytes.pop();
        Ok(TempDir(PathBuf::from(OsString::from_vec(bytes))))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The simulated GPU's libraries and state.
#[derive(Debug, Clone)]
pub struct FakeGpu {
    pub lib_dir: PathBuf,
    pub state: PathBuf,
    /// FAKEGPU_DEVICES to pass (None = inherit).
    pub devices: Option<String>,
}

/// Where this binary lives; the shim, fakegpu and the client programs are looked up here.
pub fn exe_dir() -> CliResult<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::runtime(format!("cannot locate the gpuslice binary ({e})")))?;
    Ok(exe
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

/// A program or library that must sit beside `gpuslice`.
pub fn sibling(name: &str, how_to_build: &str) -> CliResult<PathBuf> {
    let dir = exe_dir()?;
    let path = dir.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(CliError::runtime(format!(
            "cannot find {name} beside gpuslice in {}; {how_to_build}",
            dir.display()
        )))
    }
}

/// `--lib PATH`, else `libgpuslice.so` beside this binary; either way with its core
/// (`libgpuslice_core.so`) beside it, without which every CUDA call would fail closed.
pub fn find_shim(lib: Option<&Path>) -> CliResult<PathBuf> {
    let shim = match lib {
        Some(path) if path.is_file() => crate::slice::absolute(path),
        Some(path) => {
            return Err(CliError::invalid(format!(
                "--lib {}: no such file; give the path of libgpuslice.so",
                path.display()
            )))
        }
        None => sibling(
            "libgpuslice.so",
            "build it with `cargo build -p gpuslice-shim` or pass --lib PATH",
        )?,
    };
    let core = gpuslice_common::cdi::core_beside(&shim);
    if !core.is_file() {
        return Err(CliError::invalid(format!(
            "{}: {} is missing beside it (the shim is two files; `cargo build -p \
             gpuslice-shim` builds both)",
            shim.display(),
            core.display()
        )));
    }
    Ok(shim)
}

/// Whether a real NVIDIA driver is usable: a device node and a loadable libcuda.so.1.
pub fn real_driver_present() -> bool {
    if !Path::new("/dev/nvidia0").exists() {
        return false;
    }
    let name = CString::new("libcuda.so.1").unwrap_or_default();
    // SAFETY: `name` is NUL-terminated; the handle is closed right away and nothing from it
    // is used.
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

/// Lays out the simulated GPU in `dir/fakegpu` with the `fakegpu` binary beside gpuslice.
pub fn install_fake(dir: &Path, devices: Option<String>) -> CliResult<FakeGpu> {
    let fakegpu = sibling(
        "fakegpu",
        "build it with `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml`",
    )?;
    let lib_dir = dir.join("fakegpu");
    let output = Command::new(&fakegpu)
        .arg("install")
        .arg(&lib_dir)
        .output()
        .map_err(|e| CliError::runtime(format!("cannot run {} ({e})", fakegpu.display())))?;
    if !output.status.success() {
        return Err(CliError::runtime(format!(
            "`fakegpu install` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let state = std::env::var_os("FAKEGPU_STATE")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("fakegpu.state"));
    Ok(FakeGpu {
        lib_dir,
        state,
        devices,
    })
}

/// A private slice ready to run commands in.
#[derive(Debug)]
pub struct Sandbox {
    pub config_path: PathBuf,
    pub region_path: PathBuf,
    pub shim: PathBuf,
    pub fake: Option<FakeGpu>,
    // Held for its Drop (removes the directory); last, so dropped after everything else.
    _dir: TempDir,
}

impl Sandbox {
    /// Creates the temp dir (and the fake GPU when `use_fake`); the limit file is written
    /// later with `write_config` once the caller has checked it against the card.
    pub fn create(
        prefix: &str,
        shim: PathBuf,
        use_fake: bool,
        fake_devices: Option<String>,
    ) -> CliResult<Sandbox> {
        let dir = TempDir::new(prefix)?;
        let fake = if use_fake {
            Some(install_fake(dir.path(), fake_devices)?)
        } else {
            None
        };
        Ok(Sandbox {
            config_path: dir.path().join("limits.json"),
            region_path: dir.path().join("slice.region"),
            shim,
            fake,
            _dir: dir,
        })
    }

    /// Writes `config` (its region set to this sandbox's) as the slice's limit file.
    pub fn write_config(&self, config: &SliceConfig) -> CliResult<SliceConfig> {
        let mut config = config.clone();
        config.region_path = Some(self.region_path.clone());
        let config = crate::slice::validate(&config)?;
        crate::write::write_atomically(
            &self.config_path,
            config::to_json(&config).as_bytes(),
            true,
        )?;
        Ok(config)
    }

    /// Env for a process inside the slice: the limit file, the shim, and the fake GPU.
    pub fn in_slice(&self, cmd: &mut Command) {
        self.host_view(cmd);
        let mut preload = self.shim.as_os_str().to_os_string();
        if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(":");
            preload.push(existing);
        }
        cmd.env(config::CONFIG_ENV, &self.config_path)
            .env("LD_PRELOAD", preload);
    }

    /// Env for a process that sees the whole card (no shim), on the same (fake) GPU.
    pub fn host_view(&self, cmd: &mut Command) {
        for name in SLICE_ENV {
            cmd.env_remove(name);
        }
        if let Some(fake) = &self.fake {
            let mut path = fake.lib_dir.as_os_str().to_os_string();
            if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
                path.push(":");
                path.push(existing);
            }
            cmd.env("LD_LIBRARY_PATH", path)
                .env("FAKEGPU_STATE", &fake.state);
            if let Some(devices) = &fake.devices {
                cmd.env("FAKEGPU_DEVICES", devices);
            }
            // Managed memory as a Pascal-or-later GPU on Linux places it (what an
            // oversubscribed slice needs), unless the caller chose.
            if std::env::var_os("FAKEGPU_MANAGED_MEMORY").is_none() {
                cmd.env("FAKEGPU_MANAGED_MEMORY", "on-demand");
            }
        }
    }

    /// The cards as NVML reports them without the shim (`gpuslice smi --json` in a child,
    /// so the fake's libraries are loaded there and not into this process).
    pub fn host_cards(&self) -> CliResult<Vec<Card>> {
        let mut cmd = Command::new(self_exe()?);
        cmd.args(["smi", "--json"]);
        self.host_view(&mut cmd);
        smi_json(cmd)
    }

    /// The cards as a process inside the slice sees them.
    pub fn slice_cards(&self) -> CliResult<Vec<Card>> {
        let mut cmd = Command::new(self_exe()?);
        cmd.args(["smi", "--json"]);
        self.in_slice(&mut cmd);
        smi_json(cmd)
    }
}

pub fn self_exe() -> CliResult<PathBuf> {
    std::env::current_exe()
        .map_err(|e| CliError::runtime(format!("cannot locate the gpuslice binary ({e})")))
}

fn smi_json(mut cmd: Command) -> CliResult<Vec<Card>> {
    let output = cmd
        .output()
        .map_err(|e| CliError::runtime(format!("cannot run gpuslice smi ({e})")))?;
    if !output.status.success() {
        return Err(CliError::runtime(format!(
            "gpuslice smi failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let value: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| CliError::runtime(format!("gpuslice smi printed no JSON ({e})")))?;
    Ok(cards_from_json(&value))
}

/// Inverse of `smi::to_json` for the fields comparisons need.
pub fn cards_from_json(value: &serde_json::Value) -> Vec<Card> {
    let empty = Vec::new();
    value["devices"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|d| Card {
            index: d["index"].as_u64().unwrap_or(0) as u32,
            name: d["name"].as_str().unwrap_or("").to_string(),
            uuid: d["uuid"].as_str().unwrap_or("").to_string(),
            memory_total: d["memory"]["total"].as_u64().unwrap_or(0),
            memory_used: d["memory"]["used"].as_u64().unwrap_or(0),
            memory_free: d["memory"]["free"].as_u64().unwrap_or(0),
            gpu_util: d["utilization_gpu"].as_u64().map(|u| u as u32),
            processes: d["processes"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .map(|p| crate::smi::CardProcess {
                    pid: p["pid"].as_u64().unwrap_or(0) as u32,
                    used_memory: p["used_memory"].as_u64(),
                })
                .collect(),
        })
        .collect()
}

/// Refuses limits the cards cannot hold: memory above a card's total, or an explicitly named
/// device that does not exist. `explicit` is false when the devices were defaulted to every
/// index (then missing indices are simply not there).
pub fn check_against_cards(config: &SliceConfig, cards: &[Card], explicit: bool) -> CliResult<()> {
    use gpuslice_common::size::format_size;
    for limit in &config.devices {
        let card = cards
            .iter()
            .find(|card| limit.selector.matches(card.index, &card.uuid));
        match card {
            None if explicit => {
                return Err(CliError::invalid(format!(
                    "there is no device {} here ({} found: {}); pick one of those",
                    limit.selector,
                    cards.len(),
                    cards
                        .iter()
                        .map(|c| format!("{} {}", c.index, c.uuid))
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
            Some(card) => {
                if let Some(memory) = limit.memory_limit {
                    if memory > card.memory_total {
                        return Err(CliError::invalid(format!(
                            "memory limit {} is larger than device {} ({}, {}); use at most {}",
                            format_size(memory),
                            card.index,
                            card.name,
                            format_size(card.memory_total),
                            format_size(card.memory_total)
                        )));
                    }
                }
            }
            None => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuslice_common::config::parse_limit_file;

    #[test]
    fn a_shim_without_its_core_beside_it_is_refused() {
        let dir = std::env::temp_dir().join(format!("gpuslice-find-shim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let front = dir.join("libgpuslice.so");
        std::fs::write(&front, b"stand-in").unwrap();
        let refused = find_shim(Some(&front)).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("libgpuslice_core.so is missing"),
            "{refused}"
        );
        std::fs::write(dir.join("libgpuslice_core.so"), b"stand-in").unwrap();
        assert_eq!(find_shim(Some(&front)).unwrap(), front);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn card() -> Card {
        Card {
            index: 0,
            name: "Tesla V100-PCIE-32GB".into(),
            uuid: "GPU-aaaaaaaa-0000-0000-0000-000000000000".into(),
            memory_total: 32 << 30,
            memory_used: 0,
            memory_free: 32 << 30,
            gpu_util: None,
            processes: vec![],
        }
    }

    fn config(devices: &str) -> SliceConfig {
        parse_limit_file(
            Path::new("t"),
            &format!("{{\"version\": 1, \"devices\": [{devices}]}}"),
        )
        .unwrap()
    }

    #[test]
    fn limits_larger_than_the_card_or_missing_devices_are_refused() {
        let cards = [card()];
        assert!(check_against_cards(&config(r#"{"index":0,"memory":"8g"}"#), &cards, true).is_ok());
        let err = check_against_cards(&config(r#"{"index":0,"memory":"64g"}"#), &cards, true)
            .unwrap_err();
        assert!(
            err.message.contains("larger than device 0"),
            "{}",
            err.message
        );
        assert_eq!(err.code, crate::error::EXIT_INVALID);
        assert!(
            check_against_cards(&config(r#"{"index":1,"memory":"1g"}"#), &cards, true).is_err()
        );
        assert!(
            check_against_cards(&config(r#"{"index":1,"memory":"1g"}"#), &cards, false).is_ok()
        );
        assert!(check_against_cards(
            &config(r#"{"uuid":"gpu-AAAAAAAA-0000-0000-0000-000000000000","memory":"1g"}"#),
            &cards,
            true
        )
        .is_ok());
    }

    #[test]
    fn temp_dirs_are_removed_on_drop() {
        let dir = TempDir::new("gpuslice-test").unwrap();
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("x"), b"x").unwrap();
        drop(dir);
        assert!(!path.exists());
    }
}
