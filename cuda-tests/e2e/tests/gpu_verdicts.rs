//! The verdicts of `cuda-tests/gpu/validate.sh` check 9 (the compute share matrix on a real
//! GPU), judged by `evaluate.py matrix` from the `spin` helper's `RESULT` lines. No GPU runs
//! here, so the helper outputs are written by the test: what a card at the targets prints
//! must PASS, and each way a slice can miss (over its share, a burst pair splitting evenly, a
//! low priority ahead of a high one, a helper that printed nothing) must FAIL naming the case.

use std::path::{Path, PathBuf};

use cuda_e2e::{command, run_with_timeout, DEFAULT_TIMEOUT};

fn evaluate_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu/evaluate.py")
}

/// A manifest as validate.sh's `matrix_group` writes it, with one `spin` RESULT file per
/// process: `cases` = (case, kind, targets JSON members, [(slice, length, kernels/s or None)]).
struct Matrix {
    dir: PathBuf,
    lines: Vec<String>,
    files: usize,
}

/// Solo kernels/s of each kernel length on the imagined card.
const SOLO: [(&str, f64); 3] = [("10us", 80_000.0), ("1ms", 990.0), ("10ms", 99.5)];

impl Matrix {
    fn new(name: &str) -> Matrix {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("gpu-verdicts-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let mut matrix = Matrix {
            dir,
            lines: Vec::new(),
            files: 0,
        };
        for (len, rate) in SOLO {
            matrix.case(
                &format!("solo {len}"),
                "base",
                "",
                &[("solo", len, Some(rate))],
            );
        }
        matrix
    }

    fn case(&mut self, name: &str, kind: &str, targets: &str, procs: &[(&str, &str, Option<f64>)]) {
        let mut entries = Vec::new();
        for &(slice, len, rate) in procs {
            let file = self.dir.join(format!("run-{}.out", self.files));
            self.files += 1;
            let text = match rate {
                Some(r) => format!(
                    "warming up\nRESULT {{\"mode\":\"spin\",\"pid\":1,\"kernels_per_s\":{r}}}\n"
                ),
                None => "spin: cudaMalloc failed\n".to_string(),
            };
            std::fs::write(&file, text).expect("helper output");
            entries.push(format!(
                r#"{{"slice":"{slice}","len":"{len}","file":"{}"}}"#,
                file.display()
            ));
        }
        self.lines.push(format!(
            r#"{{"case":"{name}","kind":"{kind}","targets":{{{targets}}},"procs":[{}]}}"#,
            entries.join(",")
        ));
    }

    /// `evaluate.py matrix` on the manifest: (status, numbers JSON, detail).
    fn verdict(&self) -> (String, serde_json::Value, String) {
        let manifest = self.dir.join("matrix.jsonl");
        std::fs::write(&manifest, self.lines.join("\n") + "\n").expect("manifest");
        let py = evaluate_py();
        let args = [
            py.to_str().unwrap(),
            "matrix",
            manifest.to_str().unwrap(),
            "--points",
            "5",
        ];
        let out = run_with_timeout(
            command(Path::new("python3"), &args, &Vec::new()),
            None,
            DEFAULT_TIMEOUT,
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "evaluate.py: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut fields = stdout.trim_end().splitn(3, '\t');
        let status = fields.next().unwrap_or_default().to_string();
        let numbers = serde_json::from_str(fields.next().unwrap_or("null")).expect("numbers JSON");
        (
            status,
            numbers,
            fields.next().unwrap_or_default().to_string(),
        )
    }
}

/// The matrix of a card that meets every target (a fraction of each length's solo rate).
fn on_target(name: &str) -> Matrix {
    let mut m = Matrix::new(name);
    for (len, solo) in SOLO {
        for share in [10, 50, 90] {
            let rate = solo * f64::from(share) / 100.0 * 1.01;
            m.case(
                &format!("{len} x1 at {share}%"),
                "share",
                &format!(r#""a":{share}"#),
                &[("a", len, Some(rate))],
            );
        }
    }
    m.case(
        "1ms x4 at 50%",
        "share",
        r#""a":50"#,
        &[("a", "1ms", Some(990.0 * 0.125)); 4],
    );
    // Each length takes a different part; the slice adds up to 49 %.
    m.case(
        "mixed 10us+1ms+10ms at 50%",
        "share",
        r#""a":50"#,
        &[
            ("a", "10us", Some(80_000.0 * 0.09)),
            ("a", "1ms", Some(990.0 * 0.20)),
            ("a", "10ms", Some(99.5 * 0.20)),
        ],
    );
    m.case(
        "burst 30% + 20%",
        "burst",
        r#""a":30,"b":20"#,
        &[
            ("a", "1ms", Some(990.0 * 0.56)),
            ("b", "1ms", Some(990.0 * 0.37)),
        ],
    );
    m.case(
        "burst 30% high + 30% low",
        "priority",
        r#""high":30,"low":30"#,
        &[
            ("high", "1ms", Some(990.0 * 0.64)),
            ("low", "1ms", Some(990.0 * 0.30)),
        ],
    );
    m
}

#[test]
fn a_card_at_every_target_passes_the_matrix_and_reports_each_slice() {
    let (status, numbers, detail) = on_target("pass").verdict();
    assert_eq!(status, "PASS", "{detail} {numbers}");
    assert_eq!(numbers["1ms x4 at 50%"]["a"], 50.0, "{numbers}");
    assert_eq!(
        numbers["mixed 10us+1ms+10ms at 50%"]["a"], 49.0,
        "{numbers}"
    );
    assert_eq!(numbers["burst 30% + 20%"]["ratio"], 1.51, "{numbers}");
    assert_eq!(numbers["solo_kernels_per_s"]["10us"], 80_000.0, "{numbers}");
}

#[test]
fn each_way_a_slice_misses_fails_and_names_its_case() {
    let mut m = on_target("fail");
    m.case(
        "1ms x1 over",
        "share",
        r#""a":50"#,
        &[("a", "1ms", Some(990.0 * 0.57))],
    );
    m.case(
        "even burst",
        "burst",
        r#""a":30,"b":20"#,
        &[
            ("a", "1ms", Some(990.0 * 0.47)),
            ("b", "1ms", Some(990.0 * 0.46)),
        ],
    );
    m.case(
        "inverted priority",
        "priority",
        r#""high":30,"low":30"#,
        &[
            ("high", "1ms", Some(990.0 * 0.31)),
            ("low", "1ms", Some(990.0 * 0.62)),
        ],
    );
    m.case(
        "silent helper",
        "share",
        r#""a":10"#,
        &[("a", "10ms", None)],
    );
    let (status, numbers, detail) = m.verdict();
    assert_eq!(status, "FAIL", "{detail} {numbers}");
    for named in [
        "1ms x1 over: 57.0%",
        "even burst: split 1.02:1",
        "inverted priority: high 31.0%",
        "silent helper: a process gave no RESULT",
    ] {
        assert!(detail.contains(named), "{named:?} missing from: {detail}");
    }
    assert!(
        !detail.contains("at 90%"),
        "cases on target do not fail: {detail}"
    );
}

#[test]
fn no_solo_baseline_is_a_failure_not_a_pass() {
    let mut m = Matrix::new("nobase");
    m.lines.clear();
    m.case(
        "1ms x1 at 50%",
        "share",
        r#""a":50"#,
        &[("a", "1ms", Some(495.0))],
    );
    let (status, _, detail) = m.verdict();
    assert_eq!(status, "FAIL", "{detail}");
    assert!(detail.contains("1ms x1 at 50%"), "{detail}");
}
