//! The typed Rust client of belljard's API, the one every Rust client uses: the CLI, the
//! desktop app, the end-to-end tests and the benchmarks.
//!
//! - [`paths`]: where the daemon keeps its socket, port, pid and token (the daemon resolves
//!   its directories here too, so both sides agree).
//! - [`Client`]: one method per route, with the wire types of `belljar-api`; request and
//!   answer bodies stream ([`body`]); NDJSON answers arrive item by item ([`NdjsonStream`]);
//!   every variable part of a path is percent-encoded ([`routes`]).
//! - [`ClientError`]: an API error carries the daemon's `{"error":{"code","message"}}` code;
//!   everything else has a local code.

#![forbid(unsafe_code)]

pub mod body;
mod client;
pub mod commands;
mod daemon;
pub mod error;
mod files;
pub mod ndjson;
mod network;
pub mod paths;
mod pause;
pub mod ready;
pub mod routes;
mod sandboxes;
pub mod scope;
pub mod settings;
mod snapshots;
mod templates;
mod volumes;

pub use belljar_api::error_chain;
pub use body::{Body, BoxError, Download, empty, full, json, streamed};
pub use client::{Client, Conn, Transport, WebSocket, check, decode};
pub use commands::log_bytes;
pub use daemon::TerminalOptions;
pub use error::{ClientError, api_error};
pub use ndjson::{Lines, NdjsonError, NdjsonStream};
pub use paths::{Paths, PathsError};
