//! NVML utilisation derived from the fake GPU's kernel timeline: kernels of known duration
//! are launched through the fake libcuda, then NVML's device and per-process numbers are
//! compared with the time the kernels occupied.
//!
//! Timing-dependent: declared `test = false` and run alone by `cargo xtask test`
//! (`cargo test -p fakegpu-nvml --test nvml_utilization -- --test-threads=1`).
//! Needs `cargo build -p fakegpu -p fakegpu-cuda -p fakegpu-nvml` first.
//!
//! Tolerances: a read lands a little after the kernel ends (scheduling, the reaping scan);
//! the tests allow 2 percentage points (20 ms of a 1 s window). Measured on the 2-core dev
//! machine: device readings exact, per-process readings within 0.2 points (see
//! cuda-tests/README.md). Each reading is also printed to stderr for diagnosis.

mod common;

use common::{await_value, isolated, truth, Cuda, Nvml};
use gpuslice_abi::nvml::ret::*;
use gpuslice_abi::nvml::*;
use std::ffi::c_uint;
use std::time::Duration;

const MS: u64 = 1_000_000;
const TOLERANCE_PCT: i64 = 2;

/// Waits until the device timeline has no work left, whatever cuCtxSynchronize does.
fn await_idle_timeline(state: &fakegpu::SharedState) {
    await_value(Duration::from_secs(10), "device timeline drains", || {
        (state.busy_until(0) <= fakegpu::now_ns()).then_some(())
    });
}

fn within(actual: u32, expected: f64, what: &str) {
    let diff = (actual as f64 - expected).abs();
    eprintln!("{what}: NVML {actual}%, timeline {expected:.2}%");
    assert!(
        diff <= TOLERANCE_PCT as f64,
        "{what}: NVML says {actual}%, the timeline says {expected:.1}%"
    );
}

#[test]
fn device_utilization_follows_the_kernel_timeline() {
    isolated(
        "device_utilization_follows_the_kernel_timeline",
        &[("FAKEGPU_UTIL_WINDOW_MS", "1000")],
        || {
            let nvml = Nvml::load();
            nvml.init();
            let h = nvml.handle(0);
            let state = truth();
            let cuda = Cuda::load();
            cuda.init_context(0);
            let kernel = cuda.kernel();
            assert_eq!(nvml.utilization(h).gpu, 0, "nothing ran yet");

            // 400 ms of work inside a 1 s window: 40%.
            let start = fakegpu::now_ns();
            cuda.launch(kernel, 400 * MS);
            cuda.synchronize();
            await_idle_timeline(&state);
            let util = nvml.utilization(h).gpu;
            let read_at = fakegpu::now_ns();
            assert!(
                read_at - start < 900 * MS,
                "the read came too late for the kernel to be in the window"
            );
            within(util, 40.0, "one 400 ms kernel in a 1 s window");
            let direct = state.utilization_percent(0, 1000 * MS) as i64;
            assert!(
                (direct - util as i64).abs() <= 1,
                "NVML {util} vs state {direct}"
            );

            // 1.2 s of back-to-back work: the last second is fully busy.
            for _ in 0..3 {
                cuda.launch(kernel, 400 * MS);
            }
            cuda.synchronize();
            await_idle_timeline(&state);
            let util = nvml.utilization(h).gpu;
            within(util, 100.0, "a saturated window");

            // Board numbers follow utilisation.
            let temp: unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut c_uint) -> u32 =
                nvml.sym("nvmlDeviceGetTemperature");
            let power: unsafe extern "C" fn(nvmlDevice_t, *mut c_uint) -> u32 =
                nvml.sym("nvmlDeviceGetPowerUsage");
            let (mut t, mut p) = (0, 0);
            // SAFETY: valid out-pointers.
            unsafe {
                assert_eq!(temp(h, NVML_TEMPERATURE_GPU, &mut t), NVML_SUCCESS);
                assert_eq!(power(h, &mut p), NVML_SUCCESS);
            }
            assert!(t >= 65, "a busy GPU runs hot: {t} C");
            assert!(
                p >= 200_000,
                "a busy V100 draws near its 250 W limit: {p} mW"
            );

            // Once the window slides past the work, utilisation returns to 0.
            await_value(Duration::from_secs(5), "utilisation decays to 0", || {
                (nvml.utilization(h).gpu == 0).then_some(())
            });
        },
    );
}

