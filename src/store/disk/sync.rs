//! Group commit: writers apply their change to sled, then wait here until it
//! is on disk. One thread makes everything written so far durable with one
//! `flush()` + `fdatasync` and wakes every waiter of that batch.
//!
//! Writers queue behind a mutex and wake the thread only when it sleeps waiting
//! for a first writer: while a batch waits for company it sleeps in steps of the
//! idle gap and counts who came meanwhile, so a batch of 30 writers costs the
//! thread a few wake-ups, not 30 (a cross-thread wake-up is several µs of CPU).
//!
//! sled's `flush()` alone ends in `sync_file_range`, which does not survive a
//! power loss; the `fdatasync` of the log file does. Values too large for the
//! log (pages above ~128 KiB: large message copies) go to blob files of their
//! own that sled never fsyncs: new ones are fsynced here in the same batch.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// Waiters queued for the next batch; beyond that writers wait for room
/// (it is far above `max_in_flight` × 2 durable waits per event).
const QUEUE_CAPACITY: usize = 65_536;

/// Under load a batch waits for more writers, but only while they keep coming:
/// once no writer arrived for this part of the window, it commits. So a lone
/// writer never waits out the window, and a steady stream (one write per event
/// now, arriving as handlers finish) still fills a batch.
const IDLE_GAP_PARTS: u32 = 4;

pub type SyncResult = Result<(), Arc<std::io::Error>>;

pub type BeforeFlush = Box<dyn Fn() -> Result<(), sled::Error> + Send>;

/// How long a batch may wait for more writers, once the previous batch showed
/// there is load (and only while they keep arriving: see `IDLE_GAP_PARTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// As a rule (`store.commit_interval`): short, since an event waits for it.
    pub usual: Duration,
    /// While the engine has a backlog (`store.backlog_commit_interval`): more
    /// events wait to start than may run, so what an event waits for here does not
    /// delay the backlog's end, and a larger batch spreads the flush and the
    /// fdatasync over more events. At least `usual`.
    pub backlog: Duration,
}

#[cfg(test)]
impl Windows {
    /// The same window with and without a backlog.
    pub fn fixed(window: Duration) -> Windows {
        Windows { usual: window, backlog: window }
    }
}

/// Statistics of the batches, for benchmarks and logs.
#[derive(Debug, Default, Clone, Copy)]
pub struct SyncStats {
    /// Batches run (failed ones included).
    pub batches: u64,
    /// Waits the batches answered (one per `Store::durable` call: a claim, a final record, …).
    pub records: u64,
    /// Time spent making batches durable (writing the kept counts and checkpoints,
    /// flush and, with fsync on, fdatasync), summed.
    pub total_sync: Duration,
    /// The longest of those times.
    pub max_sync: Duration,
    /// sled blob files made durable.
    pub blob_files_synced: u64,
    /// Batches that waited the whole window for more writers (they kept coming);
    /// the others stopped at the first idle gap, or did not wait at all.
    pub waited_out: u64,
}

/// What is fdatasync'ed after each flush, when power-loss safety is asked for.
pub struct DataFiles {
    /// sled's log.
    pub log: File,
    pub blobs: BlobFiles,
}

/// sled's `blobs/` directory: files named by the log sequence number that
/// points at them, written once and never fsynced by sled.
pub struct BlobFiles {
    dir: PathBuf,
    /// The directory's mtime when it was last looked at: unchanged, no new file.
    seen_mtime: Option<std::time::SystemTime>,
    /// Blob files up to this sequence number are durable.
    synced_up_to: Option<u64>,
}

impl BlobFiles {
    pub fn new(store_dir: &Path) -> BlobFiles {
        BlobFiles { dir: store_dir.join("blobs"), seen_mtime: None, synced_up_to: None }
    }

