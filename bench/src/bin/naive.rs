//! `naive --config F`: outboxd's decoder and handler, no dedup, offsets
//! auto-committed as consumed. The upper bound of the benchmark.
//!
//! `naive --config F --changelog`: the same, and one changelog record per event
//! awaited before its offset is stored: the floor of outboxd's design.

/// Same allocator as outboxd (src/main.rs): the comparison is about dedup, not malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Huge pages off, as outboxd starts: the processes hold memory as the service does.
    outboxd::cli::small_pages();
    let args: Vec<String> = std::env::args().collect();
    use outboxd_bench::contender::Dedup;
    let (config, dedup) = match args.as_slice() {
        [_, flag, path] if flag == "--config" => (path.clone(), Dedup::None),
        [_, flag, path, cl] if flag == "--config" && cl == "--changelog" => (path.clone(), Dedup::Changelog),
        _ => anyhow::bail!("usage: naive --config FILE [--changelog]"),
    };
    outboxd_bench::contender::run(config.as_ref(), dedup).await
}
