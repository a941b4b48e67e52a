//! The metric families, named as upstream names them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use kpr_model::{IgnoredValue, Rejection};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    pub ip_family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectedLabels {
    pub kind: &'static str,
    pub reason: &'static str,
}

/// Labels of the ignored-values counter: the list, not the entry's index, so the series stay few.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IgnoredLabels {
    pub kind: &'static str,
    pub field: &'static str,
    pub reason: &'static str,
}

/// Labels of the health-check server failures: the family's server set and a fixed reason,
/// never the Service (series must stay few however many Services fail).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HealthCheckFailureLabels {
    pub ip_family: &'static str,
    /// `port_in_use`, `port_claimed_twice` or `listen_error`.
    pub reason: &'static str,
}

/// Labels of the HTTP servers' connection counts: which server, never the client (series must
/// stay few however many clients come).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpServerLabels {
    /// `healthz`, `metrics` or `service-healthcheck`.
    pub server: &'static str,
}

/// Labels of the HTTP servers' refused and closed connections.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpRejectedLabels {
    /// `healthz`, `metrics` or `service-healthcheck`.
    pub server: &'static str,
    /// `evicted`, `refused`, `header_timeout`, `write_timeout`, `head_too_large` or
    /// `body_too_large` (kpr-servers says which is which).
    pub reason: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn sync_duration_histogram() -> Histogram {
    // Upstream: 1 ms, doubling, 15 buckets (up to ~16 s).
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Finer than upstream's buckets below 0.25 s, where a proxy that syncs in milliseconds is
/// measured (the target is p99 <= 100 ms, which upstream's buckets cannot show).
const PROGRAMMING_LATENCY_FINE_BUCKETS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2];

/// Upstream's bounds: 0.25 s and 0.5 s, then every second to 59 s, every 5 s to 115 s,
/// every 30 s to 300 s.
fn upstream_programming_latency_buckets() -> impl Iterator<Item = f64> {
    [0.25, 0.5]
        .into_iter()
        .chain((1..60).map(f64::from))
        .chain((0..12).map(|i| 60.0 + 5.0 * f64::from(i)))
        .chain((0..7).map(|i| 120.0 + 30.0 * f64::from(i)))
}

/// Every upstream bound plus finer ones below its first: a superset, so each upstream `le`
/// series still exists with the same meaning and `histogram_quantile` over upstream's
/// dashboards keeps working (it only gains resolution below 0.25 s).
fn programming_latency_histogram() -> Histogram {
    Histogram::new(
        PROGRAMMING_LATENCY_FINE_BUCKETS
            .into_iter()
            .chain(upstream_programming_latency_buckets()),
    )
}

