//! After start-up: hands the sources' events on to the sync loop, and ends the process when
//! the pod CIDRs that `--detect-local-mode=NodeCIDR` was built from change.
//!
//! Upstream's `NodePodCIDRHandler` exits (code 1) on such a change so the DaemonSet restarts
//! it with detectors for the new CIDRs; rules written meanwhile would use the old ones.

use ipnet::IpNet;
use kpr_model::convert_node;
use kpr_sources::{Event, EventReceiver, EventSender, event_channel};
use tokio::sync::oneshot;

/// The pod CIDRs the local-traffic detectors were built from.
#[derive(Clone, Debug)]
pub struct PodCidrWatch {
    pub node_name: String,
    pub pod_cidrs: Vec<IpNet>,
}

/// Hands `buffered`, then every event from `from`, to the returned receiver. With `watch`,
/// a version of the Node whose pod CIDRs differ is not handed on: the returned restart
/// channel gets why the process must restart instead.
pub fn forward_events(
    from: EventReceiver,
    buffered: Vec<Event>,
    watch: Option<PodCidrWatch>,
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
    watch: Option<PodCidrWatch>,
    restart: oneshot::Sender<String>,
) {
    for event in buffered {
        if to.send(event).await.is_err() {
            return;
        }
    }
    while let Some(event) = from.recv().await {
        if let (Some(watch), Event::Node { object }) = (&watch, &event)
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

impl PodCidrWatch {
    /// Why this version of the Node (`None`: deleted) means a restart, if it does.
    fn restart_reason(&self, node: Option<&k8s_openapi::api::core::v1::Node>) -> Option<String> {
        let Some(node) = node else {
            tracing::error!(node = %self.node_name, "Current Node is being deleted");
            return None;
        };
        // A Node the sync loop rejects (bad name) is reported there; it says nothing here.
        let view = convert_node(node).ok()?.view;
        if view.pod_cidrs == self.pod_cidrs {
            return None;
        }
        tracing::error!(
            node = %self.node_name,
            newPodCIDRs = ?view.pod_cidrs,
            oldPodCIDRs = ?self.pod_cidrs,
            "Using NodeCIDR LocalDetector mode, current PodCIDRs are different than previous PodCIDRs, restarting"
        );
        Some(format!(
            "the pod CIDRs of Node {:?} changed from {:?} to {:?}: --detect-local-mode=NodeCIDR needs a restart \
             to use them (the DaemonSet restarts the proxy)",
            self.node_name, self.pod_cidrs, view.pod_cidrs
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    use super::*;

    fn node(labels: serde_json::Value, pod_cidrs: serde_json::Value) -> Event {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node1", "labels": labels},
            "spec": {"podCIDRs": pod_cidrs}
        }))
        .unwrap();
        Event::Node {
            object: Some(Arc::new(node)),
        }
    }

    fn watch() -> PodCidrWatch {
        PodCidrWatch {
            node_name: "node1".into(),
            pod_cidrs: vec!["10.244.1.0/24".parse().unwrap()],
        }
    }

    #[tokio::test]
    async fn buffered_events_come_first_then_the_stream() {
        let (tx, rx) = event_channel();
        let (mut out, _restart) = forward_events(rx, vec![Event::Synced { source: "a" }], None);
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
    async fn the_same_pod_cidrs_go_through_and_a_change_asks_for_a_restart() {
        let (tx, rx) = event_channel();
        let (mut out, mut restart) = forward_events(rx, Vec::new(), Some(watch()));
        tx.send(node(json!({"a": "b"}), json!(["10.244.1.0/24"])))
            .await
            .unwrap();
        assert!(
            matches!(out.recv().await, Some(Event::Node { .. })),
            "a label change goes through"
        );
        tx.send(Event::Node { object: None }).await.unwrap();
        assert!(
            matches!(out.recv().await, Some(Event::Node { object: None })),
            "a deletion is only logged"
        );
        assert!(restart.try_recv().is_err());

        tx.send(node(json!({}), json!(["10.244.2.0/24"]))).await.unwrap();
        let why = tokio::time::timeout(Duration::from_secs(10), &mut restart)
            .await
            .expect("a restart is asked for")
            .unwrap();
        assert!(
            why.contains("10.244.2.0/24") && why.contains("10.244.1.0/24"),
            "{why}"
        );
        tx.send(Event::Synced { source: "x" }).await.unwrap();
        let after = tokio::time::timeout(Duration::from_millis(200), out.recv()).await;
        assert!(after.is_err(), "nothing is handed on after the change: {after:?}");
    }
}
