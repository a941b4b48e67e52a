//! `GET` on a collection with `watch=true`: a chunked stream of newline-terminated JSON events
//! (`{"type": ..., "object": ...}`), as the real server's watch cache sends them.
//!
//! - `resourceVersion=X`: the changes after `X`. A version older than the retained history
//!   is answered `200` and one in-stream `ERROR` event carrying a `Status` with code `410`,
//!   reason `Expired` (this is what makes kube-runtime's watcher relist). A version newer than
//!   the server's is waited for, then answered `504`.
//! - `resourceVersion` unset or `0`: synthetic `ADDED` events for every current object first.
//!   `sendInitialEvents=true` (streaming lists) does the same and ends the initial part with
//!   a `BOOKMARK` annotated `k8s.io/initial-events-end: "true"`.
//! - Selectors are applied to the object before and after each change: an object that starts
//!   matching arrives as `ADDED`, one that stops matching as `DELETED` (its previous state at
//!   the change's version).
//! - `allowWatchBookmarks=true`: `BOOKMARK` events (the type's `kind`/`apiVersion` and only
//!   `metadata.resourceVersion`) at the configured interval and whenever a test forces them.
//! - `timeoutSeconds` ends the stream cleanly (the final chunk), as does
//!   [`drop_watches`](crate::TestApiServer::drop_watches). While the server is paused nothing
//!   is sent; changes are delivered on resume.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};

use crate::controls::OpenWatch;
use crate::error::ApiError;
use crate::http::{Body, Query};
use crate::list::{Selectors, parse_resource_version, wait_until_fresh};
use crate::resources::ResourceType;
use crate::server::Shared;
use crate::store::{Change, ChangeKind, Pending};

/// The server's default watch duration when the client names none (the real server picks a
/// random value between 30 and 60 minutes).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// `ADDED` for the current objects first (at least version `not_older_than`), then changes.
    InitialEvents {
        not_older_than: Option<u64>,
        end_bookmark: bool,
    },
    /// The changes after this version.
    After(u64),
    /// The changes after whatever is current now (`sendInitialEvents=false` without a version).
    Now,
}

#[derive(Debug)]
struct WatchRequest {
    selectors: Selectors,
    bookmarks: bool,
    timeout: Duration,
    start: Start,
}

impl WatchRequest {
    fn parse(query: &Query, resource: &ResourceType) -> Result<Self, ApiError> {
        let selectors = Selectors::from_query(query, resource)?;
        let bookmarks = query.flag("allowWatchBookmarks")?;
        let timeout = query
            .integer("timeoutSeconds")?
            .filter(|seconds| *seconds > 0)
            .map_or(DEFAULT_TIMEOUT, |seconds| {
                Duration::from_secs(seconds.unsigned_abs())
            });
        let send_initial = query.optional_flag("sendInitialEvents")?;
        let version_match = query.get("resourceVersionMatch").filter(|m| !m.is_empty());
        validate(send_initial, version_match, bookmarks)?;
        let resource_version = query.get("resourceVersion").unwrap_or_default();
        let start = start_of(resource_version, send_initial)?;
        Ok(WatchRequest {
            selectors,
            bookmarks,
            timeout,
            start,
        })
    }
}

fn validate(
    send_initial: Option<bool>,
    version_match: Option<&str>,
    bookmarks: bool,
) -> Result<(), ApiError> {
    match (send_initial, version_match) {
        (None, Some(_)) => Err(ApiError::Invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
                .into(),
        )),
        (Some(_), version_match) if version_match != Some("NotOlderThan") => Err(ApiError::Invalid(format!(
            "resourceVersionMatch: Unsupported value: {:?}: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            version_match.unwrap_or_default()
        ))),
        (Some(true), _) if !bookmarks => Err(ApiError::Invalid(
            "allowWatchBookmarks: Required value: sendInitialEvents requires setting allowWatchBookmarks to true".into(),
        )),
        _ => Ok(()),
    }
}