#[test]
fn utilization_window_follows_env() {
    isolated(
        "utilization_window_follows_env",
        &[("FAKEGPU_UTIL_WINDOW_MS", "500")],
        || {
            let nvml = Nvml::load();
            nvml.init();
            let h = nvml.handle(0);
            let state = truth();
            let cuda = Cuda::load();
            cuda.init_context(0);
            let kernel = cuda.kernel();
            // 200 ms in a 500 ms window: 40% (it would be 20% in the default 1 s window).
            cuda.launch(kernel, 200 * MS);
            cuda.synchronize();
            await_idle_timeline(&state);
            within(nvml.utilization(h).gpu, 40.0, "200 ms in a 500 ms window");
        },
    );
}

#[test]
fn process_utilization_is_the_process_share_since_last_seen() {
    isolated(
        "process_utilization_is_the_process_share_since_last_seen",
        &[("FAKEGPU_PID_OFFSET", "300")],
        || {
            let nvml = Nvml::load();
            nvml.init();
            let h = nvml.handle(0);
            let state = truth();
            let cuda = Cuda::load();
            cuda.init_context(0);
            let kernel = cuda.kernel();
            type ProcUtil = unsafe extern "C" fn(
                nvmlDevice_t,
                *mut nvmlProcessUtilizationSample_t,
                *mut c_uint,
                u64,
            ) -> nvmlReturn_t;
            let util: ProcUtil = nvml.sym("nvmlDeviceGetProcessUtilization");
            let sample = |last_seen_us: u64| {
                let mut buf = [nvmlProcessUtilizationSample_t::default(); 4];
                let mut n: c_uint = 4;
                // SAFETY: buffer of `n` entries.
                let rc = unsafe { util(h, buf.as_mut_ptr(), &mut n, last_seen_us) };
                assert_eq!(rc, NVML_SUCCESS);
                assert_eq!(n, 1);
                buf[0]
            };

            // NVML's clock: wall-clock microseconds (converted as the fake does).
            let clock = fakegpu::nvml_sampling::clock();
            let last_seen_us = clock.wall_us(fakegpu::now_ns());
            cuda.launch(kernel, 300 * MS);
            cuda.synchronize();
            await_idle_timeline(&state);
            // Let the device idle as long again, so the share is about half, not all.
            let idle_until = state.busy_until(0) + 300 * MS;
            await_value(Duration::from_secs(2), "300 ms of idle time pass", || {
                (fakegpu::now_ns() >= idle_until).then_some(())
            });
            let s = sample(last_seen_us);
            assert_eq!(s.pid, std::process::id() + 300);
            let span_ms = (s.timeStamp - last_seen_us) as f64 / 1000.0;
            let expected = 300.0 / span_ms * 100.0;
            within(s.smUtil, expected, "this process's share since last_seen");

            // Nothing ran after the kernel: 0%. The timeline keeps 1 ms buckets and pro-rates
            // partial ones, so the quiet interval starts on the bucket after the kernel's end.
            let bucket = fakegpu::timeline::BUCKET_NS;
            let quiet_from = (state.busy_until(0) / bucket + 1) * bucket;
            await_value(
                Duration::from_secs(1),
                "clock passes the quiet start",
                || (fakegpu::now_ns() > quiet_from + 5_000_000).then_some(()),
            );
            // A millisecond of slack for the two processes' clock offsets.
            let quiet = sample(clock.wall_us(quiet_from) + 1_000);
            assert_eq!(quiet.smUtil, 0);
        },
    );
}
