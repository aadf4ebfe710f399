//! Templates (`/v1/templates`): a name for an image plus the defaults of the sandboxes made
//! from it (limits, env, network policy, timeout, backend) and the size of its warm pool.
//! A create that names a template gets its defaults; the request's own fields override them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use ts_rs::TS;
use utoipa::ToSchema;

use crate::limits::{self, Invalid, Validate};
use crate::{BackendChoice, CreateSandbox, NetworkPolicy};

/// The most sandboxes one template's pool keeps ready.
pub const MAX_TEMPLATE_POOL: u32 = 64;

/// The body of `POST /v1/templates`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
#[serde(deny_unknown_fields)]
pub struct CreateTemplate {
    /// 1 to 64 characters of `[a-z0-9_.-]`, starting with a letter or a digit.
    #[schema(min_length = 1, max_length = 64)]
    pub name: String,
    /// Any image the daemon has: Belljar's own, pulled, imported or built.
    #[schema(min_length = 1, max_length = 128)]
    pub image: String,
    #[serde(default)]
    #[ts(optional)]
    pub backend: Option<BackendChoice>,
    /// 1 to 32; the daemon's default when absent.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1, maximum = 32)]
    pub vcpus: Option<u32>,
    /// 64 to 262144; the daemon's default when absent.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 64, maximum = 262144)]
    pub memory_mib: Option<u64>,
    /// 64 to 1048576; the daemon's default when absent.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 64, maximum = 1048576)]
    pub disk_mib: Option<u64>,
    /// Milliseconds until a sandbox of the template stops by itself.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 1, maximum = 2592000000_i64)]
    pub timeout_ms: Option<i64>,
    /// Environment of every command; a create's `env` adds to it and wins per name.
    #[serde(default)]
    #[ts(optional)]
    #[schema(schema_with = limits::env_schema, nullable)]
    pub env: Option<BTreeMap<String, String>>,
    /// The firewall of its sandboxes; a create's own policy replaces it.
    #[serde(default)]
    #[ts(optional)]
    pub network_policy: Option<NetworkPolicy>,
    /// Sandboxes kept started ahead of demand, refilled in the background; 0 (the default)
    /// keeps none. At most 64.
    #[serde(default)]
    #[ts(optional)]
    #[schema(minimum = 0, maximum = 64)]
    pub pool: Option<u32>,
}

impl Validate for CreateTemplate {
    fn validate(&self) -> Result<(), Invalid> {
        if !crate::valid_volume_name(&self.name) {
            return Err(Invalid::new(
                "name",
                "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter or digit",
            ));
        }
        if self.image.trim().is_empty() {
            return Err(Invalid::new("image", "must not be empty"));
        }
        limits::range("pool", self.pool, 0, MAX_TEMPLATE_POOL)?;
        // The defaults obey the bounds of the create they stand in for.
        self.defaults().validate()
    }
}

impl CreateTemplate {
    /// The template's defaults as the create they stand for.
    pub fn defaults(&self) -> CreateSandbox {
        CreateSandbox {
            image: Some(self.image.clone()),
            backend: self.backend,
            vcpus: self.vcpus,
            memory_mib: self.memory_mib,
            disk_mib: self.disk_mib,
            timeout_ms: self.timeout_ms,
            env: self.env.clone(),
            network_policy: self.network_policy.clone(),
            ..CreateSandbox::default()
        }
    }

    /// `req` with this template's defaults where it gave none: the request's own fields
    /// override them, its `env` adds to the template's (a name in both is the request's).
    pub fn apply(&self, mut req: CreateSandbox) -> CreateSandbox {
        req.image = req.image.or_else(|| Some(self.image.clone()));
        req.backend = req.backend.or(self.backend);
        req.vcpus = req.vcpus.or(self.vcpus);
        req.memory_mib = req.memory_mib.or(self.memory_mib);
        req.disk_mib = req.disk_mib.or(self.disk_mib);
        req.timeout_ms = req.timeout_ms.or(self.timeout_ms);
        req.network_policy = req.network_policy.or_else(|| self.network_policy.clone());
        if let Some(theirs) = &self.env {
            let mut env = theirs.clone();
            env.extend(req.env.take().unwrap_or_default());
            req.env = Some(env);
        }
        req
    }
}

