//! belljard as a library: everything but argument parsing, so that tests drive the same code.
#![forbid(unsafe_code)]

pub mod paths;
pub mod store;
pub mod events;
pub mod images;
pub mod sandbox;
pub mod util;
