//! The manifest source: load the files, report them, then follow their changes.
//!
//! The loop is: scan, let the catalog turn the scan into events, send them; then sleep
//! until a filesystem notification (after it has been quiet for a moment), the periodic
//! rescan, or the moment the catalog wants to check again whether an emptied file stayed
//! empty. Watches are set up before the first scan, so a change made while it runs is
//! not lost. Scanning and parsing run on the blocking pool: a 10k-Service file takes a
//! while to parse, and the runtime's workers have better things to do. The events of a scan
//! are decoded from the catalog's compact form there too, one at a time as the bounded
//! channel takes them.

use std::io;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{error, info, warn};

use super::catalog::ManifestCatalog;
use super::scan::{DEFAULT_MAX_FILE_BYTES, scan};
use super::validate::ValidationRules;
use super::watch::{DirWatcher, WatchedDir};
use crate::{Event, EventSender};

/// The `source` of this source's [`Event::Synced`].
pub const MANIFESTS_SOURCE: &str = "manifests";

/// How long the filesystem must be quiet before a rescan: an editor's save or a
/// `kubectl get -o yaml > file` is several events in quick succession.
const QUIET_PERIOD: Duration = Duration::from_millis(100);
/// Under constant churn, rescan at least this often anyway.
const MAX_SETTLE: Duration = Duration::from_secs(1);
/// Rescan interval when notifications are unavailable (e.g. out of inotify instances).
const POLL_WITHOUT_NOTIFICATIONS: Duration = Duration::from_secs(2);

/// Why the source cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("no manifest paths given")]
    NoPaths,
    #[error("manifest path {} does not exist", path.display())]
    NotFound { path: PathBuf },
    #[error("manifest path {} cannot be read: {source}", path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    #[error("manifest path {} is neither a file nor a directory", path.display())]
    NotFileOrDirectory { path: PathBuf },
}

/// Services, EndpointSlices and this node's Node from manifest files and directories.
#[derive(Debug)]
pub struct ManifestSource {
    /// Absolute, so events name the same path whatever the working directory.
    targets: Arc<[PathBuf]>,
    watched: Vec<WatchedDir>,
    node_name: Option<String>,
    resync: Duration,
    rules: ValidationRules,
    max_file_bytes: u64,
}

