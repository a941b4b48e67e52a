//! Reading the configured paths into a [`Snapshot`]: the only filesystem access besides watching.
//!
//! Directories are read like `kubectl apply -f dir`: not recursively, only `.yaml`, `.yml`
//! and `.json` files. Hidden files (editor swap files, Kubernetes' `..data` links of a
//! mounted ConfigMap) and editor backups are skipped. A file named explicitly is read
//! whatever its extension. Symlinks are followed, so a ConfigMap volume works.
//!
//! A file larger than the cap (`--manifests-max-file-bytes`) is not read: its size is
//! checked before reading, and the read itself stops one byte past the cap, so a file that
//! grows meanwhile is never held whole in memory either.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::warn;

use super::catalog::{FileRead, Snapshot};

/// Default `--manifests-max-file-bytes`: 128 MiB, far above any real cluster's manifests.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 128 * 1024 * 1024;

/// Reads every target; a target that vanished simply contributes nothing.
pub(crate) fn scan(targets: &[PathBuf], max_file_bytes: u64) -> Snapshot {
    let mut snapshot = Snapshot::new(Instant::now());
    let mut reader = Reader {
        snapshot: &mut snapshot,
        max_file_bytes,
    };
    for target in targets {
        reader.target(target);
    }
    snapshot
}

/// Fills a snapshot, file by file.
struct Reader<'a> {
    snapshot: &'a mut Snapshot,
    max_file_bytes: u64,
}

impl Reader<'_> {
    fn target(&mut self, target: &Path) {
        match fs::metadata(target) {
            Ok(metadata) if metadata.is_dir() => self.dir(target),
            Ok(_) => self.file(target),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                warn!(path = %target.display(), "manifest path no longer exists; its objects are deleted");
            }
            Err(error) => {
                warn!(path = %target.display(), %error, "cannot inspect manifest path; keeping what it defined");
                keep_target(target, self.snapshot, error);
            }
        }
    }

    fn dir(&mut self, dir: &Path) {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) => {
                warn!(dir = %dir.display(), %error, "cannot list manifest directory; keeping what it defined");
                self.snapshot.unreadable_dirs.push(dir.to_path_buf());
                return;
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !is_manifest_file_name(&name.to_string_lossy()) {
                continue;
            }
            let path = entry.path();
            // Follows symlinks: only what ends in a regular file counts.
            if fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                self.file(&path);
            }
        }
    }

    fn file(&mut self, path: &Path) {
        let read = match read_capped(path, self.max_file_bytes) {
            Ok(read) => read,
            // Removed between listing and reading: the next scan sees it gone.
            Err(error) if error.kind() == io::ErrorKind::NotFound => return,
            Err(error) => FileRead::Unreadable(error.to_string()),
        };
        self.snapshot.files.insert(path.to_path_buf(), read);
    }
}

