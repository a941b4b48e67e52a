//! What the manifest files define right now, and the events that bring consumers there.
//!
//! Pure: the catalog is handed a [`Snapshot`] (file contents, read by someone else) and
//! answers with the events that turn the previous state into the new one. Only
//! differences are reported, and a file whose bytes did not change is not even parsed
//! again, so rescanning thousands of Services costs a read and a comparison.
//!
//! Every decoded object passes the API server's rules (`validate`) before it can become an
//! event, and Services that ask for the same nodePort or cluster IP are settled as the API
//! server's allocators would (`claims`).
//!
//! Bad input keeps the last good state, as a failed `kubectl apply` leaves the cluster:
//! a file that is not YAML, or is over the size cap, keeps everything it defined; a
//! document that does not decode or breaks a rule keeps that one object's previous version;
//! a Service whose new version conflicts with another keeps its previous version when that
//! one conflicts with nothing. Each rejection is reported once, when it first happens.
//!
//! When two files define the same object, the file whose path sorts last wins (paths
//! compare component by component), and a warning names both.
//!
//! Objects are kept in their compact form ([`Stored`]: JSON bytes plus what claims need),
//! not as decoded API objects, and the events of a scan are handed out as [`Change`]s that
//! are decoded one at a time as they are sent: at 10k Services x 10 endpoints the decoded
//! objects were ~50 MB kept for the process's life, beside the trackers' own views.
//!
//! A file that suddenly turns empty is believed only after [`EMPTY_FILE_GRACE`]:
//! `kubectl get -o yaml > file` truncates the file long before it writes it, and deleting
//! every object of that file meanwhile would drop live traffic.

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, RandomState};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kpr_model::{ObjectKind, RejectReason, Rejection, Sizes};
use tracing::{debug, info, warn};

use super::claims::{self, Contender, Outcome, Published, Rank};
use super::object::{ObjectKey, Stored, shown_path};
use super::parse::{FileObjects, ParsedFile, parse_and_store};
use super::validate::ValidationRules;
use crate::Event;

/// How long a file that was emptied must stay empty before its objects are deleted.
pub const EMPTY_FILE_GRACE: Duration = Duration::from_secs(2);

/// One file as found on a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileRead {
    Bytes(Vec<u8>),
    /// The file exists but could not be read (e.g. permissions): what it defined stays.
    Unreadable(String),
    /// The file is larger than `limit` bytes and was not read: what it defined stays.
    TooLarge {
        size: u64,
        limit: u64,
    },
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
    rules: ValidationRules,
    /// The key of every file's [`Fingerprint`].
    fingerprint_keys: RandomState,
    files: BTreeMap<PathBuf, FileEntry>,
    published: BTreeMap<ObjectKey, Stored>,
    /// Files seen empty that defined objects before, and since when.
    emptied_at: BTreeMap<PathBuf, Instant>,
    /// The conflict last reported for each Service, so a standing conflict is reported once.
    reported_conflicts: BTreeMap<ObjectKey, Rejection>,
}

#[derive(Debug, Default)]
struct FileEntry {
    /// So that an unchanged file is recognised without parsing it.
    fingerprint: Fingerprint,
    objects: BTreeMap<ObjectKey, Placed>,
    /// The size last reported as over the cap, so an oversized file is reported once per size.
    oversized: Option<u64>,
}

/// A file's length and a keyed 64-bit hash of its bytes: recognises an unchanged file
/// without keeping its bytes (93 MB for 50k Services x 10 endpoints). The key is random
/// per process (std's SipHash `RandomState`), so nobody can craft a changed file that
/// passes for the old one; an accidental match of length and hash is a 2^-64 chance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Fingerprint {
    len: usize,
    hash: u64,
}

