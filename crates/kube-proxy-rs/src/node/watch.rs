//! After start-up: hands the sources' events on to the sync loop, and ends the process when
//! its Node changes in a way only a restart can follow (upstream's NodeManager, 1.37): its
//! node IPs (the first InternalIP, else ExternalIP, of each family) change, it is deleted,
//! or, with `--detect-local-mode=NodeCIDR`, its pod CIDRs change.
//!
//! Upstream exits with status 1 then, without touching the rules, so the DaemonSet restarts
//! it with facts for the new Node and the new process adopts the rules; rules written
//! meanwhile would use the old facts. The same holds for a Node read from manifests.

use std::net::IpAddr;

use ipnet::IpNet;
use kpr_host::node_host_ips;
use kpr_model::convert_node;
use kpr_sources::{Event, EventReceiver, EventSender, event_channel};
use tokio::sync::oneshot;

/// The facts of its Node that the proxy was built from.
#[derive(Clone, Debug)]
pub struct NodeWatch {
    pub node_name: String,
    /// The Node's host IPs at start-up (none when it had none, or did not exist).
    pub node_ips: Vec<IpAddr>,
    /// With `--detect-local-mode=NodeCIDR`: the pod CIDRs the detectors were built from.
    pub pod_cidrs: Option<Vec<IpNet>>,
}

/// Hands `buffered`, then every event from `from`, to the returned receiver. A version of
/// the Node that `watch` says needs a restart is not handed on: the returned restart
/// channel gets why the process must restart instead.
pub fn forward_events(
    from: EventReceiver,
    buffered: Vec<Event>,
    watch: NodeWatch,
) -> (EventReceiver, oneshot::Receiver<String>) {
    let (to, receiver) = event_channel();
    let (restart_tx, restart_rx) = oneshot::channel();
    tokio::spawn(forward(from, buffered, to, watch, restart_tx));
    (receiver, restart_rx)
}

async fn forward(
    mut from: EventReceiver,
    buffered: Vec<Event>,
    to: EventSender,
    watch: NodeWatch,
    restart: oneshot::Sender<String>,
) {
    for event in buffered {
        if to.send(event).await.is_err() {
            return;
        }
    }
    while let Some(event) = from.recv().await {
        if let Event::Node { object } = &event
            && let Some(why) = watch.restart_reason(object.as_deref())
        {
            let _ = restart.send(why);
            // Keep the sync loop's stream open: the process is about to exit.
            return std::future::pending().await;
        }
        if to.send(event).await.is_err() {
            return;
        }
    }
}

