//! belljard as a library: everything but argument parsing, so that tests drive the same code.
//!
//! [`server::run`] wires it together: [`paths`] and [`config`] say where things live, [`store`]
//! keeps state in SQLite, [`sandbox`] runs sandboxes on a backend, [`images`] finds and builds
//! root filesystems, [`events`] numbers and broadcasts changes, and [`http`] serves the API;
//! [`compat`] serves cloud sandbox APIs (Vercel's, E2B's, Sandbox0's) on top of the same services.
#![forbid(unsafe_code)]

pub mod build;
pub mod compat;
pub mod config;
pub mod events;
pub mod http;
pub mod images;
pub mod paths;
pub mod sandbox;
pub mod server;
pub mod store;
pub mod time;
pub mod util;
