//! `pg-table --config F --pg URL --table NAME [--pool N]`: outboxd's decoder and
//! handler, deduplicating with a PostgreSQL `processed_events`-style table
//! (created when missing, kept across restarts), synchronous_commit on.

use clap::Parser;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    config: std::path::PathBuf,
    #[arg(long)]
    pg: String,
    #[arg(long, default_value = "processed_events")]
    table: String,
    /// PostgreSQL connections (the in-flight events share them).
    #[arg(long, default_value_t = 32)]
    pool: usize,
}

/// Same allocator as outboxd (src/main.rs): the comparison is about dedup, not malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Huge pages off, as outboxd starts: the processes hold memory as the service does.
    outboxd::cli::small_pages();
    let a = Args::parse();
    anyhow::ensure!(a.table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "--table: letters, digits, _");
    let dedup = outboxd_bench::contender::Dedup::Pg { url: a.pg, table: a.table, pool: a.pool };
    outboxd_bench::contender::run(&a.config, dedup).await
}