    /// Fsyncs blob files created since the last call, then the directory.
    /// Returns how many files were synced.
    fn sync_new(&mut self) -> std::io::Result<u64> {
        let mtime = match std::fs::metadata(&self.dir) {
            Ok(m) => m.modified()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        if self.seen_mtime == Some(mtime) {
            return Ok(0);
        }
        let mut synced = 0;
        let mut newest = self.synced_up_to;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Some(lsn) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else { continue };
            if self.synced_up_to.is_some_and(|done| lsn <= done) {
                continue;
            }
            match File::open(entry.path()) {
                Ok(f) => f.sync_data()?,
                // sled removed an obsolete blob meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            synced += 1;
            newest = Some(newest.map_or(lsn, |n| n.max(lsn)));
        }
        File::open(&self.dir)?.sync_all()?;
        self.synced_up_to = newest;
        self.seen_mtime = Some(mtime);
        Ok(synced)
    }
}

/// Told the outcome of the batch that covered a write, by the sync thread (a
/// write that also waits for something else: see `changelog::settling`).
pub trait OnDurable: Send + Sync {
    /// Everything written before the wait began is durable (or why not).
    fn on_durable(&self, result: SyncResult);
}

/// Who waits for a batch: a writer's channel, or a joined wait.
enum Waiter {
    Channel(oneshot::Sender<SyncResult>),
    Joined(Joined),
}

/// A joined wait, told "stopped" if it is dropped unanswered (the sync thread
/// panicked, or the queue went away): a dropped channel tells its writer by
/// itself, a joined wait would otherwise wait for ever.
struct Joined(Option<Arc<dyn OnDurable>>);

impl Drop for Joined {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            w.on_durable(Err(stopped()));
        }
    }
}

impl Waiter {
    fn answer(self, result: SyncResult) {
        match self {
            Waiter::Channel(tx) => {
                let _ = tx.send(result);
            }
            Waiter::Joined(mut joined) => {
                if let Some(w) = joined.0.take() {
                    w.on_durable(result);
                }
            }
        }
    }
}

/// A backlog is assumed for this long after an event last waited for room
/// ([`Syncer::backlog_seen`]). In a backlog events wait for room every few µs to
/// ms, as places free up; once none has waited for this long, the stream has
/// thinned and a batch again waits only the usual window.
const BACKLOG_MEMORY: Duration = Duration::from_millis(50);

/// The writers waiting for the next batch, and how the sync thread is to be woken.
struct Queue {
    state: Mutex<Queued>,
    /// Notified when a writer arrives while the thread waits for a first one, and at close.
    arrived: Condvar,
    /// What the times below count from.
    epoch: Instant,
    /// When an event last waited for room to start ([`Syncer::backlog_seen`]), in
    /// µs since `epoch` and plus one (0: never).
    backlog_seen: AtomicU64,
}

impl Queue {
    fn new() -> Queue {
        Queue {
            state: Mutex::default(),
            arrived: Condvar::new(),
            epoch: Instant::now(),
            backlog_seen: AtomicU64::new(0),
        }
    }

    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX).saturating_add(1)
    }

    /// Whether an event waited for room within [`BACKLOG_MEMORY`].
    fn in_backlog(&self) -> bool {
        let seen = self.backlog_seen.load(Ordering::Relaxed);
        seen != 0 && self.since_epoch().saturating_sub(seen) < BACKLOG_MEMORY.as_micros() as u64
    }
}

#[derive(Default)]
struct Queued {
    waiters: Vec<Waiter>,
    /// Writers queued since start: the thread sees whether any came while it slept.
    arrivals: u64,
    /// The thread waits on `arrived` for a first writer (only then is it notified).
    idle: bool,
    /// No more writers: the thread answers those queued, then ends.
    closed: bool,
}

/// Why a writer could not queue (its waiter given back).
enum Refused {
    Full(Waiter),
    Closed(Waiter),
}

/// How long a writer waits before it tries a full queue again.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(1);

fn closed() -> Arc<std::io::Error> {
    Arc::new(std::io::Error::other("store is closed"))
}

