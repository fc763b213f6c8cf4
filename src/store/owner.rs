//! Who holds the store: written next to the database so that a second
//! process (e.g. `outboxd store list` while `outboxd run` is up) can say
//! which process to stop instead of printing sled's lock error. A later admin
//! address goes here too, so `store` commands can find the running service.

use std::path::{Path, PathBuf};

const OWNER_FILE: &str = "outboxd.owner";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    pub pid: u32,
    pub role: String,
    pub started_at: String,
    /// The running service's admin address, where `outboxd store` can ask instead.
    #[serde(default)]
    pub admin: Option<String>,
}

impl Owner {
    pub fn read(dir: &Path) -> Option<Owner> {
        let text = std::fs::read_to_string(dir.join(OWNER_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists()
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`outboxd {}` (pid {}, started {})", self.role, self.pid, self.started_at)?;
        if !self.alive() {
            write!(f, " [that pid is gone; another process holds the lock]")?;
        }
        Ok(())
    }
}

/// The owner file of this process; removed again when the store closes.
pub struct OwnerFile {
    path: PathBuf,
    owner: Owner,
}

impl OwnerFile {
    pub fn write(dir: &Path, role: &str) -> std::io::Result<OwnerFile> {
        let owner = Owner {
            pid: std::process::id(),
            role: role.to_owned(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            admin: None,
        };
        let file = OwnerFile { path: dir.join(OWNER_FILE), owner };
        file.save()?;
        Ok(file)
    }

    /// Records the admin address of the running service.
    pub fn set_admin(&mut self, addr: &str) -> std::io::Result<()> {
        self.owner.admin = Some(addr.to_owned());
        self.save()
    }

    fn save(&self) -> std::io::Result<()> {
        std::fs::write(&self.path, serde_json::to_vec(&self.owner).expect("owner serialises"))
    }
}

impl Drop for OwnerFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
