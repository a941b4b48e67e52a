//! The connection budget of one server: how many connections it holds, which of them may be
//! evicted, and the counts of what it refused.
//!
//! hyper bounds a request's head and its buffers; it has no connection limit, and its one
//! timer (`header_read_timeout`) runs from the moment a connection waits for a request to
//! the end of that request's head, so it cannot be both short for a half-sent head and long
//! for a kept-alive connection between probes. This module adds what hyper lacks:
//!
//! - a cap on connections, where a newcomer evicts the connection that has been waiting
//!   longest without a complete request (the oldest idle), or is closed at once when every
//!   connection is answering a request;
//! - each connection's phase, from which [`crate::connection`] derives its deadline: the
//!   head of a request must be complete [`HttpLimits::header_timeout`] after the connection
//!   was accepted or after the first byte of that request arrived.
//!
//! One budget serves one server, or every listener of one family's Service health-check
//! servers. All state is under one mutex (a tracker's own mutex is only ever taken after
//! it); the eviction order is a map keyed by (since, id), so admission is O(log n).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use kpr_metrics::{HttpRejectedLabels, HttpServerLabels, Metrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::limits::HttpLimits;

/// Why a connection was closed or refused: the metric's `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// Closed to make room for a newcomer: it had not sent a complete request.
    Evicted,
    /// A newcomer closed at once: the cap was reached and every connection was busy.
    Refused,
    /// A request head was not complete within the header timeout.
    HeaderTimeout,
    /// A response waited longer than the idle timeout for a client that does not read.
    WriteTimeout,
    /// The head was larger than allowed (hyper answered 431).
    HeadTooLarge,
    /// The request declared a body larger than allowed, or of unknown length (answered 413).
    BodyTooLarge,
}

impl Rejection {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::Refused => "refused",
            Self::HeaderTimeout => "header_timeout",
            Self::WriteTimeout => "write_timeout",
            Self::HeadTooLarge => "head_too_large",
            Self::BodyTooLarge => "body_too_large",
        }
    }
}

/// Where a connection is in its life, as far as its bounds are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Its request head is incomplete (or not started, on a new connection) since `since`.
    Reading { since: Instant },
    /// Kept alive after a response, no byte of the next request yet.
    Idle { since: Instant },
    /// A request is being answered; `read_ahead` when bytes of the next one came meanwhile.
    Busy { read_ahead: bool },
    /// Evicted: its task closes it.
    Evicted,
}

impl Phase {
    /// The eviction key's time, for the phases that may be evicted.
    fn waiting_since(self) -> Option<Instant> {
        match self {
            Self::Reading { since } | Self::Idle { since } => Some(since),
            Self::Busy { .. } | Self::Evicted => None,
        }
    }
}

struct Inner {
    /// Admitted, not evicted, not yet ended: what the cap counts.
    open: usize,
    next_id: u64,
    /// Connections that may be evicted, oldest first.
    waiting: BTreeMap<(Instant, u64), Weak<Tracker>>,
}

/// One server's (or one Service health-check set's) connections.
pub(crate) struct Budget {
    server: &'static str,
    limits: HttpLimits,
    rejected: Family<HttpRejectedLabels, Counter>,
    connections: Gauge,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("server", &self.server)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here panics while holding a lock; if something did, the counts are still
    // better than none.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Budget {
    pub(crate) fn new(server: &'static str, limits: HttpLimits, metrics: &Metrics) -> Arc<Self> {
        let connections = metrics
            .http_connections
            .get_or_create(&HttpServerLabels { server })
            .clone();
        Arc::new(Self {
            server,
            limits,
            rejected: metrics.http_connections_rejected_total.clone(),
            connections,
            inner: Mutex::new(Inner {
                open: 0,
                next_id: 0,
                waiting: BTreeMap::new(),
            }),
        })
    }

