//! The object store: current objects plus the retained history of changes, under one global,
//! monotonically increasing resourceVersion, as etcd and the watch cache present them.
//!
//! Lists read a snapshot at some resourceVersion (rebuilt by undoing newer changes), watches
//! read the changes after a resourceVersion, and compaction forgets old changes so that
//! requests for older versions get `410 Gone`, as on a real cluster.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::error::ApiError;
use crate::resources::ResourceType;

/// An object as stored and sent: its JSON form, with `apiVersion` and `kind`.
pub type Object = Arc<Value>;

/// Where an object lives: its type, namespace (empty for cluster-scoped types) and name.
/// Ordered the way etcd orders keys, so lists come out sorted by namespace, then name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub resource: &'static ResourceType,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(resource: &'static ResourceType, namespace: &str, name: &str) -> Self {
        ObjectKey {
            resource,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One write, as watches replay it.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    pub key: ObjectKey,
    pub kind: ChangeKind,
    /// The object after the write; for a deletion, its last state stamped with the
    /// deletion's resourceVersion (what a `DELETED` event carries).
    pub object: Object,
    /// The object before the write (none for a creation).
    pub previous: Option<Object>,
}

/// A consistent view of one type's objects at one resourceVersion.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub resource_version: u64,
    pub objects: Vec<(ObjectKey, Object)>,
}

/// What a watch at `cursor` should send next.
#[derive(Debug)]
pub enum Pending {
    /// The changes to this type after the cursor (possibly none) and the head they reach.
    Changes { changes: Vec<Arc<Change>>, head: u64 },
    /// Changes after the cursor were compacted away before the watch read them.
    Expired { oldest: u64 },
}

/// What a write did.
#[derive(Debug, Clone)]
pub struct WriteOutcome {
    pub object: Object,
    /// False when an update changed nothing (no new resourceVersion, no event).
    pub changed: bool,
}

#[derive(Debug)]
struct State {
    resource_version: u64,
    /// The oldest resourceVersion a new list or watch may start from.
    oldest_resumable: u64,
    /// The newest resourceVersion among changes dropped by compaction; an open watch whose
    /// cursor is older has missed events.
    last_dropped: u64,
    objects: BTreeMap<ObjectKey, Object>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
}

/// The shared store. Writes notify watchers through [`Store::subscribe`].
#[derive(Debug)]
pub struct Store {
    state: Mutex<State>,
    head: watch::Sender<u64>,
    /// The newest few sorted snapshots, so that the pages of one paginated list (each a
    /// request of its own) share one copy instead of each cloning and sorting every object:
    /// at 50k EndpointSlices in pages of 500 that was most of a core for half a minute.
    lists: Mutex<VecDeque<Arc<SortedSnapshot>>>,
}

/// How many sorted snapshots [`Store::sorted_snapshot`] keeps.
const SORTED_SNAPSHOTS_KEPT: usize = 4;

/// One type's objects (optionally in one namespace) at one resourceVersion, in etcd key
/// order (`namespace/name`, or `name` for cluster-scoped types), with those keys.
#[derive(Debug)]
pub struct SortedSnapshot {
    pub resource: &'static ResourceType,
    pub namespace: Option<String>,
    pub resource_version: u64,
    pub objects: Vec<(String, Object)>,
}

/// A resourceVersion to start from, as real clusters never start at 0 or 1.
const FIRST_RESOURCE_VERSION: u64 = 1000;

impl Store {
    /// An empty store retaining at most `history_limit` changes (older ones are compacted).
    pub fn new(history_limit: usize) -> Self {
        let state = State {
            resource_version: FIRST_RESOURCE_VERSION,
            oldest_resumable: FIRST_RESOURCE_VERSION,
            last_dropped: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
        };
        Store {
            state: Mutex::new(state),
            head: watch::channel(FIRST_RESOURCE_VERSION).0,
            lists: Mutex::new(VecDeque::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every write is one insert).
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The current (newest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().resource_version
    }

    /// The oldest resourceVersion a new list or watch may start from.
    pub fn oldest_resumable(&self) -> u64 {
        self.lock().oldest_resumable
    }

    /// A receiver of the current resourceVersion, updated after every write.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.head.subscribe()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Object> {
        self.lock().objects.get(key).cloned()
    }

    /// Stores a new object; fails if one with the same key exists.
    pub fn create(&self, key: ObjectKey, object: Value) -> Result<Object, ApiError> {
        let mut state = self.lock();
        if state.objects.contains_key(&key) {
            return Err(ApiError::already_exists(key.resource, &key.name));
        }
        let object = state.write(key, object, None);
        drop(state);
        self.notify();
        Ok(object)
    }

    /// Replaces an existing object. A `metadata.resourceVersion` in `object` is a
    /// precondition (409 when stale); an update that changes nothing is a no-op.
    pub fn update(&self, key: ObjectKey, object: Value) -> Result<WriteOutcome, ApiError> {
        let mut state = self.lock();
        let existing = state
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(key.resource, &key.name))?;
        check_precondition(&key, &object, &existing)?;
        let outcome = state.write_update(key, object, existing);
        drop(state);
        if outcome.changed {
            self.notify();
        }
        Ok(outcome)
    }

