//! How many entries each long-lived map, set or queue holds: the one type every crate's
//! `footprint()` returns.
//!
//! Everything a proxy keeps across syncs that is keyed by something from the cluster (a
//! name, an IP, a port, a label value) must shrink again when the cluster does; upstream's
//! users met an EndpointSlice cache that grew to ~8 GiB over weeks of churn (kubernetes
//! #128928). RSS is too noisy to catch that in CI, so each such structure reports its entry
//! counts here and the churn tests (driven by `kpr_world::churn`) assert that they are back
//! where they started after changes that end where they started. It lives in this crate
//! because every crate that keeps such state already depends on it.

use std::collections::BTreeMap;
use std::fmt;

/// Named entry counts (`"services.pending" -> 3`), ordered by name so two can be compared
/// and a difference reads well.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sizes(BTreeMap<String, usize>);

impl Sizes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the count of `name`.
    pub fn with(mut self, name: &str, count: usize) -> Self {
        self.0.insert(name.to_string(), count);
        self
    }

    /// Adds every count of `inner`, each name prefixed with `prefix.`: one structure's
    /// footprint inside another's.
    pub fn nested(mut self, prefix: &str, inner: Sizes) -> Self {
        for (name, count) in inner.0 {
            self.0.insert(format!("{prefix}.{name}"), count);
        }
        self
    }

    /// The count of `name`, if it was reported.
    pub fn get(&self, name: &str) -> Option<usize> {
        self.0.get(name).copied()
    }

    /// The sum of every count: a quick "did anything grow at all".
    pub fn total(&self) -> usize {
        self.0.values().sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, usize)> {
        self.0.iter().map(|(name, count)| (name.as_str(), *count))
    }

    /// The names whose counts differ between `self` and `other` (either side missing counts
    /// as 0), with both counts: what a failing churn test prints.
    pub fn differences(&self, other: &Sizes) -> Vec<(String, usize, usize)> {
        let names: std::collections::BTreeSet<&String> = self.0.keys().chain(other.0.keys()).collect();
        names
            .into_iter()
            .filter_map(|name| {
                let (a, b) = (self.get(name).unwrap_or(0), other.get(name).unwrap_or(0));
                (a != b).then(|| (name.clone(), a, b))
            })
            .collect()
    }
}

impl fmt::Display for Sizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, count) in &self.0 {
            writeln!(f, "{name} = {count}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_counts_are_prefixed_and_differences_name_both_sides() {
        let before = Sizes::new()
            .with("claims", 2)
            .nested("ledger", Sizes::new().with("chains", 1));
        let after = Sizes::new()
            .with("claims", 2)
            .nested("ledger", Sizes::new().with("chains", 3).with("sets", 1));
        assert_eq!(after.get("ledger.chains"), Some(3));
        assert_eq!(
            before.differences(&after),
            [
                ("ledger.chains".to_string(), 1, 3),
                ("ledger.sets".to_string(), 0, 1)
            ]
        );
        assert_eq!(before.differences(&before), []);
        assert_eq!(after.total(), 6);
    }
}
