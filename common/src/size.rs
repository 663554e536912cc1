//! Memory sizes as users write them: plain bytes, "8GiB", "8g", "8192m" (HAMi's forms).
//!
//! Owns the one grammar every size in gpuslice goes through (limit file, HAMi env, CLI):
//!
//! ```text
//! size  := ws number ws? unit? ws
//! number:= digits ( "." digits )?
//! unit  := B | K | KB | KiB | M | MB | MiB | G | GB | GiB | T | TB | TiB   (any case)
//! ```
//!
//! Every unit is binary: `GB`, `G` and `g` mean 2^30, exactly like `GiB`. That is what HAMi
//! (and `nvidia-smi`'s "MiB" columns) mean, and a slice written as "16GB" must not come out
//! 7% smaller than the "16 GiB" card it was cut from. A fractional number is allowed when the
//! result is a whole number of bytes ("1.5GiB", "0.5k"); "1.5" bytes or "0.1k" is refused
//! rather than rounded, so a size never means something other than what was written.
//!
//! `format_size` is the exact inverse (`parse_size(&format_size(n)) == Ok(n)` for every
//! `n`); `format_size_approx` is the short, rounded form for status displays.

use std::fmt;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// Units `format_size` may choose, largest first.
const DISPLAY_UNITS: [(u64, &str); 4] = [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")];

/// More decimal places than this cannot be exact for any binary unit up to TiB.
const MAX_FRACTION_DIGITS: usize = 30;

/// Why a string is not a size. Display names the input: `"8XB" is not a size: ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    /// The text as given (untrimmed).
    pub input: String,
    pub kind: SizeErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeErrorKind {
    Empty,
    Negative,
    /// No digits where the number should be, or a malformed number ("1.", "1.2.3", "+8").
    NotANumber,
    UnknownUnit(String),
    /// The value does not come out as a whole number of bytes ("1.5", "0.1k").
    FractionalBytes,
    /// Above `u64::MAX` bytes.
    Overflow,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a size: ", self.input)?;
        match &self.kind {
            SizeErrorKind::Empty => write!(f, "it is empty; write bytes or e.g. \"8GiB\""),
            SizeErrorKind::Negative => write!(f, "sizes cannot be negative"),
            SizeErrorKind::NotANumber => write!(
                f,
                "expected a number of bytes or a number with a unit, e.g. \"8GiB\", \"8192m\", \"1.5g\""
            ),
            SizeErrorKind::UnknownUnit(unit) => write!(
                f,
                "unknown unit {unit:?} (use B, K/KiB, M/MiB, G/GiB or T/TiB; GB means GiB)"
            ),
            SizeErrorKind::FractionalBytes => {
                write!(f, "it is not a whole number of bytes")
            }
            SizeErrorKind::Overflow => write!(f, "it is larger than {} bytes", u64::MAX),
        }
    }
}

impl std::error::Error for SizeError {}

/// Parse a size: "17179869184", "8GiB", "8GB", "8g", "8192m", "512k", "1.5GiB", " 8 GiB ".
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let fail = |kind| SizeError {
        input: s.to_string(),
        kind,
    };
    let text = s.trim();
    if text.is_empty() {
        return Err(fail(SizeErrorKind::Empty));
    }
    if text.starts_with('-') {
        return Err(fail(SizeErrorKind::Negative));
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let multiplier = unit_multiplier(unit.trim_start())
        .ok_or_else(|| fail(SizeErrorKind::UnknownUnit(unit.trim_start().to_string())))?;
    let (whole, fraction) = split_number(number).ok_or_else(|| fail(SizeErrorKind::NotANumber))?;
    scale_exactly(whole, fraction, multiplier).map_err(fail)
}

/// `None` when the unit is unknown. An empty unit means bytes.
fn unit_multiplier(unit: &str) -> Option<u64> {
    let multiplier = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        _ => return None,
    };
    Some(multiplier)
}

/// Splits "12.50" into ("12", "50"); `None` unless both sides of an optional single dot
/// are non-empty digit runs.
fn split_number(number: &str) -> Option<(&str, &str)> {
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() => (whole, fraction),
        Some(_) => return None,
        None => (number, ""),
    };
    let all_digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    Some((whole, fraction))
}

