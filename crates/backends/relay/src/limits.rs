//! Bounded resources: at most so many TCP connections and UDP sessions at once, for all
//! service ports of a relay together.
//!
//! Every carried connection holds two file descriptors (and a pipe per direction while it
//! splices) and an entry of its thread's table; without a bound, a flood of clients takes
//! the process to its descriptor limit, and then upstream's proxy panicked ("too many open
//! files"). Here a connection beyond the limit is closed at once
//! (a UDP packet that would open a session is dropped), the caller counts it, and one log
//! line says the limit was reached, once per episode: the next line comes only after the
//! load fell below the limit again.
//!
//! The limits bound the process, not a relay: a dual-stack proxy runs a relay per IP
//! family, both drawing on the one descriptor limit the defaults were fitted to, so they
//! share one [`Budget`] (each with its own log line and its own [`LimitObserver`]).
//!
//! A refusal is counted through a [`LimitObserver`], not a counter handle: the caller names
//! the metric, and its series appears only once a limit is first reached, as it always did
//! in userspace mode's `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Upstream raised its descriptor limit to 64000 for its userspace mode.
pub const DEFAULT_MAX_CONNECTIONS: usize = 32_000;
pub const DEFAULT_MAX_UDP_SESSIONS: usize = 16_000;
/// Descriptors a carried connection may hold: its two sockets and, once it splices, a pipe
/// (two descriptors) per direction.
pub const DESCRIPTORS_PER_CONNECTION: usize = 6;
/// Descriptors kept for everything else (API watches, HTTP servers, the pipes of each
/// `iptables-restore`): a sync must still be able to write its rules when everything else
/// is at its limit.
pub const DESCRIPTORS_RESERVED: usize = 1024;

/// The configured bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_udp_sessions: usize,
    /// Descriptors the service ports' listening sockets may hold together (a port needs
    /// one, or one per TCP thread: see [`crate::tcp::Listener::descriptors`]); a port past
    /// it is left out with an error, instead of taking the descriptors the sync itself
    /// needs.
    pub max_listener_descriptors: usize,
}

impl Limits {
    /// The defaults, lowered to fit `descriptors` (the process's limit) with
    /// [`DESCRIPTORS_RESERVED`] to spare: half of the rest for the listeners (10,000
    /// Services take 10,000 and more), the other half for connections and UDP sessions.
    pub fn within_descriptors(descriptors: usize) -> Self {
        let usable = descriptors.saturating_sub(DESCRIPTORS_RESERVED).max(4);
        let listeners = usable / 2;
        let rest = usable - listeners;
        let sessions = DEFAULT_MAX_UDP_SESSIONS.min(rest / 4).max(1);
        let connections = DEFAULT_MAX_CONNECTIONS
            .min((rest - sessions.min(rest)) / DESCRIPTORS_PER_CONNECTION)
            .max(1);
        Self {
            max_connections: connections,
            max_udp_sessions: sessions,
            max_listener_descriptors: listeners,
        }
    }
}

impl Default for Limits {
    /// What a process allowed 2^20 descriptors gets (containerd's usual limit).
    fn default() -> Self {
        Self::within_descriptors(1 << 20)
    }
}

/// The limits' counters, for every relay of a process: connections and UDP sessions
/// carried, and the descriptors the service ports' listeners hold.
#[derive(Clone, Debug)]
pub struct Budget {
    limits: Limits,
    connections: Arc<Semaphore>,
    udp_sessions: Arc<Semaphore>,
    listener_descriptors: Arc<AtomicUsize>,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            udp_sessions: Arc::new(Semaphore::new(limits.max_udp_sessions)),
            listener_descriptors: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// One relay's slots of `kind`, drawn from this budget, logged as `ip_family`'s and
    /// their refusals told to `observer`.
    pub fn slots(
        &self,
        kind: Kind,
        ip_family: &'static str,
        observer: Option<Arc<dyn LimitObserver>>,
    ) -> Slots {
        let (semaphore, max) = match kind {
            Kind::Connections => (&self.connections, self.limits.max_connections),
            Kind::UdpSessions => (&self.udp_sessions, self.limits.max_udp_sessions),
        };
        Slots {
            kind,
            max,
            semaphore: Arc::clone(semaphore),
            at_limit: AtomicBool::new(false),
            ip_family,
            observer,
        }
    }

    /// One relay's count of listener descriptors, added into this budget's total.
    pub fn listener_descriptors(&self) -> ListenerDescriptors {
        ListenerDescriptors {
            own: 0,
            total: Arc::clone(&self.listener_descriptors),
            limit: self.limits.max_listener_descriptors,
        }
    }
}

/// The descriptors one relay's listeners hold, kept in the budget's total as well; a
/// relay dropped gives its share back.
///
/// Relays check for room and then open sockets without a lock between them: two
/// families syncing at the same moment can pass the limit by a listener's descriptors,
/// which [`DESCRIPTORS_RESERVED`] absorbs.
#[derive(Debug)]
pub struct ListenerDescriptors {
    own: usize,
    total: Arc<AtomicUsize>,
    limit: usize,
}

impl ListenerDescriptors {
    /// This relay's.
    pub fn own(&self) -> usize {
        self.own
    }

    /// Every relay's of the budget.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether the listeners of all relays together may take `more`.
    pub fn spare(&self, more: usize) -> bool {
        self.total() + more <= self.limit
    }

    /// This relay's listeners hold `own` now.
    pub fn set(&mut self, own: usize) {
        if own >= self.own {
            self.total.fetch_add(own - self.own, Ordering::Relaxed);
        } else {
            self.total.fetch_sub(self.own - own, Ordering::Relaxed);
        }
        self.own = own;
    }
}

