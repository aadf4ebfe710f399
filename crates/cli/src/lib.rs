//! The `belljar` command-line client, as a library so that the end-to-end tests and the
//! benchmark drive the daemon through exactly the code the CLI uses.
//!
//! The binary (`main.rs`) only parses arguments and prints; what each command does with the
//! daemon lives here in small modules, each with its own error type, on top of the typed
//! client (`belljar-client`).

// Only `launcher` needs `unsafe` (to call `setsid` between fork and exec); it opts in locally.
#![deny(unsafe_code)]

pub mod compat;
pub mod cp;
pub mod duration;
pub mod e2b;
pub mod exec;
pub mod launcher;
pub mod logs;
pub mod mcp;
pub mod modal;
pub mod output;
pub mod sandbox0;
pub mod snapshots;
pub mod terminal;
pub mod vercel;
