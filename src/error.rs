//! Why [`App::run`](crate::App::run) failed, typed by what failed so that an
//! embedding program can branch on it; the causes hang below it as sources.

/// A cause, whatever its type.
type Source = Box<dyn std::error::Error + Send + Sync>;

/// Why [`App::run`](crate::App::run) failed, at start-up or by stopping on its own.
/// [`Error::kind`] says what failed; the message says what outboxd was doing, and
/// its [sources](std::error::Error::source) say why (`{:#}` with `anyhow` prints
/// them all, as the `outboxd` binary does).
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: String,
    source: Option<Source>,
}

/// What failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration cannot run as given: a handler given to
    /// [`App::handler`](crate::App::handler) for a topic no `[[handlers]]` entry
    /// covers, a handler that cannot be built, a changelog topic whose partition
    /// count differs from its source topic's. A person must change something.
    Config,
    /// The store could not be opened, written or flushed. When it failed while
    /// running, nothing was committed past what could not be recorded.
    Store,
    /// Kafka: a client could not be created, the store's records could not be
    /// copied into the changelog at start-up, or the consumer failed for good (an
    /// authentication failure, another member with this one's `group.instance.id`).
    Kafka,
    /// The admin server could not listen, or its address could not be recorded next
    /// to the store.
    Admin,
    /// Metrics could not be set up (another recorder is installed: see
    /// [`App::own_metrics`](crate::App::own_metrics)).
    Metrics,
    /// A task of outboxd panicked: a bug.
    Internal,
}

impl Error {
    /// What failed.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub(crate) fn new(kind: ErrorKind, context: impl Into<String>, source: impl Into<Source>) -> Error {
        Error { kind, context: context.into(), source: Some(source.into()) }
    }

    /// An error that is its own cause.
    pub(crate) fn plain(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error { kind, context: context.into(), source: None }
    }
}

/// `e` and every cause below it, each after `: ` (as `anyhow` prints a chain), for a
/// log line, a record's reason or an answer. A cause whose text `e` already ends with
/// (some clients print their cause themselves) is not said twice.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

/// The message says what outboxd was doing; `{:#}` adds every cause after it, each
/// after `: ` (as `anyhow` prints a chain).
impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.context)?;
        if f.alternate() {
            let mut cause = std::error::Error::source(self);
            while let Some(c) = cause {
                write!(f, ": {c}")?;
                cause = c.source();
            }
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_says_what_was_being_done_and_the_source_why() {
        let e = Error::new(ErrorKind::Store, "opening the store at /x", std::io::Error::other("disk full"));
        assert_eq!(e.kind(), ErrorKind::Store);
        assert_eq!(e.to_string(), "opening the store at /x");
        assert_eq!(format!("{e:#}"), "opening the store at /x: disk full");
        assert_eq!(format!("{:#}", anyhow::Error::from(e)), "opening the store at /x: disk full");
    }
}
