//! A Kubernetes API server for tests: speaks the real wire protocol for the types kube-proxy
//! reads (Services, EndpointSlices, Nodes) and writes (Events), and lets a test change objects
//! and inject the faults a real control plane has (dropped watches, compaction, outages).
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use kpr_apiserver::TestApiServer;
//! let server = TestApiServer::start().await?;
//! server.write_kubeconfig("/tmp/kubeconfig")?; // point the program under test at it
//! // server.apply(&service)?; server.drop_watches(); server.stop().await; server.restart().await?;
//! # Ok(()) }
//! ```
//!
//! # Behaviours covered (as the real server behaves for every request kube-rs makes)
//!
//! Served paths: `/api`, `/apis`, `/apis/{group}`, `/api/v1`, `/apis/{group}/{version}` (legacy
//! discovery, and aggregated discovery v2/v2beta1 when `Accept` asks for it), `/version`,
//! `/healthz`, `/livez`, `/readyz`, `/`; and for `services`, `nodes`, core `events`,
//! `discovery.k8s.io/v1` `endpointslices` and `events.k8s.io/v1` `events`: the cluster-wide
//! collection (list, watch), the namespaced collection (list, watch, create, deletecollection)
//! and the item (get, put, patch, delete). Every other path is `404` with a `Status` body;
//! an unserved method on a served path is `405`.
//!
//! - **resourceVersions**: one global counter (starting at 1000), bumped by every write of
//!   any type, as etcd's revision. Updates that change nothing keep the version and send no
//!   event. `uid` and `creationTimestamp` are set by the server.
//! - **list**: `resourceVersion` unset / `0` / `X` with `resourceVersionMatch`
//!   `NotOlderThan`/`Exact` and the legacy rule (a `limit` makes `X` exact); `limit`/`continue`
//!   pagination over a consistent snapshot in etcd key order with `remainingItemCount`;
//!   `410 Expired` for compacted versions and continue tokens; `504` (reason `Timeout`, cause
//!   `ResourceVersionTooLarge`) for future versions after a 3 s wait; the option validation
//!   errors (`422`). Items carry no `kind`/`apiVersion`, like the real server's.
//! - **selectors**: the full `labelSelector` grammar (`=`, `==`, `!=`, `in`, `notin`, `key`,
//!   `!key`, `>`, `<`) and `fieldSelector` on `metadata.name`/`metadata.namespace` and the
//!   type's own field labels (e.g. `spec.clusterIP` for Services, `spec.unschedulable` for
//!   Nodes); unsupported labels are `400`.
//! - **watch**: newline-delimited JSON events in a chunked `200` response, `ADDED`/`MODIFIED`/
//!   `DELETED`/`BOOKMARK`/`ERROR`; synthetic `ADDED`s for `resourceVersion` unset/`0`;
//!   `sendInitialEvents=true` (streaming lists) with the `k8s.io/initial-events-end` bookmark;
//!   selector transitions as `ADDED`/`DELETED`; `allowWatchBookmarks` with bookmarks every
//!   [`Options::bookmark_interval`] and on demand; `timeoutSeconds` ends the stream cleanly;
//!   a too-old version gets the in-stream `ERROR` event with a `410 Expired` `Status`, as the
//!   real server sends it, so kube-runtime's watcher relists.
//! - **writes**: JSON or YAML bodies; `apiVersion`/`kind`/namespace/name checked against the
//!   URL; name syntax (DNS-1035 for Services, DNS-1123 subdomains otherwise); `generateName`;
//!   `metadata.resourceVersion` as an update precondition (`409`); create-on-update for events;
//!   JSON merge patch (kube-runtime's event recorder) and JSON patch; DeleteOptions
//!   preconditions; responses `201` for creates, `200` otherwise.
//!
//! Not covered (answered with an error rather than pretended): strategic-merge and
//! server-side-apply patches (`415`), `dryRun` (`400`), subresources such as `/status`
//! (`404`), protobuf, authentication/authorization, namespaces as objects (any namespace
//! exists), defaulting and allocation (objects are stored as given: no `clusterIP`
//! assignment, no defaulted fields, no `managedFields`), finalizers and graceful deletion.
//!
//! # Fault controls
//!
//! [`TestApiServer::drop_watches`] ends every watch cleanly (a client resumes from its last
//! version, no relist); [`TestApiServer::compact`] forgets all history so resumes get `410`
//! (a relist); [`TestApiServer::pause`] holds every request and freezes every watch until
//! [`TestApiServer::resume`] (a hung control plane); [`TestApiServer::stop`] closes the
//! listener and cuts every connection (a killed API server: connection refused), and
//! [`TestApiServer::restart`] binds the same port again with the store intact (call
//! `compact()` before restarting to emulate a fresh watch cache that lost its history).

mod controls;
mod discovery;
mod error;
mod http;
pub mod kubeconfig;
mod list;
mod resources;
mod routes;
mod selectors;
mod server;
mod store;
mod watch;
mod write;

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::net::TcpListener;

