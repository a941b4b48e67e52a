//! What else follows the rules: told the desired state after each successful sync.
//!
//! Some of a proxy's duties are not kernel rules but must match them, e.g. the Service
//! health-check servers, which answer load balancers according to the endpoints the rules
//! just sent traffic to. Upstream updates them at the end of a successful `syncProxyRules`;
//! the sync loop calls a [`SyncObserver`] at the same moment, for every mode alike.

use std::collections::BTreeSet;

use kpr_model::NamespacedName;

use crate::DesiredState;

pub trait SyncObserver: Send + Sync + std::fmt::Debug {
    /// `state` is now programmed. `changed` names the Services that may differ from the
    /// state this observer was last told about, so it can work in proportion to the change
    /// (a cluster of 50,000 Services syncs up to a hundred times a second under churn);
    /// `None` when anything may have changed (the first sync, a full one, or one after a
    /// failed sync the observer never heard of). Called on the sync's blocking thread: must
    /// return at once (hand work to a task), and must not keep `state` (holding its
    /// snapshots alive would make the trackers copy their maps on the next change).
    fn synced(&self, state: &DesiredState, changed: Option<&BTreeSet<NamespacedName>>);
}