impl Drop for ListenerDescriptors {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// What kind of slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Connections,
    UdpSessions,
}

impl Kind {
    /// How logs name it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Connections => "connections",
            Kind::UdpSessions => "udp_sessions",
        }
    }
}

/// Told when a connection or UDP session is refused because its limit is reached (see the
/// module docs for why a trait).
pub trait LimitObserver: Send + Sync + std::fmt::Debug {
    fn limit_reached(&self, kind: Kind);
}

/// Slots of one kind, shared by every listener of a relay and drawn from the process's
/// [`Budget`]; a permit is one slot, freed when dropped (the connection or session ended).
#[derive(Debug)]
pub struct Slots {
    kind: Kind,
    max: usize,
    semaphore: Arc<Semaphore>,
    /// Set when the limit was hit and not yet logged as over.
    at_limit: AtomicBool,
    ip_family: &'static str,
    observer: Option<Arc<dyn LimitObserver>>,
}

impl Slots {
    /// A slot, or `None` at the limit (counted, and logged once per episode).
    pub fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        match self.semaphore.clone().try_acquire_owned() {
            Ok(permit) => {
                if self.at_limit.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        limit = self.kind.label(),
                        "below the userspace proxy's limit again"
                    );
                }
                Some(permit)
            }
            Err(_) => {
                if let Some(observer) = &self.observer {
                    observer.limit_reached(self.kind);
                }
                if !self.at_limit.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        limit = self.kind.label(),
                        max = self.max,
                        ipFamily = self.ip_family,
                        "userspace proxy limit reached: new {} are refused until some end",
                        self.kind.label().replace('_', " ")
                    );
                }
                None
            }
        }
    }

    /// Slots in use now, by every relay of the budget.
    pub fn in_use(&self) -> usize {
        self.max - self.semaphore.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Counts refusals by kind.
    #[derive(Debug, Default)]
    struct Refusals(Mutex<Vec<Kind>>);

    impl LimitObserver for Refusals {
        fn limit_reached(&self, kind: Kind) {
            self.0.lock().unwrap().push(kind);
        }
    }

    impl Refusals {
        fn of(&self, kind: Kind) -> usize {
            self.0.lock().unwrap().iter().filter(|k| **k == kind).count()
        }
    }

    #[test]
    fn defaults_fit_the_descriptor_limit() {
        let default = Limits::default();
        assert_eq!(default.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(default.max_udp_sessions, DEFAULT_MAX_UDP_SESSIONS);
        assert_eq!(
            default.max_listener_descriptors,
            ((1 << 20) - DESCRIPTORS_RESERVED) / 2
        );
        let small = Limits::within_descriptors(20_000);
        let used = small.max_connections * DESCRIPTORS_PER_CONNECTION
            + small.max_udp_sessions
            + small.max_listener_descriptors;
        assert!(used <= 20_000 - DESCRIPTORS_RESERVED, "{small:?}");
        assert_eq!(small.max_listener_descriptors, 9488);
        assert_eq!(small.max_udp_sessions, 2372);
        assert_eq!(small.max_connections, 1186);
        let tiny = Limits::within_descriptors(100);
        assert!(
            tiny.max_connections >= 1 && tiny.max_udp_sessions >= 1,
            "{tiny:?}"
        );
    }

    #[test]
    fn slots_run_out_at_the_limit_count_it_and_come_back() {
        let refusals = Arc::new(Refusals::default());
        let budget = Budget::new(Limits {
            max_connections: 2,
            ..Limits::default()
        });
        let slots = budget.slots(Kind::Connections, "IPv4", Some(refusals.clone()));
        let a = slots.try_take().unwrap();
        let _b = slots.try_take().unwrap();
        assert!(slots.try_take().is_none());
        assert!(slots.try_take().is_none());
        assert_eq!(refusals.of(Kind::Connections), 2);
        assert_eq!(slots.in_use(), 2);
        drop(a);
        assert_eq!(slots.in_use(), 1);
        assert!(slots.try_take().is_some());
    }

    #[test]
    fn both_families_draw_on_one_budget() {
        let (refused4, refused6) = (Arc::new(Refusals::default()), Arc::new(Refusals::default()));
        let budget = Budget::new(Limits {
            max_connections: 2,
            max_udp_sessions: 1,
            max_listener_descriptors: 5,
        });
        let v4 = budget.slots(Kind::Connections, "IPv4", Some(refused4.clone()));
        let v6 = budget.slots(Kind::Connections, "IPv6", Some(refused6.clone()));
        let _a = v4.try_take().unwrap();
        let b = v6.try_take().unwrap();
        assert!(v4.try_take().is_none(), "the other family holds the second slot");
        assert_eq!(
            (refused4.of(Kind::Connections), refused6.of(Kind::Connections)),
            (1, 0)
        );
        drop(b);
        assert!(v4.try_take().is_some());
        let sessions = budget.slots(Kind::UdpSessions, "IPv6", None);
        assert!(
            sessions.try_take().is_some(),
            "sessions are a budget of their own"
        );

        let mut v4 = budget.listener_descriptors();
        let mut v6 = budget.listener_descriptors();
        v4.set(3);
        assert!(v6.spare(2) && !v6.spare(3));
        v6.set(2);
        v4.set(1);
        assert_eq!((v4.own(), v6.own(), v6.total()), (1, 2, 3));
        drop(v6);
        assert_eq!(v4.total(), 1, "a relay dropped gives its descriptors back");
    }
}