pub use controls::RecordedRequest;
pub use error::ApiError;

use resources::ResourceType;
use server::{Running, Shared};
use store::{ObjectKey, Store};

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to listen; port 0 picks a free port (kept across `restart()`).
    pub listen: SocketAddr,
    /// How many changes the server remembers; watches and exact lists from before the oldest
    /// remembered change get `410 Gone`, as after an etcd compaction.
    pub history_limit: usize,
    /// How often watches that allow bookmarks get one (the real server: about a minute).
    pub bookmark_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(60),
        }
    }
}

/// A running (or stopped) test API server. Dropping it stops the server.
#[derive(Debug)]
pub struct TestApiServer {
    shared: Arc<Shared>,
    running: Mutex<Option<Running>>,
}

impl TestApiServer {
    /// Starts on a free port of 127.0.0.1 with default options.
    pub async fn start() -> io::Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Starts on `addr` with default options otherwise.
    pub async fn start_on(addr: SocketAddr) -> io::Result<Self> {
        Self::start_with(Options {
            listen: addr,
            ..Options::default()
        })
        .await
    }

    pub async fn start_with(options: Options) -> io::Result<Self> {
        let listener = TcpListener::bind(options.listen).await?;
        let shared = Arc::new(Shared {
            store: Store::new(options.history_limit),
            controls: controls::Controls::new(),
            bookmark_interval: options.bookmark_interval,
            address: listener.local_addr()?,
        });
        let running = Running::start(listener, shared.clone());
        Ok(TestApiServer {
            shared,
            running: Mutex::new(Some(running)),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.address)
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.address
    }

    /// A kubeconfig for this server (plain HTTP, no credentials, namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig::render(&self.url())
    }

    /// Writes [`kubeconfig_yaml`](Self::kubeconfig_yaml) to `path`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    // ---- objects -------------------------------------------------------------------------

    /// Creates or replaces an object (any `resourceVersion` in it is ignored); a namespaced
    /// object without a namespace goes to `default`. Returns the stored object.
    pub fn apply<K: Serialize + DeserializeOwned + k8s_openapi::Resource>(
        &self,
        object: &K,
    ) -> Result<K, ApiError> {
        decode(self.apply_json(encode(object)?)?)
    }

    /// Creates an object; `409 AlreadyExists` if it exists.
    pub fn create<K: Serialize + DeserializeOwned + k8s_openapi::Resource>(
        &self,
        object: &K,
    ) -> Result<K, ApiError> {
        let (resource, object) = self.prepare(encode(object)?)?;
        decode(write::create_prepared(&self.shared.store, resource, object)?)
    }

    /// Replaces an existing object; its `metadata.resourceVersion`, when set, must be current.
    pub fn update<K: Serialize + DeserializeOwned + k8s_openapi::Resource>(
        &self,
        object: &K,
    ) -> Result<K, ApiError> {
        let (resource, object) = self.prepare(encode(object)?)?;
        let key = write::key_of(resource, &object)?;
        decode((*self.shared.store.update(key, object)?.object).clone())
    }

    /// Deletes an object (`namespace` is ignored for cluster-scoped types); returns its last
    /// state.
    pub fn delete<K: DeserializeOwned + k8s_openapi::Resource>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<K, ApiError> {
        let key = ObjectKey::new(served::<K>()?, namespace, name);
        decode(self.delete_key(key)?)
    }

    pub fn get<K: DeserializeOwned + k8s_openapi::Resource>(&self, namespace: &str, name: &str) -> Option<K> {
        let resource = served::<K>().ok()?;
        let object = self.shared.store.get(&key_in(resource, namespace, name))?;
        decode((*object).clone()).ok()
    }

    /// Every object of one type, sorted by namespace and name.
    pub fn list<K: DeserializeOwned + k8s_openapi::Resource>(&self) -> Vec<K> {
        let Ok(resource) = served::<K>() else {
            return Vec::new();
        };
        self.shared
            .store
            .objects_of(resource)
            .into_iter()
            .filter_map(|o| decode((*o).clone()).ok())
            .collect()
    }

    /// [`apply`](Self::apply) for a JSON object naming its `apiVersion` and `kind`.
    pub fn apply_json(&self, object: Value) -> Result<Value, ApiError> {
        let (resource, object) = self.prepare(object)?;
        let named = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if !named {
            return write::create_prepared(&self.shared.store, resource, object);
        }
        let key = write::key_of(resource, &object)?;
        Ok((*self.shared.store.apply(key, object).object).clone())
    }

    /// Deletes the object a JSON manifest names (by `apiVersion`, `kind`, namespace, name).
    pub fn delete_json(&self, object: &Value) -> Result<Value, ApiError> {
        let (resource, object) = self.prepare(object.clone())?;
        self.delete_key(write::key_of(resource, &object)?)
    }