/// `whole.fraction * multiplier`, refusing anything that is not a whole number of bytes.
fn scale_exactly(whole: &str, fraction: &str, multiplier: u64) -> Result<u64, SizeErrorKind> {
    let whole_digits = whole.trim_start_matches('0');
    // u64::MAX has 20 digits; anything longer overflows before the unit is applied.
    if whole_digits.len() > 20 {
        return Err(SizeErrorKind::Overflow);
    }
    let whole_value: u128 = whole_digits.parse().unwrap_or(0);
    let mut total = whole_value
        .checked_mul(u128::from(multiplier))
        .ok_or(SizeErrorKind::Overflow)?;

    let fraction = fraction.trim_end_matches('0');
    if !fraction.is_empty() {
        if fraction.len() > MAX_FRACTION_DIGITS {
            return Err(SizeErrorKind::FractionalBytes);
        }
        // The fraction as an exact integer over 10^digits; at most 30 digits fits in u128,
        // but multiplying by up to 2^40 might not, so go through a checked multiply.
        let numerator: u128 = fraction.parse().map_err(|_| SizeErrorKind::NotANumber)?;
        let denominator = 10u128.pow(fraction.len() as u32);
        let scaled = numerator
            .checked_mul(u128::from(multiplier))
            .ok_or(SizeErrorKind::FractionalBytes)?;
        if scaled % denominator != 0 {
            return Err(SizeErrorKind::FractionalBytes);
        }
        total = total
            .checked_add(scaled / denominator)
            .ok_or(SizeErrorKind::Overflow)?;
    }
    u64::try_from(total).map_err(|_| SizeErrorKind::Overflow)
}

/// Exact, human-readable form: "8 GiB", "1.5 GiB", "512 MiB", "123 B". Picks the largest
/// binary unit in which the value needs at most three decimals; `parse_size` gives the
/// same number back.
pub fn format_size(bytes: u64) -> String {
    for (unit, name) in DISPLAY_UNITS {
        if bytes < unit {
            continue;
        }
        let thousandths = u128::from(bytes) * 1000;
        if thousandths % u128::from(unit) == 0 {
            return format!(
                "{} {name}",
                decimal_from_thousandths(thousandths / u128::from(unit))
            );
        }
    }
    format!("{bytes} B")
}

/// Rounded form for displays where exactness does not matter: "1.3 GiB", "17.2 MiB",
/// "123 B" (one decimal at most).
pub fn format_size_approx(bytes: u64) -> String {
    for (unit, name) in DISPLAY_UNITS {
        if bytes >= unit {
            let tenths = (u128::from(bytes) * 10 + u128::from(unit) / 2) / u128::from(unit);
            return format!("{} {name}", decimal_from_thousandths(tenths * 100));
        }
    }
    format!("{bytes} B")
}

