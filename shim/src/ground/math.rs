//! The one libm function the shim calls (`exp`, from `f64::exp` in the compute-share
//! controller), built in, so that `libm.so.6` is not a dependency of `libgpuslice_core.so`.
//!
//! Why: each dependency of a library `/etc/ld.so.preload` maps is opened, mapped, relocated and
//! protected at every exec, even by programs that never touch a GPU (`/bin/true` does not load
//! libm): about +100 us per exec for libm on the development VM (`docs/performance-history.md`,
//! "Preload cost"). That is the front's concern (`shim/front/`, which names libc only); the
//! core is loaded at a process's first CUDA/NVML call, usually into a process that has libm
//! already (Python and the C++ runtime use it). So this saves little: one library at the
//! core's load where the process lacks it. It stays because it is exact (tested against libm
//! below) and costs nothing at run time; importing libm's `exp` would be a simplification, not
//! a loss (`shim/build.rs` says the same of the static unwinder).
//!
//! How: a HIDDEN `exp` symbol defined in assembly that jumps to [`exp`] below. The linker binds
//! the controller's call to it inside the library, so `exp` is neither imported (the linker's
//! `--as-needed` then drops libm) nor exported (a hidden symbol never interposes on the host
//! program's `exp`). Other architectures keep importing libm's.
//!
//! The algorithm is fdlibm's `__ieee754_exp` (via FreeBSD msun `e_exp.c`): reduction by ln 2
//! and a degree-5 Remez polynomial, error < 1 ulp. Copyright (C) 2004 by Sun Microsystems,
//! Inc. All rights reserved. Permission to use, copy, modify, and distribute this software is
//! freely granted, provided that this notice is preserved.
//! The constants are fdlibm's, bit for bit. Unlike C's `exp` it never sets `errno` (Rust's `f64::exp` does not look at it).

const O_THRESHOLD: f64 = f64::from_bits(0x4086_2e42_fefa_39ef); // 709.78
const U_THRESHOLD: f64 = f64::from_bits(0xc087_4910_d52d_3051); // -745.13
const LN2_HI: [f64; 2] = [
    f64::from_bits(0x3fe6_2e42_fee0_0000),
    f64::from_bits(0xbfe6_2e42_fee0_0000),
];
const LN2_LO: [f64; 2] = [
    f64::from_bits(0x3dea_39ef_3579_3c76),
    f64::from_bits(0xbdea_39ef_3579_3c76),
];
const HALF: [f64; 2] = [0.5, -0.5];
const INV_LN2: f64 = f64::from_bits(0x3ff7_1547_652b_82fe);
const P1: f64 = f64::from_bits(0x3fc5_5555_5555_553e);
const P2: f64 = f64::from_bits(0xbf66_c16c_16be_bd93);
const P3: f64 = f64::from_bits(0x3f11_566a_af25_de2c);
const P4: f64 = f64::from_bits(0xbebb_bd41_c5d2_6bf1);
const P5: f64 = f64::from_bits(0x3e66_3769_72be_a4d0);
/// 2^-1000, for results below the normal range.
const TWO_M1000: f64 = f64::from_bits(0x0170_0000_0000_0000);