/// A template and the state of its pool (brokered header values read as `[redacted]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct Template {
    pub name: String,
    pub image: String,
    #[serde(default)]
    #[ts(optional)]
    pub backend: Option<BackendChoice>,
    #[serde(default)]
    #[ts(optional)]
    pub vcpus: Option<u32>,
    #[serde(default)]
    #[ts(optional)]
    pub memory_mib: Option<u64>,
    #[serde(default)]
    #[ts(optional)]
    pub disk_mib: Option<u64>,
    #[serde(default)]
    #[ts(optional)]
    pub timeout_ms: Option<i64>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    #[ts(optional)]
    pub network_policy: Option<NetworkPolicy>,
    /// How many sandboxes its pool keeps ready (0: no pool).
    pub pool: u32,
    /// Pooled sandboxes ready to be claimed now.
    pub pool_ready: u32,
    /// Pooled sandboxes starting now (refills).
    pub pool_starting: u32,
    pub created_at: i64,
}

impl Template {
    /// What `GET` shows of `spec`, with its pool's state.
    pub fn new(
        spec: &CreateTemplate,
        created_at: i64,
        pool_ready: u32,
        pool_starting: u32,
    ) -> Self {
        Self {
            name: spec.name.clone(),
            image: spec.image.clone(),
            backend: spec.backend,
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            disk_mib: spec.disk_mib,
            timeout_ms: spec.timeout_ms,
            env: spec.env.clone().unwrap_or_default(),
            network_policy: spec.network_policy.as_ref().map(NetworkPolicy::redacted),
            pool: spec.pool.unwrap_or(0),
            pool_ready,
            pool_starting,
            created_at,
        }
    }
}

/// `GET /v1/templates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, TS)]
pub struct TemplateList {
    pub templates: Vec<Template>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn python() -> CreateTemplate {
        CreateTemplate {
            name: "py".into(),
            image: "python3.13".into(),
            memory_mib: Some(512),
            timeout_ms: Some(60_000),
            env: Some(BTreeMap::from([
                ("A".into(), "1".into()),
                ("B".into(), "2".into()),
            ])),
            network_policy: Some(NetworkPolicy::Mode(crate::NetworkMode::DenyAll)),
            pool: Some(2),
            ..CreateTemplate::default()
        }
    }

    #[test]
    fn the_request_overrides_the_defaults() {
        let t = python();
        let plain = t.apply(CreateSandbox::default());
        assert_eq!(plain.image.as_deref(), Some("python3.13"));
        assert_eq!(plain.memory_mib, Some(512));
        assert_eq!(plain.timeout_ms, Some(60_000));
        assert_eq!(plain.vcpus, None, "left to the daemon's default");
        assert_eq!(
            plain.network_policy,
            Some(NetworkPolicy::Mode(crate::NetworkMode::DenyAll))
        );
        let own = t.apply(CreateSandbox {
            memory_mib: Some(256),
            env: Some(BTreeMap::from([
                ("B".into(), "mine".into()),
                ("C".into(), "3".into()),
            ])),
            network_policy: Some(NetworkPolicy::Mode(crate::NetworkMode::AllowAll)),
            ..CreateSandbox::default()
        });
        assert_eq!(own.memory_mib, Some(256));
        assert_eq!(own.timeout_ms, Some(60_000));
        let env = own.env.unwrap();
        assert_eq!(
            env.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
            ["A=1", "B=mine", "C=3"]
        );
        assert_eq!(
            own.network_policy,
            Some(NetworkPolicy::Mode(crate::NetworkMode::AllowAll))
        );
    }

    #[test]
    fn bad_templates_are_refused_with_the_field() {
        assert!(python().validate().is_ok());
        let field = |t: CreateTemplate| t.validate().unwrap_err().to_string();
        let mut t = python();
        t.name = "Py".into();
        assert!(field(t).starts_with("name"));
        let mut t = python();
        t.pool = Some(65);
        assert!(field(t).starts_with("pool"));
        let mut t = python();
        t.memory_mib = Some(1);
        assert!(field(t).starts_with("memory_mib"));
        let mut t = python();
        t.image = " ".into();
        assert!(field(t).starts_with("image"));
    }
}