    /// Creates or unconditionally replaces (any resourceVersion in `object` is ignored).
    pub fn apply(&self, key: ObjectKey, object: Value) -> WriteOutcome {
        let mut state = self.lock();
        let outcome = match state.objects.get(&key).cloned() {
            Some(existing) => state.write_update(key, object, existing),
            None => WriteOutcome {
                object: state.write(key, object, None),
                changed: true,
            },
        };
        drop(state);
        if outcome.changed {
            self.notify();
        }
        outcome
    }

    /// Applies `change` to the current object and stores the result (for PATCH).
    pub fn modify(
        &self,
        key: ObjectKey,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<WriteOutcome, ApiError> {
        let mut state = self.lock();
        let existing = state
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(key.resource, &key.name))?;
        let updated = change(&existing)?;
        let outcome = state.write_update(key, updated, existing);
        drop(state);
        if outcome.changed {
            self.notify();
        }
        Ok(outcome)
    }

    /// Deletes an object and returns its last state.
    pub fn delete(&self, key: &ObjectKey) -> Result<Object, ApiError> {
        self.delete_if(key, |_| Ok(()))
    }

    /// Deletes an object if `precondition` accepts its current state (DeleteOptions'
    /// preconditions), atomically with the check.
    pub fn delete_if(
        &self,
        key: &ObjectKey,
        precondition: impl FnOnce(&Value) -> Result<(), ApiError>,
    ) -> Result<Object, ApiError> {
        let mut state = self.lock();
        let current = state
            .objects
            .get(key)
            .ok_or_else(|| ApiError::not_found(key.resource, &key.name))?;
        precondition(current)?;
        let existing = state
            .objects
            .remove(key)
            .ok_or_else(|| ApiError::not_found(key.resource, &key.name))?;
        let resource_version = state.next_resource_version();
        let mut last = (*existing).clone();
        stamp_resource_version(&mut last, resource_version);
        let last = Arc::new(last);
        state.record(Change {
            resource_version,
            key: key.clone(),
            kind: ChangeKind::Deleted,
            object: last.clone(),
            previous: Some(existing),
        });
        drop(state);
        self.notify();
        Ok(last)
    }

