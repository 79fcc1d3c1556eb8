//! Scratch folders that go away with their guard.

use std::path::{Path, PathBuf};

/// A folder removed (with what it holds) when the guard is dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty folder `$TMPDIR/ztier-TAG-PID-N`.
    pub fn new(tag: &str) -> std::io::Result<TempDir> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("ztier-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(TempDir(d))
    }

    /// Removes `path` when the guard is dropped.
    pub fn adopt(path: PathBuf) -> TempDir {
        TempDir(path)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
