//! nftables mode's own metrics, registered in this mode only, as upstream's
//! `RegisterMetrics` does. The backend records them itself after each sync, so the generic
//! sync loop knows nothing of them.
//!
//! With the gate `KubeProxyNFTablesLocalhostNodePorts` on, upstream 1.37's three localhost
//! NodePort metrics too: the listeners gauge and the creation failures counter (recorded by
//! the [`LocalhostProxy`](crate::LocalhostProxy)), and the rejected packets, read from the
//! table's named counters at every scrape (as iptables mode's nfacct counters are), never
//! cached after syncs.

use std::sync::Arc;

use kpr_metrics::FamilyLabels;
use kpr_model::{IpFamily, Protocol};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub use crate::localhost::LocalhostMetrics;
use crate::names::RejectCounter;

/// Handles of the mode's metric families; cheap to clone (clones share the values).
#[derive(Clone, Debug, Default)]
pub struct NftablesMetrics {
    sync_failures: Family<FamilyLabels, Counter>,
    /// Upstream counts failures of its separate stale-chain cleanup transaction; ours
    /// deletes unused chains in the same transaction as the change, so this stays at zero.
    cleanup_failures: Family<FamilyLabels, Counter>,
    /// Registered with the gate `KubeProxyNFTablesLocalhostNodePorts` on.
    localhost: Option<LocalhostMetrics>,
}

impl NftablesMetrics {
    /// Creates the families and registers them under upstream's names.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("kubeproxy");
        // prometheus-client appends `_total` to counters.
        r.register(
            "sync_proxy_rules_nftables_sync_failures",
            "Cumulative proxy nftables sync failures",
            m.sync_failures.clone(),
        );
        r.register(
            "sync_proxy_rules_nftables_cleanup_failures",
            "Cumulative proxy nftables cleanup failures",
            m.cleanup_failures.clone(),
        );
        m
    }

    /// Also registers the localhost NodePort metrics (the gate on), the rejected packets
    /// read through `rejected` at every scrape.
    pub fn register_localhost(mut self, registry: &mut Registry, rejected: Arc<dyn RejectedPackets>) -> Self {
        let localhost = LocalhostMetrics::default();
        let r = registry.sub_registry_with_prefix("kubeproxy");
        r.register(
            "nftables_localhost_nodeport_listeners",
            "Number of active localhost NodePort proxy listeners",
            localhost.listeners.clone(),
        );
        r.register(
            "nftables_localhost_nodeport_listener_creation_failures",
            "Cumulative number of failures to create a localhost NodePort proxy listener",
            localhost.creation_failures.clone(),
        );
        r.register_collector(Box::new(RejectedCollector { rejected }));
        self.localhost = Some(localhost);
        self
    }

    /// The localhost NodePort proxy's handles, when registered.
    pub fn localhost(&self) -> Option<&LocalhostMetrics> {
        self.localhost.as_ref()
    }

    /// A failed sync, full or partial.
    pub(crate) fn record_failure(&self, family: IpFamily) {
        self.sync_failures
            .get_or_create(&FamilyLabels {
                ip_family: family.label(),
            })
            .inc();
    }
}

/// Reads the packets the localhost NodePort rules rejected, per protocol, from a family's
/// table (its named counters).
pub trait RejectedPackets: Send + Sync + 'static {
    /// The packets of each of our counters in `family`'s table; none when the table (or a
    /// counter) does not exist; `Err` with a message when reading failed otherwise.
    fn read(&self, family: IpFamily) -> Result<Vec<(Protocol, u64)>, String>;
}

/// [`RejectedPackets`] over nf_tables netlink, in the network namespace of the thread that
/// scrapes (the process's).
#[derive(Clone, Copy, Debug, Default)]
pub struct NetlinkRejectedPackets;

