//! Filesystem notifications that wake the source up to rescan.
//!
//! Directories are watched, never single files: editors and Kubernetes' ConfigMap volumes
//! replace a file by renaming another over it, which a watch on the old file's inode would
//! never see. For a configured file, its parent directory is watched.
//!
//! A notification only says "something may have changed": the source rescans everything
//! and the catalog works out what did. So the handler just drops a token into a channel of
//! capacity one; bursts collapse on their own. What happens to other files in a watched
//! directory wakes nobody ([`WatchedDir::concerns`]): a log or database written beside a
//! manifest would otherwise cost a rescan of every manifest each second, for as long as it
//! is written.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::scan::is_manifest_file_name;

/// A directory to watch, and which of its entries the source reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct WatchedDir {
    pub(crate) dir: PathBuf,
    /// The directory is configured itself: its manifest files are read.
    pub(crate) manifests: bool,
    /// Files in it configured by name, read whatever their names.
    pub(crate) files: BTreeSet<OsString>,
}

impl WatchedDir {
    /// Whether a change to the entry `name` of this directory may change what the source
    /// reads: a file it reads, or one of the `..`-names with which a ConfigMap volume swaps
    /// all its files at once (`..data` is renamed over; the visible names are links into it
    /// and see no event of their own).
    fn concerns(&self, name: &str) -> bool {
        name.starts_with("..")
            || self.files.iter().any(|file| file.as_os_str() == name)
            || (self.manifests && is_manifest_file_name(name))
    }
}

/// Watches a fixed set of directories, re-adding watches for ones that come back.
pub(crate) struct DirWatcher {
    watcher: RecommendedWatcher,
    dirs: Arc<[WatchedDir]>,
    watched: BTreeSet<PathBuf>,
}

impl DirWatcher {
    /// Starts watching `dirs`; every relevant change sends a token on `wake`.
    pub(crate) fn start(dirs: Vec<WatchedDir>, wake: mpsc::Sender<()>) -> notify::Result<Self> {
        let dirs: Arc<[WatchedDir]> = dirs.into();
        let interest = Arc::clone(&dirs);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if is_relevant(&event, &interest) {
                // Full means a rescan is already pending, which will see this change too.
                let _ = wake.try_send(());
            }
        })?;
        let mut this = Self {
            watcher,
            dirs,
            watched: BTreeSet::new(),
        };
        this.refresh();
        Ok(this)
    }

    /// Watches directories that exist and are not watched yet (e.g. re-created), and
    /// forgets the ones that are gone, so that a later re-creation is watched again.
    pub(crate) fn refresh(&mut self) {
        for WatchedDir { dir, .. } in self.dirs.iter() {
            let exists = dir.is_dir();
            let watched = self.watched.contains(dir);
            if exists && !watched {
                match self.watcher.watch(dir, RecursiveMode::NonRecursive) {
                    Ok(()) => {
                        debug!(dir = %dir.display(), "watching manifest directory");
                        self.watched.insert(dir.clone());
                    }
                    Err(error) => {
                        warn!(dir = %dir.display(), %error, "cannot watch manifest directory; relying on periodic rescans");
                    }
                }
            } else if !exists && watched {
                // The kernel dropped the watch with the directory; this only clears notify's record.
                let _ = self.watcher.unwatch(dir);
                self.watched.remove(dir);
            }
        }
    }
}

/// Everything but reads, of an entry the source reads (or of a watched directory itself).
/// Our own rescans open and read the files; if those woke us up, we would rescan forever.
/// Closing a file after writing it is a change, though. An event naming no path (the
/// kernel's queue overflowed, say) may hide anything.
fn is_relevant(event: &notify::Result<notify::Event>, dirs: &[WatchedDir]) -> bool {
    match event {
        Ok(event) => {
            let changes = match event.kind {
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
                EventKind::Access(_) => false,
                _ => true,
            };
            changes && (event.paths.is_empty() || event.paths.iter().any(|path| concerns(dirs, path)))
        }
        Err(error) => {
            warn!(%error, "manifest watch error; rescanning");
            true
        }
    }
}

