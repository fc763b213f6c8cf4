//! # outboxd
//!
//! Runs the side effects of transactional-outbox events exactly once.
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
//! event there and every earlier one of its partition is durably `done` or
//! `dead`. Events of one key run one at a time in offset order. A crash
//! *during* a handler leaves the event uncommitted: the next delivery runs it
//! again with the same idempotency key (under `verify`/`park` the durable claim
//! makes it found `claimed`, and the policy decides). A panic while
//! handling one message is contained: it is recorded dead and its key and
//! partition go on; `/readyz` names a partition that stalls anyway.
//!
//! ## Where things live
//! Imports flow one way, from `cli` and `app` down to the leaves (`event`, `template`,
//! `metrics`, `offsets`; `config` uses only `template`); `scripts/module-dag` fails CI on a
//! loop. `docs/architecture.md` §5 says what each module owns, §6 lists the imports.
//! - [`config`]: the TOML file as serde data, defaults, `validate()` naming the field.
//! - [`template`]: URL templates; event data only in path and query, percent-encoded.
//! - [`event`] / [`codec`]: the one decoder, Kafka message → [`event::OutboxEvent`] (Debezium JSON/text shapes, Avro); typed `DecodeError`s.
//! - [`avro`]: the Confluent wire format, the registry client (subjects checked, errors loud), bounded decoding.
//! - [`store`]: the sled dedup store keyed by (event id, dedup scope), group commit (flush + fdatasync of the
//!   log and of new blob files; a failed sync fails every later wait), time slices, message copies within a
//!   quota. Only place that uses sled. [`store::view`]: records, stats, pages and repair answers as typed views
//!   (the admin API's JSON, `store … --json`) and the tables `store …` prints.
//!   [`store::changelog`]: with `[store.changelog]` the store is a cache of changelog partitions: final
//!   records also go to Kafka (awaited with the group commit), restores apply them, checkpoints say how far.
//! - [`offsets`]: per-partition tracker of the next committable offset.
//! - [`kafka`]: the consumer and its rebalance handling (assigned partitions paused until restored), the dead-letter
//!   producer, changelog topics, their producer and restore reader, client options. Only place that uses rdkafka.
//! - [`engine`]: poll loop, per-key chains, bounded in-flight, retries, drain, restore on assignment,
//!   standby replicas of partitions owned elsewhere (`store.changelog.standby`).
//! - [`handler`]: the `Handler` trait (one attempt in, its result out); `http` (reqwest calls to the receivers), `log`, closures.
//! - [`metrics`]: metric names and the Prometheus recorder (a leaf).
//! - [`app`]: wires store, metrics, Kafka, engine, admin server and background tasks; one shutdown token, a `JoinSet`.
//!   [`App`] embeds outboxd in a program, with its own handlers for some topics (`examples/custom_handler.rs`).
//! - [`ops`]: the store operations a person runs (stats, get, list, forget, resolve, re-run, gc, export),
//!   written once against [`ops::StoreApi`]: on the store itself, or through a running service.
//! - [`admin`]: [`admin::server`]: health, readiness, Prometheus metrics (open), the store API behind a bearer
//!   token (axum), answered by [`ops`]; [`admin::client`]: that API's client, which `store …` uses.
//! - [`cli`]: `run`, `check-config`, `store …`: parses arguments, calls [`ops`], prints.

#![warn(missing_docs)]

pub mod admin;
pub mod app;
pub mod avro;
pub mod cli;
pub mod codec;
pub mod config;
pub mod engine;
pub mod event;
pub mod handler;
pub mod kafka;
pub mod metrics;
pub mod offsets;
pub mod ops;
pub mod store;
pub mod template;

pub use app::App;