impl NodeWatch {
    /// Why this version of the Node (`None`: deleted) means a restart, if it does.
    fn restart_reason(&self, node: Option<&k8s_openapi::api::core::v1::Node>) -> Option<String> {
        let Some(node) = node else {
            tracing::info!(node = %self.node_name, "Node is being deleted");
            return Some(format!(
                "Node {:?} was deleted: the proxy restarts to follow it (the DaemonSet restarts it)",
                self.node_name
            ));
        };
        // A Node the sync loop rejects (bad name) is reported there; it says nothing here.
        let view = convert_node(node).ok()?.view;
        if let Some(pod_cidrs) = &self.pod_cidrs
            && view.pod_cidrs != *pod_cidrs
        {
            tracing::info!(
                node = %self.node_name,
                newPodCIDRs = ?view.pod_cidrs,
                oldPodCIDRs = ?pod_cidrs,
                "PodCIDRs changed for the node"
            );
            return Some(format!(
                "the pod CIDRs of Node {:?} changed from {:?} to {:?}: --detect-local-mode=NodeCIDR needs a restart \
                 to use them (the DaemonSet restarts the proxy)",
                self.node_name, pod_cidrs, view.pod_cidrs
            ));
        }
        let node_ips = node_host_ips(&view);
        if node_ips != self.node_ips {
            tracing::info!(
                node = %self.node_name,
                newNodeIPs = ?node_ips,
                oldNodeIPs = ?self.node_ips,
                "NodeIPs changed for the node"
            );
            return Some(format!(
                "the IPs of Node {:?} changed from {:?} to {:?}: the proxy restarts to use them (the DaemonSet \
                 restarts it)",
                self.node_name, self.node_ips, node_ips
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    use super::*;

    fn node(labels: serde_json::Value, pod_cidrs: serde_json::Value, addresses: &[&str]) -> Event {
        let addresses: Vec<_> = addresses
            .iter()
            .map(|a| json!({"type": "InternalIP", "address": a}))
            .collect();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1", "labels": labels},
            "spec": {"podCIDRs": pod_cidrs},
            "status": {"addresses": addresses}
        }))
        .unwrap();
        Event::Node {
            object: Some(Arc::new(node)),
        }
    }

    fn watch(pod_cidrs: Option<&str>) -> NodeWatch {
        NodeWatch {
            node_name: "node1".into(),
            node_ips: vec!["192.168.0.10".parse().unwrap()],
            pod_cidrs: pod_cidrs.map(|cidr| vec![cidr.parse().unwrap()]),
        }
    }

    /// What the forwarder does with `events`: the events handed on, and the restart reason.
    async fn forwarded(watch: NodeWatch, events: Vec<Event>) -> (Vec<Event>, Option<String>) {
        let (tx, rx) = event_channel();
        let (mut out, mut restart) = forward_events(rx, Vec::new(), watch);
        for event in events {
            tx.send(event).await.unwrap();
        }
        tx.send(Event::Synced { source: "end" }).await.unwrap();
        let mut handed = Vec::new();
        loop {
            tokio::select! {
                event = out.recv() => match event {
                    Some(Event::Synced { source: "end" }) | None => return (handed, None),
                    Some(event) => handed.push(event),
                },
                why = &mut restart => return (handed, why.ok()),
            }
        }
    }

    #[tokio::test]
    async fn buffered_events_come_first_then_the_stream() {
        let (tx, rx) = event_channel();
        let (mut out, _restart) = forward_events(rx, vec![Event::Synced { source: "a" }], watch(None));
        tx.send(Event::Synced { source: "b" }).await.unwrap();
        drop(tx);
        let mut order = Vec::new();
        while let Some(event) = out.recv().await {
            if let Event::Synced { source } = event {
                order.push(source);
            }
        }
        assert_eq!(order, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_node_whose_ips_and_pod_cidrs_stay_goes_through() {
        let same = node(json!({"a": "b"}), json!(["10.244.1.0/24"]), &["192.168.0.10"]);
        let (handed, why) = forwarded(watch(Some("10.244.1.0/24")), vec![same]).await;
        assert_eq!(why, None);
        assert!(
            matches!(handed[..], [Event::Node { .. }]),
            "a label change goes through"
        );
    }

    #[tokio::test]
    async fn changed_pod_cidrs_restart_a_node_cidr_proxy_only() {
        let moved = || node(json!({}), json!(["10.244.2.0/24"]), &["192.168.0.10"]);
        let (handed, why) = forwarded(watch(Some("10.244.1.0/24")), vec![moved()]).await;
        let why = why.expect("a restart is asked for");
        assert!(
            why.contains("10.244.2.0/24") && why.contains("10.244.1.0/24"),
            "{why}"
        );
        assert!(handed.is_empty(), "the changed Node is not handed on");
        let (_, why) = forwarded(watch(None), vec![moved()]).await;
        assert_eq!(why, None, "other detect-local modes do not read pod CIDRs");
    }

    #[tokio::test]
    async fn changed_node_ips_restart_the_proxy() {
        let renumbered = node(json!({}), json!([]), &["192.168.0.11"]);
        let (_, why) = forwarded(watch(None), vec![renumbered]).await;
        let why = why.expect("a restart is asked for");
        assert!(
            why.contains("192.168.0.11") && why.contains("192.168.0.10"),
            "{why}"
        );
        let gained = node(json!({}), json!([]), &["192.168.0.10", "fd00::10"]);
        let (_, why) = forwarded(watch(None), vec![gained]).await;
        assert!(why.is_some(), "an IP of the other family counts too");
    }

    #[tokio::test]
    async fn a_deleted_node_restarts_the_proxy() {
        let (_, why) = forwarded(watch(None), vec![Event::Node { object: None }]).await;
        assert!(why.expect("a restart is asked for").contains("deleted"));
    }
}
