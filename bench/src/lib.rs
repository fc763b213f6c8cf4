//! Benchmark support for outboxd: the `naive` and `pg-table` contenders (one
//! consumer loop, see [`contender`]) and the suite driver (`src/main.rs`).
//! Not part of the product.

pub mod contender;
pub mod probe;
pub mod scale;
