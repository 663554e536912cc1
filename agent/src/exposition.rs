//! The Prometheus text exposition format (version 0.0.4), written by hand: a dozen gauge and
//! counter families need no metrics registry, and every scrape is built afresh from the
//! node's files and the driver, so there is no state to keep in one.

use std::fmt::Write;

/// The content type Prometheus expects for this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

/// One metric family: its HELP and TYPE lines, then its samples.
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    samples: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl Family {
    pub fn new(name: &'static str, kind: Kind, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }

    pub fn add(&mut self, labels: &[(&'static str, &str)], value: f64) {
        let labels = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
        self.samples.push((labels, value));
    }

    /// Appends the family to `out`; a family without samples writes nothing.
    pub fn write(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let kind = match self.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        for (labels, value) in &self.samples {
            out.push_str(self.name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (key, value)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{key}=\"{}\"", escape_label(value));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {}", number(*value));
        }
    }
}

/// Label values escape backslash, double quote and line feed.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// HELP text escapes backslash and line feed.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Integers as integers (byte counts up to 2^53 are exact in f64), the rest in Rust's
/// shortest round-trip form; the format's spellings of the special values.
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if value.fract() == 0.0 && value.abs() < 9.0e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_help_type_and_escaped_labels() {
        let mut family = Family::new("x_bytes", Kind::Gauge, "Some \\ help\nline.");
        family.add(&[("slice", "a\"b\\c\nd"), ("index", "0")], 1073741824.0);
        family.add(&[], 0.25);
        let mut out = String::new();
        family.write(&mut out);
        assert_eq!(
            out,
            "# HELP x_bytes Some \\\\ help\\nline.\n# TYPE x_bytes gauge\n\
             x_bytes{slice=\"a\\\"b\\\\c\\nd\",index=\"0\"} 1073741824\nx_bytes 0.25\n"
        );
    }

    #[test]
    fn empty_families_and_special_values() {
        let mut out = String::new();
        Family::new("y_total", Kind::Counter, "h").write(&mut out);
        assert!(out.is_empty());
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(-3.0), "-3");
        assert_eq!(number(u64::MAX as f64), "18446744073709552000");
    }
}
