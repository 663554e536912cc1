//! `gpuslice`, the command-line tool. Filled in by the CLI issue.
fn main() {
    eprintln!("gpuslice: not built yet");
    std::process::exit(2);
}
