//! The admin HTTP API of a running outboxd: the [`server`] (health,
//! readiness, Prometheus metrics and the authenticated store API under
//! `/v1`) and the [`client`] that `outboxd store …` uses while the service
//! holds the store. The two share only the wire format: the views of
//! [`crate::store::view`], which the server serializes and the client reads.

pub mod client;
pub mod server;

pub use client::{AdminClient, AdminError};
pub use server::{bind, serve, AdminState, BindError};
