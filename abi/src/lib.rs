//! The part of the CUDA driver API and NVML ABI that gpuslice touches, declared once for the
//! shim, the fake GPU and the test clients.
//!
//! Result codes are plain integers (`CUresult = u32`), never Rust enums: a newer driver can
//! return a code this crate has never heard of, and receiving an unknown discriminant into a
//! Rust enum is undefined behaviour. Struct layouts are checked against the bindgen output of
//! `cudarc::driver::sys` and `nvml-wrapper-sys` in `tests/layout.rs`.

#![allow(non_camel_case_types, non_snake_case)]

pub mod cuda;
pub mod nvml;