    /// [`Store::snapshot`] in etcd key order, shared with earlier requests for the same
    /// version (a snapshot at a version never changes; a compacted version still answers
    /// `410`, checked before the cache is asked).
    pub fn sorted_snapshot(
        &self,
        resource: &'static ResourceType,
        namespace: Option<&str>,
        at: Option<u64>,
    ) -> Result<Arc<SortedSnapshot>, ApiError> {
        let at = self.readable_version(at)?;
        let cached = self
            .lists
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|s| {
                s.resource == resource && s.namespace.as_deref() == namespace && s.resource_version == at
            })
            .cloned();
        if let Some(hit) = cached {
            return Ok(hit);
        }
        let snapshot = self.snapshot(resource, namespace, Some(at))?;
        let mut objects: Vec<(String, Object)> = snapshot
            .objects
            .into_iter()
            .map(|(key, object)| (crate::list::etcd_key(&key), object))
            .collect();
        objects.sort_by(|a, b| a.0.cmp(&b.0));
        let sorted = Arc::new(SortedSnapshot {
            resource,
            namespace: namespace.map(str::to_owned),
            resource_version: at,
            objects,
        });
        let mut lists = self.lists.lock().unwrap_or_else(|p| p.into_inner());
        lists.push_front(sorted.clone());
        lists.truncate(SORTED_SNAPSHOTS_KEPT);
        Ok(sorted)
    }

    /// `at` (or the newest version) if a list may be read there.
    fn readable_version(&self, at: Option<u64>) -> Result<u64, ApiError> {
        let state = self.lock();
        let at = at.unwrap_or(state.resource_version);
        if at < state.oldest_resumable {
            return Err(ApiError::Expired(format!(
                "too old resource version: {at} ({})",
                state.oldest_resumable
            )));
        }
        if at > state.resource_version {
            return Err(ApiError::TooLargeResourceVersion {
                requested: at,
                current: state.resource_version,
            });
        }
        Ok(at)
    }

    /// One type's objects (optionally in one namespace) as they were at `at`, or now.
    pub fn snapshot(
        &self,
        resource: &'static ResourceType,
        namespace: Option<&str>,
        at: Option<u64>,
    ) -> Result<Snapshot, ApiError> {
        let at = self.readable_version(at)?;
        let state = self.lock();
        // Compaction may have moved on since: check again under this lock.
        if at < state.oldest_resumable {
            return Err(ApiError::Expired(format!(
                "too old resource version: {at} ({})",
                state.oldest_resumable
            )));
        }
        let in_scope =
            |key: &ObjectKey| key.resource == resource && namespace.is_none_or(|ns| key.namespace == ns);
        let mut objects: BTreeMap<ObjectKey, Object> = state
            .objects
            .iter()
            .filter(|(key, _)| in_scope(key))
            .map(|(key, object)| (key.clone(), object.clone()))
            .collect();
        for change in state.history.iter().rev().take_while(|c| c.resource_version > at) {
            if !in_scope(&change.key) {
                continue;
            }
            match &change.previous {
                Some(previous) => objects.insert(change.key.clone(), previous.clone()),
                None => objects.remove(&change.key),
            };
        }
        Ok(Snapshot {
            resource_version: at,
            objects: objects.into_iter().collect(),
        })
    }

    /// The changes to `resource` after `cursor`, for an open watch.
    pub fn pending(&self, resource: &'static ResourceType, cursor: u64) -> Pending {
        let state = self.lock();
        if state.last_dropped > cursor {
            return Pending::Expired {
                oldest: state.oldest_resumable,
            };
        }
        let start = state.history.partition_point(|c| c.resource_version <= cursor);
        let changes = state
            .history
            .range(start..)
            .filter(|c| c.key.resource == resource)
            .cloned()
            .collect();
        Pending::Changes {
            changes,
            head: state.resource_version,
        }
    }

    /// Forgets the history up to `resource_version`: lists and watches from older versions
    /// get 410 from now on. Never moves backwards.
    pub fn compact(&self, resource_version: u64) {
        let mut state = self.lock();
        let target = resource_version.min(state.resource_version);
        state.compact_to(target);
    }

    /// Forgets all history. Like on a busy cluster, the resourceVersion moves on first (as if
    /// another type had been written), so every version a client holds is now too old while a
    /// fresh list starts cleanly. Returns the new oldest resumable version.
    pub fn compact_all(&self) -> u64 {
        let mut state = self.lock();
        let target = state.next_resource_version();
        state.compact_to(target);
        drop(state);
        self.notify();
        target
    }

    /// Every current object of one type, sorted by namespace and name.
    pub fn objects_of(&self, resource: &'static ResourceType) -> Vec<Object> {
        let state = self.lock();
        state
            .objects
            .iter()
            .filter(|(key, _)| key.resource == resource)
            .map(|(_, o)| o.clone())
            .collect()
    }

    fn notify(&self) {
        let head = self.resource_version();
        self.head.send_replace(head);
    }
}

impl State {
    fn next_resource_version(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    /// Stores `object` under a new resourceVersion, keeping identity fields of `existing`.
    fn write(&mut self, key: ObjectKey, mut object: Value, existing: Option<Object>) -> Object {
        let resource_version = self.next_resource_version();
        match &existing {
            Some(existing) => keep_identity(&mut object, existing),
            None => assign_identity(&mut object, &key, resource_version),
        }
        stamp_resource_version(&mut object, resource_version);
        let object = Arc::new(object);
        let kind = if existing.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.objects.insert(key.clone(), object.clone());
        self.record(Change {
            resource_version,
            key,
            kind,
            object: object.clone(),
            previous: existing,
        });
        object
    }

    /// An update: a no-op when nothing but bookkeeping differs, else a new version.
    fn write_update(&mut self, key: ObjectKey, mut object: Value, existing: Object) -> WriteOutcome {
        keep_identity(&mut object, &existing);
        if let Some(current) = existing.pointer("/metadata/resourceVersion").cloned()
            && let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut)
        {
            metadata.insert("resourceVersion".into(), current);
        }
        if object == *existing {
            return WriteOutcome {
                object: existing,
                changed: false,
            };
        }
        WriteOutcome {
            object: self.write(key, object, Some(existing)),
            changed: true,
        }
    }