fn start_of(resource_version: &str, send_initial: Option<bool>) -> Result<Start, ApiError> {
    let version = match resource_version {
        "" | "0" => None,
        text => Some(parse_resource_version(text)?),
    };
    Ok(match (send_initial, version) {
        (Some(true), not_older_than) => Start::InitialEvents {
            not_older_than,
            end_bookmark: true,
        },
        (Some(false), None) => Start::Now,
        (_, Some(version)) => Start::After(version),
        (None, None) => Start::InitialEvents {
            not_older_than: None,
            end_bookmark: false,
        },
    })
}

/// Opens a watch: validates, reads the starting point, and returns the event stream.
pub(crate) async fn watch(
    shared: Arc<Shared>,
    resource: &'static ResourceType,
    namespace: Option<String>,
    query: &Query,
) -> Result<Body, ApiError> {
    let request = WatchRequest::parse(query, resource)?;
    let store = &shared.store;
    let mut queue = VecDeque::new();
    let mut finished = false;
    let cursor = match request.start {
        Start::After(version) if version < store.oldest_resumable() => {
            let expired = ApiError::Expired(format!(
                "too old resource version: {version} ({})",
                store.oldest_resumable()
            ));
            queue.push_back(event_line("ERROR", &expired.to_status()));
            finished = true;
            version
        }
        Start::After(version) => {
            wait_until_fresh(store, version).await?;
            version
        }
        Start::Now => store.resource_version(),
        Start::InitialEvents {
            not_older_than,
            end_bookmark,
        } => {
            if let Some(version) = not_older_than {
                wait_until_fresh(store, version).await?;
            }
            let snapshot = store.snapshot(resource, namespace.as_deref(), None)?;
            for (_, object) in &snapshot.objects {
                if request.selectors.matches(object) {
                    queue.push_back(event_line("ADDED", object));
                }
            }
            if end_bookmark {
                queue.push_back(bookmark_line(resource, snapshot.resource_version, true));
            }
            snapshot.resource_version
        }
    };
    let session = Session {
        _open: shared.controls.watch_opened(),
        head: store.subscribe(),
        paused: shared.controls.paused(),
        drops: shared.controls.drops(),
        forced_bookmarks: shared.controls.forced_bookmarks(),
        deadline: Instant::now() + request.timeout,
        next_bookmark: Instant::now() + shared.bookmark_interval,
        resource,
        namespace,
        selectors: request.selectors,
        bookmarks: request.bookmarks,
        cursor,
        queue,
        finished,
        shared,
    };
    let frames = futures::stream::unfold(session, |mut session| async move {
        let line = session.next_line().await?;
        Some((Ok::<_, Infallible>(Frame::data(line)), session))
    });
    Ok(StreamBody::new(frames).boxed_unsync())
}

/// One open watch: what it has sent up to (`cursor`) and what it must still send.
struct Session {
    shared: Arc<Shared>,
    /// Counts this watch as open until the stream is dropped.
    _open: OpenWatch,
    head: watch::Receiver<u64>,
    paused: watch::Receiver<bool>,
    drops: watch::Receiver<u64>,
    forced_bookmarks: watch::Receiver<u64>,
    deadline: Instant,
    next_bookmark: Instant,
    resource: &'static ResourceType,
    namespace: Option<String>,
    selectors: Selectors,
    bookmarks: bool,
    cursor: u64,
    queue: VecDeque<Bytes>,
    finished: bool,
}