    pub(crate) fn server(&self) -> &'static str {
        self.server
    }

    pub(crate) fn limits(&self) -> &HttpLimits {
        &self.limits
    }

    pub(crate) fn count(&self, rejection: Rejection) {
        self.rejected
            .get_or_create(&HttpRejectedLabels {
                server: self.server,
                reason: rejection.label(),
            })
            .inc();
    }

    /// Takes a new connection in, evicting the oldest idle one at the cap; `None` when the
    /// cap is reached and no connection is idle (the caller closes the newcomer).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Arc<Tracker>> {
        let mut inner = lock(&self.inner);
        let victim = if inner.open >= self.limits.max_connections {
            match inner.evict_oldest() {
                Some(victim) => Some(victim),
                None => {
                    drop(inner);
                    self.count(Rejection::Refused);
                    return None;
                }
            }
        } else {
            None
        };
        let id = inner.next_id;
        inner.next_id += 1;
        inner.open += 1;
        let since = Instant::now();
        let tracker = Arc::new(Tracker {
            id,
            budget: self.clone(),
            phase: Mutex::new(Phase::Reading { since }),
            evicted: Notify::new(),
            write_blocked_since: Mutex::new(None),
        });
        inner.waiting.insert((since, id), Arc::downgrade(&tracker));
        drop(inner);
        self.connections.inc();
        if victim.is_some() {
            self.count(Rejection::Evicted);
        }
        // Dropped outside the lock: the victim's last reference may be this one, and its
        // drop takes the lock.
        drop(victim);
        Some(tracker)
    }

    /// Connections counted against the cap (tests).
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        lock(&self.inner).open
    }
}

impl Inner {
    /// Marks the oldest waiting connection evicted and wakes its task; returns it so the
    /// caller drops it outside the lock.
    fn evict_oldest(&mut self) -> Option<Arc<Tracker>> {
        while let Some((_, weak)) = self.waiting.pop_first() {
            // A tracker being dropped right now frees its place by itself.
            let Some(victim) = weak.upgrade() else { continue };
            *lock(&victim.phase) = Phase::Evicted;
            self.open -= 1;
            victim.evicted.notify_one();
            return Some(victim);
        }
        None
    }
}

/// One connection's place in its budget, shared by its task, its I/O and its service.
pub(crate) struct Tracker {
    id: u64,
    budget: Arc<Budget>,
    phase: Mutex<Phase>,
    /// Notified once, when evicted.
    pub(crate) evicted: Notify,
    /// When a write last returned "would block" without progress since.
    write_blocked_since: Mutex<Option<Instant>>,
}

impl Tracker {
    pub(crate) fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Moves to the phase `next` computes from the current one (none: stay), keeping the
    /// eviction map in step.
    fn transition(self: &Arc<Self>, next: impl FnOnce(Phase) -> Option<Phase>) {
        let mut inner = lock(&self.budget.inner);
        let mut phase = lock(&self.phase);
        if let Some(next) = next(*phase) {
            if let Some(since) = phase.waiting_since() {
                inner.waiting.remove(&(since, self.id));
            }
            if let Some(since) = next.waiting_since() {
                inner.waiting.insert((since, self.id), Arc::downgrade(self));
            }
            *phase = next;
        }
    }

    /// A complete request head arrived: the connection is busy until [`Tracker::answered`].
    pub(crate) fn request_started(self: &Arc<Self>) {
        self.transition(|phase| match phase {
            Phase::Evicted => None,
            _ => Some(Phase::Busy { read_ahead: false }),
        });
    }

    /// The answer is ready: the connection waits for its next request.
    pub(crate) fn answered(self: &Arc<Self>) {
        self.transition(|phase| match phase {
            Phase::Busy { read_ahead: true } => Some(Phase::Reading {
                since: Instant::now(),
            }),
            Phase::Busy { read_ahead: false } => Some(Phase::Idle {
                since: Instant::now(),
            }),
            _ => None,
        });
    }

    /// Bytes came from the client: on an idle connection, a request head starts.
    pub(crate) fn bytes_read(self: &Arc<Self>) {
        // Cheap for the usual case (a head arriving on a reading connection).
        if matches!(*lock(&self.phase), Phase::Reading { .. } | Phase::Evicted) {
            return;
        }
        self.transition(|phase| match phase {
            Phase::Idle { .. } => Some(Phase::Reading {
                since: Instant::now(),
            }),
            Phase::Busy { read_ahead: false } => Some(Phase::Busy { read_ahead: true }),
            _ => None,
        });
    }

