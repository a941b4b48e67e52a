//! What the demo prints: which pod answered how often on each path, and the proxy's own
//! view (its metrics, the rules it wrote). Pure text functions, so tests can read them.

use std::fmt::Write as _;

use kpr_netns::pod_ip;

use crate::cluster::PODS;
use crate::traffic::PathResult;

/// The metrics worth showing: when the rules were last synced and how many were written.
const LAST_SYNC_METRIC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
const RULE_COUNT_METRIC_SUFFIX: &str = "_iptables_total";

/// Marks the chains kube-proxy owns in `iptables-save` output.
const CHAIN_PREFIX: &str = "KUBE-";

const FROM_WIDTH: usize = 8;
const TO_WIDTH: usize = 40;
const POD_WIDTH: usize = 13;
const FAILED_WIDTH: usize = 8;

/// One row per path: answers per pod ("-" where the pod is no endpoint), failed requests,
/// and ok or FAIL; the problems of failed paths below the table. No timings: they would
/// mostly measure the test backends, which poll for connections.
pub fn answer_table(results: &[PathResult]) -> String {
    let mut table = String::new();
    let pods = |text: &dyn Fn(usize) -> String| -> String {
        (0..PODS)
            .map(|pod| format!("{:>POD_WIDTH$}", text(pod)))
            .collect()
    };
    let _ = writeln!(
        table,
        "{:<FROM_WIDTH$}{:<TO_WIDTH$}{}{:>FAILED_WIDTH$}  result",
        "from",
        "to",
        pods(&|pod| format!("pod{pod}")),
        "failed",
    );
    let _ = writeln!(
        table,
        "{:<FROM_WIDTH$}{:<TO_WIDTH$}{}",
        "",
        "",
        pods(&|pod| pod_ip(pod).to_string())
    );
    for result in results {
        let cell = |pod: usize| match result.answers.get(&pod) {
            Some(n) => n.to_string(),
            None if result.path.expected.contains(&pod) => "0".to_owned(),
            None => "-".to_owned(),
        };
        let _ = writeln!(
            table,
            "{:<FROM_WIDTH$}{:<TO_WIDTH$}{}{:>FAILED_WIDTH$}  {}",
            result.path.source.label(),
            result.path.destination(),
            pods(&cell),
            result.failed(),
            if result.ok() { "ok" } else { "FAIL" }
        );
    }
    for result in results.iter().filter(|result| !result.ok()) {
        let _ = writeln!(
            table,
            "FAIL {} -> {}: {}",
            result.path.source.label(),
            result.path.destination(),
            result.problems().join("; ")
        );
    }
    table
}

/// The last-sync and rule-count samples of a `/metrics` body; the last sync gets its age
/// relative to `now` (seconds since the epoch).
pub fn metric_lines(body: &str, now: f64) -> Vec<String> {
    body.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let name = line.split(['{', ' ']).next()?;
            if name == LAST_SYNC_METRIC {
                let age = line
                    .rsplit(' ')
                    .next()
                    .and_then(|value| value.parse::<f64>().ok())
                    .map(|synced| format!("   ({:.1}s ago)", now - synced))
                    .unwrap_or_default();
                Some(format!("{line}{age}"))
            } else if name.ends_with(RULE_COUNT_METRIC_SUFFIX) {
                Some(line.to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// `iptables-save | grep -c KUBE-`: lines that mention a kube-proxy chain.
pub fn kube_line_count(iptables_save: &str) -> usize {
    iptables_save
        .lines()
        .filter(|line| line.contains(CHAIN_PREFIX))
        .count()
}

/// The elements of every set and map in an `nft list table` listing: in nftables mode a
/// Service is elements of shared maps, not rules, so this is what grows with the cluster.
pub fn nft_element_count(listing: &str) -> usize {
    listing
        .split("elements = {")
        .skip(1)
        .map(|block| {
            let body = block.split('}').next().unwrap_or_default();
            if body.trim().is_empty() {
                0
            } else {
                body.matches(',').count() + 1
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::traffic::paths;

    fn result(index: usize, answers: &[(usize, usize)], failures: &[(&str, usize)]) -> PathResult {
        PathResult {
            path: paths(10, 10).swap_remove(index),
            answers: answers.iter().copied().collect(),
            failures: failures.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            strangers: BTreeMap::new(),
        }
    }

    #[test]
    fn nft_elements_are_counted_across_sets_and_lines() {
        let listing = "table ip kube-proxy {\n\tset a {\n\t\telements = { 10.0.0.1, 10.0.0.2,\n\t\t\t     10.0.0.3 }\n\t}\n\
                       \tmap b {\n\t\telements = { 10.0.0.1 . tcp . 80 : goto x }\n\t}\n\tset c {\n\t}\n}\n";
        assert_eq!(nft_element_count(listing), 4);
        assert_eq!(nft_element_count("table ip kube-proxy {\n}\n"), 0);
    }

    #[test]
    fn the_table_shows_counts_dashes_and_verdicts() {
        let table = answer_table(&[
            result(0, &[(0, 3), (1, 4), (2, 3)], &[]),
            result(3, &[(0, 6)], &[("timed out", 4)]),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "from    to                                               pod0         pod1         pod2  failed  result",
                "                                                  10.244.1.10  10.244.1.11  10.244.1.12",
                "pod2    ClusterIP 10.96.0.10:80/TCP                         3            4            3       0  ok",
                "pod2    ClusterIP 10.96.0.53:53/UDP                         6            0            -       4  FAIL",
                "FAIL pod2 -> ClusterIP 10.96.0.53:53/UDP: pod1 never answered; 4 requests failed: timed out",
            ]
        );
    }

    #[test]
    fn metrics_keep_the_last_sync_with_its_age_and_the_rule_counts() {
        let body = "\
# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were successfully synced.
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds 1000.5
kubeproxy_sync_proxy_rules_duration_seconds_count 3
kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"} 42
kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"filter\"} 7
";
        assert_eq!(
            metric_lines(body, 1003.0),
            [
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds 1000.5   (2.5s ago)",
                "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"} 42",
                "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"filter\"} 7",
            ]
        );
    }

    #[test]
    fn only_lines_naming_kube_chains_count() {
        let save = "*nat\n:KUBE-SERVICES - [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n";
        assert_eq!(kube_line_count(save), 2);
        assert_eq!(kube_line_count(""), 0);
    }
}
