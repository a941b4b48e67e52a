//! Waiting for this node's Node object at start-up, where upstream waits.
//!
//! Upstream asks the API server for its Node before it builds the proxier: up to six tries,
//! one second apart and doubling (about 31 s), for the Node's addresses (`getNodeIPs`; then
//! it carries on with loopback), and with `--detect-local-mode=NodeCIDR` up to five minutes
//! for the Node's pod CIDRs (`waitForPodCIDR`; then it fails). Here the Node arrives on the
//! sources' event stream (the API source watches it; a Node among the manifests counts too),
//! so waiting means reading that stream, keeping every event for the sync loop, until the
//! Node has what is needed or the time is up. A source that can only deliver the Node with
//! its initial state (the manifests) needs no waiting beyond that state; it sends the Node
//! first, so what is kept here is the Node and not every decoded Service and EndpointSlice
//! (the rest waits, compact, in the source until the sync loop takes it). A source's trouble
//! reports are logged as they come (an API server that cannot be reached is why the Node
//! does not come); only each source's last report is kept for the sync loop.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use kpr_model::{NodeView, convert_node};
use kpr_sources::{Event, EventReceiver};
use tokio::time::Instant;

/// Upstream's `getNodeIPs` back-off: tries at 0, 1, 3, 7, 15 and 31 s.
pub const NODE_IPS_WAIT: Duration = Duration::from_secs(31);

/// Upstream's `timeoutForNodePodCIDR`.
pub const POD_CIDRS_WAIT: Duration = Duration::from_secs(5 * 60);

/// What to wait for.
#[derive(Clone, Debug)]
pub struct NodeWait {
    pub node_name: String,
    /// The sources whose initial state must be in before a Node that is not there counts as
    /// missing (see [`Self::node_ips_for`]).
    pub sources: BTreeSet<&'static str>,
    /// How long to wait for the Node's addresses when a source may deliver the Node after
    /// its initial state (the API source); `None`: only until every source's initial state
    /// is in.
    pub node_ips_for: Option<Duration>,
    /// How long to wait for the Node's pod CIDRs (NodeCIDR mode); `None`: not needed.
    pub pod_cidrs_for: Option<Duration>,
}

/// What the wait saw: the Node as it last looked, and every event read meanwhile, for the
/// sync loop, in order.
#[derive(Debug, Default)]
pub struct Waited {
    pub node: Option<NodeView>,
    pub buffered: Vec<Event>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum WaitError {
    /// NodeCIDR mode without the Node's pod CIDRs: upstream fails start-up the same way.
    NoPodCidrs { node: String, waited: Duration },
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoPodCidrs { node, waited } => write!(
                f,
                "timeout waiting for PodCIDR allocation to configure detect-local-mode NodeCIDR: \
                 Node {node:?} had no spec.podCIDRs after {waited:?}"
            ),
        }
    }
}

/// Reads `events` until the Node is known as far as `wait` needs, or the time is up.
pub async fn wait_for_node(events: &mut EventReceiver, wait: &NodeWait) -> Result<Waited, WaitError> {
    let started = Instant::now();
    let mut seen = Seen::default();
    announce(wait);
    loop {
        let now = Instant::now();
        let ips_done = seen.has_addresses()
            || match wait.node_ips_for {
                Some(budget) => now >= started + budget,
                None => seen.synced.is_superset(&wait.sources),
            };
        let cidrs_done = wait.pod_cidrs_for.is_none() || seen.has_pod_cidrs();
        if ips_done && cidrs_done {
            return Ok(seen.finish(wait));
        }
        let pod_cidrs_deadline = wait.pod_cidrs_for.map(|budget| started + budget);
        if !cidrs_done && pod_cidrs_deadline.is_some_and(|deadline| now >= deadline) {
            return Err(no_pod_cidrs(wait, started));
        }
        let ips_deadline = wait
            .node_ips_for
            .map(|budget| started + budget)
            .filter(|_| !ips_done);
        let deadline = [ips_deadline, pod_cidrs_deadline.filter(|_| !cidrs_done)]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            event = events.recv() => match event {
                Some(event) => seen.see(event, &wait.node_name),
                // The sources are gone: nothing more will come (the sync loop says so).
                None if cidrs_done => return Ok(seen.finish(wait)),
                None => return Err(no_pod_cidrs(wait, started)),
            },
            () = sleep_until(deadline) => {}
        }
    }
}

