//! NVML utilisation derived from the fake GPU's kernel timeline (timing-dependent: run alone).

mod common;