    fn record(&mut self, change: Change) {
        self.history.push_back(Arc::new(change));
        if self.history.len() > self.history_limit {
            let overflow = self.history.len() - self.history_limit;
            if let Some(last_dropped) = self.history.get(overflow - 1).map(|c| c.resource_version) {
                self.compact_to(last_dropped);
            }
        }
    }

    fn compact_to(&mut self, target: u64) {
        if target <= self.oldest_resumable {
            return;
        }
        while self.history.front().is_some_and(|c| c.resource_version <= target) {
            if let Some(dropped) = self.history.pop_front() {
                self.last_dropped = self.last_dropped.max(dropped.resource_version);
            }
        }
        self.oldest_resumable = target;
    }
}

fn check_precondition(key: &ObjectKey, object: &Value, existing: &Value) -> Result<(), ApiError> {
    let wanted = object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty());
    let current = existing
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    match wanted {
        Some(wanted) if Some(wanted) != current => Err(ApiError::conflict(
            key.resource,
            &key.name,
            format!(
                "the object has been modified (resourceVersion {wanted} is stale, current is {})",
                current.unwrap_or("unknown")
            ),
        )),
        _ => Ok(()),
    }
}

fn metadata_mut(object: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object.as_object_mut()?.insert("metadata".into(), json!({}));
    }
    object.get_mut("metadata").and_then(Value::as_object_mut)
}

fn stamp_resource_version(object: &mut Value, resource_version: u64) {
    if let Some(metadata) = metadata_mut(object) {
        metadata.insert(
            "resourceVersion".into(),
            Value::String(resource_version.to_string()),
        );
    }
}

/// A new object's `uid` and `creationTimestamp`; the uid is derived from the key and the
/// creating version, so it is unique per incarnation and stable across test runs.
fn assign_identity(object: &mut Value, key: &ObjectKey, resource_version: u64) {
    let digest = Sha256::digest(format!(
        "{}/{}/{}@{resource_version}",
        key.resource, key.namespace, key.name
    ));
    let hex = data_encoding::HEXLOWER.encode(&digest[..16]);
    let uid = format!(
        "{}-{}-4{}-8{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    );
    // Whole seconds, as the real server's `Time` serializes.
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or_default();
    let created = k8s_openapi::jiff::Timestamp::from_second(seconds)
        .ok()
        .and_then(|now| serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)).ok())
        .unwrap_or(Value::Null);
    if let Some(metadata) = metadata_mut(object) {
        metadata.insert("uid".into(), Value::String(uid));
        metadata.insert("creationTimestamp".into(), created);
    }
}