/// 1500 -> "1.5", 2000 -> "2", 1125 -> "1.125".
fn decimal_from_thousandths(thousandths: u128) -> String {
    let whole = thousandths / 1000;
    let fraction = thousandths % 1000;
    if fraction == 0 {
        whole.to_string()
    } else {
        let digits = format!("{fraction:03}");
        format!("{whole}.{}", digits.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_every_documented_form() {
        let cases: &[(&str, u64)] = &[
            ("17179869184", 17_179_869_184),
            ("0", 0),
            ("123", 123),
            ("123B", 123),
            ("123 b", 123),
            ("8GiB", 8 * GIB),
            ("8GB", 8 * GIB),
            ("8G", 8 * GIB),
            ("8g", 8 * GIB),
            ("8gib", 8 * GIB),
            ("8 GiB", 8 * GIB),
            ("  8GiB\n", 8 * GIB),
            ("8192m", 8192 * MIB),
            ("8192M", 8192 * MIB),
            ("8192MiB", 8192 * MIB),
            ("8192mb", 8192 * MIB),
            ("512k", 512 * KIB),
            ("512KB", 512 * KIB),
            ("512KiB", 512 * KIB),
            ("1t", TIB),
            ("2TiB", 2 * TIB),
            ("1.5GiB", GIB + GIB / 2),
            ("1.5g", GIB + GIB / 2),
            ("0.5k", 512),
            ("1.125 GiB", GIB + GIB / 8),
            ("2.0", 2),
            ("2.000m", 2 * MIB),
            ("007g", 7 * GIB),
            ("18446744073709551615", u64::MAX),
            ("16777215.999999046325683593750t", u64::MAX - (MIB - 1)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_size(input), Ok(*want), "input {input:?}");
        }
    }

    #[test]
    fn refuses_every_bad_form_with_a_reason() {
        use SizeErrorKind::*;
        let cases: &[(&str, SizeErrorKind)] = &[
            ("", Empty),
            ("   ", Empty),
            ("-1", Negative),
            ("-8GiB", Negative),
            (" -0", Negative),
            ("8XB", UnknownUnit("XB".into())),
            ("8 gigs", UnknownUnit("gigs".into())),
            ("8GiB extra", UnknownUnit("GiB extra".into())),
            ("8 8", UnknownUnit("8".into())),
            ("banana", UnknownUnit("banana".into())),
            ("GiB", NotANumber),
            ("+8", UnknownUnit("+8".into())),
            ("0x10", UnknownUnit("x10".into())),
            ("1.", NotANumber),
            (".5g", NotANumber),
            ("1.2.3", NotANumber),
            ("1..2", NotANumber),
            ("1.5", FractionalBytes),
            ("1.5b", FractionalBytes),
            ("0.1k", FractionalBytes),
            ("1.0000000001g", FractionalBytes),
            ("18446744073709551616", Overflow),
            ("99999999999999999999999999", Overflow),
            ("16777216t", Overflow),
            ("17179869184g", Overflow),
        ];
        for (input, kind) in cases {
            let err = parse_size(input).expect_err(input);
            assert_eq!(&err.kind, kind, "input {input:?}");
            assert_eq!(err.input, *input);
        }
    }

    #[test]
    fn error_message_names_the_input_and_the_problem() {
        let text = parse_size("8XB").unwrap_err().to_string();
        assert!(text.contains("\"8XB\""), "{text}");
        assert!(text.contains("unknown unit \"XB\""), "{text}");
        let text = parse_size("-1g").unwrap_err().to_string();
        assert!(
            text.contains("\"-1g\"") && text.contains("negative"),
            "{text}"
        );
        let text = parse_size("1.5").unwrap_err().to_string();
        assert!(text.contains("whole number of bytes"), "{text}");
        let text = parse_size("99999999999999999999").unwrap_err().to_string();
        assert!(text.contains("larger than"), "{text}");
    }

    #[test]
    fn formats_exactly_in_the_largest_fitting_unit() {
        let cases: &[(u64, &str)] = &[
            (0, "0 B"),
            (123, "123 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (1536, "1.5 KiB"),
            (1025, "1025 B"),
            (512 * MIB, "512 MiB"),
            (8 * GIB, "8 GiB"),
            (GIB + GIB / 2, "1.5 GiB"),
            (GIB + GIB / 8, "1.125 GiB"),
            (GIB + MIB, "1025 MiB"),
            (1024 * GIB, "1 TiB"),
            (u64::MAX, "18446744073709551615 B"),
        ];
        for (bytes, want) in cases {
            assert_eq!(format_size(*bytes), *want, "bytes {bytes}");
        }
    }

    #[test]
    fn approximate_format_rounds_to_one_decimal() {
        assert_eq!(format_size_approx(123), "123 B");
        assert_eq!(format_size_approx(8 * GIB), "8 GiB");
        assert_eq!(format_size_approx(1_400_000_000), "1.3 GiB");
        assert_eq!(format_size_approx(GIB + MIB), "1 GiB");
        assert_eq!(format_size_approx(u64::MAX), "16777216 TiB");
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(bytes in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }

        #[test]
        fn whole_units_round_trip(n in 0u64..1_000_000, unit in prop::sample::select(vec!["k", "KiB", "m", "MB", "g", "GiB"])) {
            let multiplier = unit_multiplier(unit).unwrap();
            prop_assert_eq!(parse_size(&format!("{n}{unit}")), Ok(n * multiplier));
        }

        #[test]
        fn parse_never_panics(s in ".{0,40}") {
            let _ = parse_size(&s);
        }

        #[test]
        fn parse_never_panics_on_size_like_text(s in "[ 0-9.kKmMgGtTiIbB-]{0,40}") {
            if let Err(err) = parse_size(&s) {
                prop_assert!(err.to_string().contains("is not a size"));
            }
        }
    }
}
