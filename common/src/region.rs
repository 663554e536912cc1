//! The shared region.
