//! # outboxd
//!
//! Runs the side effect of each transactional-outbox event once per event id (a call
//! cut short by a crash is repeated, with the same idempotency key).
//! Services write an event row into an `outbox` table in the same transaction
//! as their state change; Debezium (EventRouter) streams the rows into Kafka;
//! outboxd consumes them and, per event:
//!
//! ```text
//! consumer ─► decode ─► claim id ─► handler ─► record done (durable) ─► store offset
//!   kafka      codec        store                handler      store                 offsets
//! ```
//!
//! **Guarantee.** A handler runs only after its event id is claimed (in memory for
//! `on_uncertain = retry`, durably for `verify`/`park`: see `docs/architecture.md` §2, invariant 1); an
//! event recorded `done` is never run again while its record is retained, at
//! whatever offset it comes back (records are keyed by event id and dedup scope,
//! by default the topic); an offset is stored for commit only when the
//! event there and every earlier one of its partition is durably `done`,
//! `dead` or `held`. Events of one key run one at a time in offset order, and
//! (`on_dead = "hold"`, the default) none runs past a dead one of its key: they are
//! recorded `held` and run in order once it is retried, resolved or forgotten. A crash
//! *during* a handler leaves the event uncommitted: the next delivery runs it
//! again with the same idempotency key (under `verify`/`park` the durable claim
//! makes it found `claimed`, and the policy decides). A panic while
//! handling one message is contained: it is recorded dead and its key and
//! partition go on; `/readyz` names a partition that stalls anyway.
//!
//! ## Embedding outboxd
//! The public API is what a program that embeds outboxd needs: [`App`] (the service,
//! with handlers of your own for some topics, and [`App::own_metrics`] when the
//! program records metrics itself), [`config`] (the TOML file, parsed and validated),
//! [`handler`] (the [`handler::Handler`] trait, [`handler::from_fn`] for a closure) and
//! [`event`] (what a handler is given), [`Error`] (why [`App::run`] failed, by
//! [`ErrorKind`]) and [`main`] (the `outboxd` command line). The guarantee above holds for your handlers
//! too: one runs for an event only after its id is claimed, and an event it already
//! finished is never given to it again; a re-execution after a crash gets the same
//! event, so use its id as the receiver's idempotency key.
//!
//! ```no_run
//! use outboxd::handler::{from_fn, Outcome};
//!
//! # async fn example() -> anyhow::Result<()> {
//! let config = outboxd::config::Config::load("outboxd.toml".as_ref())?;
//! outboxd::App::new(config)
//!     .handler("outbox.event.payment", from_fn(|event| async move {
//!         println!("payment event {} at {}", event.id, event.position);
//!         Ok(Outcome::new("printed"))
//!     }))
//!     .run(async { tokio::signal::ctrl_c().await.unwrap() })
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! The other modules are private to the crate. The `internals` feature makes them
//! public (hidden from this documentation) for the benchmark, the fuzz targets and
//! the integration tests: they are not an API to build on, and change without notice.
//!
//! ## Where things live
//! Imports flow one way, from `cli` and `app` down to the leaves (`event`, `template`, `wire`,
//! `metrics`, `offsets`; `config` uses only `template`); `scripts/module-dag` fails CI on a
//! loop. `docs/architecture.md` §5 says what each module owns, §6 lists the imports.
//! - [`config`]: the TOML file as serde data, defaults, `validate()` naming the field; `config::routes`: the handlers
//!   that share a topic (its routes), what each selects, its record scope and idempotency key.
//! - `template`: URL templates; event data only in path and query, percent-encoded.
//! - [`event`] / `codec`: the one decoder, Kafka message → `event::OutboxEvent` (Debezium JSON/text shapes, Avro); typed `DecodeError`s.
//! - `avro`: the Confluent wire format, the registry client (subjects checked, errors loud), bounded decoding.
//! - `store`: the sled dedup store keyed by (event id, dedup scope); the only place that uses sled. In layers,
//!   each using only those before it (`scripts/module-dag` checks store/ file by file):
//!   `store::disk`, the disk core: group commit (flush + fdatasync of the log and of new blob files; a failed
//!   sync fails every later wait), time slices (packed into runs of 64-record blocks once no longer live,
//!   `store/disk/runs.rs`; lookup filters per run, stored with it, and per overlay, so a new id reads no sled
//!   page), message copies within a quota; it knows nothing of claims, chains, the audit or the changelog.
//!   Then the parts held beside it (`store::chain_index`: the events held behind a dead one of their Kafka key,
//!   rebuilt from the records so it follows the changelog; `store::audit_log`; `store::problem_index`; in-memory
//!   claims), then `store::base` (the `Store` and its life: open, gc, sealing), then the ledger (`store::handling`,
//!   `store::held`: recording events held and running them; `store::repair`; `store::audit`: what people did,
//!   who, when, why, kept `retention` long and written to the changelog partition of the events named).
//!   `store::changelog`: with `[store.changelog]` the store is a cache of changelog partitions: final
//!   records also go to Kafka (awaited with the group commit: `store::changelog::settling` wakes the writer once
//!   both are in), restores apply them, checkpoints say how far;
//!   with `key`, each carries a MAC (`store::changelog::mac`) and reads apply only records that check.
//!   `store::changelog::publish`: records written while the changelog was off, copied into it (resumably) before
//!   anything is handled, and the marker that says the changelog has them all. Views last: `store::read`,
//!   `store::view` (records, stats, the audit and message copies as the wire views), `store::roles`.
//! - `offsets`: per-partition tracker of the next committable offset.
//! - `kafka`: the consumer and its rebalance handling (assigned partitions paused until restored), the dead-letter
//!   producer, changelog topics, their producer and restore reader, the reader of single source messages for
//!   replays (`kafka::reread`), client options. Only place that uses rdkafka.
//!   `kafka::group`: the group's members as the brokers describe them (the console's overview).
//!   `kafka::health`: the brokers' reachability, which every client reports to: one warning when they are away,
//!   a summary per interval, one line when they are back (`/readyz`, `outboxd_broker_reachable`).
//! - `engine`: poll loop, per-key chains, bounded in-flight, retries, drain, restore on assignment,
//!   standby replicas of partitions owned elsewhere (`store.changelog.standby`); `engine::circuit` (a
//!   handler's receiver health: while open nothing of it starts and its partitions pause),
//!   `engine::concurrency` (its adaptive limit of calls in flight) and `engine::hold`, which runs
//!   the held events of a released chain on the partition's owner.
//! - [`handler`]: the `Handler` trait (one attempt in, its result out); `http` (reqwest calls to the receivers), `log`,
//!   `postgres` (statements and an inbox row in one transaction in the receiver's database), closures.
//! - `metrics`: metric names and the Prometheus recorder (a leaf).
//! - `log_writer`: the binary's stderr writer, which drops (and counts) a line it cannot write instead of failing.
//! - `telemetry`: the one user of OpenTelemetry: with `[tracing.otlp]`, the binary's layer that exports the
//!   per-event spans (`engine::spans`) over OTLP/HTTP, batched and bounded; an event's span continues the
//!   trace context its message carried, and the http handler sends its call's context on (`traceparent`).
//! - `app`: wires store, metrics, Kafka, engine, admin server and background tasks; one shutdown token, a `JoinSet`.
//!   [`App`] embeds outboxd in a program, with its own handlers for some topics (`examples/custom_handler.rs`).
//! - `ops`: the store operations a person runs (stats, get, list, forget, resolve, re-run, replay, gc, export, audit),
//!   written once against `ops::StoreApi`: on the store itself, or through a running service (`ops::client`, the
//!   admin API's client); every repair is audited under its `ops::Actor`.
//! - `wire`: the admin API's wire format (a leaf): the typed views of records, stats, pages, the audit and repair
//!   answers, whose JSON `/v1`, `store … --json` and `store export` carry; the server, the client, the CLI and
//!   the console all use these types.
//! - `admin`: the admin server: health, readiness, Prometheus metrics (open), the store API behind a bearer
//!   token, named and with its access (`[[admin.tokens]]`) (axum), answered by `ops`; `admin::ui`:
//!   the operators' console at `/ui` (askama templates, htmx, assets in the binary; its own login, sessions
//!   and origin checks; a file per page).
//! - `cli`: `run`, `check-config`, `store …`: parses arguments, calls `ops`, prints (`cli::tables`).