fn stopped() -> Arc<std::io::Error> {
    Arc::new(std::io::Error::other("store sync thread stopped"))
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Queued> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, waiter: Waiter) -> Result<(), Refused> {
        let mut q = self.lock();
        if q.closed {
            return Err(Refused::Closed(waiter));
        }
        if q.waiters.len() >= QUEUE_CAPACITY {
            return Err(Refused::Full(waiter));
        }
        q.waiters.push(waiter);
        q.arrivals += 1;
        let wake = std::mem::take(&mut q.idle);
        drop(q);
        if wake {
            self.arrived.notify_one();
        }
        Ok(())
    }

    fn close(&self) {
        self.lock().closed = true;
        self.arrived.notify_one();
    }
}

pub struct Syncer {
    queue: Arc<Queue>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What the sync thread counts of its batches (the tests read it).
    #[cfg_attr(not(test), expect(dead_code, reason = "only the tests read the batch counts"))]
    stats: Arc<Mutex<SyncStats>>,
}

impl Syncer {
    /// `windows`: how long a batch may wait for more writers. `data_file`: sled's
    /// log and blob files, fdatasync'ed after each flush when `Some`.
    /// `before_flush` writes what must become durable with every batch (the per-state counts).
    pub fn start(db: sled::Db, data_file: Option<DataFiles>, windows: Windows, before_flush: BeforeFlush) -> Syncer {
        let queue = Arc::new(Queue::new());
        let stats = Arc::new(Mutex::new(SyncStats::default()));
        let (thread_queue, thread_stats) = (queue.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("outboxd-sync".into())
            .spawn(move || run(db, data_file, windows, before_flush, &thread_queue, thread_stats))
            .expect("spawning the store sync thread");
        Syncer { queue, thread: Some(thread), stats }
    }

    /// An event waited for room to start (more events wait than may run): the
    /// batches of the next [`BACKLOG_MEMORY`] wait up to [`Windows::backlog`] for
    /// more writers.
    pub fn backlog_seen(&self) {
        self.queue.backlog_seen.store(self.queue.since_epoch(), Ordering::Relaxed);
    }

    /// Whether an event ever waited for room since the store opened.
    #[cfg(test)]
    pub fn backlog_ever_seen(&self) -> bool {
        self.queue.backlog_seen.load(Ordering::Relaxed) != 0
    }

    /// Resolves once everything written before this call is durable.
    pub async fn durable(&self) -> SyncResult {
        let (done_tx, done_rx) = oneshot::channel();
        self.queue_waiter(Waiter::Channel(done_tx)).await;
        done_rx.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Tells `waiter` once everything written before this call is durable
    /// (or why not), from the sync thread: the caller is not woken for it.
    pub async fn durable_then(&self, waiter: Arc<dyn OnDurable>) {
        self.queue_waiter(Waiter::Joined(Joined(Some(waiter)))).await;
    }

    /// [`Syncer::durable`] for a thread outside the async runtime (a restore's):
    /// blocks it until everything written before this call is durable.
    pub fn durable_blocking(&self) -> SyncResult {
        let (done_tx, done_rx) = oneshot::channel();
        let mut pending = Waiter::Channel(done_tx);
        while let Err(back) = self.try_queue(pending) {
            pending = back;
            std::thread::sleep(QUEUE_FULL_PAUSE);
        }
        done_rx.blocking_recv().unwrap_or_else(|_| Err(stopped()))
    }

    /// Queues `waiter` for the next batch. The queue is far larger than the
    /// writers in flight: a full queue only delays.
    async fn queue_waiter(&self, waiter: Waiter) {
        let mut pending = waiter;
        while let Err(back) = self.try_queue(pending) {
            pending = back;
            tokio::time::sleep(QUEUE_FULL_PAUSE).await;
        }
    }

    /// Queues `waiter`, or gives it back when the queue is full. A closed
    /// store answers it at once.
    fn try_queue(&self, waiter: Waiter) -> Result<(), Waiter> {
        match self.queue.push(waiter) {
            Ok(()) => Ok(()),
            Err(Refused::Full(back)) => Err(back),
            Err(Refused::Closed(back)) => {
                back.answer(Err(closed()));
                Ok(())
            }
        }
    }

    #[cfg(test)]
    pub fn stats(&self) -> SyncStats {
        *self.stats.lock().expect("sync stats lock")
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.queue.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    db: sled::Db,
    mut data_file: Option<DataFiles>,
    windows: Windows,
    before_flush: BeforeFlush,
    queue: &Queue,
    stats: Arc<Mutex<SyncStats>>,
) {
    let mut last_batch = 0usize;
    // After a failed flush or fdatasync the kernel may have dropped the dirty pages
    // and cleared the error ("fsyncgate"): a later fdatasync could succeed without
    // the lost writes. So the first failure is the answer to every later wait.
    let mut failed: Option<Arc<std::io::Error>> = None;
    loop {
        let mut q = queue.lock();
        while q.waiters.is_empty() && !q.closed {
            q.idle = true;
            q = queue.arrived.wait(q).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        q.idle = false;
        if q.waiters.is_empty() {
            return; // closed, and nobody waits
        }
        // Under load, wait a little so the next fdatasync covers more writers; stop
        // at the first idle gap, so that nobody waits for writers who are not coming.
        // Writers who come meanwhile queue without waking this thread.
        let mut waited_out = false;
        let window = match queue.in_backlog() {
            true => windows.backlog.max(windows.usual),
            false => windows.usual,
        };
        if last_batch > 1 && !window.is_zero() {
            let deadline = Instant::now() + window;
            let gap = window / IDLE_GAP_PARTS;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    waited_out = true;
                    break;
                }
                let (seen, wait) = (q.arrivals, left.min(gap));
                drop(q);
                std::thread::sleep(wait);
                q = queue.lock();
                if q.arrivals == seen || q.closed {
                    // An idle gap, unless it was cut short by the window's end.
                    waited_out = q.arrivals != seen || wait == left;
                    break;
                }
            }
        }
        let waiters = std::mem::take(&mut q.waiters);
        drop(q);
        last_batch = waiters.len();
        let started = Instant::now();
        let result: Result<u64, _> = match &failed {
            Some(error) => Err(error.clone()),
            None => before_flush()
                .map_err(|e| Arc::new(std::io::Error::other(e)))
                .and_then(|()| make_durable(&db, data_file.as_mut())),
        };
        if let Err(error) = &result {
            failed.get_or_insert_with(|| error.clone());
        }
        let took = started.elapsed();
        metrics::histogram!(crate::metrics::names::BATCH).record(waiters.len() as f64);
        metrics::histogram!(crate::metrics::names::SYNC_SECONDS).record(took.as_secs_f64());
        if let Ok(mut s) = stats.lock() {
            s.batches += 1;
            s.records += waiters.len() as u64;
            s.total_sync += took;
            s.max_sync = s.max_sync.max(took);
            s.waited_out += u64::from(waited_out);
        }
        if let (Ok(blobs), Ok(mut s)) = (&result, stats.lock()) {
            s.blob_files_synced += blobs;
        }
        for w in waiters {
            w.answer(result.clone().map(drop));
        }
    }
}

/// Returns how many blob files were synced.
fn make_durable(db: &sled::Db, data_file: Option<&mut DataFiles>) -> Result<u64, Arc<std::io::Error>> {
    db.flush().map_err(|e| Arc::new(std::io::Error::other(e)))?;
    let Some(files) = data_file else { return Ok(0) };
    files.log.sync_data().map_err(Arc::new)?;
    files.blobs.sync_new().map_err(Arc::new)
}

/// sled's log file inside its directory.
pub fn open_data_file(dir: &Path) -> std::io::Result<File> {
    File::open(dir.join("db"))
}

/// Makes a file's content durable, if it exists.
pub fn sync_file(path: &Path) -> std::io::Result<()> {
    match File::open(path) {
        Ok(f) => f.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes the directory entries of a fresh database durable (files created by sled).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn a_backlog_is_remembered_for_a_while_then_forgotten() {
        let queue = Queue::new();
        assert!(!queue.in_backlog(), "no event waited for room yet");
        queue.backlog_seen.store(queue.since_epoch(), Ordering::Relaxed);
        assert!(queue.in_backlog(), "an event waited for room just now");
        let long_ago = Instant::now().checked_sub(BACKLOG_MEMORY * 4).expect("the clock is past that");
        let queue = Queue { epoch: long_ago, ..Queue::new() };
        queue.backlog_seen.store(1, Ordering::Relaxed);
        assert!(!queue.in_backlog(), "the last wait for room was {:?} ago", BACKLOG_MEMORY * 4);
    }

    #[tokio::test]
    async fn after_a_failed_sync_every_later_wait_fails_too() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        let calls = std::sync::atomic::AtomicU32::new(0);
        // Fails once, then would succeed: the second wait must not be told "durable".
        let flaky: BeforeFlush = Box::new(move || {
            if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                Err(sled::Error::Unsupported("disk went away".into()))
            } else {
                Ok(())
            }
        });
        let syncer = Syncer::start(db, None, Windows::fixed(Duration::ZERO), flaky);
        let first = syncer.durable().await.unwrap_err();
        assert!(first.to_string().contains("disk went away"), "{first}");
        let later = syncer.durable().await.unwrap_err();
        assert!(later.to_string().contains("disk went away"), "the first failure answers later waits: {later}");
    }

    #[test]
    fn a_joined_wait_dropped_unanswered_is_told_the_sync_stopped() {
        struct Told(Mutex<Option<SyncResult>>);
        impl OnDurable for Told {
            fn on_durable(&self, result: SyncResult) {
                *self.0.lock().unwrap() = Some(result);
            }
        }
        let told = Arc::new(Told(Mutex::new(None)));
        drop(Waiter::Joined(Joined(Some(told.clone()))));
        let result = told.0.lock().unwrap().take().expect("told when dropped");
        assert!(result.unwrap_err().to_string().contains("stopped"));
        let answered = Arc::new(Told(Mutex::new(None)));
        Waiter::Joined(Joined(Some(answered.clone()))).answer(Ok(()));
        assert!(answered.0.lock().unwrap().take().expect("answered").is_ok(), "answered once, not told again");
    }

    #[tokio::test]
    async fn lone_writer_after_a_busy_batch_does_not_wait_out_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::disk::db::open_db(dir.path(), crate::store::options::SMALL_CACHE_BYTES).unwrap();
        let window = Duration::from_secs(2);
        // The first batch's flush says it began, then waits for the gate: the writers
        // queued meanwhile are the next batch, however fast this machine flushes (a
        // flush of nothing can be quicker than queueing the next writer).
        let (began_tx, began) = mpsc::channel::<()>();
        let (open, gate) = mpsc::channel::<()>();
        let first = Mutex::new(Some((began_tx, gate)));
        let held: BeforeFlush = Box::new(move || {
            if let Some((began, gate)) = first.lock().expect("test lock").take() {
                let _ = began.send(());
                let _ = gate.recv();
            }
            Ok(())
        });
        let syncer = Syncer::start(db, None, Windows::fixed(window), held);
        let mut writers: Vec<_> = (0..8).map(|_| Box::pin(syncer.durable())).collect();
        assert!(futures::poll!(writers[0].as_mut()).is_pending());
        began.recv().unwrap();
        for w in &mut writers[1..] {
            assert!(futures::poll!(w.as_mut()).is_pending(), "queued behind the held flush");
        }
        open.send(()).unwrap();
        for r in futures::future::join_all(writers).await {
            r.unwrap();
        }
        let busy = syncer.stats();
        assert_eq!((busy.batches, busy.records), (2, 8), "one writer, then seven together: {busy:?}");
        // After a batch of seven, the next one waits for company, but stops at the first idle gap.
        syncer.durable().await.unwrap();
        let s = syncer.stats();
        assert_eq!(s.batches, 3, "the lone writer's batch: {s:?}");
        // Whether it stopped at the idle gap, not how long that took (a loaded machine may
        // oversleep the gap): the window is left only when writers keep coming.
        assert_eq!(s.waited_out, 0, "a lone writer's batch waited out the window: {s:?}");
    }
}
