//! `naive --config F`: outboxd's decoder and handler, no dedup, offsets
//! auto-committed as consumed. The upper bound of the benchmark.

/// Same allocator as outboxd (src/main.rs): the comparison is about dedup, not malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Huge pages off, as outboxd starts: the processes hold memory as the service does.
    outboxd::cli::small_pages();
    let args: Vec<String> = std::env::args().collect();
    let config = match args.as_slice() {
        [_, flag, path] if flag == "--config" => path.clone(),
        _ => anyhow::bail!("usage: naive --config FILE"),
    };
    outboxd_bench::contender::run(config.as_ref(), outboxd_bench::contender::Dedup::None).await
}
