//! What a mode's removal of its own leftovers did, so the one caller can judge it: at
//! start-up (another mode is starting) it is logged and never fatal; under `--cleanup`,
//! which promises a clean node, anything not removed fails the command.

/// The outcome of one mode's [`crate::Mode::remove_leftovers`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// What was removed, named as an admin would name it (`ipset KUBE-CLUSTER-IP`).
    pub removed: Vec<String>,
    /// What could not be removed, and why.
    pub failures: Vec<String>,
    /// Where nothing could be looked at at all (no flavour of a family's tools runs):
    /// expected at start-up on a host without those tools; a failure for `--cleanup`.
    pub nothing_checked: Vec<String>,
    /// Where one of several places could not be looked at (one iptables flavour is not
    /// installed): never a failure on its own.
    pub unchecked: Vec<String>,
}

impl Leftovers {
    /// Adds `other`'s outcome to this one.
    pub fn merge(&mut self, other: Leftovers) {
        self.removed.extend(other.removed);
        self.failures.extend(other.failures);
        self.nothing_checked.extend(other.nothing_checked);
        self.unchecked.extend(other.unchecked);
    }

    /// Start-up: another mode's leftovers were removed best effort.
    pub fn log_at_start_up(&self, mode: &str) {
        for failure in &self.failures {
            tracing::warn!(mode, "leftovers of another mode not removed: {failure}");
        }
        for place in self.nothing_checked.iter().chain(&self.unchecked) {
            tracing::debug!(mode, "leftovers not checked: {place}");
        }
    }

    /// `--cleanup`: every reason the node may not be clean, or none. Places one of several
    /// was not checked are logged.
    pub fn cleanup_failures(&self) -> Vec<String> {
        for place in &self.unchecked {
            tracing::warn!("--cleanup: not checked: {place}");
        }
        let mut failures: Vec<String> = self
            .failures
            .iter()
            .chain(&self.nothing_checked)
            .cloned()
            .collect();
        // Modes share tools (three modes write iptables rules): one cause, said once.
        let mut seen = std::collections::BTreeSet::new();
        failures.retain(|failure| seen.insert(failure.clone()));
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_fails_for_failures_and_places_nothing_could_check_once_each() {
        let mut all = Leftovers {
            failures: vec!["ipset KUBE-CLUSTER-IP: busy".into()],
            nothing_checked: vec!["IPv6 rules could not be checked at all".into()],
            unchecked: vec!["IPv4 Legacy".into()],
            ..Leftovers::default()
        };
        all.merge(Leftovers {
            nothing_checked: vec!["IPv6 rules could not be checked at all".into()],
            removed: vec!["table ip kube-proxy".into()],
            ..Leftovers::default()
        });
        assert_eq!(
            all.cleanup_failures(),
            [
                "ipset KUBE-CLUSTER-IP: busy",
                "IPv6 rules could not be checked at all"
            ]
        );
        assert!(Leftovers::default().cleanup_failures().is_empty());
    }
}
