//! Why a config file is refused. Every message names the field it is about
//! (`handlers[2].url: ...`); only reading the file and the file itself carry a
//! cause as their `source`, which `{:#}` prints after ": ".

use std::path::PathBuf;

use crate::template::TemplateError;

/// A config file that cannot be read, parsed or validated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading config file {}", path.display())]
    Read {
        /// The file as given.
        path: PathBuf,
        /// What the read said.
        #[source]
        error: std::io::Error,
    },
    /// What is wrong inside the file at `path`.
    #[error("invalid config {}", path.display())]
    File {
        /// The file as given.
        path: PathBuf,
        /// The parse or validation error.
        #[source]
        error: Box<ConfigError>,
    },
    /// Not TOML, or not the shape of a config (an unknown key, a wrong type, a
    /// missing section); the message names the line.
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// A field's value is refused.
    #[error("{field}: {message}")]
    Field {
        /// The field, as a path into the file (`store.retention`, `handlers[1].url`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A `${VAR}` in a field's value could not be expanded.
    #[error("{field}: {error}")]
    Env {
        /// The field whose value names the variable.
        field: String,
        /// What is wrong with the reference.
        error: EnvError,
    },
    /// A URL template (`handlers[].url`, `handlers[].verify.url`) is malformed.
    #[error("{field}: {error}")]
    Template {
        /// The field holding the template.
        field: String,
        /// What is wrong with it.
        error: TemplateError,
    },
    /// The file has no `[[handlers]]` entry.
    #[error("handlers: at least one [[handlers]] entry is required")]
    NoHandlers,
    /// A handler with `format = "avro"` and no `[schema_registry]` section.
    #[error("handlers[{index}].format: \"avro\" needs a [schema_registry] section (url or schemas_dir)")]
    AvroWithoutRegistry {
        /// The handler.
        index: usize,
    },
}

impl ConfigError {
    /// `field: message`.
    pub(super) fn field(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Field { field: field.into(), message: message.into() }
    }
}

/// Why a `${VAR}` reference could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// `${` without its `}`.
    #[error("unterminated \"${{\"")]
    Unterminated,
    /// A name that is empty or not letters, digits and `_`.
    #[error("invalid variable name {0:?}")]
    InvalidName(String),
    /// The environment has no such variable.
    #[error("environment variable {0} is not set")]
    Unset(String),
}
