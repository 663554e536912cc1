//! The simulated GPU's state, shared by every process through one mapped file.
