//! Sandboxes: their lifecycle (`pending → running → stopping → stopped | failed`), the
//! backends that run them, admission, commands and their logs, files, and adoption of running
//! sandboxes after a daemon restart.

pub mod admission;
pub mod backend;
pub mod microvm;