/// Every metric the proxy exports. Cheap to clone: all handles share their values.
#[derive(Clone)]
pub struct Metrics {
    pub sync_proxy_rules_duration_seconds: Family<FamilyLabels, Histogram>,
    pub sync_full_proxy_rules_duration_seconds: Family<FamilyLabels, Histogram>,
    pub sync_partial_proxy_rules_duration_seconds: Family<FamilyLabels, Histogram>,
    pub sync_proxy_rules_last_timestamp_seconds: Family<FamilyLabels, FloatGauge>,
    pub sync_proxy_rules_last_queued_timestamp_seconds: Family<FamilyLabels, FloatGauge>,
    pub network_programming_duration_seconds: Family<FamilyLabels, Histogram>,
    pub sync_proxy_rules_endpoint_changes_pending: Family<FamilyLabels, Gauge>,
    pub sync_proxy_rules_endpoint_changes_total: Family<FamilyLabels, Counter>,
    pub sync_proxy_rules_service_changes_pending: Family<FamilyLabels, Gauge>,
    pub sync_proxy_rules_service_changes_total: Family<FamilyLabels, Counter>,
    pub sync_proxy_rules_no_local_endpoints_total: Family<TrafficLabels, Gauge>,
    pub proxy_healthz_total: Family<CodeLabels, Counter>,
    pub proxy_livez_total: Family<CodeLabels, Counter>,
    /// Not upstream: objects refused as malformed, by kind and reason.
    pub rejected_objects_total: Family<RejectedLabels, Counter>,
    /// Not upstream: malformed list entries dropped from objects that were used otherwise.
    pub ignored_values_total: Family<IgnoredLabels, Counter>,
    pub conntrack_reconciler_sync_duration_seconds: Family<FamilyLabels, Histogram>,
    pub conntrack_reconciler_deleted_entries_total: Family<FamilyLabels, Counter>,
    /// Not upstream: Service health-check node ports that could not be opened, per attempt
    /// (each sync retries), by reason.
    pub service_healthcheck_failures_total: Family<HealthCheckFailureLabels, Counter>,
    /// Not upstream: connections the HTTP servers (healthz, metrics, Service health checks)
    /// closed or refused to stay within their bounds, by server and reason.
    pub http_connections_rejected_total: Family<HttpRejectedLabels, Counter>,
    /// Not upstream: connections open now on each kind of HTTP server.
    pub http_connections: Family<HttpServerLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabels {
    pub ip_family: &'static str,
    /// "internal" or "external".
    pub traffic_policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: &'static str,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under the `kubeproxy` prefix.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self {
            sync_proxy_rules_duration_seconds: Family::new_with_constructor(sync_duration_histogram),
            sync_full_proxy_rules_duration_seconds: Family::new_with_constructor(sync_duration_histogram),
            sync_partial_proxy_rules_duration_seconds: Family::new_with_constructor(sync_duration_histogram),
            sync_proxy_rules_last_timestamp_seconds: Family::default(),
            sync_proxy_rules_last_queued_timestamp_seconds: Family::default(),
            network_programming_duration_seconds: Family::new_with_constructor(programming_latency_histogram),
            sync_proxy_rules_endpoint_changes_pending: Family::default(),
            sync_proxy_rules_endpoint_changes_total: Family::default(),
            sync_proxy_rules_service_changes_pending: Family::default(),
            sync_proxy_rules_service_changes_total: Family::default(),
            sync_proxy_rules_no_local_endpoints_total: Family::default(),
            proxy_healthz_total: Family::default(),
            proxy_livez_total: Family::default(),
            rejected_objects_total: Family::default(),
            ignored_values_total: Family::default(),
            conntrack_reconciler_sync_duration_seconds: Family::new_with_constructor(sync_duration_histogram),
            conntrack_reconciler_deleted_entries_total: Family::default(),
            service_healthcheck_failures_total: Family::default(),
            http_connections_rejected_total: Family::default(),
            http_connections: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("kubeproxy");
        r.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_proxy_rules_duration_seconds.clone(),
        );
        r.register(
            "sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            m.sync_full_proxy_rules_duration_seconds.clone(),
        );
        r.register(
            "sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            m.sync_partial_proxy_rules_duration_seconds.clone(),
        );
        r.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.sync_proxy_rules_last_timestamp_seconds.clone(),
        );
        r.register(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            m.sync_proxy_rules_last_queued_timestamp_seconds.clone(),
        );
        r.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            m.network_programming_duration_seconds.clone(),
        );
        r.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            m.sync_proxy_rules_endpoint_changes_pending.clone(),
        );
        // prometheus-client appends `_total` to counters.
        r.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            m.sync_proxy_rules_endpoint_changes_total.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            m.sync_proxy_rules_service_changes_pending.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            m.sync_proxy_rules_service_changes_total.clone(),
        );
        r.register(
            "sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            m.sync_proxy_rules_no_local_endpoints_total.clone(),
        );
        r.register(
            "proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            m.proxy_healthz_total.clone(),
        );
        r.register(
            "proxy_livez",
            "Cumulative proxy livez HTTP status",
            m.proxy_livez_total.clone(),
        );
        r.register(
            "conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            m.conntrack_reconciler_sync_duration_seconds.clone(),
        );
        r.register(
            "conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            m.conntrack_reconciler_deleted_entries_total.clone(),
        );
        r.register(
            "rejected_objects",
            "Objects refused as malformed, by kind and reason (kube-proxy-rs)",
            m.rejected_objects_total.clone(),
        );
        r.register(
            "ignored_values",
            "Malformed list entries (external IPs, load-balancer ingress, source ranges, EndpointSlice \
             addresses and ports, Node addresses and pod CIDRs) dropped from objects that are otherwise used, by kind, \
             list and reason (kube-proxy-rs)",
            m.ignored_values_total.clone(),
        );
        r.register(
            "service_healthcheck_failures",
            "Attempts to open a Service's health-check node port that failed (the port is busy, \
             claimed by two Services, or cannot be listened on), by reason (kube-proxy-rs)",
            m.service_healthcheck_failures_total.clone(),
        );
        r.register(
            "http_connections_rejected",
            "Connections the healthz, metrics and Service health-check servers closed or refused to \
             stay within their bounds (connection cap, header and write timeouts, request size), by server \
             and reason (kube-proxy-rs)",
            m.http_connections_rejected_total.clone(),
        );
        r.register(
            "http_connections",
            "Connections open now on the healthz, metrics and Service health-check servers, by server \
             (kube-proxy-rs)",
            m.http_connections.clone(),
        );
        m
    }

    /// Counts a refused object. Logging it is the caller's job (it knows the context).
    pub fn count_rejection(&self, rejection: &Rejection) {
        self.rejected_objects_total
            .get_or_create(&RejectedLabels {
                kind: rejection.kind.as_str(),
                reason: rejection.reason.as_str(),
            })
            .inc();
    }

    /// Counts a dropped list entry. Logging it is the caller's job.
    pub fn count_ignored(&self, ignored: &IgnoredValue) {
        self.ignored_values_total
            .get_or_create(&IgnoredLabels {
                kind: ignored.kind.as_str(),
                field: ignored.list,
                reason: ignored.reason.as_str(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_model::{ObjectKind, RejectReason};
    use prometheus_client::encoding::text::encode;

    #[test]
    fn exports_upstream_names() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        let v4 = FamilyLabels { ip_family: "IPv4" };
        m.sync_proxy_rules_duration_seconds
            .get_or_create(&v4)
            .observe(0.01);
        m.sync_proxy_rules_service_changes_total.get_or_create(&v4).inc();
        m.count_rejection(&Rejection::new(
            ObjectKind::Service,
            "a/b",
            "spec",
            RejectReason::MissingField,
            "x",
        ));
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\",ip_family=\"IPv4\"}",
            "kubeproxy_sync_proxy_rules_service_changes_total{ip_family=\"IPv4\"} 1",
            "kubeproxy_rejected_objects_total{kind=\"Service\",reason=\"missing_field\"} 1",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }

    /// The `le` bounds of one histogram series as exposed, in order.
    fn exposed_bounds(text: &str, name: &str) -> Vec<String> {
        let prefix = format!("{name}_bucket{{le=\"");
        text.lines()
            .filter_map(|line| Some(line.strip_prefix(&prefix)?.split('"').next()?.to_string()))
            .collect()
    }

    #[test]
    fn programming_latency_buckets_are_upstreams_plus_finer_ones_below() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        let v4 = FamilyLabels { ip_family: "IPv4" };
        m.network_programming_duration_seconds
            .get_or_create(&v4)
            .observe(0.03);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        let bounds = exposed_bounds(&text, "kubeproxy_network_programming_duration_seconds");
        let fine = [
            "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2",
        ];
        assert_eq!(bounds[..fine.len()], fine, "{bounds:?}");
        // Upstream's, written out so a change to the generator cannot hide here.
        let mut upstream: Vec<String> = vec!["0.25".into(), "0.5".into()];
        upstream.extend((1..=59).map(|s| format!("{s}.0")));
        upstream.extend((60..=115).step_by(5).map(|s| format!("{s}.0")));
        upstream.extend((120..=300).step_by(30).map(|s| format!("{s}.0")));
        upstream.push("+Inf".into());
        assert_eq!(bounds[fine.len()..], upstream[..], "{bounds:?}");
        // 30 ms falls in the 50 ms bucket, not in the 25 ms one.
        let bucket = |le: &str| {
            format!(
                "kubeproxy_network_programming_duration_seconds_bucket{{le=\"{le}\",ip_family=\"IPv4\"}} "
            )
        };
        assert!(text.contains(&(bucket("0.025") + "0")), "{text}");
        assert!(text.contains(&(bucket("0.05") + "1")), "{text}");
    }

    #[test]
    fn ignored_values_are_counted_per_list_not_per_entry() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        for index in [1, 7] {
            m.count_ignored(&kpr_model::IgnoredValue {
                kind: ObjectKind::Service,
                object: format!("ns/svc-{index}"),
                field: format!("spec.externalIPs[{index}]"),
                list: "spec.externalIPs",
                reason: RejectReason::InvalidIp,
                detail: "x".into(),
            });
        }
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        let series = "kubeproxy_ignored_values_total{kind=\"Service\",field=\"spec.externalIPs\",reason=\"invalid_ip\"} 2";
        assert!(text.contains(series), "missing {series} in\n{text}");
        assert!(!text.contains("svc-1"), "no object names in labels");
    }

    #[test]
    fn health_check_failures_are_counted_by_family_and_reason() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        let busy = HealthCheckFailureLabels {
            ip_family: "IPv4",
            reason: "port_in_use",
        };
        m.service_healthcheck_failures_total.get_or_create(&busy).inc();
        m.service_healthcheck_failures_total.get_or_create(&busy).inc();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        let series =
            "kubeproxy_service_healthcheck_failures_total{ip_family=\"IPv4\",reason=\"port_in_use\"} 2";
        assert!(text.contains(series), "missing {series} in\n{text}");
    }

    #[test]
    fn exports_the_conntrack_reconciler_metrics_as_upstream() {
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        let v4 = FamilyLabels { ip_family: "IPv4" };
        m.conntrack_reconciler_sync_duration_seconds
            .get_or_create(&v4)
            .observe(0.003);
        m.conntrack_reconciler_deleted_entries_total
            .get_or_create(&v4)
            .inc_by(18);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE kubeproxy_conntrack_reconciler_sync_duration_seconds histogram",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{le=\"0.004\",ip_family=\"IPv4\"} 1",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_bucket{le=\"16.384\",ip_family=\"IPv4\"} 1",
            "# TYPE kubeproxy_conntrack_reconciler_deleted_entries counter",
            "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 18",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }
}
