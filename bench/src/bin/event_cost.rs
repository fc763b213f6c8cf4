//! Allocations and CPU per event through outboxd's executor, without Kafka: a store
//! (changelog off, fsync off), a handler that answers at once, new events, 64 in
//! flight. The (system) allocator counts every allocation the runs make (the messages are
//! made before each count). Prints one row per `on_uncertain` policy.
//!
//! ```text
//! cargo run --release -p outboxd-bench --bin event-cost -- [EVENTS] [ROUNDS]
//! ```

use std::time::Instant;

use outboxd::engine::cost::EventCost;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

/// The system allocator, counted: how many allocations a run asks for does not depend
/// on the allocator (the CPU column does: outboxd ships with mimalloc, so compare
/// CPU between runs of this program, not with the drain's).
#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

fn cpu_secs() -> f64 {
    let t = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).expect("getrusage");
    let secs = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    secs(t.user_time()) + secs(t.system_time())
}

#[tokio::main(worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    println!("| on_uncertain | allocations per event | bytes allocated per event | CPU µs per event | events/s |");
    println!("|---|---:|---:|---:|---:|");
    for policy in ["retry", "park"] {
        let dir = tempfile_dir()?;
        let mut cost = EventCost::new(&dir, policy)?;
        // Warm-up: the store's trees, the topic's metric handles, the runtime's pools.
        let warm = cost.messages(n / 5);
        cost.run(&warm, 64).await?;
        let (mut allocs, mut bytes, mut cpu, mut wall) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let messages = cost.messages(n);
            let (region, c0, t0) = (Region::new(ALLOCATOR), cpu_secs(), Instant::now());
            cost.run(&messages, 64).await?;
            let took = t0.elapsed().as_secs_f64();
            let counted = region.change();
            allocs.push((counted.allocations + counted.reallocations) as f64 / n as f64);
            bytes.push((counted.bytes_allocated + counted.bytes_reallocated.max(0) as usize) as f64 / n as f64);
            cpu.push((cpu_secs() - c0) * 1e6 / n as f64);
            wall.push(n as f64 / took);
        }
        println!(
            "| {policy} | {:.1} | {:.0} | {:.1} | {:.0} |",
            median(&allocs),
            median(&bytes),
            median(&cpu),
            median(&wall)
        );
        drop(cost);
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("outboxd-event-cost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
