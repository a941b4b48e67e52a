//! iptables mode's own metrics, registered in this mode only, as upstream's
//! `RegisterMetrics` does: the rules it owns and wrote per table, its restore failures
//! (all, and those of partial syncs), and the two packet counters the kernel keeps in
//! nfacct objects ([`nfacct`]).
//!
//! The backend records them itself after each sync, so the generic sync loop needs to know
//! nothing of tables or restores.

pub mod nfacct;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use kpr_metrics::FamilyLabels;
use kpr_model::IpFamily;
use kpr_state::SyncKind;

use crate::proxier::SyncError;
use crate::ruleset::TableCount;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabels {
    pub ip_family: &'static str,
    pub table: &'static str,
}

/// Handles of the mode's metric families; cheap to clone (clones share the values).
#[derive(Clone, Debug, Default)]
pub struct IptablesMetrics {
    rules_total: Family<TableLabels, Gauge>,
    rules_last: Family<TableLabels, Gauge>,
    restore_failures: Family<FamilyLabels, Counter>,
    partial_restore_failures: Family<FamilyLabels, Counter>,
}

impl IptablesMetrics {
    /// Creates the families and registers them under upstream's names.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("kubeproxy");
        r.register(
            "sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            m.rules_total.clone(),
        );
        r.register(
            "sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            m.rules_last.clone(),
        );
        // prometheus-client appends `_total` to counters.
        r.register(
            "sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            m.restore_failures.clone(),
        );
        r.register(
            "sync_proxy_rules_iptables_partial_restore_failures",
            "Cumulative proxy iptables partial restore failures",
            m.partial_restore_failures.clone(),
        );
        m
    }

    /// After a successful sync: each table's rules.
    pub(crate) fn record_tables(&self, family: IpFamily, tables: &[TableCount]) {
        for table in tables {
            let labels = TableLabels {
                ip_family: family.label(),
                table: table.table,
            };
            self.rules_total
                .get_or_create(&labels)
                .set(i64::try_from(table.total).unwrap_or(i64::MAX));
            self.rules_last
                .get_or_create(&labels)
                .set(i64::try_from(table.written).unwrap_or(i64::MAX));
        }
    }

    /// After a failed sync: upstream counts every failed partial sync, and failures of the
    /// restore itself (full or partial).
    pub(crate) fn record_failure(&self, family: IpFamily, error: &SyncError) {
        let labels = FamilyLabels {
            ip_family: family.label(),
        };
        if error.attempted() == SyncKind::Partial {
            self.partial_restore_failures.get_or_create(&labels).inc();
        }
        if matches!(error, SyncError::Restore { .. }) {
            self.restore_failures.get_or_create(&labels).inc();
        }
    }
}
