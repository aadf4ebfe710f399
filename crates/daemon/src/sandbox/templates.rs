//! Templates: a name for an image plus the defaults of the sandboxes made from it, kept in
//! the store, and the warm pool each may have (see `pool`). A create that names a template
//! gets its defaults (`CreateTemplate::apply`); its pool serves the creates that ask for
//! nothing else a pooled sandbox cannot take at claim.

use belljar_api::{BackendChoice, CreateTemplate, Template, TemplateList, Validate};

use super::pool::Class;
use super::{SandboxError, Sandboxes};
use crate::util::now_ms;

impl Sandboxes {
    /// Records a template over an image the daemon has, and starts its pool.
    pub fn create_template(&self, req: CreateTemplate) -> Result<Template, SandboxError> {
        self.check_template(&req)?;
        // The image must be here now, and the backend able to run it.
        let class = self.template_class(&req)?;
        if !self.inner.store.insert_template(&req, now_ms())? {
            return Err(SandboxError::Conflict(format!(
                "A template named {} exists",
                req.name
            )));
        }
        self.add_template_pool(&req.name, class, req.pool.unwrap_or(0) as usize);
        self.template(&req.name)
    }

    /// Replaces template `name` with `req` (whose name must be the same): the sandboxes made
    /// from it before stay as they are; its pooled ones, made to the old defaults, are
    /// destroyed and the pool refills to the new ones.
    pub async fn replace_template(
        &self,
        name: &str,
        req: CreateTemplate,
    ) -> Result<Template, SandboxError> {
        if req.name != name {
            return Err(SandboxError::BadRequest(format!(
                "name: {:?} is not the template's name {name:?} (a template is not renamed)",
                req.name
            )));
        }
        self.check_template(&req)?;
        let class = self.template_class(&req)?;
        if !self.inner.store.replace_template(&req)? {
            return Err(SandboxError::TemplateNotFound(name.to_owned()));
        }
        self.drain_template_pool(name).await;
        self.add_template_pool(name, class, req.pool.unwrap_or(0) as usize);
        self.template(name)
    }

    /// What every template must be: valid, within the daemon's limits, its policy one the
    /// firewall takes.
    fn check_template(&self, req: &CreateTemplate) -> Result<(), SandboxError> {
        req.validate()
            .map_err(|e| SandboxError::BadRequest(e.to_string()))?;
        let s = &self.inner.settings;
        if req.timeout_ms.is_some_and(|t| t > s.max_timeout_ms) {
            return Err(SandboxError::BadRequest(format!(
                "timeout_ms: exceeds the maximum of {} ms",
                s.max_timeout_ms
            )));
        }
        if let Some(policy) = &req.network_policy {
            super::network::policy::firewall(policy)?;
        }
        Ok(())
    }

    /// Every template, by name, with its pool's state.
    pub fn templates(&self) -> Result<TemplateList, SandboxError> {
        let templates = (self.inner.store.templates()?.iter())
            .map(|(spec, at)| self.shown(spec, *at))
            .collect();
        Ok(TemplateList { templates })
    }

    /// Template `name` with its pool's state.
    pub fn template(&self, name: &str) -> Result<Template, SandboxError> {
        match self.inner.store.template(name)? {
            Some((spec, at)) => Ok(self.shown(&spec, at)),
            None => Err(SandboxError::TemplateNotFound(name.to_owned())),
        }
    }

    /// Deletes template `name` and destroys its pooled sandboxes; sandboxes made from it
    /// stay.
    pub async fn remove_template(&self, name: &str) -> Result<(), SandboxError> {
        if !self.inner.store.delete_template(name)? {
            return Err(SandboxError::TemplateNotFound(name.to_owned()));
        }
        self.drain_template_pool(name).await;
        Ok(())
    }

    /// `req` made to name user template `name` instead of an image, when there is one: a
    /// compatibility layer's template names a user's template first, its built-in mapping
    /// (an image) only when there is none.
    pub fn prefer_template(
        &self,
        mut req: belljar_api::CreateSandbox,
        name: &str,
    ) -> Result<belljar_api::CreateSandbox, SandboxError> {
        if self.inner.store.template(name)?.is_some() {
            req.template = Some(name.to_owned());
            req.image = None;
        }
        Ok(req)
    }

    /// The template a create names, whose defaults it gets.
    pub(super) fn template_spec(&self, name: &str) -> Result<CreateTemplate, SandboxError> {
        match self.inner.store.template(name)? {
            Some((spec, _)) => Ok(spec),
            None => Err(SandboxError::TemplateNotFound(name.to_owned())),
        }
    }

    /// What the pooled sandboxes of `spec` are launched as: what a create that names only
    /// the template gets.
    pub(super) fn template_class(&self, spec: &CreateTemplate) -> Result<Class, SandboxError> {
        let image = self.inner.images.resolve(&spec.image)?;
        let choice = spec.backend.unwrap_or(BackendChoice::Auto);
        let (backend, _) = self.pick_backend(&image, choice, false)?;
        let s = &self.inner.settings;
        Ok(Class {
            template: Some(spec.name.clone()),
            image: spec.image.clone(),
            backend: backend.kind(),
            vcpus: spec.vcpus.unwrap_or(s.default_vcpus),
            memory_mib: spec.memory_mib.unwrap_or(s.default_memory_mib),
            disk_mib: spec.disk_mib.unwrap_or(s.default_disk_mib),
        })
    }

    fn shown(&self, spec: &CreateTemplate, created_at: i64) -> Template {
        let (ready, starting) = self.template_pool(&spec.name);
        Template::new(spec, created_at, ready, starting)
    }
}
