//! `/metrics/slis`: component-base's SLI registry, the results of the metrics port's health
//! checks.
//!
//! Upstream keeps two STABLE metrics in a registry of their own, written each time a
//! component-base health handler runs a check: in kube-proxy only the metrics port's
//! `/healthz` does, with its one check, `ping` (type `healthz`). A check excluded with
//! `?exclude=` does not run and is not recorded; `/healthz/ping` is not recorded either.
//! `DELETE /metrics/slis` empties the registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// What a health handler records checks as: its path's first segment, as upstream names it.
pub(crate) const HEALTHZ: &str = "healthz";

/// Upstream's help texts, with their stability level and full stop; prometheus-client adds
/// another full stop, which the endpoints take off again ([`crate::exposition::upstream_help`]).
const HEALTHCHECK_HELP: &str = "[STABLE] This metric records the result of a single healthcheck.";
const HEALTHCHECKS_TOTAL_HELP: &str = "[STABLE] This metric records the results of all healthcheck.";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    name: &'static str,
    r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckResultLabels {
    name: &'static str,
    status: &'static str,
    r#type: &'static str,
}

/// The SLI registry and its two metrics.
#[derive(Debug)]
pub(crate) struct HealthcheckSlis {
    registry: Registry,
    /// `kubernetes_healthcheck{name,type}`: 1 when the check's last run passed, else 0.
    healthcheck: Family<CheckLabels, Gauge>,
    /// `kubernetes_healthchecks_total{name,type,status}`: runs, by `success` or `error`.
    healthchecks_total: Family<CheckResultLabels, Counter>,
}

impl Default for HealthcheckSlis {
    fn default() -> Self {
        let healthcheck = Family::<CheckLabels, Gauge>::default();
        let healthchecks_total = Family::<CheckResultLabels, Counter>::default();
        let mut registry = Registry::default();
        registry.register("kubernetes_healthcheck", HEALTHCHECK_HELP, healthcheck.clone());
        // prometheus-client appends `_total` to a counter's samples.
        registry.register(
            "kubernetes_healthchecks",
            HEALTHCHECKS_TOTAL_HELP,
            healthchecks_total.clone(),
        );
        Self {
            registry,
            healthcheck,
            healthchecks_total,
        }
    }
}

impl HealthcheckSlis {
    /// Records one run of the check `name` by the handler `kind` (e.g. `healthz`).
    pub(crate) fn observe(&self, name: &'static str, kind: &'static str, passed: bool) {
        self.healthcheck
            .get_or_create(&CheckLabels { name, r#type: kind })
            .set(i64::from(passed));
        self.healthchecks_total
            .get_or_create(&CheckResultLabels {
                name,
                status: if passed { "success" } else { "error" },
                r#type: kind,
            })
            .inc();
    }

    /// Forgets every series, as upstream's reset does.
    pub(crate) fn reset(&self) {
        self.healthcheck.clear();
        self.healthchecks_total.clear();
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::{Format, encode};

    fn text(slis: &HealthcheckSlis) -> String {
        encode(slis.registry(), Format::Text).unwrap()
    }

    #[test]
    fn records_checks_as_upstream_writes_them() {
        let slis = HealthcheckSlis::default();
        assert_eq!(text(&slis), "", "nothing before the first check");
        for _ in 0..3 {
            slis.observe("ping", HEALTHZ, true);
        }
        assert_eq!(
            text(&slis),
            "# HELP kubernetes_healthcheck [STABLE] This metric records the result of a single healthcheck.\n\
             # TYPE kubernetes_healthcheck gauge\n\
             kubernetes_healthcheck{name=\"ping\",type=\"healthz\"} 1\n\
             # HELP kubernetes_healthchecks_total [STABLE] This metric records the results of all healthcheck.\n\
             # TYPE kubernetes_healthchecks_total counter\n\
             kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 3\n"
        );
    }

    #[test]
    fn a_failed_check_sets_the_gauge_to_zero_and_counts_an_error() {
        let slis = HealthcheckSlis::default();
        slis.observe("ping", HEALTHZ, true);
        slis.observe("ping", HEALTHZ, false);
        let text = text(&slis);
        for line in [
            "kubernetes_healthcheck{name=\"ping\",type=\"healthz\"} 0",
            "kubernetes_healthchecks_total{name=\"ping\",status=\"error\",type=\"healthz\"} 1",
            "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn reset_forgets_every_series() {
        let slis = HealthcheckSlis::default();
        slis.observe("ping", HEALTHZ, true);
        slis.reset();
        assert_eq!(text(&slis), "");
        slis.observe("ping", HEALTHZ, true);
        assert!(
            text(&slis).contains(
                "kubernetes_healthchecks_total{name=\"ping\",status=\"success\",type=\"healthz\"} 1\n"
            ),
            "counts start again from zero"
        );
    }
}
