//! Shared helpers for the client programs.
