//! Files the benchmark hands to the binary it runs (manifest, kubeconfig, log), in the temp
//! directory under names unique to this process, deleted when dropped.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static SERIAL: AtomicUsize = AtomicUsize::new(0);

/// A file in the temp directory, deleted on drop (also on an early return or a panic).
pub struct ScratchFile(PathBuf);

impl ScratchFile {
    /// Writes `contents` to `kpr-bench-<pid>-<serial>-<suffix>`.
    pub fn create(suffix: &str, contents: &[u8]) -> Result<Self, String> {
        let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("kpr-bench-{}-{serial}-{suffix}", std::process::id()));
        std::fs::write(&path, contents).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_distinct_and_gone_after_drop() {
        let a = ScratchFile::create("a.json", b"{}").unwrap();
        let b = ScratchFile::create("a.json", b"[]").unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(std::fs::read(a.path()).unwrap(), b"{}");
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
    }
}