    /// A write could not proceed (`true`) or made progress (`false`).
    pub(crate) fn write_blocked(&self, blocked: bool) {
        let mut since = lock(&self.write_blocked_since);
        match (blocked, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, Some(_)) => *since = None,
            _ => {}
        }
    }

    /// When this connection must be closed, and why; `None` when its phase has no deadline
    /// here (hyper's timer bounds an idle connection).
    pub(crate) fn deadline(&self) -> Option<(Instant, Rejection)> {
        let limits = self.budget.limits();
        let head = match *lock(&self.phase) {
            Phase::Reading { since } => Some((since + limits.header_timeout, Rejection::HeaderTimeout)),
            _ => None,
        };
        let write = lock(&self.write_blocked_since)
            .map(|since| (since + limits.idle_timeout, Rejection::WriteTimeout));
        match (head, write) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }

    /// Whether the connection is reading a request head (for telling a timeout's kind).
    pub(crate) fn reading(&self) -> bool {
        matches!(*lock(&self.phase), Phase::Reading { .. })
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let phase = *self.phase.get_mut().unwrap_or_else(PoisonError::into_inner);
        let mut inner = lock(&self.budget.inner);
        if let Some(since) = phase.waiting_since() {
            inner.waiting.remove(&(since, self.id));
        }
        if phase != Phase::Evicted {
            inner.open -= 1;
        }
        drop(inner);
        self.budget.connections.dec();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;

    use super::*;

    fn budget(max_connections: usize) -> Arc<Budget> {
        let limits = HttpLimits {
            max_connections,
            ..HttpLimits::HEALTHZ
        };
        Budget::new("healthz", limits, &Metrics::new(&mut Registry::default()))
    }

    fn evicted(tracker: &Tracker) -> bool {
        *lock(&tracker.phase) == Phase::Evicted
    }

    #[tokio::test(start_paused = true)]
    async fn the_oldest_waiting_connection_goes_first_and_busy_ones_never() {
        let budget = budget(3);
        let a = budget.admit().unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let b = budget.admit().unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let c = budget.admit().unwrap();
        // `a` answers a request: not evictable until answered, then idle since now.
        a.request_started();
        let d = budget.admit().unwrap();
        assert!(evicted(&b) && !evicted(&a) && !evicted(&c));
        assert_eq!(budget.open(), 3);
        tokio::time::advance(Duration::from_millis(1)).await;
        a.answered();
        // Idle since its answer, `a` is now the newest waiting: c, then d, go before it.
        let e = budget.admit().unwrap();
        assert!(evicted(&c) && !evicted(&a) && !evicted(&d));
        let f = budget.admit().unwrap();
        assert!(evicted(&d) && !evicted(&a) && !evicted(&e));
        for busy in [&a, &e, &f] {
            busy.request_started();
        }
        assert!(budget.admit().is_none(), "every connection is busy");
        assert_eq!(budget.open(), 3);
    }

    #[tokio::test]
    async fn each_connection_frees_its_place_once() {
        let budget = budget(1);
        let a = budget.admit().unwrap();
        let b = budget.admit().unwrap();
        assert!(evicted(&a));
        assert_eq!(budget.open(), 1);
        // The evicted one's task ends later: its place was already given to b.
        drop(a);
        assert_eq!(budget.open(), 1);
        drop(b);
        assert_eq!(budget.open(), 0);
        let c = budget.admit().unwrap();
        assert!(!evicted(&c));
        assert_eq!(budget.connections.get(), 1);
        drop(c);
        assert_eq!(budget.connections.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_head_has_the_header_timeout_from_its_first_byte() {
        let budget = budget(4);
        let a = budget.admit().unwrap();
        let accepted = Instant::now();
        let header_timeout = HttpLimits::HEALTHZ.header_timeout;
        assert_eq!(
            a.deadline(),
            Some((accepted + header_timeout, Rejection::HeaderTimeout))
        );
        a.request_started();
        assert_eq!(a.deadline(), None);
        a.answered();
        // Idle: hyper's timer (the idle timeout) bounds it.
        assert_eq!(a.deadline(), None);
        tokio::time::advance(Duration::from_secs(7)).await;
        a.bytes_read();
        let first_byte = Instant::now();
        assert_eq!(
            a.deadline(),
            Some((first_byte + header_timeout, Rejection::HeaderTimeout))
        );
        // A client that does not read: the idle timeout from the first blocked write.
        a.request_started();
        a.write_blocked(true);
        let blocked = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        a.write_blocked(true);
        let idle_timeout = HttpLimits::HEALTHZ.idle_timeout;
        assert_eq!(
            a.deadline(),
            Some((blocked + idle_timeout, Rejection::WriteTimeout))
        );
        a.write_blocked(false);
        assert_eq!(a.deadline(), None);
    }
}