/// The file's bytes, or [`FileRead::TooLarge`] without reading more than `limit + 1` bytes.
fn read_capped(path: &Path, limit: u64) -> io::Result<FileRead> {
    let mut file = fs::File::open(path)?;
    let size = file.metadata()?.len();
    if size > limit {
        return Ok(FileRead::TooLarge { size, limit });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    (&mut file)
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > limit {
        // It grew while being read: report its size now, at least what was read.
        let size = file.metadata().map_or(read, |m| m.len().max(read));
        return Ok(FileRead::TooLarge { size, limit });
    }
    Ok(FileRead::Bytes(bytes))
}

/// A target whose type cannot even be checked keeps its files, whichever kind it was.
fn keep_target(target: &Path, snapshot: &mut Snapshot, error: io::Error) {
    snapshot.unreadable_dirs.push(target.to_path_buf());
    snapshot
        .files
        .insert(target.to_path_buf(), FileRead::Unreadable(error.to_string()));
}

/// Whether a directory entry is a manifest: a visible `.yaml`, `.yml` or `.json` file that
/// is not an editor's temporary copy.
pub(crate) fn is_manifest_file_name(name: &str) -> bool {
    let hidden = name.starts_with('.');
    let editor_temp = name.starts_with('#') || name.ends_with('~') || name.ends_with('#');
    let manifest_ext = Path::new(name)
        .extension()
        .is_some_and(|ext| ext == "yaml" || ext == "yml" || ext == "json");
    !hidden && !editor_temp && manifest_ext
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_file_names() {
        for name in ["svc.yaml", "a.yml", "list.json", "x.y.yaml"] {
            assert!(is_manifest_file_name(name), "{name}");
        }
        for name in [
            ".svc.yaml",
            ".svc.yaml.swp",
            "svc.yaml~",
            "#svc.yaml#",
            ".#svc.yaml",
            "svc.yaml.tmp",
            "4913",
            "README.md",
            "..data",
            "yaml",
        ] {
            assert!(!is_manifest_file_name(name), "{name}");
        }
    }

    #[test]
    fn scans_directories_flat_and_explicit_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("a.yaml"), "a").unwrap();
        fs::write(root.join("b.json"), "b").unwrap();
        fs::write(root.join("notes.txt"), "n").unwrap();
        fs::write(root.join(".hidden.yaml"), "h").unwrap();
        fs::create_dir(root.join("sub.yaml")).unwrap();
        fs::write(root.join("sub.yaml").join("deep.yaml"), "d").unwrap();
        let explicit = tempfile::tempdir().unwrap();
        let odd = explicit.path().join("services.txt");
        fs::write(&odd, "o").unwrap();

        let snapshot = scan(
            &[root.to_path_buf(), odd.clone(), root.join("missing.yaml")],
            DEFAULT_MAX_FILE_BYTES,
        );
        let found: Vec<_> = snapshot.files.keys().cloned().collect();
        assert_eq!(found, {
            let mut expected = vec![root.join("a.yaml"), root.join("b.json"), odd.clone()];
            expected.sort();
            expected
        });
        assert_eq!(snapshot.files[&odd], FileRead::Bytes(b"o".to_vec()));
        assert!(snapshot.unreadable_dirs.is_empty());
    }

    #[test]
    fn follows_symlinks_like_a_configmap_volume() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("..2024_01_01")).unwrap();
        fs::write(root.join("..2024_01_01").join("svc.yaml"), "s").unwrap();
        std::os::unix::fs::symlink("..2024_01_01", root.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/svc.yaml", root.join("svc.yaml")).unwrap();
        std::os::unix::fs::symlink("..data/gone.yaml", root.join("dangling.yaml")).unwrap();

        let snapshot = scan(&[root.to_path_buf()], DEFAULT_MAX_FILE_BYTES);
        assert_eq!(
            snapshot.files.keys().collect::<Vec<_>>(),
            vec![&root.join("svc.yaml")]
        );
    }

    #[test]
    fn files_over_the_cap_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("small.yaml"), "a".repeat(100)).unwrap();
        fs::write(root.join("exact.yaml"), "b".repeat(101)).unwrap();
        fs::write(root.join("big.yaml"), "c".repeat(102)).unwrap();
        let snapshot = scan(&[root.to_path_buf()], 101);
        assert_eq!(
            snapshot.files[&root.join("small.yaml")],
            FileRead::Bytes(vec![b'a'; 100])
        );
        assert_eq!(
            snapshot.files[&root.join("exact.yaml")],
            FileRead::Bytes(vec![b'b'; 101])
        );
        assert_eq!(
            snapshot.files[&root.join("big.yaml")],
            FileRead::TooLarge {
                size: 102,
                limit: 101
            }
        );
    }

    #[test]
    fn a_stream_without_a_size_is_cut_one_byte_past_the_cap() {
        // /dev/zero reports size 0 and never ends: only the bounded read stops it.
        assert_eq!(
            read_capped(Path::new("/dev/zero"), 4096).unwrap(),
            FileRead::TooLarge {
                size: 4097,
                limit: 4096
            }
        );
    }
}