/// e^x, to within 1 ulp (fdlibm). NaN in, NaN out; exp(+inf) = +inf, exp(-inf) = 0;
/// overflow gives +inf and underflow 0, as libm does.
pub extern "C" fn exp(x: f64) -> f64 {
    let bits = x.to_bits();
    let high = (bits >> 32) as u32;
    let sign = (high >> 31) as usize; // 1 for negative x
    let abs_high = high & 0x7fff_ffff;

    // Non-finite and out-of-range arguments.
    if abs_high >= 0x4086_2e42 {
        if abs_high >= 0x7ff0_0000 {
            if x.is_nan() {
                return x + x;
            }
            return if sign == 0 { x } else { 0.0 };
        }
        if x > O_THRESHOLD {
            return f64::INFINITY;
        }
        if x < U_THRESHOLD {
            return 0.0;
        }
    }

    // Argument reduction: x = k*ln2 + r, |r| <= 0.5*ln2, with r = hi - lo.
    let mut x = x;
    let mut k: i32 = 0;
    let mut hi = 0.0;
    let mut lo = 0.0;
    if abs_high > 0x3fd6_2e42 {
        if abs_high < 0x3ff0_a2b2 {
            hi = x - LN2_HI[sign];
            lo = LN2_LO[sign];
            k = 1 - 2 * sign as i32;
        } else {
            // |x| <= 745.2 here, so k fits easily; `as` truncates toward zero like C.
            k = (INV_LN2 * x + HALF[sign]) as i32;
            let t = f64::from(k);
            hi = x - t * LN2_HI[0]; // exact: LN2_HI has its low bits zero
            lo = t * LN2_LO[0];
        }
        x = hi - lo;
    } else if abs_high < 0x3e30_0000 {
        // |x| < 2^-28: e^x = 1 + x to within rounding.
        return 1.0 + x;
    }

    // x is now in the primary range.
    let t = x * x;
    let two_pk = if k >= -1021 {
        f64::from_bits(((0x3ff0_0000 + (k << 20)) as u64) << 32)
    } else {
        f64::from_bits(((0x3ff0_0000 + ((k + 1000) << 20)) as u64) << 32)
    };
    let c = x - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))));
    if k == 0 {
        return 1.0 - ((x * c) / (c - 2.0) - x);
    }
    let y = 1.0 - ((lo - (x * c) / (2.0 - c)) - hi);
    if k >= -1021 {
        if k == 1024 {
            return y * 2.0 * f64::from_bits(0x7fe0_0000_0000_0000); // 2^1023
        }
        y * two_pk
    } else {
        y * two_pk * TWO_M1000
    }
}

// The hidden `exp` the linker binds libgpuslice's own calls to (see the module doc). Not in
// unit-test binaries: they link libm through std and must keep its `exp`.
#[cfg(all(not(test), target_arch = "x86_64"))]
std::arch::global_asm!(
    ".globl exp",
    ".hidden exp",
    ".type exp, @function",
    "exp:",
    "jmp {f}",
    ".size exp, . - exp",
    f = sym exp,
);

#[cfg(all(not(test), target_arch = "aarch64"))]
std::arch::global_asm!(
    ".globl exp",
    ".hidden exp",
    ".type exp, %function",
    "exp:",
    "b {f}",
    ".size exp, . - exp",
    f = sym exp,
);

#[cfg(test)]
mod tests {
    use super::exp;

    /// Distance in units in the last place between two finite doubles of the same sign.
    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn matches_libm_to_one_ulp_across_the_range() {
        // A dense sweep of every reduction branch: tiny, |x| < 1.5 ln2, large, subnormal
        // results (x < -708.4) and the k == 1024 edge near the overflow threshold.
        let mut checked = 0;
        let mut x = -745.0_f64;
        while x <= 709.7 {
            for probe in [x, -x * 1e-3, x * 1e-9, x * 1e-17] {
                let ours = exp(probe);
                let libm = probe.exp();
                if libm == 0.0 || libm.is_infinite() {
                    assert_eq!(ours, libm, "exp({probe})");
                } else {
                    assert!(ulps(ours, libm) <= 1, "exp({probe}) = {ours}, libm {libm}");
                }
                checked += 1;
            }
            x += 0.012_345_6;
        }
        assert!(checked > 400_000);
        for probe in [709.78, 709.782_712_893_38, -708.4, -708.39, -740.0, -744.44] {
            let (ours, libm) = (exp(probe), probe.exp());
            assert!(ulps(ours, libm) <= 1, "exp({probe}) = {ours}, libm {libm}");
        }
    }

    #[test]
    fn special_values_are_libms() {
        assert!(exp(f64::NAN).is_nan());
        assert_eq!(exp(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert!(ulps(exp(1.0), std::f64::consts::E) <= 1);
        assert_eq!(exp(710.0), f64::INFINITY);
        assert_eq!(exp(-746.0), 0.0);
        assert_eq!(exp(f64::MAX), f64::INFINITY);
        assert_eq!(exp(f64::MIN), 0.0);
        assert_eq!(exp(f64::MIN_POSITIVE), 1.0);
    }
}
