//! sled 0.34.7 against sled 1.0.0-alpha on the store's design: one tree per
//! time slice, per event one look-up that misses and one insert of a compact
//! record (18-byte key, ~36-byte value), a flush per group of 256 (the group
//! commit), expiry by dropping a slice's tree. Measures bytes on disk per
//! record, CPU per event, RSS, the time to drop a full slice, and recovery after
//! SIGKILL (reopen time, every acknowledged record present).
//!
//!   cargo run --release --manifest-path bench/sled-versions/Cargo.toml -- [RECORDS] [KILLS]
//!
//! Each engine runs in a process of its own (`sled-versions load ENGINE DIR N`),
//! so RSS and CPU are its alone.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Records per group commit (outboxd batches about this many under load).
const GROUP: u64 = 256;
/// Page cache of both engines (outboxd's `store.cache_size` default).
const CACHE_BYTES: usize = 32 << 20;

#[derive(Clone, Copy, Debug)]
enum Engine {
    Old,
    Alpha,
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Old => "sled 0.34.7",
            Engine::Alpha => "sled 1.0.0-alpha.124",
        }
    }

    fn arg(self) -> &'static str {
        match self {
            Engine::Old => "old",
            Engine::Alpha => "alpha",
        }
    }
}

/// Both versions behind the few calls the store makes.
enum Db {
    Old(sled::Db, sled::Tree),
    /// Boxed: the alpha's handles are ~28 KB.
    Alpha(Box<(sled1::Db, sled1::Tree)>),
}

impl Db {
    fn open(engine: Engine, dir: &Path) -> anyhow::Result<Db> {
        Ok(match engine {
            Engine::Old => {
                let db = sled::Config::new().path(dir).cache_capacity(CACHE_BYTES as u64).open()?;
                let tree = db.open_tree("slice")?;
                Db::Old(db, tree)
            }
            Engine::Alpha => {
                let db: sled1::Db = sled1::Config::new().path(dir).cache_capacity_bytes(CACHE_BYTES).open()?;
                let tree = db.open_tree("slice")?;
                Db::Alpha(Box::new((db, tree)))
            }
        })
    }

    fn contains(&self, key: &[u8]) -> anyhow::Result<bool> {
        Ok(match self {
            Db::Old(_, t) => t.contains_key(key)?,
            Db::Alpha(b) => b.1.contains_key(key)?,
        })
    }

    fn insert(&self, key: &[u8], value: &[u8]) -> anyhow::Result<()> {
        match self {
            Db::Old(_, t) => drop(t.insert(key, value)?),
            Db::Alpha(b) => drop(b.1.insert(key, value)?),
        }
        Ok(())
    }

    fn flush(&self) -> anyhow::Result<()> {
        match self {
            Db::Old(db, _) => drop(db.flush()?),
            Db::Alpha(b) => drop(b.0.flush()?),
        }
        Ok(())
    }

    fn drop_slice(&self) -> anyhow::Result<()> {
        match self {
            Db::Old(db, _) => drop(db.drop_tree("slice")?),
            Db::Alpha(b) => drop(b.0.drop_tree("slice")?),
        }
        self.flush()
    }
}

/// The key and value of event `i`, shaped like the store's: tag, 16 id bytes,
/// scope id; flags, attempts, topic, partition, offset, times, outcome, key, type.
fn record(i: u64) -> ([u8; 18], Vec<u8>) {
    let h = |x: u64| x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ 0xD6E8_FEB8_6659_FD93;
    let mut key = [0u8; 18];
    key[0] = 1;
    key[1..9].copy_from_slice(&h(i).to_be_bytes());
    key[9..17].copy_from_slice(&h(i ^ 0xFFFF).to_be_bytes());
    key[17] = 1;
    let mut value = vec![0x05, 0x02, 1, 1, (i % 8) as u8 * 2];
    value.extend_from_slice(&[(i as u8) | 0x80, ((i >> 7) as u8) | 0x80, (i >> 14) as u8 & 0x7F]);
    value.extend_from_slice(&[0xC0, 0x84, 0x3D, 0x88, 0x01, 0xE8, 0x07, 0, 0, 0xC8, 0x01]);
    value.push(10);
    value.extend_from_slice(format!("order-{:04}", i % 10_000).as_bytes());
    value.push(1);
    (key, value)
}

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

fn cpu_secs() -> f64 {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(usage.user_time()) + t(usage.system_time())
}

fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => n += dir_bytes(&e.path()),
            Ok(m) => n += m.blocks() * 512,
            Err(_) => {}
        }
    }
    n
}