impl Fingerprint {
    fn of(bytes: &[u8], keys: &RandomState) -> Self {
        if bytes.is_empty() {
            // Equal to the default, which files that were never read start with.
            return Self::default();
        }
        Self {
            len: bytes.len(),
            hash: keys.hash_one(bytes),
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An object and its position in its file (see [`super::Placement`]).
#[derive(Clone, Debug)]
struct Placed {
    object: Stored,
    ordinal: usize,
}

/// One event of a scan, with a new or changed object still in its stored form: the source
/// decodes each as it sends it, so the decoded objects of a whole scan never exist at once.
#[derive(Debug)]
pub(crate) enum Change {
    Ready(Event),
    Upsert(ObjectKey, Stored),
}

impl Change {
    pub(crate) fn into_event(self) -> Event {
        match self {
            Self::Ready(event) => event,
            Self::Upsert(key, object) => object.to_event(&key),
        }
    }
}

impl ManifestCatalog {
    /// `node_name` selects the only Node object that is reported; objects are checked with
    /// the default [`ValidationRules`].
    pub fn new(node_name: Option<String>) -> Self {
        Self {
            node_name,
            rules: ValidationRules::default(),
            fingerprint_keys: RandomState::new(),
            files: BTreeMap::new(),
            published: BTreeMap::new(),
            emptied_at: BTreeMap::new(),
            reported_conflicts: BTreeMap::new(),
        }
    }

    /// The same catalog, checking objects with `rules`.
    pub fn with_rules(mut self, rules: ValidationRules) -> Self {
        self.rules = rules;
        self
    }

    /// What the catalog keeps between scans (kpr_model::Sizes): files and their objects,
    /// the published view, emptied files waiting out the grace, standing conflicts.
    pub fn footprint(&self) -> Sizes {
        Sizes::new()
            .with("files", self.files.len())
            .with(
                "files.objects",
                self.files.values().map(|f| f.objects.len()).sum(),
            )
            .with(
                "files.oversized",
                self.files.values().filter(|f| f.oversized.is_some()).count(),
            )
            .with("published", self.published.len())
            .with("emptied_at", self.emptied_at.len())
            .with("reported_conflicts", self.reported_conflicts.len())
    }

    /// When a rescan should check again whether an emptied file is still empty.
    pub fn next_recheck(&self) -> Option<Instant> {
        self.emptied_at
            .values()
            .min()
            .map(|since| *since + EMPTY_FILE_GRACE)
    }

    /// Moves to what `snapshot` shows; returns rejections for newly read files and new
    /// conflicts, then one event per new or changed object and one per deleted object.
    pub fn apply(&mut self, snapshot: Snapshot) -> Vec<Event> {
        self.apply_changes(snapshot)
            .into_iter()
            .map(Change::into_event)
            .collect()
    }

    /// [`Self::apply`] with new and changed objects not yet decoded.
    pub(crate) fn apply_changes(&mut self, snapshot: Snapshot) -> Vec<Change> {
        let mut events = Vec::new();
        let mut changed = self.forget_removed_files(&snapshot);
        for (path, read) in snapshot.files {
            changed |= self.update_file(path, read, snapshot.taken_at, &mut events);
        }
        if changed {
            let (merged, conflicts) = settle_claims(merge(&self.files), &self.published);
            for (key, rejection) in &conflicts {
                if self.reported_conflicts.get(key) != Some(rejection) {
                    events.push(Change::Ready(Event::Rejected(rejection.clone())));
                }
            }
            self.reported_conflicts = conflicts;
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
                info!(file = %shown_path(path), "manifest file removed; deleting its objects");
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
        events: &mut Vec<Change>,
    ) -> bool {
        let bytes = match read {
            FileRead::Bytes(bytes) => bytes,
            FileRead::Unreadable(reason) => {
                warn!(file = %shown_path(&path), reason, "cannot read manifest file; keeping what it defined");
                return false;
            }
            FileRead::TooLarge { size, limit } => {
                self.oversized(path, size, limit, events);
                return false;
            }
        };
        let fingerprint = Fingerprint::of(&bytes, &self.fingerprint_keys);
        if let Some(entry) = self.files.get_mut(&path)
            && entry.fingerprint == fingerprint
        {
            entry.oversized = None;
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
        let parsed = parse_and_store(&path, &bytes, self.node_name.as_deref(), &self.rules);
        let objects = match parsed {
            ParsedFile::Malformed(rejection) => {
                events.push(Change::Ready(Event::Rejected(rejection)));
                previous
            }
            ParsedFile::Documents(file) => keep_last_good(file, previous, events),
        };
        drop(bytes);
        let entry = FileEntry {
            fingerprint,
            objects,
            oversized: None,
        };
        self.files.insert(path, entry);
        true
    }

    /// A file over the size cap keeps what it defined (nothing, if it is new); reported
    /// once for each size it is seen at.
    fn oversized(&mut self, path: PathBuf, size: u64, limit: u64, events: &mut Vec<Change>) {
        self.emptied_at.remove(&path);
        let file = shown_path(&path);
        let entry = self.files.entry(path).or_default();
        if entry.oversized == Some(size) {
            return;
        }
        entry.oversized = Some(size);
        events.push(Change::Ready(Event::Rejected(Rejection::new(
            ObjectKind::Manifest,
            file,
            "file",
            RejectReason::TooLarge,
            format!(
                "{size} bytes is over the limit of {limit} bytes (--manifests-max-file-bytes); \
                 keeping what this file defined before"
            ),
        ))));
    }

    /// True while a file that defined something has been empty for less than the grace.
    fn still_being_written(&mut self, path: &Path, bytes: &[u8], taken_at: Instant) -> bool {
        let was_filled = self
            .files
            .get(path)
            .is_some_and(|entry| !entry.fingerprint.is_empty());
        if !bytes.is_empty() || !was_filled {
            self.emptied_at.remove(path);
            return false;
        }
        let since = *self.emptied_at.entry(path.to_path_buf()).or_insert(taken_at);
        if taken_at < since + EMPTY_FILE_GRACE {
            debug!(file = %shown_path(path), "manifest file is empty; waiting in case it is being written");
            return true;
        }
        self.emptied_at.remove(path);
        false
    }
}

/// The new objects of a file, plus the previous version of each object whose new
/// document was rejected.
fn keep_last_good(
    file: FileObjects<Stored>,
    mut previous: BTreeMap<ObjectKey, Placed>,
    events: &mut Vec<Change>,
) -> BTreeMap<ObjectKey, Placed> {
    let FileObjects {
        objects,
        placements,
        failed,
        rejections,
    } = file;
    events.extend(rejections.into_iter().map(|r| Change::Ready(Event::Rejected(r))));
    let mut kept: BTreeMap<ObjectKey, Placed> = objects
        .into_iter()
        .map(|(key, object)| {
            let ordinal = placements.get(&key).map_or(usize::MAX, |p| p.ordinal);
            (key, Placed { object, ordinal })
        })
        .collect();
    for key in failed {
        if kept.contains_key(&key) {
            continue;
        }
        if let Some(old) = previous.remove(&key) {
            warn!(object = %key, "keeping the last good version of a rejected object");
            kept.insert(key, old);
        }
    }
    kept
}

/// One object of the merged view, and the file it comes from.
struct Merged<'a> {
    placed: &'a Placed,
    path: &'a Path,
}

/// All files' objects in one map; for an object in several files, the last path wins.
fn merge(files: &BTreeMap<PathBuf, FileEntry>) -> BTreeMap<ObjectKey, Merged<'_>> {
    let mut merged: BTreeMap<ObjectKey, Merged<'_>> = BTreeMap::new();
    for (path, entry) in files {
        for (key, placed) in &entry.objects {
            let this = Merged { placed, path };
            if let Some(earlier) = merged.insert(key.clone(), this) {
                warn!(
                    object = %key,
                    ignored = %shown_path(earlier.path),
                    used = %shown_path(path),
                    "object defined in two manifest files; the path that sorts last wins"
                );
            }
        }
    }
    merged
}

/// Settles nodePorts and cluster IPs between the merged Services (see `claims`): a Service
/// whose newest version conflicts keeps its `published` version or is left out. Returns the
/// objects to publish and the conflicts.
fn settle_claims(
    merged: BTreeMap<ObjectKey, Merged<'_>>,
    published: &BTreeMap<ObjectKey, Stored>,
) -> (BTreeMap<ObjectKey, Stored>, BTreeMap<ObjectKey, Rejection>) {
    let published_service = |key: &ObjectKey| {
        published
            .get(key)
            .filter(|stored| stored.service_claims().is_some())
    };
    let contenders: Vec<Contender<'_>> = merged
        .iter()
        .filter_map(|(key, merged)| {
            let object = &merged.placed.object;
            let candidate = object.service_claims()?;
            let published = match published_service(key) {
                None => Published::Nothing,
                Some(published) if published.same_content(object) => Published::Candidate,
                Some(published) => Published::Other(published.service_claims()?),
            };
            Some(Contender {
                key,
                candidate,
                published,
                rank: Rank::new(candidate, merged.path.to_path_buf(), merged.placed.ordinal),
            })
        })
        .collect();
    let outcomes = claims::settle(&contenders);
    let decided: Vec<(ObjectKey, Outcome)> = contenders.iter().map(|c| c.key.clone()).zip(outcomes).collect();
    let mut result: BTreeMap<ObjectKey, Stored> = merged
        .into_iter()
        .map(|(key, merged)| (key, merged.placed.object.clone()))
        .collect();
    let mut conflicts = BTreeMap::new();
    for (key, outcome) in decided {
        let (rejection, kept) = match outcome {
            Outcome::Candidate => continue,
            Outcome::Published(rejection) => (rejection, published_service(&key)),
            Outcome::Absent(rejection) => (rejection, None),
        };
        match kept {
            Some(service) => result.insert(key.clone(), service.clone()),
            None => result.remove(&key),
        };
        conflicts.insert(key, rejection);
    }
    (result, conflicts)
}

/// Events for new and changed objects, then for deleted ones. The Node comes first: start-up
/// reads the source's events until it has the Node (`kube-proxy-rs`'s `node::wait`) and keeps
/// what it read meanwhile, so a Node sent after the Services and EndpointSlices would have
/// every one of them decoded and held at once; sent first, the rest stays compact here and is
/// decoded as the sync loop takes it.
fn diff(old: &BTreeMap<ObjectKey, Stored>, new: &BTreeMap<ObjectKey, Stored>) -> Vec<Change> {
    let changed =
        |(key, object): &(&ObjectKey, &Stored)| !old.get(*key).is_some_and(|prev| prev.same_content(object));
    let is_node = |(key, _): &(&ObjectKey, &Stored)| key.kind == ObjectKind::Node;
    let nodes = new.iter().filter(changed).filter(is_node);
    let others = new.iter().filter(changed).filter(|entry| !is_node(entry));
    let upserts = nodes
        .chain(others)
        .map(|(key, object)| Change::Upsert(key.clone(), object.clone()));
    let deletions = old
        .keys()
        .filter(|key| !new.contains_key(*key))
        .map(|key| Change::Ready(key.deletion()));
    upserts.chain(deletions).collect()
}

#[cfg(test)]
mod churn_tests;
#[cfg(test)]
mod tests;
