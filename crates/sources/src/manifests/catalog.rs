//! What the manifest files define right now, and the events that bring consumers there.
//!
//! Pure: the catalog is handed a [`Snapshot`] (file contents, read by someone else) and
//! answers with the events that turn the previous state into the new one. Only
//! differences are reported, and a file whose bytes did not change is not even parsed
//! again, so rescanning thousands of Services costs a read and a comparison.
//!
//! Bad input keeps the last good state, as a failed `kubectl apply` leaves the cluster:
//! a file that is not YAML keeps everything it defined, a document that does not decode
//! keeps that one object's previous version.
//!
//! When two files define the same object, the file whose path sorts last wins (paths
//! compare component by component), and a warning names both.
//!
//! A file that suddenly turns empty is believed only after [`EMPTY_FILE_GRACE`]:
//! `kubectl get -o yaml > file` truncates the file long before it writes it, and deleting
//! every object of that file meanwhile would drop live traffic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::object::{ManifestObject, ObjectKey};
use super::parse::{FileObjects, ParsedFile, parse_manifest};
use crate::Event;

/// How long a file that was emptied must stay empty before its objects are deleted.
pub const EMPTY_FILE_GRACE: Duration = Duration::from_secs(2);

/// One file as found on a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileRead {
    Bytes(Vec<u8>),
    /// The file exists but could not be read (e.g. permissions): what it defined stays.
    Unreadable(String),
}

/// Everything one scan found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub files: BTreeMap<PathBuf, FileRead>,
    /// Directories that could not be listed: the files known in them are kept, not deleted.
    pub unreadable_dirs: Vec<PathBuf>,
    /// When the scan started.
    pub taken_at: Instant,
}

impl Snapshot {
    /// An empty scan taken at `taken_at`, to be filled in.
    pub fn new(taken_at: Instant) -> Self {
        Self {
            files: BTreeMap::new(),
            unreadable_dirs: Vec::new(),
            taken_at,
        }
    }
}

/// The last good version of each file, and the merged view the consumers have been told.
#[derive(Debug)]
pub struct ManifestCatalog {
    node_name: Option<String>,
    files: BTreeMap<PathBuf, FileEntry>,
    published: BTreeMap<ObjectKey, ManifestObject>,
    /// Files seen empty that defined objects before, and since when.
    emptied_at: BTreeMap<PathBuf, Instant>,
}

#[derive(Debug)]
struct FileEntry {
    /// Kept so that an unchanged file is recognised without parsing it.
    bytes: Vec<u8>,
    objects: BTreeMap<ObjectKey, ManifestObject>,
}

impl ManifestCatalog {
    /// `node_name` selects the only Node object that is reported.
    pub fn new(node_name: Option<String>) -> Self {
        Self {
            node_name,
            files: BTreeMap::new(),
            published: BTreeMap::new(),
            emptied_at: BTreeMap::new(),
        }
    }

    /// When a rescan should check again whether an emptied file is still empty.
    pub fn next_recheck(&self) -> Option<Instant> {
        self.emptied_at
            .values()
            .min()
            .map(|since| *since + EMPTY_FILE_GRACE)
    }

    /// Moves to what `snapshot` shows; returns rejections for newly read files, then one
    /// event per new or changed object and one per deleted object.
    pub fn apply(&mut self, snapshot: Snapshot) -> Vec<Event> {
        let mut events = Vec::new();
        let mut changed = self.forget_removed_files(&snapshot);
        for (path, read) in snapshot.files {
            changed |= self.update_file(path, read, snapshot.taken_at, &mut events);
        }
        if changed {
            let merged = merge(&self.files);
            events.extend(diff(&self.published, &merged));
            self.published = merged;
        }
        events
    }

    /// Drops files that are gone; true if there were any.
    fn forget_removed_files(&mut self, snapshot: &Snapshot) -> bool {
        let still_listed = |path: &Path| {
            snapshot.files.contains_key(path)
                || path
                    .parent()
                    .is_some_and(|dir| snapshot.unreadable_dirs.iter().any(|d| d == dir))
        };
        let before = self.files.len();
        self.files.retain(|path, _| {
            let keep = still_listed(path);
            if !keep {
                info!(file = %path.display(), "manifest file removed; deleting its objects");
            }
            keep
        });
        let files = &self.files;
        self.emptied_at.retain(|path, _| files.contains_key(path));
        before != self.files.len()
    }

