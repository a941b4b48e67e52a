//! The fault and observation switches a test flips while clients talk to the server: pause,
//! drop every watch, force bookmarks, count open watches, and the log of requests received.
//!
//! Each switch is a `tokio::sync::watch` channel so handlers and open watch streams react at
//! once, without polling.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

/// One request as it arrived (recorded before any pause holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
}

impl RecordedRequest {
    /// The first value of a query parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// A `GET` with `watch=true` (or `1`).
    pub fn is_watch(&self) -> bool {
        self.method == "GET"
            && matches!(
                self.param("watch"),
                Some("true" | "1" | "t" | "True" | "TRUE" | "T")
            )
    }

    /// A `GET` on a collection that is not a watch. `path` must be a collection path.
    pub fn is_list_of(&self, path: &str) -> bool {
        self.method == "GET" && self.path == path && !self.is_watch()
    }
}

#[derive(Debug)]
pub(crate) struct Controls {
    paused: watch::Sender<bool>,
    /// Bumped to end every open watch.
    drop_generation: watch::Sender<u64>,
    /// Bumped to make every bookmark-enabled watch send a bookmark now.
    bookmark_generation: watch::Sender<u64>,
    open_watches: Arc<watch::Sender<usize>>,
    requests: Mutex<Vec<RecordedRequest>>,
}

impl Controls {
    pub(crate) fn new() -> Self {
        Controls {
            paused: watch::channel(false).0,
            drop_generation: watch::channel(0).0,
            bookmark_generation: watch::channel(0).0,
            open_watches: Arc::new(watch::channel(0).0),
            requests: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    pub(crate) fn paused(&self) -> watch::Receiver<bool> {
        self.paused.subscribe()
    }

    /// Returns once the server is not paused.
    pub(crate) async fn wait_while_paused(&self) {
        let mut paused = self.paused.subscribe();
        // The sender lives as long as `self`, so this cannot fail while we are borrowed.
        let _ = paused.wait_for(|paused| !paused).await;
    }

    /// Ends every open watch; returns how many were open.
    pub(crate) fn drop_watches(&self) -> usize {
        let open = self.open_watches();
        self.drop_generation.send_modify(|generation| *generation += 1);
        open
    }

    pub(crate) fn drops(&self) -> watch::Receiver<u64> {
        self.drop_generation.subscribe()
    }

    pub(crate) fn send_bookmarks(&self) {
        self.bookmark_generation
            .send_modify(|generation| *generation += 1);
    }

    pub(crate) fn forced_bookmarks(&self) -> watch::Receiver<u64> {
        self.bookmark_generation.subscribe()
    }

    pub(crate) fn open_watches(&self) -> usize {
        *self.open_watches.borrow()
    }

    /// Counts one watch as open until the guard is dropped.
    pub(crate) fn watch_opened(&self) -> OpenWatch {
        self.open_watches.send_modify(|open| *open += 1);
        OpenWatch {
            open_watches: self.open_watches.clone(),
        }
    }

    pub(crate) async fn wait_for_open_watches(&self, at_least: usize) {
        let mut open = self.open_watches.subscribe();
        let _ = open.wait_for(|open| *open >= at_least).await;
    }

    pub(crate) fn record(&self, request: RecordedRequest) {
        tracing::debug!(method = %request.method, path = %request.path, query = ?request.query, "request");
        self.log().push(request);
    }

    pub(crate) fn requests(&self) -> Vec<RecordedRequest> {
        self.log().clone()
    }

    pub(crate) fn clear_requests(&self) {
        self.log().clear();
    }

    fn log(&self) -> MutexGuard<'_, Vec<RecordedRequest>> {
        // Every critical section is a single push, clone or clear: a poisoned log is intact.
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Keeps a watch counted in [`Controls::open_watches`] while alive.
#[derive(Debug)]
pub(crate) struct OpenWatch {
    open_watches: Arc<watch::Sender<usize>>,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.open_watches
            .send_modify(|open| *open = open.saturating_sub(1));
    }
}
