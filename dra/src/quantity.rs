//! Kubernetes `resource.Quantity` strings, as far as the driver needs them: bytes of memory and
//! percent of compute, whole numbers. Parsing is exact (no floating point): a quantity that is
//! not a whole number of units, negative, or too large for `u64` is an error naming it.

/// Parses a quantity (`8Gi`, `8589934592`, `8G`, `1.5Gi`, `25`, `2e3`) into a whole number.
pub fn parse(text: &str) -> Result<u64, String> {
    let bad = |why: &str| format!("quantity {text:?}: {why}");
    let s = text.trim();
    if s.is_empty() {
        return Err(bad("empty"));
    }
    if s.starts_with('-') {
        return Err(bad("negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(bad("no digits"));
    }
    // value = digits * 10^-(fraction len) * base^exp
    let digits: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| bad("too many digits"))?;
    let (base, exp): (u128, u32) = match suffix {
        "" => (10, 0),
        "Ki" => (1024, 1),
        "Mi" => (1024, 2),
        "Gi" => (1024, 3),
        "Ti" => (1024, 4),
        "Pi" => (1024, 5),
        "Ei" => (1024, 6),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        "m" => return Err(bad("milli-units are not a whole number")),
        other => match other.strip_prefix(['e', 'E']).map(str::parse::<u32>) {
            Some(Ok(e)) if e <= 30 => (10, e),
            _ => return Err(bad(&format!("unknown suffix {other:?}"))),
        },
    };
    let scale = base.checked_pow(exp).ok_or_else(|| bad("too large"))?;
    let numerator = digits.checked_mul(scale).ok_or_else(|| bad("too large"))?;
    let denominator = 10u128.pow(fraction.len() as u32);
    if !numerator.is_multiple_of(denominator) {
        return Err(bad("not a whole number"));
    }
    u64::try_from(numerator / denominator).map_err(|_| bad("too large"))
}

/// Formats bytes the way the API server's canonical form does for binary quantities: the
/// largest binary suffix that divides it exactly (`8Gi`, `1536Mi`), else plain bytes.
pub fn format_bytes(bytes: u64) -> String {
    for (suffix, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_the_api_server_writes() {
        assert_eq!(parse("8Gi"), Ok(8 << 30));
        assert_eq!(parse("8589934592"), Ok(8 << 30));
        assert_eq!(parse("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse("8G"), Ok(8_000_000_000));
        assert_eq!(parse("25"), Ok(25));
        assert_eq!(parse("2e3"), Ok(2000));
        assert_eq!(parse("0"), Ok(0));
    }

    #[test]
    fn refuses_what_is_not_a_whole_number_of_units() {
        for bad in [
            "",
            "-1",
            "1.5",
            "500m",
            "8Gb",
            "Gi",
            "1e40",
            "99999999999999999999Ei",
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn formats_exact_binary_suffixes() {
        assert_eq!(format_bytes(8 << 30), "8Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        for bytes in [8u64 << 30, 1536 << 20, 1000, 12345 << 10] {
            assert_eq!(parse(&format_bytes(bytes)), Ok(bytes));
        }
    }
}
