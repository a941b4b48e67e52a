//! Nothing intake, the trackers, the backends or the metrics keep grows with the number of
//! changes: a dual-stack proxy (intake, trackers, `sync_once`, the real nftables backend
//! of each family without a kernel) runs rounds of kpr_world's churn (each ending where it
//! started, with a sync wherever the workload says) and every size and every metric
//! family's set of label combinations is what it was after the first round.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kpr_model::{IpFamily, NamespacedName, Sizes};
use kpr_nftables::{NftablesBackend, NftablesOptions, NoKernel};
use kpr_sources::Event;
use kpr_world::churn::{Change, churn};
use prometheus_client::registry::Registry;

use crate::Shared;
use crate::sync::sync_once;
use crate::test_support::{metrics_text, settings};

use super::Intake;

fn nftables(family: IpFamily) -> NftablesBackend {
    let opts = NftablesOptions {
        family,
        ..NftablesOptions::default()
    };
    NftablesBackend::new(opts, Box::new(NoKernel)).expect("default options are valid")
}

struct DualStack {
    intake: Intake,
    shared: Arc<Shared>,
    registry: Registry,
    /// One per family, in the order of `shared.proxiers`.
    backends: Vec<NftablesBackend>,
}

impl DualStack {
    fn new() -> Self {
        let mut settings = settings(vec!["manifests"]);
        settings.node_name = kpr_world::NODE.into();
        let (mut intake, shared, registry) =
            super::tests::dual_stack_intake_with(&settings, Duration::from_secs(60));
        intake.apply(Event::Synced { source: "manifests" });
        Self {
            intake,
            shared,
            registry,
            backends: [IpFamily::V4, IpFamily::V6].into_iter().map(nftables).collect(),
        }
    }

    /// Intake's and the trackers' sizes, and each family's backend's.
    fn footprint(&self) -> Sizes {
        let backends = self.shared.proxiers.iter().zip(&self.backends);
        backends.fold(self.intake.footprint(), |sizes, (proxier, backend)| {
            sizes.nested(
                &format!("nftables.{}", proxier.labels.ip_family),
                backend.footprint(),
            )
        })
    }

    fn run(&mut self, changes: &[Change]) {
        for change in changes {
            match event(change) {
                Some(event) => self.intake.apply(event),
                None => self.sync_every_family(),
            }
        }
    }

    fn sync_every_family(&mut self) {
        for (proxier, backend) in self.shared.proxiers.iter().zip(&mut self.backends) {
            sync_once(&self.shared, proxier, backend).expect("nothing refuses a batch");
        }
    }

    /// Every metric family's label combinations (the series without their values).
    fn label_sets(&self) -> BTreeSet<String> {
        metrics_text(&self.registry)
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' ').map(|(series, _value)| series.to_string()))
            .collect()
    }
}

/// `change` as a source reports it; `None` for a sync.
fn event(change: &Change) -> Option<Event> {
    let id = |name: &str| NamespacedName::new(kpr_world::NAMESPACE, name);
    Some(match change {
        Change::Service(name, object) => Event::Service {
            id: id(name),
            object: object.clone(),
        },
        Change::Slice(name, object) => Event::EndpointSlice {
            id: id(name),
            object: object.clone(),
        },
        Change::Node(node) => Event::Node {
            object: Some(node.clone()),
        },
        Change::ServiceCidr(name, object) => Event::ServiceCidr {
            name: name.clone(),
            object: object.clone(),
        },
        Change::Sync => return None,
    })
}

#[test]
fn sizes_and_metric_label_sets_come_back_after_churn() {
    let mut proxy = DualStack::new();
    // A first round creates every label combination the workload can reach (a rejection
    // reason, an ignored field); from then on nothing may be added.
    proxy.run(&churn(0, 1));
    let (sizes, labels) = (proxy.footprint(), proxy.label_sets());
    // A zone change forces a full sync, which rebuilds the backends' state from scratch and
    // would hide what partial syncs leak: one more whole round, then rounds without it.
    proxy.run(&churn(1, 1));
    let partial_only: Vec<Change> = churn(2, 40)
        .into_iter()
        .filter(|change| !matches!(change, Change::Node(_)))
        .collect();
    proxy.run(&partial_only);
    let (sizes_after, labels_after) = (proxy.footprint(), proxy.label_sets());

    assert_eq!(
        sizes.differences(&sizes_after),
        [],
        "sizes grew with churn:\n{sizes_after}"
    );
    let added: Vec<_> = labels_after.difference(&labels).collect();
    let gone: Vec<_> = labels.difference(&labels_after).collect();
    assert!(
        added.is_empty() && gone.is_empty(),
        "label sets changed: added {added:#?}, gone {gone:#?}"
    );
    for family in ["IPv4", "IPv6"] {
        assert!(
            sizes.get(&format!("{family}.services.applied")).is_some(),
            "{sizes}"
        );
    }
}

#[test]
fn the_churn_reaches_rejections_ignored_values_and_both_families() {
    // Without these series the label-set comparison above would check next to nothing.
    let mut proxy = DualStack::new();
    proxy.run(&churn(0, 1));
    let labels = proxy.label_sets();
    for series in [
        r#"kubeproxy_rejected_objects_total{kind="Service",reason="invalid_ip"}"#,
        r#"kubeproxy_sync_proxy_rules_service_changes_total{ip_family="IPv6"}"#,
        r#"kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family="IPv4"}"#,
        r#"kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"}"#,
    ] {
        assert!(labels.contains(series), "{series} missing from {labels:#?}");
    }
    assert!(
        labels
            .iter()
            .any(|s| s.starts_with("kubeproxy_ignored_values_total{")),
        "{labels:#?}"
    );
    // Midway through a round, intake holds a ServiceCIDR and the trackers Services.
    let changes = churn(1, 1);
    let cidr_added = changes
        .iter()
        .position(|c| matches!(c, Change::ServiceCidr(_, Some(_))))
        .expect("the workload adds a ServiceCIDR");
    proxy.run(&changes[..=cidr_added]);
    let midway = proxy.footprint();
    assert_eq!(midway.get("service_cidrs"), Some(1), "{midway}");
    assert_eq!(midway.get("IPv6.service_cidrs"), Some(1), "{midway}");
    assert!(midway.get("IPv4.endpoints.applied").unwrap_or(0) > 0, "{midway}");
    assert!(
        midway.get("nftables.IPv6.ledger.claims").unwrap_or(0) > 0,
        "{midway}"
    );
}