impl ManifestSource {
    /// Checks that every path exists and can be read. `node_name` selects the one Node
    /// reported; `resync` is the safety-net rescan interval (zero: none).
    pub fn new(
        paths: Vec<PathBuf>,
        node_name: Option<String>,
        resync: Duration,
    ) -> Result<Self, ManifestError> {
        if paths.is_empty() {
            return Err(ManifestError::NoPaths);
        }
        let mut targets = Vec::with_capacity(paths.len());
        let mut watched: Vec<WatchedDir> = Vec::new();
        for path in paths {
            let (absolute, is_dir) = check_path(&path)?;
            // An absolute path to an existing file always has a parent and a name.
            let (dir, file) = match (is_dir, absolute.parent(), absolute.file_name()) {
                (false, Some(parent), Some(name)) => (parent.to_path_buf(), Some(name.to_os_string())),
                _ => (absolute.clone(), None),
            };
            let index = match watched.iter().position(|w| w.dir == dir) {
                Some(index) => index,
                None => {
                    watched.push(WatchedDir {
                        dir,
                        ..WatchedDir::default()
                    });
                    watched.len() - 1
                }
            };
            match file {
                Some(name) => {
                    watched[index].files.insert(name);
                }
                None => watched[index].manifests = true,
            }
            targets.push(absolute);
        }
        Ok(Self {
            targets: targets.into(),
            watched,
            node_name,
            resync,
            rules: ValidationRules::default(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        })
    }

    /// NodePorts outside `range` are rejected (`--service-node-port-range`; default
    /// 30000-32767, as the API server's).
    pub fn node_port_range(mut self, range: RangeInclusive<u16>) -> Self {
        self.rules.node_port_range = range;
        self
    }

    /// Files larger than `bytes` are rejected and what they defined before is kept
    /// (`--manifests-max-file-bytes`; default 128 MiB).
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Sends the initial state, [`Event::Synced`] once, then every change, until the
    /// receiving side of `events` is dropped.
    pub async fn run(self, events: EventSender) {
        let (wake_tx, wake_rx) = mpsc::channel(1);
        let (mut watcher, mut wake) = match DirWatcher::start(self.watched.clone(), wake_tx) {
            Ok(watcher) => (Some(watcher), Some(wake_rx)),
            Err(error) => {
                warn!(%error, "cannot watch manifest files; polling instead");
                (None, None)
            }
        };
        let mut ticker = self.ticker(watcher.is_some());
        let mut catalog = ManifestCatalog::new(self.node_name.clone()).with_rules(self.rules.clone());

        let Some(next) = self.rescan_and_send(catalog, &events).await else {
            return;
        };
        catalog = next;
        if events
            .send(Event::Synced {
                source: MANIFESTS_SOURCE,
            })
            .await
            .is_err()
        {
            return;
        }
        info!(paths = ?self.targets, "manifests loaded");

        loop {
            let recheck = catalog.next_recheck();
            tokio::select! {
                () = events.closed() => return,
                () = next_wake(&mut wake) => settle(&mut wake).await,
                _ = tick(&mut ticker) => {}
                () = sleep_until(recheck) => {}
            }
            if let Some(watcher) = &mut watcher {
                watcher.refresh();
            }
            let Some(next) = self.rescan_and_send(catalog, &events).await else {
                return;
            };
            catalog = next;
        }
    }

    /// Hands the catalog back, or `None` when the source must stop.
    async fn rescan_and_send(
        &self,
        mut catalog: ManifestCatalog,
        events: &EventSender,
    ) -> Option<ManifestCatalog> {
        let targets = Arc::clone(&self.targets);
        let max_file_bytes = self.max_file_bytes;
        let events = events.clone();
        // Objects are decoded one at a time as the bounded channel takes them, on the same
        // thread that parsed them: the memory the parse freed is what the decoding reuses
        // (on a runtime worker, glibc's per-thread arenas kept both, +50 MB RSS at 10k).
        let work = tokio::task::spawn_blocking(move || {
            let changes = catalog.apply_changes(scan(&targets, max_file_bytes));
            let delivered = changes
                .into_iter()
                .all(|change| events.blocking_send(change.into_event()).is_ok());
            (catalog, delivered)
        });
        let (catalog, delivered) = match work.await {
            Ok(done) => done,
            Err(failure) => {
                error!(%failure, "manifest rescan failed; the manifest source stops");
                return None;
            }
        };
        if !delivered {
            return None;
        }
        Some(catalog)
    }

    fn ticker(&self, notified: bool) -> Option<tokio::time::Interval> {
        let period = match (self.resync.is_zero(), notified) {
            (true, true) => return None,
            (true, false) => POLL_WITHOUT_NOTIFICATIONS,
            (false, true) => self.resync,
            (false, false) => self.resync.min(POLL_WITHOUT_NOTIFICATIONS),
        };
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Some(ticker)
    }
}

/// The absolute form of a configured path, and whether it is a directory.
fn check_path(path: &Path) -> Result<(PathBuf, bool), ManifestError> {
    let unreadable = |source: io::Error| match source.kind() {
        io::ErrorKind::NotFound => ManifestError::NotFound {
            path: path.to_path_buf(),
        },
        _ => ManifestError::Unreadable {
            path: path.to_path_buf(),
            source,
        },
    };
    let absolute = std::path::absolute(path).map_err(unreadable)?;
    let metadata = std::fs::metadata(&absolute).map_err(unreadable)?;
    if metadata.is_dir() {
        std::fs::read_dir(&absolute).map_err(unreadable)?;
        Ok((absolute, true))
    } else if metadata.is_file() {
        std::fs::File::open(&absolute).map_err(unreadable)?;
        Ok((absolute, false))
    } else {
        Err(ManifestError::NotFileOrDirectory {
            path: path.to_path_buf(),
        })
    }
}

/// Waits for a notification; forever once notifications have stopped.
async fn next_wake(wake: &mut Option<mpsc::Receiver<()>>) {
    if let Some(receiver) = wake {
        if receiver.recv().await.is_some() {
            return;
        }
        *wake = None;
    }
    std::future::pending().await
}

/// Swallows the rest of a burst: returns once no notification came for [`QUIET_PERIOD`],
/// or after [`MAX_SETTLE`] in any case.
async fn settle(wake: &mut Option<mpsc::Receiver<()>>) {
    let Some(receiver) = wake else { return };
    let give_up = Instant::now() + MAX_SETTLE;
    loop {
        let quiet_until = (Instant::now() + QUIET_PERIOD).min(give_up);
        match tokio::time::timeout_at(quiet_until, receiver.recv()).await {
            Ok(Some(())) if Instant::now() < give_up => continue,
            _ => return,
        }
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(Instant::from_std(deadline)).await,
        None => std::future::pending().await,
    }
}

async fn tick(ticker: &mut Option<tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn missing_paths_are_refused_before_running() {
        let error =
            ManifestSource::new(vec!["/nonexistent/kpr/manifests".into()], None, Duration::ZERO).unwrap_err();
        assert!(matches!(error, ManifestError::NotFound { .. }));
        assert_eq!(
            error.to_string(),
            "manifest path /nonexistent/kpr/manifests does not exist"
        );
        assert!(matches!(
            ManifestSource::new(vec![], None, Duration::ZERO),
            Err(ManifestError::NoPaths)
        ));
    }

    #[test]
    fn files_are_watched_through_their_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.yaml");
        std::fs::write(&file, "").unwrap();
        let sub = dir.path().join("more");
        std::fs::create_dir(&sub).unwrap();
        let source = ManifestSource::new(
            vec![file.clone(), sub.clone(), file.clone()],
            None,
            Duration::ZERO,
        )
        .unwrap();
        let dirs: Vec<(PathBuf, bool, Vec<OsString>)> = source
            .watched
            .iter()
            .map(|w| (w.dir.clone(), w.manifests, w.files.iter().cloned().collect()))
            .collect();
        assert_eq!(
            dirs,
            [
                (dir.path().to_path_buf(), false, vec![OsString::from("svc.yaml")]),
                (sub, true, vec![]),
            ]
        );
        assert_eq!(&source.targets[..2], &[file.clone(), dir.path().join("more")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_notifications_settles_into_one_rescan() {
        let (tx, rx) = mpsc::channel(1);
        let mut wake = Some(rx);
        tx.try_send(()).unwrap();
        next_wake(&mut wake).await;
        let sender = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = tx.try_send(());
            }
            tx
        });
        settle(&mut wake).await;
        let _tx = sender.await.unwrap();
        // Every token of the burst was consumed by `settle`.
        assert!(wake.as_mut().unwrap().try_recv().is_err());
    }
}
