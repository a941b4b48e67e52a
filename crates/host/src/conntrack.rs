//! The conntrack settings upstream kube-proxy applies at start-up (`--conntrack-*`).
//!
//! A busy node runs out of conntrack entries long before anything else, and established TCP
//! flows must outlive idle periods of clients, so upstream raises the table size and sets the
//! timeouts. Values are only written when they differ; the table size is only ever raised.
//! Some keys are global and read-only outside the host's network namespace (in a container
//! without privileges, or in tests): failing to set them is logged, not fatal, as upstream.

use crate::sysctl::{Sysctl, TCP_BE_LIBERAL};
use kpr_config::KubeProxyConntrackConfiguration;

const MAX: &str = "net/netfilter/nf_conntrack_max";

/// The `(key, value)` pairs to set, for a machine with `cores` CPUs. `nf_conntrack_max` is
/// a floor (only raised), the rest are exact.
pub fn wanted(config: &KubeProxyConntrackConfiguration, cores: usize) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let per_core = i64::from(config.max_per_core.unwrap_or(0));
    if per_core > 0 {
        let cores = i64::try_from(cores).unwrap_or(1);
        let max = (per_core * cores).max(i64::from(config.min.unwrap_or(0)));
        out.push((MAX, max.to_string()));
    }
    let seconds = |d: Option<kpr_config::GoDuration>| d.and_then(|d| d.to_std()).map(|d| d.as_secs());
    for (key, value) in [
        (
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            seconds(config.tcp_established_timeout),
        ),
        (
            "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
            seconds(config.tcp_close_wait_timeout),
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout",
            seconds(Some(config.udp_timeout)),
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout_stream",
            seconds(Some(config.udp_stream_timeout)),
        ),
    ] {
        // Zero means "leave the kernel's value", as upstream.
        if let Some(secs) = value.filter(|s| *s > 0) {
            out.push((key, secs.to_string()));
        }
    }
    if config.tcp_be_liberal {
        out.push((TCP_BE_LIBERAL, "1".to_string()));
    }
    out
}

/// Applies [`wanted`]; returns what could not be set.
pub fn apply(config: &KubeProxyConntrackConfiguration, sysctl: &dyn Sysctl) -> Vec<String> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut failures = Vec::new();
    for (key, value) in wanted(config, cores) {
        let current = sysctl.get(key).unwrap_or_default();
        let already = if key == MAX {
            current.parse::<i64>().ok() >= value.parse::<i64>().ok()
        } else {
            current == value
        };
        if already {
            continue;
        }
        match sysctl.set(key, &value) {
            Ok(()) => tracing::info!(key, value, "set conntrack sysctl"),
            Err(error) => failures.push(format!("{key}={value}: {error}")),
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::io;

    use super::*;

    fn defaults() -> KubeProxyConntrackConfiguration {
        let settings = kpr_config::load(["kube-proxy-rs"]).unwrap();
        settings.config.conntrack
    }

    #[test]
    fn upstream_defaults_give_table_size_and_tcp_timeouts_only() {
        let wanted = wanted(&defaults(), 2);
        assert_eq!(
            wanted,
            [
                (MAX, "131072".to_string()),
                (
                    "net/netfilter/nf_conntrack_tcp_timeout_established",
                    "86400".to_string()
                ),
                (
                    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
                    "3600".to_string()
                ),
            ]
        );
        assert_eq!(super::wanted(&defaults(), 8)[0], (MAX, "262144".to_string()));
    }

    struct Fake(RefCell<BTreeMap<String, String>>);

    impl Sysctl for Fake {
        fn get(&self, key: &str) -> io::Result<String> {
            Ok(self.0.borrow().get(key).cloned().unwrap_or_default())
        }
        fn set(&self, key: &str, value: &str) -> io::Result<()> {
            if key == MAX {
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, "read-only here"));
            }
            self.0.borrow_mut().insert(key.into(), value.into());
            Ok(())
        }
    }

    #[test]
    fn a_larger_table_is_kept_and_read_only_keys_are_reported() {
        let big = Fake(RefCell::new(BTreeMap::from([(
            MAX.to_string(),
            "9999999".to_string(),
        )])));
        assert!(
            apply(&defaults(), &big).is_empty(),
            "a larger table is never shrunk"
        );
        let small = Fake(RefCell::new(BTreeMap::from([(MAX.to_string(), "1".to_string())])));
        let failures = apply(&defaults(), &small);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("nf_conntrack_max"));
        assert_eq!(
            small.0.borrow()["net/netfilter/nf_conntrack_tcp_timeout_close_wait"],
            "3600"
        );
    }
}
