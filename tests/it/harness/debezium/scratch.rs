//! The connectors, replication slots, publications and tables a test creates, removed
//! when it ends (also when it fails), and what killed test processes left behind.

use super::*;

static SCRATCH_COUNTER: AtomicU32 = AtomicU32::new(0);
const SQL_PREFIX: &str = "outboxd_it_";
const CONNECTOR_PREFIX: &str = "outboxd-it-";

/// Connectors, replication slots, publications and tables one test creates; all are
/// removed by [`Scratch::cleanup`] or, if the test fails before that, when the
/// `Scratch` is dropped. Names carry the test process id, so that [`sweep_leftovers`]
/// can remove what a killed test process left behind.
pub struct Scratch {
    pg: Pg,
    connect: Connect,
    /// `outboxd_it_<pid>_<n>_<random>`
    prefix: String,
    connectors: Vec<String>,
    slots: Vec<String>,
    publications: Vec<String>,
    tables: Vec<String>,
    clean: bool,
}

impl Scratch {
    pub fn new(pg: &Pg, connect: &Connect) -> Scratch {
        let n = SCRATCH_COUNTER.fetch_add(1, Ordering::Relaxed);
        let r: u32 = rand::random();
        Scratch {
            pg: pg.clone(),
            connect: connect.clone(),
            prefix: format!("{SQL_PREFIX}{}_{n}_{r:08x}", std::process::id()),
            connectors: Vec::new(),
            slots: Vec::new(),
            publications: Vec::new(),
            tables: Vec::new(),
            clean: true,
        }
    }

    /// A unique table, publication or slot name (lower case, at most 63 bytes).
    pub fn sql_name(&self, what: &str) -> String {
        let name = format!("{}_{what}", self.prefix);
        assert!(name.len() <= 63, "name too long for PostgreSQL: {name}");
        name
    }

    /// A unique connector name.
    pub fn connector_name(&self, what: &str) -> String {
        format!("{}-{what}", self.prefix.replace('_', "-"))
    }

    /// Creates a table in the outbox shape (as in `debezium/outbox.sql`) and a
    /// publication for it; returns (table, publication).
    pub fn create_outbox_table(&mut self, what: &str) -> (String, String) {
        let table = self.sql_name(what);
        let publication = self.sql_name(&format!("{what}_pub"));
        self.clean = false;
        self.tables.push(table.clone());
        self.pg.query(&format!(
            "CREATE TABLE public.{table} (
                 id            uuid         PRIMARY KEY,
                 aggregatetype varchar(255) NOT NULL,
                 aggregateid   varchar(255) NOT NULL,
                 type          varchar(255) NOT NULL,
                 payload       jsonb,
                 created_at    timestamptz  DEFAULT now());"
        ));
        self.publications.push(publication.clone());
        self.pg.query(&format!("CREATE PUBLICATION {publication} FOR TABLE public.{table};"));
        (table, publication)
    }

    /// Registers connector `name` (its `slot.name` is recorded for clean-up too) and
    /// waits until it and its task are RUNNING and its replication slot is active,
    /// i.e. every change committed from now on will be streamed.
    pub async fn start_connector(&mut self, name: &str, config: &Value, timeout: Duration) {
        let slot = config["slot.name"].as_str().expect("slot.name in the connector config").to_string();
        self.clean = false;
        self.connectors.push(name.to_string());
        self.slots.push(slot.clone());
        self.connect.put_config(name, config).await.unwrap_or_else(|e| panic!("register connector {name}: {e}"));
        self.connect.wait_running(name, timeout).await;
        wait_for(format!("replication slot {slot} of connector {name} to be active"), timeout, async || {
            let active =
                self.pg.query(&format!("SELECT active FROM pg_replication_slots WHERE slot_name = {}", lit(&slot)));
            if active.trim() == "t" {
                Ok(())
            } else {
                Err(format!("active = {active:?}"))
            }
        })
        .await;
    }

    /// Deletes connector `name`, waits until it is gone, then drops its slot.
    pub async fn remove_connector(&mut self, name: &str) -> Result<(), String> {
        let slot = self
            .connect
            .config(name)
            .await?
            .and_then(|c| c["slot.name"].as_str().map(str::to_string))
            .ok_or_else(|| format!("connector {name} is not registered"))?;
        self.connect.delete(name).await?;
        self.connectors.retain(|c| c != name);
        drop_slot(&self.pg, &slot).await?;
        self.slots.retain(|s| *s != slot);
        Ok(())
    }

    /// Removes everything recorded, in order: connectors (waiting until gone), their
    /// slots (once inactive), publications, tables.
    pub async fn cleanup(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        for name in std::mem::take(&mut self.connectors) {
            if let Err(e) = self.connect.delete(&name).await {
                errors.push(format!("connector {name}: {e}"));
            }
        }
        for slot in std::mem::take(&mut self.slots) {
            if let Err(e) = drop_slot(&self.pg, &slot).await {
                errors.push(format!("slot {slot}: {e}"));
            }
        }
        for publication in std::mem::take(&mut self.publications) {
            if let Err(e) = self.pg.try_query(&format!("DROP PUBLICATION IF EXISTS {publication};")) {
                errors.push(format!("publication {publication}: {e}"));
            }
        }
        for table in std::mem::take(&mut self.tables) {
            if let Err(e) = self.pg.try_query(&format!("DROP TABLE IF EXISTS public.{table};")) {
                errors.push(format!("table {table}: {e}"));
            }
        }
        self.clean = true;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.clean {
            return;
        }
        // Usually reached while a failed test unwinds, inside its Tokio runtime: clean
        // up on a thread and runtime of our own, with a client of our own.
        let mut scratch = Scratch {
            pg: self.pg.clone(),
            connect: self.connect.fresh(),
            prefix: self.prefix.clone(),
            connectors: std::mem::take(&mut self.connectors),
            slots: std::mem::take(&mut self.slots),
            publications: std::mem::take(&mut self.publications),
            tables: std::mem::take(&mut self.tables),
            clean: true,
        };
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            rt.block_on(scratch.cleanup())
        })
        .join();
        match done {
            Ok(Ok(())) => eprintln!("scratch objects of {} removed", self.prefix),
            Ok(Err(e)) => eprintln!("clean-up of {} incomplete: {e}", self.prefix),
            Err(_) => eprintln!("clean-up of {} panicked", self.prefix),
        }
    }
}

