//! Sending requests as a user's client would, and reading what came back.
//!
//! Every pod of a [`crate::stage::Stage`] answers `"pod<i> from <source it saw>"`, so a
//! batch of requests tells which pods the proxy picked, which source addresses reached them
//! (kept or masqueraded), and how the others failed: refused (the proxy rejected them) or
//! timed out (dropped).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kpr_netns::{Netns, eventually, split_peer_reply, spread, spread_from, spread_udp};

use crate::support::{CONVERGE, POLL};

/// How many requests a drop check sends; each must time out.
const DROP_CHECKS: usize = 3;

/// Where requests come from: a namespace, and in it a chosen source address or the default.
pub struct Sender<'a> {
    pub ns: &'a Netns,
    pub source: Option<IpAddr>,
    pub label: String,
}

/// What a batch of requests got.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Answers per pod.
    pub answers: BTreeMap<String, usize>,
    /// The source addresses the pods saw.
    pub seen: BTreeSet<IpAddr>,
    /// Failed requests per error kind (`"timed out"`, `"connection refused"`).
    pub failures: BTreeMap<String, usize>,
}

impl Outcome {
    pub fn from_replies(replies: BTreeMap<String, usize>) -> Self {
        let mut outcome = Self::default();
        for (reply, count) in replies {
            if let Some(kind) = reply.strip_prefix("error: ") {
                outcome.failures.insert(kind.to_owned(), count);
                continue;
            }
            // A connection accepted and closed without a word: userspace mode's listener
            // does that while its port has no endpoint (as upstream's userspace proxy did).
            if reply.is_empty() {
                *outcome
                    .failures
                    .entry("closed without a reply".to_owned())
                    .or_insert(0) += count;
                continue;
            }
            let (pod, seen) =
                split_peer_reply(&reply).unwrap_or_else(|| panic!("not a pod's reply: {reply:?}"));
            *outcome.answers.entry(pod.to_owned()).or_insert(0) += count;
            outcome.seen.insert(seen);
        }
        outcome
    }

    /// The pods that answered, in order.
    pub fn pods(&self) -> Vec<&str> {
        self.answers.keys().map(String::as_str).collect()
    }

    /// Whether every request was answered, each by one of `pods`, and each of them answered.
    pub fn answered_by_exactly(&self, pods: &[&str]) -> bool {
        self.failures.is_empty() && self.pods() == pods
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "answers {:?}, sources seen {:?}, failures {:?}",
            self.answers, self.seen, self.failures
        )
    }
}

impl Sender<'_> {
    /// Sends `n` requests to `to`, one connection each.
    pub fn requests(&self, to: SocketAddr, n: usize) -> Outcome {
        let replies = match self.source {
            Some(source) => spread_from(self.ns, source, to, n),
            None => spread(self.ns, to, n),
        };
        Outcome::from_replies(replies)
    }

    /// Waits until `n` requests to `to` are all answered, by whichever pods, and returns
    /// that batch.
    #[track_caller]
    pub fn wait_answered(&self, to: SocketAddr, n: usize) -> Outcome {
        eventually(CONVERGE, POLL, || {
            let outcome = self.requests(to, n);
            if outcome.failures.is_empty() {
                Ok(outcome)
            } else {
                Err(format!("{} to {to}: {outcome}", self.label))
            }
        })
    }

    /// Waits until `n` requests to `to` are all answered, by exactly `pods` (each of them
    /// at least once), and returns that batch.
    #[track_caller]
    pub fn wait_answered_by(&self, to: SocketAddr, n: usize, pods: &[&str]) -> Outcome {
        eventually(CONVERGE, POLL, || {
            let outcome = self.requests(to, n);
            if outcome.answered_by_exactly(pods) {
                Ok(outcome)
            } else {
                Err(format!("{} to {to}: {outcome}; want only {pods:?}", self.label))
            }
        })
    }

    /// Asserts that requests to `to` are dropped: each times out, none is answered or
    /// refused. Only meaningful once the proxy has programmed the rules that drop them
    /// (a scenario first sees another request of the same sync answered). The requests go
    /// at once, each on its own connection: each must time out on its own, and the check
    /// takes one timeout, not one per request.
    #[track_caller]
    pub fn assert_dropped(&self, to: SocketAddr) {
        let outcome = std::thread::scope(|scope| {
            let requests: Vec<_> = (0..DROP_CHECKS)
                .map(|_| scope.spawn(|| self.requests(to, 1)))
                .collect();
            let mut outcome = Outcome::default();
            for request in requests {
                let one = request.join().expect("a request thread panicked");
                for (kind, count) in one.failures {
                    *outcome.failures.entry(kind).or_insert(0) += count;
                }
                for (pod, count) in one.answers {
                    *outcome.answers.entry(pod).or_insert(0) += count;
                }
                outcome.seen.extend(one.seen);
            }
            outcome
        });
        assert_eq!(
            outcome.failures,
            BTreeMap::from([("timed out".to_owned(), DROP_CHECKS)]),
            "{} to {to} should be dropped: {outcome}",
            self.label
        );
    }

    /// Waits until a request to `to` is answered by no pod: refused, dropped, or sent where
    /// nothing listens (a Service port that is gone).
    #[track_caller]
    pub fn wait_unanswered(&self, to: SocketAddr) {
        eventually(CONVERGE, POLL, || {
            let outcome = self.requests(to, 1);
            if outcome.answers.is_empty() {
                Ok(())
            } else {
                Err(format!("{} to {to} should go unanswered: {outcome}", self.label))
            }
        })
    }

    /// Sends `n` UDP requests to `to`, one fresh socket (so one fresh flow) each.
    pub fn udp_requests(&self, to: SocketAddr, n: usize) -> Outcome {
        assert!(self.source.is_none(), "UDP requests go from the default source");
        Outcome::from_replies(spread_udp(self.ns, to, n))
    }

    /// Like [`Sender::wait_answered_by`], over UDP.
    #[track_caller]
    pub fn wait_udp_answered_by(&self, to: SocketAddr, n: usize, pods: &[&str]) -> Outcome {
        eventually(CONVERGE, POLL, || {
            let outcome = self.udp_requests(to, n);
            if outcome.answered_by_exactly(pods) {
                Ok(outcome)
            } else {
                Err(format!(
                    "{} to udp {to}: {outcome}; want only {pods:?}",
                    self.label
                ))
            }
        })
    }

    /// Like [`Sender::wait_unanswered`], over UDP.
    #[track_caller]
    pub fn wait_udp_unanswered(&self, to: SocketAddr) {
        eventually(CONVERGE, POLL, || {
            let outcome = self.udp_requests(to, 1);
            if outcome.answers.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "{} to udp {to} should go unanswered: {outcome}",
                    self.label
                ))
            }
        })
    }

    /// Waits until requests to `to` are refused at once (the proxy rejects them).
    #[track_caller]
    pub fn wait_refused(&self, to: SocketAddr) {
        eventually(CONVERGE, POLL, || {
            let outcome = self.requests(to, DROP_CHECKS);
            if outcome.failures == BTreeMap::from([("connection refused".to_owned(), DROP_CHECKS)]) {
                Ok(())
            } else {
                Err(format!("{} to {to} should be refused: {outcome}", self.label))
            }
        })
    }
}

/// `ip:port`.
pub fn at(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}
