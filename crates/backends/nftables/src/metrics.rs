//! nftables mode's own metrics, registered in this mode only, as upstream's
//! `RegisterMetrics` does. The backend records them itself after each sync, so the generic
//! sync loop knows nothing of them.

use kpr_metrics::FamilyLabels;
use kpr_model::IpFamily;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Handles of the mode's metric families; cheap to clone (clones share the values).
#[derive(Clone, Debug, Default)]
pub struct NftablesMetrics {
    sync_failures: Family<FamilyLabels, Counter>,
    /// Upstream counts failures of its separate stale-chain cleanup transaction; ours
    /// deletes unused chains in the same transaction as the change, so this stays at zero.
    cleanup_failures: Family<FamilyLabels, Counter>,
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

    /// A failed sync, full or partial.
    pub(crate) fn record_failure(&self, family: IpFamily) {
        self.sync_failures
            .get_or_create(&FamilyLabels {
                ip_family: family.label(),
            })
            .inc();
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