fn no_pod_cidrs(wait: &NodeWait, started: Instant) -> WaitError {
    WaitError::NoPodCidrs {
        node: wait.node_name.clone(),
        waited: started.elapsed(),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn announce(wait: &NodeWait) {
    if let Some(budget) = wait.pod_cidrs_for {
        tracing::info!(
            hostname = %wait.node_name,
            timeout = ?budget,
            "Watching for node, awaiting podCIDR allocation"
        );
    }
    match wait.node_ips_for {
        Some(budget) => tracing::info!(
            node = %wait.node_name,
            timeout = ?budget,
            "waiting for the Node object: its addresses are the node IPs"
        ),
        None => tracing::info!(
            node = %wait.node_name,
            "reading the Node object from the sources' initial state, if there: its addresses are the node IPs"
        ),
    }
}

/// What the events read so far said.
#[derive(Debug, Default)]
struct Seen {
    node: Option<NodeView>,
    /// The Node being deleted: upstream does not take its pod CIDRs.
    deleting: bool,
    synced: BTreeSet<&'static str>,
    buffered: Vec<Event>,
    /// Each source's last trouble report (`None`: recovered).
    trouble: BTreeMap<&'static str, Option<String>>,
}

impl Seen {
    fn see(&mut self, event: Event, node_name: &str) {
        if let Event::SourceTrouble { source, problem } = event {
            match &problem {
                Some(problem) => tracing::warn!(source, "{problem}"),
                None => tracing::info!(source, "source recovered"),
            }
            self.trouble.insert(source, problem);
            return;
        }
        match &event {
            Event::Node { object: Some(node) } => match convert_node(node) {
                // A malformed Node is the sync loop's to report when it reads this event.
                Ok(converted) if converted.view.name == node_name => {
                    self.node = Some(converted.view);
                    self.deleting = node.metadata.deletion_timestamp.is_some();
                }
                _ => {}
            },
            Event::Node { object: None } => {
                self.node = None;
                self.deleting = false;
            }
            Event::Synced { source } => {
                self.synced.insert(source);
            }
            _ => {}
        }
        self.buffered.push(event);
    }

    fn has_addresses(&self) -> bool {
        self.node.as_ref().is_some_and(|n| !n.addresses.is_empty())
    }

    fn has_pod_cidrs(&self) -> bool {
        !self.deleting && self.node.as_ref().is_some_and(|n| !n.pod_cidrs.is_empty())
    }

    fn finish(mut self, wait: &NodeWait) -> Waited {
        // The sync loop shows a source still in trouble in /healthz; recovered ones it never
        // heard of need no report.
        for (source, problem) in std::mem::take(&mut self.trouble) {
            if problem.is_some() {
                self.buffered.push(Event::SourceTrouble { source, problem });
            }
        }
        match &self.node {
            Some(node) if !node.addresses.is_empty() => {
                tracing::info!(node = %node.name, addresses = ?node.addresses, "Successfully retrieved node IP(s)");
            }
            _ => tracing::warn!(
                node = %wait.node_name,
                "the Node object (with an InternalIP or ExternalIP address) did not arrive; the node IPs come from --bind-address or loopback"
            ),
        }
        if wait.pod_cidrs_for.is_some()
            && let Some(node) = &self.node
        {
            tracing::info!(podCIDRs = ?node.pod_cidrs, "NodeInfo");
        }
        Waited {
            node: self.node,
            buffered: self.buffered,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Node;
    use kpr_model::NamespacedName;
    use kpr_sources::{EventSender, event_channel};
    use serde_json::json;

    use super::*;

    const NODE: &str = "node1";

    fn node_event(spec: serde_json::Value, addresses: serde_json::Value) -> Event {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": NODE},
            "spec": spec,
            "status": {"addresses": addresses}
        }))
        .unwrap();
        Event::Node {
            object: Some(Arc::new(node)),
        }
    }

    fn with_address() -> Event {
        node_event(json!({}), json!([{"type": "InternalIP", "address": "10.0.0.5"}]))
    }

    fn service_deleted() -> Event {
        Event::Service {
            id: NamespacedName::new("default", "web"),
            object: None,
        }
    }

    fn api_wait(pod_cidrs: bool) -> NodeWait {
        NodeWait {
            node_name: NODE.into(),
            sources: ["api"].into(),
            node_ips_for: Some(NODE_IPS_WAIT),
            pod_cidrs_for: pod_cidrs.then_some(POD_CIDRS_WAIT),
        }
    }

    /// Sends `events` and keeps the channel open (a source that stays connected).
    async fn feed(events: Vec<Event>) -> (EventSender, EventReceiver) {
        let (tx, rx) = event_channel();
        for event in events {
            tx.send(event).await.unwrap();
        }
        (tx, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn the_node_with_an_address_ends_the_wait_and_every_event_is_kept() {
        let (_tx, mut rx) = feed(vec![service_deleted(), with_address()]).await;
        let started = Instant::now();
        let waited = wait_for_node(&mut rx, &api_wait(false)).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1), "no need to wait on");
        assert_eq!(
            waited.node.unwrap().addresses,
            ["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
        );
        assert_eq!(waited.buffered.len(), 2);
        assert!(matches!(waited.buffered[0], Event::Service { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn without_the_node_the_api_source_is_given_upstreams_31_seconds() {
        let (_tx, mut rx) = feed(vec![Event::Synced { source: "api" }]).await;
        let started = Instant::now();
        let waited = wait_for_node(&mut rx, &api_wait(false)).await.unwrap();
        assert_eq!(started.elapsed(), NODE_IPS_WAIT);
        assert!(waited.node.is_none());
        assert_eq!(
            waited.buffered.len(),
            1,
            "the Synced event is kept for the sync loop"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_without_addresses_is_waited_on_like_a_missing_one() {
        let (_tx, mut rx) = feed(vec![node_event(json!({}), json!([]))]).await;
        let started = Instant::now();
        let waited = wait_for_node(&mut rx, &api_wait(false)).await.unwrap();
        assert_eq!(started.elapsed(), NODE_IPS_WAIT);
        assert!(waited.node.unwrap().addresses.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn manifests_need_no_wait_beyond_their_initial_state() {
        let wait = NodeWait {
            node_name: NODE.into(),
            sources: ["manifests"].into(),
            node_ips_for: None,
            pod_cidrs_for: None,
        };
        let (_tx, mut rx) = feed(vec![service_deleted(), Event::Synced { source: "manifests" }]).await;
        let started = Instant::now();
        let waited = wait_for_node(&mut rx, &wait).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(waited.node.is_none());
        assert_eq!(waited.buffered.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn node_cidr_mode_waits_for_pod_cidrs_that_come_later() {
        let (tx, mut rx) = feed(vec![with_address()]).await;
        let wait = api_wait(true);
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(90)).await;
            let cidrs = json!({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]});
            let address = json!([{"type": "InternalIP", "address": "10.0.0.5"}]);
            tx.send(node_event(cidrs, address)).await.unwrap();
            tx
        });
        let started = Instant::now();
        let waited = wait_for_node(&mut rx, &wait).await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(90));
        let cidrs: Vec<String> = waited
            .node
            .unwrap()
            .pod_cidrs
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(cidrs, ["10.244.1.0/24"]);
        drop(later.await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn node_cidr_mode_gives_up_after_five_minutes() {
        let (_tx, mut rx) = feed(vec![with_address()]).await;
        let error = wait_for_node(&mut rx, &api_wait(true)).await.unwrap_err();
        assert_eq!(
            error,
            WaitError::NoPodCidrs {
                node: NODE.into(),
                waited: POD_CIDRS_WAIT
            }
        );
        assert!(error.to_string().contains("NodeCIDR"), "{error}");
    }

    /// Upstream does not take the pod CIDRs of a Node that is being deleted.
    #[tokio::test(start_paused = true)]
    async fn a_node_being_deleted_gives_no_pod_cidrs() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": NODE, "deletionTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.5"}]}
        }))
        .unwrap();
        let deleting = Event::Node {
            object: Some(Arc::new(node)),
        };
        let (_tx, mut rx) = feed(vec![deleting]).await;
        let error = wait_for_node(&mut rx, &api_wait(true)).await.unwrap_err();
        assert!(matches!(error, WaitError::NoPodCidrs { .. }));
    }

    /// Trouble is logged as it comes; the sync loop gets each source's last report only, and
    /// none for a source that recovered.
    #[tokio::test(start_paused = true)]
    async fn only_the_last_trouble_of_each_source_is_kept() {
        let trouble = |source, problem: Option<&str>| Event::SourceTrouble {
            source,
            problem: problem.map(str::to_string),
        };
        let (_tx, mut rx) = feed(vec![
            trouble("api", Some("connection refused")),
            trouble("api", Some("connection reset")),
            trouble("manifests", Some("cannot read")),
            trouble("manifests", None),
            with_address(),
        ])
        .await;
        let waited = wait_for_node(&mut rx, &api_wait(false)).await.unwrap();
        let kept: Vec<_> = waited
            .buffered
            .iter()
            .filter_map(|event| match event {
                Event::SourceTrouble { source, problem } => Some((*source, problem.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(kept, [("api", Some("connection reset".to_string()))]);
        assert_eq!(waited.buffered.len(), 2, "the Node and api's last trouble");
    }

    #[tokio::test(start_paused = true)]
    async fn sources_that_end_leave_node_cidr_mode_without_pod_cidrs() {
        let (tx, mut rx) = feed(vec![with_address()]).await;
        drop(tx);
        let started = Instant::now();
        assert!(wait_for_node(&mut rx, &api_wait(true)).await.is_err());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "no point waiting for nothing"
        );
    }
}
