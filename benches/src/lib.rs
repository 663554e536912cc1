//! Helpers shared by the criterion benchmarks in `benches/benches/`.
