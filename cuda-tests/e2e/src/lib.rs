//! Test harness: where the built artifacts are, fake GPU set-up per test, process helpers.
