//! A size-limited tmpfs for a store whose filesystem fills up (needs root), and a
//! filler that takes what space is left.

use std::path::Path;

/// A tmpfs with a size limit, unmounted when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("outboxd-fault-tmpfs-").tempdir().expect("temp dir");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "cannot mount a tmpfs (this scenario needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = std::process::Command::new("umount").arg(self.dir.path()).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
        }
    }
}

/// Fills the filesystem with a file until writing fails; returns the bytes written.
pub fn fill(path: &Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = vec![0x55u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(_) => break,
        }
    }
    let _ = f.sync_all();
    written
}
