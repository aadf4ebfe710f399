//! `GET /v1/doctor` (and `belljar doctor --json`): what this host offers Belljar and what is
//! missing, each finding with the one command that fixes it. The checks themselves live in
//! the `belljar-doctor` crate; these are their wire types, so the CLI, the daemon and the app's
//! settings show one report.

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

/// How bad a finding is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema, TS,
)]
#[serde(rename_all = "snake_case")]
pub enum DoctorStatus {
    Ok,
    /// Belljar works, with less: no microVMs, limits not enforced.
    Warning,
    /// Sandboxes cannot be created (or images not stored) until it is fixed.
    Problem,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct DoctorFinding {
    /// Stable name of the check: `kvm`, `cgroup`, `subids`, `overlayfs`, `network`, `disk`,
    /// `daemon`.
    pub check: String,
    pub status: DoctorStatus,
    /// What was found, one sentence for people.
    pub found: String,
    /// The one command that fixes it, when there is one.
    pub fix: Option<String>,
    /// The same findings as data, for scripts (each check's own fields).
    #[ts(type = "Record<string, unknown>")]
    #[schema(value_type = Object)]
    pub facts: serde_json::Value,
}

/// All findings, in a fixed order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, TS)]
pub struct DoctorReport {
    /// No finding is a [`DoctorStatus::Problem`].
    pub ok: bool,
    pub findings: Vec<DoctorFinding>,
}

impl DoctorReport {
    pub fn new(findings: Vec<DoctorFinding>) -> Self {
        let ok = findings.iter().all(|f| f.status != DoctorStatus::Problem);
        Self { ok, findings }
    }
}
