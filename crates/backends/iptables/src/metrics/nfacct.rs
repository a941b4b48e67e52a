//! Upstream's two nfacct-backed counters of iptables mode:
//! `kubeproxy_iptables_ct_state_invalid_dropped_packets_total` and
//! `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`.
//!
//! The kernel does the counting (the `-m nfacct` matches of the rules); like upstream's
//! collector, the values are read from the kernel at each scrape, not cached after syncs,
//! so a scrape always shows the counter as the kernel has it. A counter that cannot be
//! read is left out of that scrape (upstream logs it and sends no sample), never shown
//! as 0.
//!
//! The reader is a [`PacketCounters`] (the mode reads the nfacct counters kpr-iptables
//! names and creates, through nfnetlink_acct), so the rendering is tested without a kernel.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;

/// The kernel packet counters upstream's iptables mode exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IptablesCounter {
    /// Packets the ctstate INVALID rule dropped.
    CtStateInvalidDropped,
    /// Packets accepted for NodePorts on 127.0.0.0/8.
    LocalhostNodeportsAccepted,
}

/// Reads the kernel's packet counters.
pub trait PacketCounters: Send + Sync + 'static {
    /// The counter's packets; `Ok(None)` when it does not exist (e.g. nfacct is missing),
    /// `Err` with a message when reading it failed otherwise.
    fn packets(&self, counter: IptablesCounter) -> Result<Option<u64>, String>;
}

/// One metric: name (under the `kubeproxy` prefix, without prometheus-client's `_total`),
/// help, and the kernel counter it reports.
struct NfacctMetric {
    name: &'static str,
    help: &'static str,
    counter: IptablesCounter,
}

/// Upstream's names and help texts.
const METRICS: [NfacctMetric; 2] = [
    NfacctMetric {
        name: "iptables_ct_state_invalid_dropped_packets",
        help: "packets dropped by iptables to work around conntrack problems",
        counter: IptablesCounter::CtStateInvalidDropped,
    },
    NfacctMetric {
        name: "iptables_localhost_nodeports_accepted_packets",
        help: "Number of packets accepted on nodeports of loopback interface",
        counter: IptablesCounter::LocalhostNodeportsAccepted,
    },
];

struct NfacctCollector {
    metric: &'static NfacctMetric,
    counters: Arc<dyn PacketCounters>,
}

impl std::fmt::Debug for NfacctCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfacctCollector")
            .field("counter", &self.metric.counter)
            .finish_non_exhaustive()
    }
}

impl Collector for NfacctCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let packets = match self.counters.packets(self.metric.counter) {
            Ok(Some(packets)) => packets,
            Ok(None) => {
                tracing::debug!(counter = ?self.metric.counter, "nfacct counter absent; no sample");
                return Ok(());
            }
            Err(error) => {
                tracing::warn!(counter = ?self.metric.counter, %error, "cannot read nfacct counter");
                return Ok(());
            }
        };
        let counter = ConstCounter::new(packets);
        let metric =
            encoder.encode_descriptor(self.metric.name, self.metric.help, None, counter.metric_type())?;
        counter.encode(metric)
    }
}

/// Registers upstream's nfacct metrics (iptables mode only, as upstream), read through
/// `counters` at every scrape.
pub fn register_nfacct_metrics(registry: &mut Registry, counters: Arc<dyn PacketCounters>) {
    let registry = registry.sub_registry_with_prefix("kubeproxy");
    for metric in &METRICS {
        registry.register_collector(Box::new(NfacctCollector {
            metric,
            counters: counters.clone(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use std::collections::HashMap;

    struct Fixed(HashMap<IptablesCounter, Result<Option<u64>, String>>);

    impl PacketCounters for Fixed {
        fn packets(&self, counter: IptablesCounter) -> Result<Option<u64>, String> {
            self.0.get(&counter).cloned().unwrap_or(Ok(None))
        }
    }

    fn scrape(counters: Fixed) -> String {
        let mut registry = Registry::default();
        register_nfacct_metrics(&mut registry, Arc::new(counters));
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn exports_upstreams_names_as_counters_read_at_scrape() {
        let text = scrape(Fixed(HashMap::from([
            (IptablesCounter::CtStateInvalidDropped, Ok(Some(42))),
            (IptablesCounter::LocalhostNodeportsAccepted, Ok(Some(7))),
        ])));
        for line in [
            "# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets packets dropped by iptables to work around conntrack problems",
            "# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets counter",
            "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 42",
            "# TYPE kubeproxy_iptables_localhost_nodeports_accepted_packets counter",
            "kubeproxy_iptables_localhost_nodeports_accepted_packets_total 7",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_counter_that_cannot_be_read_has_no_sample_not_a_zero() {
        let text = scrape(Fixed(HashMap::from([
            (IptablesCounter::CtStateInvalidDropped, Err("EPERM".to_string())),
            (IptablesCounter::LocalhostNodeportsAccepted, Ok(Some(3))),
        ])));
        assert!(!text.contains("ct_state_invalid"), "{text}");
        assert!(
            text.contains("kubeproxy_iptables_localhost_nodeports_accepted_packets_total 3"),
            "{text}"
        );
        assert!(!scrape(Fixed(HashMap::new())).contains("kubeproxy_iptables"));
    }
}
