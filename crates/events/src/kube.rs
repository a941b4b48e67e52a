//! The real recorder: Events to the API server through kube-runtime's event recorder.
//!
//! Upstream kube-proxy hands its Events to client-go's `events.k8s.io/v1` broadcaster as
//! reporting controller `kube-proxy`, instance `kube-proxy-<hostname>`. The broadcaster queues
//! them (and drops them when its queue is full) while a goroutine writes them, so recording
//! never waits for the API server. [`KubeRecorder`] does the same: [`EventRecorder::record`]
//! puts the Event on a bounded queue and returns; one task publishes the queue through
//! kube-runtime's [`Recorder`] (`events.k8s.io/v1`; a repeat within a few minutes becomes a
//! series on the first Event, as client-go does it). Each write is bounded by a timeout, so a
//! hung API server costs queued Events, never a sync or a health check. A full queue drops
//! the Event (counted, logged); a failed write is logged and not retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use ::kube::Client;
use ::kube::runtime::events::{Event, EventType as KubeEventType, Recorder};
use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc};

use crate::{EventRecorder, EventType, ObjectRef, ProxyEvent};

/// Who reports: kube-runtime's reporter (controller and instance names).
pub use ::kube::runtime::events::Reporter;

/// Upstream's reporting controller (`cmd/kube-proxy/app/server.go`).
pub const REPORTING_CONTROLLER: &str = "kube-proxy";

/// The API server refuses longer notes (`events.k8s.io/v1` validation: at most 1 kB).
const NOTE_LIMIT_BYTES: usize = 1024;

/// The reporter upstream's broadcaster uses: controller `kube-proxy`, instance
/// `kube-proxy-<hostname>` (the host's name, not `--hostname-override`).
pub fn upstream_reporter(hostname: &str) -> Reporter {
    Reporter {
        controller: REPORTING_CONTROLLER.to_string(),
        instance: Some(format!("{REPORTING_CONTROLLER}-{hostname}")),
    }
}

/// How much the recorder holds back and how long one write may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Events waiting for the API server; more are dropped. Upstream's broadcaster: 1000.
    pub queue: usize,
    /// A write that takes longer is abandoned (and logged) so the ones behind it can go.
    pub publish_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            queue: 1000,
            publish_timeout: Duration::from_secs(10),
        }
    }
}

/// Records Events to the API server without ever making the caller wait.
#[derive(Clone, Debug)]
pub struct KubeRecorder {
    queue: mpsc::Sender<ProxyEvent>,
    state: Arc<QueueState>,
}

/// What the caller side and the publishing task share.
#[derive(Debug, Default)]
struct QueueState {
    /// Events dropped because the queue was full.
    dropped: AtomicU64,
    /// Events accepted and not yet written (or given up on).
    pending: AtomicUsize,
    /// Woken whenever `pending` drops to zero.
    idle: Notify,
}

impl QueueState {
    fn accepted(&self) {
        self.pending.fetch_add(1, Ordering::SeqCst);
    }

    fn finished(&self) {
        if self.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }
}

impl KubeRecorder {
    /// Starts the publishing task on the current Tokio runtime (like `tokio::spawn`, this
    /// must be called from within one). The task ends when every clone is dropped.
    pub fn start(client: Client, reporter: Reporter) -> Self {
        Self::with_limits(client, reporter, Limits::default())
    }

    pub fn with_limits(client: Client, reporter: Reporter, limits: Limits) -> Self {
        let (queue, receiver) = mpsc::channel(limits.queue.max(1));
        let state = Arc::new(QueueState::default());
        let recorder = Recorder::new(client, reporter);
        tokio::spawn(publish_all(
            recorder,
            receiver,
            Arc::clone(&state),
            limits.publish_timeout,
        ));
        Self { queue, state }
    }

    /// How many Events were dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::Relaxed)
    }

    /// Waits until every accepted Event has been written or given up on, for at most
    /// `within`; true if the queue ran empty. For a process about to exit, so the Event
    /// saying why reaches the API server.
    pub async fn flush(&self, within: Duration) -> bool {
        tokio::time::timeout(within, self.idle()).await.is_ok()
    }

    async fn idle(&self) {
        loop {
            let notified = self.state.idle.notified();
            tokio::pin!(notified);
            // Registered before the check, so a wake-up in between is not lost.
            notified.as_mut().enable();
            if self.state.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    fn count_dropped(&self, event: &ProxyEvent) {
        let dropped = self.state.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        // A hung API server may meet a stream of Events: say so, but not once per Event.
        if dropped.is_power_of_two() {
            tracing::warn!(
                object = %event.regarding,
                reason = event.reason,
                dropped,
                "event queue full (the API server is slow or away): dropping events"
            );
        }
    }
}

impl EventRecorder for KubeRecorder {
    fn record(&self, event: ProxyEvent) {
        self.state.accepted();
        match self.queue.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(event)) => {
                self.state.finished();
                self.count_dropped(&event);
            }
            Err(TrySendError::Closed(event)) => {
                self.state.finished();
                tracing::debug!(object = %event.regarding, reason = event.reason, "event not recorded: shutting down");
            }
        }
    }
}

/// The publishing task: one write at a time, in the order recorded.
async fn publish_all(
    recorder: Recorder,
    mut queue: mpsc::Receiver<ProxyEvent>,
    state: Arc<QueueState>,
    timeout: Duration,
) {
    while let Some(event) = queue.recv().await {
        publish_one(&recorder, &event, timeout).await;
        state.finished();
    }
}

async fn publish_one(recorder: &Recorder, event: &ProxyEvent, timeout: Duration) {
    let reference = object_reference(&event.regarding);
    let kube_event = kube_event(event);
    let write = recorder.publish(&kube_event, &reference);
    match tokio::time::timeout(timeout, write).await {
        Ok(Ok(())) => tracing::debug!(
            object = %event.regarding,
            reason = event.reason,
            "event recorded"
        ),
        Ok(Err(error)) => tracing::warn!(
            object = %event.regarding,
            reason = event.reason,
            %error,
            "cannot record event"
        ),
        Err(_) => tracing::warn!(
            object = %event.regarding,
            reason = event.reason,
            ?timeout,
            "cannot record event: the API server did not answer in time"
        ),
    }
}

fn kube_event(event: &ProxyEvent) -> Event {
    Event {
        type_: match event.event_type {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: event.reason.to_string(),
        // Upstream's empty note is left out of the object, as client-go's omitempty does.
        note: (!event.note.is_empty()).then(|| within_note_limit(&event.note).to_string()),
        action: event.action.to_string(),
        secondary: None,
    }
}

/// The `regarding` reference; empty strings are left out, as client-go's omitempty does.
fn object_reference(object: &ObjectRef) -> ObjectReference {
    let non_empty = |text: &str| (!text.is_empty()).then(|| text.to_string());
    ObjectReference {
        kind: Some(object.kind.to_string()),
        api_version: non_empty(object.api_version),
        namespace: non_empty(&object.namespace),
        name: Some(object.name.clone()),
        uid: object.uid.clone(),
        ..ObjectReference::default()
    }
}

/// The longest prefix the API server accepts, cut at a character boundary: a long error
/// message must not cost the whole Event.
fn within_note_limit(note: &str) -> &str {
    let mut end = note.len().min(NOTE_LIMIT_BYTES);
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

#[cfg(test)]
#[path = "kube_tests.rs"]
mod tests;
