//! Filesystem notifications that wake the source up to rescan.
//!
//! Directories are watched, never single files: editors and Kubernetes' ConfigMap volumes
//! replace a file by renaming another over it, which a watch on the old file's inode would
//! never see. For a configured file, its parent directory is watched.
//!
//! A notification only says "something may have changed": the source rescans everything
//! and the catalog works out what did. So the handler just drops a token into a channel of
//! capacity one; bursts collapse on their own.

use std::collections::BTreeSet;
use std::path::PathBuf;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Watches a fixed set of directories, re-adding watches for ones that come back.
pub(crate) struct DirWatcher {
    watcher: RecommendedWatcher,
    dirs: Vec<PathBuf>,
    watched: BTreeSet<PathBuf>,
}

impl DirWatcher {
    /// Starts watching `dirs`; every relevant change sends a token on `wake`.
    pub(crate) fn start(dirs: Vec<PathBuf>, wake: mpsc::Sender<()>) -> notify::Result<Self> {
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if is_relevant(&event) {
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
        for dir in &self.dirs {
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

/// Everything but reads. Our own rescans open and read the files; if those woke us up,
/// we would rescan forever. Closing a file after writing it is a change, though.
fn is_relevant(event: &notify::Result<notify::Event>) -> bool {
    match event {
        Ok(event) => match event.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            EventKind::Access(_) => false,
            _ => true,
        },
        Err(error) => {
            warn!(%error, "manifest watch error; rescanning");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, ModifyKind, RemoveKind, RenameMode};

    fn event(kind: EventKind) -> notify::Result<notify::Event> {
        Ok(notify::Event::new(kind))
    }

    #[test]
    fn reads_do_not_wake_but_writes_do() {
        assert!(!is_relevant(&event(EventKind::Access(AccessKind::Open(
            AccessMode::Any
        )))));
        assert!(!is_relevant(&event(EventKind::Access(AccessKind::Close(
            AccessMode::Read
        )))));
        assert!(is_relevant(&event(EventKind::Access(AccessKind::Close(
            AccessMode::Write
        )))));
        assert!(is_relevant(&event(EventKind::Create(CreateKind::File))));
        assert!(is_relevant(&event(EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        )))));
        assert!(is_relevant(&event(EventKind::Remove(RemoveKind::File))));
        assert!(is_relevant(&Err(notify::Error::generic("queue overflow"))));
    }
}
