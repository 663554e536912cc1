//! `gpuslice reset`: rebuild a slice's shared region that is corrupt, truncated or foreign.
//!
//! The shim never repairs a bad region on its own (it fails closed instead), because silently
//! rebuilding would forget what live processes hold. An operator who knows the file is the
//! slice's uses this; it refuses while any live process still holds a slot.

use std::path::PathBuf;

use clap::Args;
use gpuslice_common::region::{Region, RegionError};

use crate::error::{CliError, CliResult};
use crate::status::resolve_region_path;

#[derive(Debug, Args)]
pub struct ResetArgs {
    /// The region file to rebuild.
    #[arg(long, value_name = "PATH", conflicts_with = "config")]
    pub region: Option<PathBuf>,

    /// Take the region path from this limit file. Default (neither flag): the limit file or
    /// HAMi env the shim would load.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

pub fn run(args: &ResetArgs) -> CliResult<()> {
    let path = resolve_region_path(args.region.as_ref(), args.config.as_ref())?;
    Region::reset(&path).map_err(|error| match error {
        RegionError::Io { .. } => CliError::runtime(error.to_string()),
        other => CliError::invalid(other.to_string()),
    })?;
    println!("{}: rebuilt as an empty region", path.display());
    Ok(())
}