/// The server owns `uid` and `creationTimestamp`: an update keeps the stored ones.
fn keep_identity(object: &mut Value, existing: &Value) {
    let uid = existing.pointer("/metadata/uid").cloned();
    let created = existing.pointer("/metadata/creationTimestamp").cloned();
    if let Some(metadata) = metadata_mut(object) {
        for (field, value) in [("uid", uid), ("creationTimestamp", created)] {
            match value {
                Some(value) => metadata.insert(field.into(), value),
                None => metadata.remove(field),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{NODES, SERVICES};

    fn service(namespace: &str, name: &str, port: u16) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "ports": [{ "port": port }] },
        })
    }

    fn key(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey::new(&SERVICES, namespace, name)
    }

    fn rv(object: &Value) -> u64 {
        object["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn writes_bump_one_global_resource_version_and_stamp_identity() {
        let store = Store::new(100);
        let start = store.resource_version();
        let a = store.create(key("ns", "a"), service("ns", "a", 80)).unwrap();
        let node = store
            .create(
                ObjectKey::new(&NODES, "", "n1"),
                json!({"metadata": {"name": "n1"}}),
            )
            .unwrap();
        assert_eq!(rv(&a), start + 1);
        assert_eq!(rv(&node), start + 2);
        assert_eq!(a["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert!(
            a["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
    }

    #[test]
    fn update_keeps_identity_and_checks_preconditions() {
        let store = Store::new(100);
        let created = store.create(key("ns", "a"), service("ns", "a", 80)).unwrap();
        let mut stale = service("ns", "a", 81);
        stale["metadata"]["resourceVersion"] = json!("1");
        assert_eq!(store.update(key("ns", "a"), stale).unwrap_err().code(), 409);
        let updated = store.update(key("ns", "a"), service("ns", "a", 81)).unwrap();
        assert!(updated.changed);
        assert_eq!(updated.object["metadata"]["uid"], created["metadata"]["uid"]);
        assert_eq!(rv(&updated.object), rv(&created) + 1);
        assert_eq!(
            store
                .update(key("ns", "b"), service("ns", "b", 1))
                .unwrap_err()
                .code(),
            404
        );
    }

    #[test]
    fn no_op_updates_do_not_move_the_resource_version() {
        let store = Store::new(100);
        store.create(key("ns", "a"), service("ns", "a", 80)).unwrap();
        let before = store.resource_version();
        let outcome = store.apply(key("ns", "a"), service("ns", "a", 80));
        assert!(!outcome.changed);
        assert_eq!(store.resource_version(), before);
        assert!(
            matches!(store.pending(&SERVICES, before), Pending::Changes { ref changes, .. } if changes.is_empty())
        );
    }

    #[test]
    fn snapshots_see_the_past() {
        let store = Store::new(100);
        store.create(key("ns", "a"), service("ns", "a", 80)).unwrap();
        let past = store.resource_version();
        store.update(key("ns", "a"), service("ns", "a", 81)).unwrap();
        store.create(key("ns", "b"), service("ns", "b", 80)).unwrap();
        store.delete(&key("ns", "a")).unwrap();
        let then = store.snapshot(&SERVICES, None, Some(past)).unwrap();
        assert_eq!(then.objects.len(), 1);
        assert_eq!(then.objects[0].1["spec"]["ports"][0]["port"], 80);
        let now = store.snapshot(&SERVICES, None, None).unwrap();
        assert_eq!(
            now.objects
                .iter()
                .map(|(k, _)| k.name.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(
            store
                .snapshot(&SERVICES, Some("other"), None)
                .unwrap()
                .objects
                .len(),
            0
        );
    }

    #[test]
    fn deletion_events_carry_the_last_state_at_the_deletion_version() {
        let store = Store::new(100);
        store.create(key("ns", "a"), service("ns", "a", 80)).unwrap();
        let before = store.resource_version();
        let last = store.delete(&key("ns", "a")).unwrap();
        assert_eq!(rv(&last), before + 1);
        let Pending::Changes { changes, head } = store.pending(&SERVICES, before) else {
            panic!("expired")
        };
        assert_eq!(head, before + 1);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].kind, ChangeKind::Deleted);
        assert_eq!(changes[0].object["spec"]["ports"][0]["port"], 80);
    }

    #[test]
    fn compaction_expires_older_versions_only() {
        let store = Store::new(100);
        store.create(key("ns", "a"), service("ns", "a", 80)).unwrap();
        let old = store.resource_version();
        store.create(key("ns", "b"), service("ns", "b", 80)).unwrap();
        let newer = store.resource_version();
        store.compact(newer);
        assert_eq!(
            store.snapshot(&SERVICES, None, Some(old)).unwrap_err().code(),
            410
        );
        assert!(store.snapshot(&SERVICES, None, Some(newer)).is_ok());
        assert!(matches!(store.pending(&SERVICES, old), Pending::Expired { oldest } if oldest == newer));
        assert!(matches!(store.pending(&SERVICES, newer), Pending::Changes { .. }));
    }

    #[test]
    fn compact_all_moves_on_so_every_held_version_is_too_old() {
        let store = Store::new(100);
        store.create(key("ns", "a"), service("ns", "a", 80)).unwrap();
        let held = store.resource_version();
        let oldest = store.compact_all();
        assert_eq!(oldest, held + 1);
        assert_eq!(
            store.snapshot(&SERVICES, None, Some(held)).unwrap_err().code(),
            410
        );
        // A watch that had already read everything is not broken by it.
        assert!(matches!(store.pending(&SERVICES, held), Pending::Changes { .. }));
        assert_eq!(
            store.snapshot(&SERVICES, None, None).unwrap().resource_version,
            oldest
        );
    }

    #[test]
    fn history_limit_compacts_automatically() {
        let store = Store::new(2);
        let start = store.resource_version();
        for name in ["a", "b", "c"] {
            store.create(key("ns", name), service("ns", name, 80)).unwrap();
        }
        assert_eq!(store.oldest_resumable(), start + 1);
        assert!(matches!(store.pending(&SERVICES, start), Pending::Expired { .. }));
        assert!(
            matches!(store.pending(&SERVICES, start + 1), Pending::Changes { ref changes, .. } if changes.len() == 2)
        );
    }

    #[test]
    fn future_versions_are_too_large() {
        let store = Store::new(10);
        let error = store
            .snapshot(&SERVICES, None, Some(store.resource_version() + 5))
            .unwrap_err();
        assert_eq!(error.code(), 504);
    }
}