/// Whether `path`, named by an event, is something the source reads. A path in no watched
/// directory is taken as relevant: watches are not recursive, so only the directories
/// themselves can be named that way.
fn concerns(dirs: &[WatchedDir], path: &Path) -> bool {
    let entry = path.parent().zip(path.file_name());
    let owner = entry.and_then(|(parent, name)| {
        let dir = dirs.iter().find(|watched| watched.dir == parent)?;
        Some((dir, name))
    });
    match owner {
        Some((dir, name)) => dir.concerns(&name.to_string_lossy()),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};

    /// `/m` is configured as a directory; `/etc/kp/services` as a file.
    fn dirs() -> Vec<WatchedDir> {
        vec![
            WatchedDir {
                dir: "/m".into(),
                manifests: true,
                files: BTreeSet::new(),
            },
            WatchedDir {
                dir: "/etc/kp".into(),
                manifests: false,
                files: [OsString::from("services")].into(),
            },
        ]
    }

    fn event(kind: EventKind, paths: &[&str]) -> notify::Result<notify::Event> {
        let mut event = notify::Event::new(kind);
        event.paths = paths.iter().map(PathBuf::from).collect();
        Ok(event)
    }

    fn wakes(kind: EventKind, paths: &[&str]) -> bool {
        is_relevant(&event(kind, paths), &dirs())
    }

    #[test]
    fn reads_do_not_wake_but_writes_do() {
        let svc = ["/m/svc.yaml"];
        assert!(!wakes(EventKind::Access(AccessKind::Open(AccessMode::Any)), &svc));
        assert!(!wakes(
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            &svc
        ));
        assert!(wakes(
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            &svc
        ));
        assert!(wakes(EventKind::Create(CreateKind::File), &svc));
        assert!(wakes(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &svc));
        assert!(wakes(EventKind::Remove(RemoveKind::File), &svc));
        assert!(is_relevant(
            &Err(notify::Error::generic("queue overflow")),
            &dirs()
        ));
        assert!(
            wakes(EventKind::Other, &[]),
            "an event naming nothing may hide anything"
        );
    }

    /// Only what the source reads wakes it: a configured directory's manifests, a named
    /// file whatever its name, a ConfigMap volume's swap, the directories themselves.
    #[test]
    fn only_entries_the_source_reads_wake_it() {
        let write = EventKind::Modify(ModifyKind::Any);
        for read in [
            "/m/svc.yaml",
            "/m/list.json",
            "/etc/kp/services",
            "/m/..data",
            "/etc/kp/..2026_11_28_09_00_00.123",
            "/m",
            "/etc/kp",
        ] {
            assert!(wakes(write, &[read]), "{read}");
        }
        for other in [
            "/m/proxy.log",
            "/m/.svc.yaml.swp",
            "/m/svc.yaml~",
            "/etc/kp/services.yaml",
            "/etc/kp/other",
        ] {
            assert!(!wakes(write, &[other]), "{other}");
        }
        // A rename names both ends: either one being read is enough.
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        assert!(wakes(rename, &["/etc/kp/services.tmp", "/etc/kp/services"]));
        assert!(!wakes(rename, &["/m/a.log", "/m/a.log.1"]));
    }

    /// Real notifications: a file written again and again beside the configured one wakes
    /// nothing; the configured one, written once, does. (The waits are ceilings; the
    /// first one is what a wrong filter fails.)
    #[tokio::test]
    async fn a_busy_neighbour_file_wakes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let watched = WatchedDir {
            dir: dir.path().to_path_buf(),
            manifests: false,
            files: [OsString::from("svc.yaml")].into(),
        };
        std::fs::write(dir.path().join("svc.yaml"), "").unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        let _watcher = DirWatcher::start(vec![watched], tx).unwrap();
        for round in 0..20 {
            std::fs::write(dir.path().join("proxy.log"), format!("line {round}\n")).unwrap();
        }
        let woken = tokio::time::timeout(std::time::Duration::from_millis(500), rx.recv()).await;
        assert!(woken.is_err(), "a neighbour's writes woke the source");
        std::fs::write(dir.path().join("svc.yaml"), "# edited\n").unwrap();
        let woken = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv()).await;
        assert_eq!(
            woken,
            Ok(Some(())),
            "the configured file's write did not wake the source"
        );
    }
}
