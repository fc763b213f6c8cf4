//! Who holds the store: written next to the database so that a second
//! process (e.g. `outboxd store list` while `outboxd run` is up) can say
//! which process to stop instead of printing sled's lock error, and can find
//! the running service's admin address and the per-run credential to use it.
//!
//! The file carries a secret, so it is readable by its owner only (mode 0600)
//! from the moment it exists: each save writes a 0600 temporary file and
//! renames it over the old one, so no reader ever sees a half-written or
//! world-readable file.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::store::options::Role;

const OWNER_FILE: &str = "outboxd.owner";
/// Only the user running outboxd (and root) may read the admin credential.
const OWNER_FILE_MODE: u32 = 0o600;
/// Random bytes in a per-run admin token (hex-encoded: twice as many characters).
const ADMIN_TOKEN_BYTES: usize = 32;

#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// [`Role::as_str`] of the holder; text, so that any version can read it.
    pub role: String,
    pub started_at: String,
    /// The running service's admin address, where `outboxd store` can ask instead.
    #[serde(default)]
    pub admin: Option<String>,
    /// The bearer token the admin API of this run accepts (besides `[admin] token`).
    /// Never printed: see the `Debug` and `Display` impls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
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

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("pid", &self.pid)
            .field("role", &self.role)
            .field("started_at", &self.started_at)
            .field("admin", &self.admin)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<redacted>"))
            .finish()
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
    pub fn write(dir: &Path, role: Role) -> std::io::Result<OwnerFile> {
        let owner = Owner {
            pid: std::process::id(),
            role: role.as_str().to_owned(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            admin: None,
            admin_token: None,
        };
        let file = OwnerFile { path: dir.join(OWNER_FILE), owner };
        file.save()?;
        Ok(file)
    }

    /// Records the admin address of the running service together with a
    /// fresh random token for it, in one write: a reader never finds the
    /// address without the credential.
    pub fn set_admin(&mut self, addr: &str) -> std::io::Result<()> {
        self.owner.admin = Some(addr.to_owned());
        self.owner.admin_token = Some(new_token());
        self.save()
    }

    /// The per-run admin token, once [`OwnerFile::set_admin`] made one.
    pub fn admin_token(&self) -> Option<&str> {
        self.owner.admin_token.as_deref()
    }

    fn save(&self) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&self.owner).expect("owner serialises");
        let tmp = self.path.with_extension(format!("owner.tmp.{}", std::process::id()));
        // A leftover of a crashed save may have other permissions: `mode` applies only when creating.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(OWNER_FILE_MODE)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

impl Drop for OwnerFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// 32 bytes from the thread-local CSPRNG (ChaCha, seeded from the OS), hex-encoded.
fn new_token() -> String {
    let bytes: [u8; ADMIN_TOKEN_BYTES] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn owner_file_is_readable_by_its_user_only_and_carries_a_fresh_token() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = OwnerFile::write(dir.path(), Role::Run).unwrap();
        assert_eq!(mode(&dir.path().join(OWNER_FILE)), 0o600);
        assert!(Owner::read(dir.path()).unwrap().admin_token.is_none(), "no token before an admin address");

        file.set_admin("127.0.0.1:9464").unwrap();
        assert_eq!(mode(&dir.path().join(OWNER_FILE)), 0o600);
        let owner = Owner::read(dir.path()).unwrap();
        assert_eq!(owner.admin.as_deref(), Some("127.0.0.1:9464"));
        let token = owner.admin_token.clone().expect("a token next to the address");
        assert_eq!(token.len(), 2 * ADMIN_TOKEN_BYTES);
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
        assert_eq!(file.admin_token(), Some(token.as_str()));
        assert!(!format!("{owner:?} {owner}").contains(&token), "neither Debug nor Display shows the token");

        let mut next = OwnerFile::write(dir.path(), Role::Run).unwrap();
        next.set_admin("127.0.0.1:9464").unwrap();
        assert_ne!(next.admin_token(), Some(token.as_str()), "every run has its own token");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers, [OWNER_FILE], "no temporary file stays behind");
    }

    #[test]
    fn world_readable_owner_file_of_an_earlier_run_is_replaced_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(OWNER_FILE);
        std::fs::write(&path, "{}").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut file = OwnerFile::write(dir.path(), Role::Run).unwrap();
        file.set_admin("127.0.0.1:1").unwrap();
        assert_eq!(mode(&path), 0o600);
    }
}
