//! The fake nvml API.
