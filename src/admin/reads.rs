//! The admin server's store reads: each on the blocking pool, at most `[admin]
//! max_reads` at once, so that the pool's threads (which restores need) and the
//! store's time go to the engine first, however many pages, exports and console
//! lists are asked for. A request waits for a turn; its `request_timeout` bounds the wait.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Turns for store reads, shared by the store API and the console.
#[derive(Clone)]
pub struct Reads(Arc<Semaphore>);

impl Reads {
    pub fn new(max_reads: usize) -> Reads {
        Reads(Arc::new(Semaphore::new(max_reads.max(1))))
    }

    /// Runs `read` on the blocking pool once a turn is free. The turn goes with the
    /// thread: a request given up meanwhile does not free it before the read ends.
    pub async fn run<T: Send + 'static>(
        &self,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        let turn = self.0.clone().acquire_owned().await.expect("the reads semaphore is never closed");
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            read()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_reads_run_at_once_than_there_are_turns() {
        let reads = Reads::new(2);
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let all = (0..8).map(|_| {
            let (reads, now, most) = (reads.clone(), now.clone(), most.clone());
            tokio::spawn(async move {
                reads
                    .run(move || {
                        most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        now.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
            })
        });
        for r in futures::future::join_all(all).await {
            r.unwrap().unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!((1..=2).contains(&most), "{most} reads ran at once");
    }
}
