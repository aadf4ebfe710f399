//! Wire types of the daemon's public API, shared by the daemon, the CLI, the SDKs and the UI.
//!
//! Everything that crosses the daemon's HTTP boundary is defined here once, so the OpenAPI
//! document (utoipa) and the TypeScript types in `sdk/typescript/src/generated/api.ts` (ts-rs) are both
//! generated from the same Rust types. The route table lives in [`routes`].
//!
//! Conventions: JSON field names are `snake_case`; times are Unix milliseconds (`i64`);
//! durations are milliseconds (as text, see [`duration`]: a bare number is seconds); sizes are MiB where a person picks them (memory, disk) and
//! bytes where a machine measured them.

#![forbid(unsafe_code)]

pub mod command;
pub mod diff;
pub mod dockerignore;
pub mod doctor;
pub mod duration;
pub mod error;
pub mod event;
pub mod file;
pub mod info;
pub mod limits;
pub mod network;
pub mod routes;
pub mod sandbox;
pub mod snapshot;
pub mod template;
pub mod typescript;
pub mod usage;
pub mod volume;

pub use command::*;
pub use diff::*;
pub use doctor::*;
pub use error::*;
pub use event::*;
pub use file::*;
pub use info::*;
pub use limits::{Invalid, Validate};
pub use network::*;
pub use sandbox::*;
pub use snapshot::*;
pub use template::*;
pub use usage::*;
pub use volume::*;

/// An error and its sources, `: `-separated, for a person (a log line, a sandbox's
/// `status_reason`, an error message): errors carry their cause as a source and do not repeat
/// it in their own message. (`belljar_namespace::error_chain` is the same for the crates
/// below this one.)
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