impl Session {
    /// The next line to send, or `None` when the watch ends. A dropped or timed-out watch
    /// sends nothing more, even lines already queued: the client resumes from what it got.
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if self.ended() {
                return None;
            }
            if *self.paused.borrow_and_update() {
                tokio::select! {
                    biased;
                    _ = self.drops.changed() => return None,
                    () = sleep_until(self.deadline) => return None,
                    _ = self.paused.changed() => continue,
                }
            }
            if let Some(line) = self.queue.pop_front() {
                return Some(line);
            }
            if self.finished {
                return None;
            }
            self.head.borrow_and_update();
            self.collect_changes();
            if !self.queue.is_empty() {
                continue;
            }
            tokio::select! {
                biased;
                _ = self.drops.changed() => return None,
                () = sleep_until(self.deadline) => return None,
                _ = self.paused.changed() => {}
                _ = self.head.changed() => {}
                _ = self.forced_bookmarks.changed(), if self.bookmarks => self.queue_bookmark(),
                () = sleep_until(self.next_bookmark), if self.bookmarks => {
                    self.queue_bookmark();
                    self.next_bookmark = Instant::now() + self.shared.bookmark_interval;
                }
            }
        }
    }

    /// Dropped by the test, or past `timeoutSeconds`.
    fn ended(&self) -> bool {
        self.drops.has_changed().unwrap_or(true) || Instant::now() >= self.deadline
    }

    fn collect_changes(&mut self) {
        match self.shared.store.pending(self.resource, self.cursor) {
            Pending::Expired { oldest } => {
                let expired =
                    ApiError::Expired(format!("too old resource version: {} ({oldest})", self.cursor));
                self.queue.push_back(event_line("ERROR", &expired.to_status()));
                self.finished = true;
            }
            Pending::Changes { changes, head } => {
                for change in changes {
                    if let Some(line) = self.event_for(&change) {
                        self.queue.push_back(line);
                    }
                }
                self.cursor = self.cursor.max(head);
            }
        }
    }

    /// The event a change means to this watch, given its namespace and selectors.
    fn event_for(&self, change: &Change) -> Option<Bytes> {
        if self
            .namespace
            .as_ref()
            .is_some_and(|ns| *ns != change.key.namespace)
        {
            return None;
        }
        let matches_now = change.kind != ChangeKind::Deleted && self.selectors.matches(&change.object);
        let matched_before = change
            .previous
            .as_ref()
            .is_some_and(|previous| self.selectors.matches(previous));
        match (matched_before, matches_now) {
            (false, true) => Some(event_line("ADDED", &change.object)),
            (true, true) => Some(event_line("MODIFIED", &change.object)),
            (true, false) => {
                let mut last = change.previous.as_deref().cloned().unwrap_or(Value::Null);
                last["metadata"]["resourceVersion"] = json!(change.resource_version.to_string());
                Some(event_line("DELETED", &last))
            }
            (false, false) => None,
        }
    }

    fn queue_bookmark(&mut self) {
        self.queue
            .push_back(bookmark_line(self.resource, self.cursor, false));
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn bookmark_line(resource: &ResourceType, resource_version: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({ "resourceVersion": resource_version.to_string(), "creationTimestamp": null });
    if initial_events_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    let object = json!({ "kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata });
    event_line("BOOKMARK", &object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starting_points() {
        assert_eq!(
            start_of("", None).unwrap(),
            Start::InitialEvents {
                not_older_than: None,
                end_bookmark: false
            }
        );
        assert_eq!(
            start_of("0", None).unwrap(),
            Start::InitialEvents {
                not_older_than: None,
                end_bookmark: false
            }
        );
        assert_eq!(start_of("12", None).unwrap(), Start::After(12));
        assert_eq!(
            start_of("12", Some(true)).unwrap(),
            Start::InitialEvents {
                not_older_than: Some(12),
                end_bookmark: true
            }
        );
        assert_eq!(start_of("", Some(false)).unwrap(), Start::Now);
        assert_eq!(start_of("12", Some(false)).unwrap(), Start::After(12));
        assert_eq!(start_of("abc", None).unwrap_err().code(), 400);
    }

    #[test]
    fn streaming_list_options_are_validated() {
        assert_eq!(
            validate(None, Some("NotOlderThan"), true).unwrap_err().code(),
            422
        );
        assert_eq!(validate(Some(true), None, true).unwrap_err().code(), 422);
        assert_eq!(validate(Some(true), Some("Exact"), true).unwrap_err().code(), 422);
        assert_eq!(
            validate(Some(true), Some("NotOlderThan"), false)
                .unwrap_err()
                .code(),
            422
        );
        assert!(validate(Some(true), Some("NotOlderThan"), true).is_ok());
        assert!(validate(None, None, false).is_ok());
    }

    #[test]
    fn bookmarks_carry_only_type_and_version() {
        let line = bookmark_line(&crate::resources::SERVICES, 42, true);
        let event: Value = serde_json::from_slice(&line).unwrap();
        assert!(line.ends_with(b"\n"));
        assert_eq!(event["type"], "BOOKMARK");
        assert_eq!(event["object"]["kind"], "Service");
        assert_eq!(event["object"]["metadata"]["resourceVersion"], "42");
        assert_eq!(
            event["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
}
