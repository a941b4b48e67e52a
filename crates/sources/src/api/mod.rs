//! The Kubernetes API source: Services, EndpointSlices, this node's Node and (when the mode
//! uses them) the cluster's ServiceCIDRs, from kube-rs watchers.
//!
//! Each watcher lists, then watches from the list's resourceVersion; kube-runtime resumes a
//! dropped watch from the last version it saw and relists when the server answers `410 Gone`.
//! A relist reports every object again (the trackers drop what did not change) and, once it
//! is complete, the deletion of every object that vanished while we were not watching, so the
//! rules never have to be torn down to recover. [`Event::Synced`] is sent once, when both
//! Services and EndpointSlices have been listed completely.
//!
//! Filtering is upstream's and happens on the server, through label selectors on the list and
//! the watch: Services and EndpointSlices labelled `service.kubernetes.io/service-proxy-name`
//! belong to another proxy, and those labelled `service.kubernetes.io/headless` are never
//! proxied. The Node watch selects this node by name.
//!
//! ServiceCIDRs are watched only when asked for ([`ApiSource::with_service_cidrs`]): upstream
//! starts that informer only in nftables mode, and an iptables-mode proxy needs no RBAC for
//! them. As upstream, the first sync does not wait for their list: a ServiceCIDR arriving
//! later queues a sync of its own.

mod client;
mod watch;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::mpsc;

pub use client::{ClientError, ClientOptions, build_client};
pub use watch::{Kind, Watched};

use crate::{Event, EventSender};

/// Name under which the API source reports `Synced`.
pub const API_SOURCE: &str = "api";

/// Upstream's selector for Services and EndpointSlices this proxy must handle.
pub const PROXIED_SELECTOR: &str =
    "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

pub struct ApiSource {
    client: Client,
    node_name: String,
    service_cidrs: bool,
}

impl ApiSource {
    pub fn new(client: Client, node_name: impl Into<String>) -> Self {
        Self {
            client,
            node_name: node_name.into(),
            service_cidrs: false,
        }
    }

    /// Also watches `networking.k8s.io/v1` ServiceCIDRs (nftables mode).
    pub fn with_service_cidrs(mut self) -> Self {
        self.service_cidrs = true;
        self
    }

    /// Watches until the receiving side of `events` is dropped.
    pub async fn run(self, events: EventSender) {
        let (synced_tx, mut synced_rx) = mpsc::channel::<Kind>(4);
        let proxied = watcher::Config::default().labels(PROXIED_SELECTOR);
        let node = watcher::Config::default().fields(&format!("metadata.name={}", self.node_name));
        let services = pump::<Service>(
            Api::all(self.client.clone()),
            proxied.clone(),
            &events,
            &synced_tx,
        );
        let slices = pump::<EndpointSlice>(Api::all(self.client.clone()), proxied, &events, &synced_tx);
        let nodes = pump::<Node>(Api::all(self.client.clone()), node, &events, &synced_tx);
        let service_cidrs = async {
            if self.service_cidrs {
                let all = watcher::Config::default();
                pump::<ServiceCIDR>(Api::all(self.client.clone()), all, &events, &synced_tx).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let announce = async {
            let mut listed = Vec::new();
            while let Some(kind) = synced_rx.recv().await {
                if !listed.contains(&kind) {
                    listed.push(kind);
                }
                if listed.contains(&Kind::Service) && listed.contains(&Kind::EndpointSlice) {
                    tracing::info!("API: initial lists of Services and EndpointSlices complete");
                    if events.send(Event::Synced { source: API_SOURCE }).await.is_err() {
                        return;
                    }
                    break;
                }
            }
            // Stay alive (and keep the channel open) while the watchers run.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = services => {}
            () = slices => {}
            () = nodes => {}
            () = service_cidrs => {}
            () = announce => {}
        }
        tracing::info!("API source stopped: nobody listens any more");
    }
}

/// Feeds one watcher into `events` until the receiver is gone. Errors are logged and reported
/// as trouble (shown by `/healthz` when syncs fall behind); the watcher retries with backoff.
async fn pump<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
    events: &EventSender,
    synced: &mpsc::Sender<Kind>,
) {
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    let mut state = watch::WatchState::<K>::default();
    let mut troubled = false;
    while let Some(item) = stream.next().await {
        let mut out = Vec::new();
        match item {
            Ok(event) => {
                if std::mem::take(&mut troubled) {
                    out.push(Event::SourceTrouble {
                        source: API_SOURCE,
                        problem: None,
                    });
                }
                out.extend(state.handle(event));
            }
            Err(error) => {
                troubled = true;
                out.push(Event::SourceTrouble {
                    source: API_SOURCE,
                    problem: Some(format!("watching {}: {error}", K::KIND.plural())),
                });
            }
        }
        for event in out {
            if let Event::Synced { .. } = event {
                let _ = synced.send(K::KIND).await;
                continue;
            }
            if events.send(event).await.is_err() {
                return;
            }
        }
    }
}

pub(crate) fn arc<K>(object: K) -> Option<Arc<K>> {
    Some(Arc::new(object))
}
