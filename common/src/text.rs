//! Bounded text for messages: a path or a value quoted in an error can be as long as the
//! input that carried it (a 10 MB limit file, a 4 KiB path), and a "one line" message must
//! stay one readable line. `shorten` keeps the head and the tail (where paths and sizes say
//! the most) around an ellipsis, on UTF-8 character boundaries.

use std::borrow::Cow;

/// The most bytes of a path or value quoted in a message.
pub const MAX_QUOTED: usize = 256;
/// The most bytes of one whole message line (the shim's log lines, the CLI's errors).
pub const MAX_LINE: usize = 2048;

const ELLIPSIS: &str = "…";

/// `text` itself when it has at most `max` bytes, else its first and last parts joined by
/// "…" so that the result has at most `max` bytes (never less than the ellipsis alone).
pub fn shorten(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let budget = max.saturating_sub(ELLIPSIS.len());
    let mut head = budget - budget / 3;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - budget / 3;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    Cow::Owned(format!("{}{ELLIPSIS}{}", &text[..head], &text[tail..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_untouched_and_long_text_keeps_both_ends() {
        assert_eq!(shorten("abc", 3), "abc");
        let long = format!("/var/run/{}/slice.region", "x".repeat(10_000_000));
        let short = shorten(&long, MAX_QUOTED);
        assert!(short.len() <= MAX_QUOTED, "{}", short.len());
        assert!(short.starts_with("/var/run/x"));
        assert!(short.ends_with("x/slice.region"));
        assert!(short.contains('…'));
    }

    #[test]
    fn never_splits_a_character() {
        let text = "é".repeat(1000);
        for max in 0..40 {
            let short = shorten(&text, max);
            assert!(short.len() <= max.max(ELLIPSIS.len()), "{max}: {short}");
        }
    }
}
