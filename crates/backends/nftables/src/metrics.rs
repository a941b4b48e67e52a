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