    /// Re-reads one file if its bytes changed; true if they did.
    fn update_file(
        &mut self,
        path: PathBuf,
        read: FileRead,
        taken_at: Instant,
        events: &mut Vec<Event>,
    ) -> bool {
        let bytes = match read {
            FileRead::Bytes(bytes) => bytes,
            FileRead::Unreadable(reason) => {
                warn!(file = %path.display(), reason, "cannot read manifest file; keeping what it defined");
                return false;
            }
        };
        if self.files.get(&path).is_some_and(|entry| entry.bytes == bytes) {
            self.emptied_at.remove(&path);
            return false;
        }
        if self.still_being_written(&path, &bytes, taken_at) {
            return false;
        }
        let previous = self
            .files
            .remove(&path)
            .map(|entry| entry.objects)
            .unwrap_or_default();
        let parsed = parse_manifest(&path, &bytes, self.node_name.as_deref());
        let objects = match parsed {
            ParsedFile::Malformed(rejection) => {
                events.push(Event::Rejected(rejection));
                previous
            }
            ParsedFile::Documents(file) => keep_last_good(file, previous, events),
        };
        self.files.insert(path, FileEntry { bytes, objects });
        true
    }

    /// True while a file that defined something has been empty for less than the grace.
    fn still_being_written(&mut self, path: &Path, bytes: &[u8], taken_at: Instant) -> bool {
        let was_filled = self.files.get(path).is_some_and(|entry| !entry.bytes.is_empty());
        if !bytes.is_empty() || !was_filled {
            self.emptied_at.remove(path);
            return false;
        }
        let since = *self.emptied_at.entry(path.to_path_buf()).or_insert(taken_at);
        if taken_at < since + EMPTY_FILE_GRACE {
            debug!(file = %path.display(), "manifest file is empty; waiting in case it is being written");
            return true;
        }
        self.emptied_at.remove(path);
        false
    }
}

/// The new objects of a file, plus the previous version of each object whose new
/// document was rejected.
fn keep_last_good(
    file: FileObjects,
    mut previous: BTreeMap<ObjectKey, ManifestObject>,
    events: &mut Vec<Event>,
) -> BTreeMap<ObjectKey, ManifestObject> {
    let FileObjects {
        mut objects,
        failed,
        rejections,
    } = file;
    events.extend(rejections.into_iter().map(Event::Rejected));
    for key in failed {
        if objects.contains_key(&key) {
            continue;
        }
        if let Some(old) = previous.remove(&key) {
            warn!(object = %key, "keeping the last good version of a rejected object");
            objects.insert(key, old);
        }
    }
    objects
}

/// All files' objects in one map; for an object in several files, the last path wins.
fn merge(files: &BTreeMap<PathBuf, FileEntry>) -> BTreeMap<ObjectKey, ManifestObject> {
    let mut merged = BTreeMap::new();
    let mut origin: BTreeMap<&ObjectKey, &Path> = BTreeMap::new();
    for (path, entry) in files {
        for (key, object) in &entry.objects {
            if let Some(earlier) = origin.insert(key, path) {
                warn!(
                    object = %key,
                    ignored = %earlier.display(),
                    used = %path.display(),
                    "object defined in two manifest files; the path that sorts last wins"
                );
            }
            merged.insert(key.clone(), object.clone());
        }
    }
    merged
}

/// Events for new and changed objects, then for deleted ones.
fn diff(old: &BTreeMap<ObjectKey, ManifestObject>, new: &BTreeMap<ObjectKey, ManifestObject>) -> Vec<Event> {
    let upserts = new
        .iter()
        .filter(|(key, object)| !old.get(*key).is_some_and(|prev| prev.same_content(object)))
        .map(|(key, object)| object.to_event(key));
    let deletions = old
        .keys()
        .filter(|key| !new.contains_key(*key))
        .map(ObjectKey::deletion);
    upserts.chain(deletions).collect()
}

#[cfg(test)]
mod tests;
