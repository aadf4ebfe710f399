//! belljard as a library: everything but argument parsing, so that tests drive the same code.
#![forbid(unsafe_code)]

pub mod paths;
pub mod store;
