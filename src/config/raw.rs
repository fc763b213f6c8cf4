//! The file as written: `RawConfig`, each section's raw form, checked into [`Config`].

use serde::Deserialize;

use super::*;

/// The file as written by the user. No `Debug`, nor for the sections that hold secrets:
/// as written they are in clear (a password in `kafka.options`, a header value, a key);
/// the validated [`Config`] shows them redacted.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[kafka]` (required): brokers, consumer group, commit and drain timing, librdkafka options.
    pub kafka: RawKafka,
    /// `[store]` (required): the dedup store's directory, retention, group commit, in-flight bounds.
    pub store: RawStore,
    /// `[admin]`: the admin server; absent means every default.
    pub admin: Option<RawAdmin>,
    /// `[schema_registry]`: where Avro schemas come from; needed by `format = "avro"`.
    pub schema_registry: Option<RawSchemaRegistry>,
    /// `[tracing]`: span export (`[tracing.otlp]`); absent means none.
    pub tracing: Option<RawTracing>,
    /// `[log]`: the per-handler summary line; absent means every default.
    pub log: Option<RawLog>,
    /// `[[handlers]]`: one entry per set of topics; at least one is required.
    #[serde(default)]
    pub handlers: Vec<RawHandler>,
}

impl RawConfig {
    /// Each section in file order, then the checks across sections.
    pub fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let kafka = self.kafka.validate(env)?;
        let store = self.store.validate(&kafka.group_id, env)?;
        let admin = admin::validate(self.admin, env)?;
        let schema_registry = self.schema_registry.map(|r| r.validate(&store.path, env)).transpose()?;
        let otlp = self.tracing.map(|t| t.validate(env)).transpose()?.flatten();
        let log = self.log.unwrap_or_default().validate()?;

        if self.handlers.is_empty() {
            return Err(ConfigError::NoHandlers);
        }
        let mut handlers = Vec::with_capacity(self.handlers.len());
        for (index, h) in self.handlers.into_iter().enumerate() {
            handlers.push(h.validate(index, env)?);
        }
        routes::check(&handlers)?;
        for (i, h) in handlers.iter().enumerate() {
            if let Some(other) = handlers[..i].iter().find(|o| o.name == h.name) {
                return Err(ConfigError::field(
                    format!("handlers[{i}].name"),
                    format!("{:?} is handlers[{}]'s name too (set a distinct `name`)", h.name, other.index),
                ));
            }
        }
        if let Some(h) = handlers.iter().find(|h| h.format == Format::Avro) {
            if schema_registry.is_none() {
                return Err(ConfigError::AvroWithoutRegistry { index: h.index });
            }
        }
        Ok(Config { kafka, store, admin, schema_registry, handlers, otlp, log })
    }
}