    /// Applies every object in a YAML stream (multi-document, `List` kinds unpacked), in
    /// order; returns the stored objects.
    pub fn load_yaml(&self, text: &str) -> Result<Vec<Value>, ApiError> {
        let mut stored = Vec::new();
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            let value = Value::deserialize(document)
                .map_err(|e| ApiError::BadRequest(format!("invalid YAML: {e}")))?;
            let items = match value.get("items").and_then(Value::as_array) {
                Some(items) if value["kind"].as_str().is_some_and(|k| k.ends_with("List")) => items.clone(),
                _ if value.is_null() => Vec::new(),
                _ => vec![value],
            };
            for item in items {
                stored.push(self.apply_json(item)?);
            }
        }
        Ok(stored)
    }

    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }

    fn prepare(&self, object: Value) -> Result<(&'static ResourceType, Value), ApiError> {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        let resource = resources::by_type_meta(api_version, kind).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "{api_version} {kind} is not served by this test API server"
            ))
        })?;
        Ok((resource, write::prepare(resource, None, object)?))
    }

    fn delete_key(&self, key: ObjectKey) -> Result<Value, ApiError> {
        let key = key_in(key.resource, &key.namespace, &key.name);
        Ok((*self.shared.store.delete(&key)?).clone())
    }

    // ---- faults and observation ------------------------------------------------------------

    /// Ends every open watch cleanly (the final chunk); clients resume from their last
    /// version. Returns how many watches were open.
    pub fn drop_watches(&self) -> usize {
        self.shared.controls.drop_watches()
    }

    /// How many watch streams are open now.
    pub fn open_watches(&self) -> usize {
        self.shared.controls.open_watches()
    }

    /// Returns once at least `at_least` watches are open (wrap it in a timeout).
    pub async fn wait_for_open_watches(&self, at_least: usize) {
        self.shared.controls.wait_for_open_watches(at_least).await;
    }

    /// Makes every watch that allows bookmarks send one now.
    pub fn send_bookmarks(&self) {
        self.shared.controls.send_bookmarks();
    }

    /// Holds every request (new and open watches alike) until [`resume`](Self::resume):
    /// connections are accepted, nothing is answered. Watches deliver the changes made
    /// meanwhile on resume.
    pub fn pause(&self) {
        self.shared.controls.set_paused(true);
    }

    pub fn resume(&self) {
        self.shared.controls.set_paused(false);
    }

    pub fn is_paused(&self) -> bool {
        self.shared.controls.is_paused()
    }

    /// Forgets all change history and moves the resourceVersion on, so every version a client
    /// holds is too old: its next watch gets the in-stream `410 Expired` and it relists.
    /// Watches already open keep running. Returns the oldest version still served.
    pub fn compact(&self) -> u64 {
        self.shared.store.compact_all()
    }

    /// Forgets the history up to and including `resource_version` (never moves backwards).
    pub fn compact_to(&self, resource_version: u64) {
        self.shared.store.compact(resource_version);
    }

    /// The oldest resourceVersion a list or watch may still start from.
    pub fn oldest_resource_version(&self) -> u64 {
        self.shared.store.oldest_resumable()
    }

    /// Closes the listener (new connections are refused) and cuts every open connection.
    pub async fn stop(&self) {
        let running = self.running_slot().take();
        if let Some(running) = running {
            running.stop().await;
        }
    }

    /// Listens again on the same address, store and history intact (stops first if running).
    pub async fn restart(&self) -> io::Result<()> {
        self.stop().await;
        let listener = TcpListener::bind(self.shared.address).await?;
        *self.running_slot() = Some(Running::start(listener, self.shared.clone()));
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.running_slot().is_some()
    }

    /// Every request received since the start (or the last [`clear_requests`](Self::clear_requests)).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.controls.requests()
    }

    pub fn clear_requests(&self) {
        self.shared.controls.clear_requests();
    }

    fn running_slot(&self) -> MutexGuard<'_, Option<Running>> {
        // Only `take` and assignment happen under this lock; a poisoned slot is still valid.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if let Some(running) = self.running_slot().take() {
            running.abort();
        }
    }
}

/// The key of an object in a type's scope (cluster-scoped types have no namespace).
fn key_in(resource: &'static ResourceType, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey::new(resource, if resource.namespaced { namespace } else { "" }, name)
}

fn served<K: k8s_openapi::Resource>() -> Result<&'static ResourceType, ApiError> {
    resources::of::<K>().ok_or_else(|| {
        ApiError::BadRequest(format!(
            "{} {} is not served by this test API server",
            K::API_VERSION,
            K::KIND
        ))
    })
}

fn encode<K: Serialize>(object: &K) -> Result<Value, ApiError> {
    serde_json::to_value(object)
        .map_err(|e| ApiError::BadRequest(format!("cannot serialize the object: {e}")))
}

fn decode<K: DeserializeOwned>(object: Value) -> Result<K, ApiError> {
    serde_json::from_value(object)
        .map_err(|e| ApiError::BadRequest(format!("cannot read the stored object back: {e}")))
}
