//! outboxd's integration tests, one test binary (one link step) with a module per theme.
//!
//! Run one theme with a filter on its module path, e.g. `cargo test --test it core::`.
//! Most modules need the local stack (`scripts/stack up`); see each module's docs.
//! `[store.changelog]` is on (its default) unless `OUTBOXD_TEST_CHANGELOG=off`.

mod harness;

mod admin;
mod admin_limits;
mod audit;
mod avro;
mod avro_local;
mod avro_registry;
mod broker_away;
mod changelog_auth;
mod compose;
mod console;
mod core;
mod dashboard;
mod debezium;
mod decode_regressions;
mod embed;
mod failure;
mod faults;
mod fencing;
mod hold;
mod hostile;
mod kill_loop;
mod kubernetes;
mod log_stream;
mod postgres_inbox;
mod replay;
mod resilience;
mod restore_bounds;
mod restore_crashes;
mod routes;
mod scale;
mod scale_churn;
mod scale_repairs;
mod scale_repartition;
mod scale_standby;
mod scale_topics;
mod seal_crashes;
mod signatures;
mod store_failure;
mod tls_config;
mod traces;
mod upgrade;
