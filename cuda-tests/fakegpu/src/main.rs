//! `fakegpu install DIR` and `fakegpu smi`.
fn main() {}