impl RejectedPackets for NetlinkRejectedPackets {
    fn read(&self, family: IpFamily) -> Result<Vec<(Protocol, u64)>, String> {
        let mut socket = kpr_nfnetlink::Socket::open().map_err(|e| e.to_string())?;
        let table = crate::netlink::table(family);
        let objects = socket
            .objects(&table, Some(kpr_nfnetlink::ObjectType::COUNTER))
            .map_err(|e| e.to_string())?;
        Ok(objects
            .into_iter()
            .filter_map(|object| {
                let RejectCounter(protocol) = RejectCounter::parse(&object.name)?;
                Some((protocol, object.counter?.packets))
            })
            .collect())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct RejectedPacketsLabels {
    ip_family: &'static str,
    /// As upstream's collector labels it: the API's spelling (`UDP`, `SCTP`, `TCP`).
    protocol: &'static str,
}

/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total`, upstream's help text.
struct RejectedCollector {
    rejected: Arc<dyn RejectedPackets>,
}

impl std::fmt::Debug for RejectedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RejectedCollector").finish_non_exhaustive()
    }
}

/// Upstream's help text (its exposition adds `[ALPHA] `, as kpr-servers' does).
const REJECTED_HELP: &str = "Number of packets rejected on localhost NodePorts. UDP and SCTP are always \
     rejected; TCP is rejected when the localhost NodePort proxy is not running";

impl Collector for RejectedCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut samples = Vec::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            match self.rejected.read(family) {
                Ok(counts) => samples.extend(counts.into_iter().map(|(protocol, packets)| {
                    let labels = RejectedPacketsLabels {
                        ip_family: family.label(),
                        protocol: protocol.api(),
                    };
                    (labels, packets)
                })),
                Err(error) => {
                    tracing::error!(ipFamily = family.label(), err = %error, "failed to list nftables counters");
                }
            }
        }
        if samples.is_empty() {
            return Ok(());
        }
        samples.sort();
        let mut metric = encoder.encode_descriptor(
            "nftables_localhost_nodeport_rejected_packets",
            REJECTED_HELP,
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (labels, packets) in samples {
            ConstCounter::new(packets).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use kpr_model::NamespacedName;
    use kpr_state::SyncRequest;
    use prometheus_client::encoding::text::encode;

    use super::*;
    use crate::batch::Batch;
    use crate::transport::{Listing, Transport, TransportError};
    use crate::{NftablesBackend, NftablesOptions};

    /// A kernel that refuses every batch.
    struct Refusing;

    impl Transport for Refusing {
        fn apply(&mut self, _batch: &Batch) -> Result<(), TransportError> {
            Err(TransportError::Refused {
                status: "exit status: 1".into(),
                stderr: "refused".into(),
            })
        }

        fn read_back(&mut self, _family: IpFamily) -> Result<Option<Listing>, TransportError> {
            Ok(None)
        }

        fn check(&mut self, _batch: &Batch) -> Result<(), TransportError> {
            Ok(())
        }

        fn foreign_changes(&mut self) -> Result<Option<bool>, TransportError> {
            Ok(Some(false))
        }
    }

    #[test]
    fn a_failed_sync_is_counted_under_its_family() {
        let mut registry = Registry::default();
        let metrics = NftablesMetrics::register(&mut registry);
        let mut backend = NftablesBackend::new(NftablesOptions::default(), Box::new(Refusing))
            .unwrap()
            .with_metrics(metrics);
        let state = kpr_state::DesiredState::default();
        let changed = std::collections::BTreeSet::<NamespacedName>::new();
        let request = SyncRequest {
            state: &state,
            changed: &changed,
            service_changes: &[],
            endpoint_changes: &[],
            force_full: false,
        };
        backend.sync_rules(&request).unwrap_err();
        backend.sync_rules(&request).unwrap_err();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 2"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod localhost_tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    /// IPv4 has counted, IPv6 cannot be read.
    struct Fixed;

    impl RejectedPackets for Fixed {
        fn read(&self, family: IpFamily) -> Result<Vec<(Protocol, u64)>, String> {
            match family {
                IpFamily::V4 => Ok(vec![(Protocol::Udp, 7), (Protocol::Sctp, 3)]),
                IpFamily::V6 => Err("EPERM".into()),
            }
        }
    }

    /// Upstream's names, labels and help text (its metrics_linux_test.go expects
    /// `protocol="SCTP"` and `protocol="UDP"`: the API's spelling); a family that cannot
    /// be read has no sample, never a 0. A collector's help text gets no '.' appended, as
    /// registered ones do (kpr-servers strips that '.' for upstream's exposition).
    #[test]
    fn the_localhost_metrics_are_upstreams() {
        let mut registry = Registry::default();
        let metrics =
            NftablesMetrics::register(&mut registry).register_localhost(&mut registry, Arc::new(Fixed));
        let handles = metrics.localhost().unwrap();
        let v4 = FamilyLabels { ip_family: "IPv4" };
        handles.listeners.get_or_create(&v4).set(2);
        handles.creation_failures.get_or_create(&v4).inc();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "# HELP kubeproxy_nftables_localhost_nodeport_rejected_packets Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
            "# TYPE kubeproxy_nftables_localhost_nodeport_rejected_packets counter",
            "kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=\"IPv4\",protocol=\"SCTP\"} 3",
            "kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family=\"IPv4\",protocol=\"UDP\"} 7",
            "# TYPE kubeproxy_nftables_localhost_nodeport_listeners gauge",
            "kubeproxy_nftables_localhost_nodeport_listeners{ip_family=\"IPv4\"} 2",
            "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total{ip_family=\"IPv4\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("IPv6"), "{text}");
    }

    /// Without the gate nothing of it is registered.
    #[test]
    fn without_the_gate_no_localhost_metric_exists() {
        let mut registry = Registry::default();
        let metrics = NftablesMetrics::register(&mut registry);
        assert!(metrics.localhost().is_none());
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(!text.contains("localhost"), "{text}");
    }
}
