//! What else follows the rules: told the desired state after each successful sync.
//!
//! Some of a proxy's duties are not kernel rules but must match them, e.g. the Service
//! health-check servers, which answer load balancers according to the endpoints the rules
//! just sent traffic to. Upstream updates them at the end of a successful `syncProxyRules`;
//! the sync loop calls a [`SyncObserver`] at the same moment, for every mode alike.

use crate::DesiredState;

pub trait SyncObserver: Send + Sync + std::fmt::Debug {
    /// `state` is now programmed. Called on the sync's blocking thread: must return at once
    /// (hand work to a task), and must not keep `state` (holding its snapshots alive would
    /// make the trackers copy their maps on the next change).
    fn synced(&self, state: &DesiredState);
}
