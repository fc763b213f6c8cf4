//! Benchmark support for outboxd: the `naive` and `pg-table` contenders (one
//! consumer loop, see [`contender`]) and the suite driver (`src/main.rs`).
//! Not part of the product.

pub mod contender;
pub mod probe;
pub mod scale;

/// As `outboxd` starts (src/cli/entry.rs): transparent huge pages off for the
/// process unless `MIMALLOC_ALLOW_THP` is set, so that the contenders and the scale
/// scenario's store processes hold memory as the service does.
pub fn small_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        let _ = nix::sys::prctl::set_thp_disable(true);
    }
}