/// `load ENGINE DIR N`: N events into a fresh store; prints one line of figures.
fn load(engine: Engine, dir: &Path, n: u64) -> anyhow::Result<()> {
    let db = Db::open(engine, dir)?;
    let (t0, cpu0) = (Instant::now(), cpu_secs());
    for i in 0..n {
        let (k, v) = record(i);
        if db.contains(&k)? {
            bail!("event {i} found before it was written");
        }
        db.insert(&k, &v)?;
        if (i + 1) % GROUP == 0 {
            db.flush()?;
        }
    }
    db.flush()?;
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_secs() - cpu0);
    std::thread::sleep(Duration::from_millis(500));
    let (rss, hwm) = (status_kb("VmRSS:"), status_kb("VmHWM:"));
    let bytes = dir_bytes(dir);
    let t = Instant::now();
    db.drop_slice()?;
    let drop_secs = t.elapsed().as_secs_f64();
    println!("{secs:.2} {cpu:.2} {rss} {hwm} {bytes} {drop_secs:.3} {}", dir_bytes(dir),);
    Ok(())
}

/// `child ENGINE DIR START`: writes from event START on, printing the count of
/// events made durable after each flush, until killed.
fn child(engine: Engine, dir: &Path, start: u64) -> anyhow::Result<()> {
    let db = Db::open(engine, dir)?;
    let mut out = std::io::stdout().lock();
    for i in start.. {
        let (k, v) = record(i);
        db.insert(&k, &v)?;
        if (i + 1) % GROUP == 0 {
            db.flush()?;
            writeln!(out, "{}", i + 1)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// Kills a writer at a random moment `kills` times; after each, reopens and
/// checks every acknowledged event. Returns (reopen seconds max, records lost).
fn kill_loop(engine: Engine, dir: &Path, preload: u64, kills: u32) -> anyhow::Result<(f64, u64)> {
    let me = std::env::current_exe()?;
    let mut durable = preload;
    let (mut worst_open, mut lost) = (0f64, 0u64);
    for round in 0..kills {
        let mut c = Command::new(&me)
            .args(["child", engine.arg(), &dir.to_string_lossy(), &durable.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = c.stdout.take().context("child stdout")?;
        let wait = Duration::from_millis(300 + u64::from(round) * 137 % 700);
        let reader = std::thread::spawn(move || {
            let mut last = None;
            let t = Instant::now();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                last = line.trim().parse::<u64>().ok().or(last);
                if t.elapsed() > wait * 4 {
                    break;
                }
            }
            last
        });
        std::thread::sleep(wait);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGKILL)?;
        c.wait()?;
        let acked = reader.join().expect("reader").unwrap_or(durable);
        let t = Instant::now();
        let db = Db::open(engine, dir)?;
        worst_open = worst_open.max(t.elapsed().as_secs_f64());
        for i in 0..acked {
            if !db.contains(&record(i).0)? {
                lost += 1;
            }
        }
        durable = acked;
    }
    Ok((worst_open, lost))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let engine = |s: &str| match s {
        "old" => Ok(Engine::Old),
        "alpha" => Ok(Engine::Alpha),
        other => bail!("unknown engine {other:?}: old or alpha"),
    };
    match args.first().map(String::as_str) {
        Some("load") => return load(engine(&args[1])?, Path::new(&args[2]), args[3].parse()?),
        Some("child") => return child(engine(&args[1])?, Path::new(&args[2]), args[3].parse()?),
        _ => {}
    }
    let n: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let kills: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let me = std::env::current_exe()?;
    println!("| engine | load s | CPU µs/event | RSS MB (peak) | bytes on disk / record | drop a slice of {n}, s | reopen after SIGKILL, worst s | acknowledged records lost |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for engine in [Engine::Old, Engine::Alpha] {
        let dir = tempdir(engine)?;
        let out = Command::new(&me).args(["load", engine.arg(), &dir.to_string_lossy(), &n.to_string()]).output()?;
        if !out.status.success() {
            bail!("{} load failed: {}", engine.name(), String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let f: Vec<f64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        let [secs, cpu, rss, hwm, bytes, drop_secs, _] = f[..] else { bail!("unexpected output {text:?}") };
        // A store of n records again, then writers killed at random moments.
        std::fs::remove_dir_all(&dir)?;
        let preload = n.min(200_000);
        {
            let db = Db::open(engine, &dir)?;
            for i in 0..preload {
                let (k, v) = record(i);
                db.insert(&k, &v)?;
            }
            db.flush()?;
        }
        let (open, lost) = kill_loop(engine, &dir, preload, kills)?;
        println!(
            "| {} | {secs:.1} | {:.1} | {:.0} ({:.0}) | {:.0} | {drop_secs:.2} | {open:.2} | {lost} |",
            engine.name(),
            cpu / n as f64 * 1e6,
            rss / 1024.0,
            hwm / 1024.0,
            bytes / n as f64,
        );
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}

fn tempdir(engine: Engine) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("sled-versions-{}-{}", engine.arg(), std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(dir)
}
