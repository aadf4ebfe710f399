//! `belljar-agent`'s internals: the agent that runs inside every sandbox (PID 1 of a microVM
//! or of a namespace sandbox) and serves the daemon the routes of `belljar-agent-proto`.

pub mod agent;
pub mod ca;
pub mod commands;
pub mod config;
pub mod error;
pub mod fdio;
pub mod files;
pub mod listen;
pub mod metrics;
pub mod mounts;
pub mod net;
pub mod reaper;
pub mod server;
pub mod system;
pub mod users;
pub mod watch;
