//! The fake cuda API.
