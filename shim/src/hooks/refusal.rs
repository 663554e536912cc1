//! Fail closed, as the process sees it: the one `[gpuslice]` line on stderr, which names
//! where the fault is and what to run, and which entry points still answer.
//!
//! Every hooked entry point refuses (`CUDA_ERROR_NOT_INITIALIZED`, `NVML_ERROR_UNINITIALIZED`,
//! see `registry`), except the ones marked `[open]` in the registry: `cuGetProcAddress` and
//! `cuGetProcAddress_v2`. Bindings that build their whole function table through them
//! (cuda-bindings, the CUDA runtime) take a refused lookup for a missing function and raise
//! "function cuInit is not found" instead of showing the error, so they are answered as
//! usual: hooked functions map to our wrappers, which refuse, and the driver's own functions
//! that need no initialisation (`cuDriverGetVersion`, `cuGetErrorString`, `cuGetErrorName`)
//! keep working, so a client can print the refusal. Nothing reaches the GPU: every other
//! driver function answers `CUDA_ERROR_NOT_INITIALIZED` while the real `cuInit` has not run,
//! and `cuInit` is always our refusing wrapper (`proc_address`).

use gpuslice_common::config::ConfigError;

/// Where an invalid configuration came from, which decides what the line tells the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The limit file or HAMi env (`ConfigError::origin` is a path or a variable name).
    Configuration,
    /// The slice's shared region, at this path (`origin` names where the path is set).
    Region(String),
    /// The shim itself failed while loading (a contained panic).
    Internal,
}

/// The one line a fail-closed process prints (without the `[gpuslice]` prefix).
pub(crate) fn refusal_line(error: &ConfigError, fault: Fault) -> String {
    let origin = &error.origin;
    let remedy = match fault {
        Fault::Configuration if origin.contains('/') => format!("run `gpuslice check {origin}`"),
        Fault::Configuration => "run `gpuslice check` to see what the shim loads".to_string(),
        Fault::Region(path) => format!(
            "`gpuslice status --region {path}` shows it; `gpuslice reset --region {path}` \
             rebuilds a corrupt one"
        ),
        Fault::Internal => "please report this".to_string(),
    };
    format!("{error}; CUDA and NVML calls are refused until it is fixed ({remedy})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(origin: &str, field: &str) -> ConfigError {
        ConfigError {
            origin: origin.into(),
            field: field.into(),
            problem: "bad".into(),
        }
    }

    #[test]
    fn the_line_names_the_origin_and_what_to_run() {
        let line = refusal_line(
            &error("/etc/gpuslice/limits.json", "devices[0].memory"),
            Fault::Configuration,
        );
        assert!(line.starts_with(
            "invalid configuration /etc/gpuslice/limits.json: devices[0].memory: bad"
        ));
        assert!(line.contains("refused"), "{line}");
        assert!(
            line.contains("run `gpuslice check /etc/gpuslice/limits.json`"),
            "{line}"
        );

        let line = refusal_line(&error("CUDA_DEVICE_MEMORY_LIMIT", ""), Fault::Configuration);
        assert!(line.contains("CUDA_DEVICE_MEMORY_LIMIT: bad"), "{line}");
        assert!(line.contains("run `gpuslice check` "), "{line}");

        let line = refusal_line(
            &error("/tmp/a.region", ""),
            Fault::Region("/tmp/a.region".into()),
        );
        assert!(
            line.contains("gpuslice reset --region /tmp/a.region"),
            "{line}"
        );
        assert!(!line.contains("gpuslice check"), "{line}");
        assert_eq!(line.lines().count(), 1);
    }
}