#![warn(missing_docs)]

/// A `use` that is public with the `internals` feature, for items of the public modules
/// that only the crate (and the benchmark, fuzz targets and tests) work with.
macro_rules! internal_use {
    ($($path:tt)*) => {
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub use $($path)*;
        #[cfg(not(feature = "internals"))]
        pub(crate) use $($path)*;
    };
}

/// Modules that are public only with the `internals` feature (the benchmark, the fuzz
/// targets and the integration tests use them), and private to the crate otherwise.
macro_rules! internal_modules {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "internals")]
        #[doc(hidden)]
        pub mod $name;
        #[cfg(not(feature = "internals"))]
        mod $name;
    )*};
}

internal_modules!(
    admin, app, avro, cli, codec, engine, kafka, log_writer, metrics, offsets, ops, store, telemetry, template, wire,
);

pub mod config;
mod error;
pub mod event;
pub mod handler;

pub use error::{Error, ErrorKind};

pub use app::App;

/// The `outboxd` command line (`run`, `check-config`, `store …`), as the `outboxd`
/// binary runs it: parses the process's arguments, runs the command on a runtime of
/// its own with logging on stderr, and returns the exit code (an error is printed
/// with its causes). A program may call it to be the `outboxd` command itself.
pub fn main() -> std::process::ExitCode {
    cli::main()
}