/// Drops replication slot `slot` once no connector streams from it any more
/// (terminating a walsender that lingers past [`SLOT_RELEASE_TIMEOUT`]). A missing
/// slot is fine.
pub async fn drop_slot(pg: &Pg, slot: &str) -> Result<(), String> {
    // Ok ends the wait: the slot is dropped or gone, or an error came; Err is the pid
    // of the walsender that still streams from it.
    let mut look = async || -> Result<Result<(), String>, String> {
        let row = match pg.try_query(&format!(
            "SELECT active, coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = {}",
            lit(slot)
        )) {
            Ok(row) => row,
            Err(e) => return Ok(Err(e)),
        };
        let row = row.trim();
        if row.is_empty() {
            return Ok(Ok(()));
        }
        let (active, pid) = row.split_once('|').unwrap_or((row, "0"));
        if active != "f" {
            return Err(pid.to_owned());
        }
        match pg.try_query(&format!("SELECT pg_drop_replication_slot({});", lit(slot))) {
            Ok(_) => Ok(Ok(())),
            // It became active again in between, or vanished: look again.
            Err(e) if e.contains("is active") || e.contains("does not exist") => Err(pid.to_owned()),
            Err(e) => Ok(Err(e)),
        }
    };
    let pace = Duration::from_millis(200);
    let pid = match keep_looking(SLOT_RELEASE_TIMEOUT, pace, &mut look).await {
        Ok(dropped) => return dropped,
        Err(pid) => pid,
    };
    eprintln!("slot {slot} still active after {SLOT_RELEASE_TIMEOUT:?}: terminating its walsender (pid {pid})");
    pg.try_query(&format!("SELECT pg_terminate_backend({pid});"))?;
    match keep_looking(pace, pace, &mut look).await {
        Ok(dropped) => dropped,
        Err(pid) => Err(format!("still active (pid {pid}) after {SLOT_RELEASE_TIMEOUT:?} and a terminate")),
    }
}

/// Whether process `pid` lives (Linux /proc). Elsewhere every process counts as alive,
/// so nothing is swept.
fn pid_alive(pid: u32) -> bool {
    !cfg!(target_os = "linux") || Path::new(&format!("/proc/{pid}")).exists()
}

/// The process id in a scratch name (`outboxd_it_<pid>_…` / `outboxd-it-<pid>-…`).
fn scratch_pid(name: &str, prefix: &str, sep: char) -> Option<u32> {
    name.strip_prefix(prefix)?.split(sep).next()?.parse().ok()
}

/// Once per test process: removes scratch connectors, slots, publications and tables
/// that test processes which no longer run left behind (killed before their clean-up).
pub async fn sweep_leftovers(pg: &Pg, connect: &Connect) {
    static SWEPT: AtomicBool = AtomicBool::new(false);
    if SWEPT.swap(true, Ordering::SeqCst) {
        return;
    }
    let dead = |name: &str, prefix: &str, sep: char| scratch_pid(name, prefix, sep).is_some_and(|p| !pid_alive(p));
    let mut removed = Vec::new();
    for name in connect.names().await.unwrap_or_default() {
        if dead(&name, CONNECTOR_PREFIX, '-') {
            match connect.delete(&name).await {
                Ok(()) => removed.push(format!("connector {name}")),
                Err(e) => eprintln!("could not remove leftover connector {name}: {e}"),
            }
        }
    }
    let list = |sql: &str| -> Vec<String> {
        pg.query(sql).lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
    };
    let like = format!("'{}%'", SQL_PREFIX.replace('_', "\\_"));
    for slot in list(&format!("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE {like}")) {
        if dead(&slot, SQL_PREFIX, '_') {
            match drop_slot(pg, &slot).await {
                Ok(()) => removed.push(format!("slot {slot}")),
                Err(e) => eprintln!("could not drop leftover slot {slot}: {e}"),
            }
        }
    }
    for publication in list(&format!("SELECT pubname FROM pg_publication WHERE pubname LIKE {like}")) {
        if dead(&publication, SQL_PREFIX, '_') {
            pg.query(&format!("DROP PUBLICATION IF EXISTS {publication};"));
            removed.push(format!("publication {publication}"));
        }
    }
    for table in list(&format!("SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE {like}"))
    {
        if dead(&table, SQL_PREFIX, '_') {
            pg.query(&format!("DROP TABLE IF EXISTS public.{table};"));
            removed.push(format!("table {table}"));
        }
    }
    if !removed.is_empty() {
        eprintln!("removed leftovers of earlier test processes: {}", removed.join(", "));
    }
}
