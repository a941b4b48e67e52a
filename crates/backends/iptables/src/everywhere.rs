//! One mode's iptables rules removed from every place they can be: both IP families and
//! both iptables flavours (a node may have run either, and upstream's iptables-wrapper picks
//! one per start).
//!
//! Upstream only ever checks one flavour per family and skips a family whose iptables
//! cannot run. We report what was not looked at instead of claiming a clean node: a flavour
//! whose tools are missing next to one that runs is [unchecked](Leftovers::unchecked); a
//! family no flavour could check is [nothing checked](Leftovers::nothing_checked), which
//! fails `--cleanup`.

use kpr_mode::Leftovers;
use kpr_model::IpFamily;

use crate::cleanup::{CLEANUP_TABLES, CleanupReport, Footprint, cleanup_footprint};
use crate::exec::{ExecError, IptablesCli, Variant};

/// Removes `footprint`'s rules in both families and both flavours.
pub fn remove_everywhere(footprint: &dyn Footprint) -> Leftovers {
    let mut leftovers = Leftovers::default();
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut unrunnable = Vec::new();
        for variant in [Variant::Legacy, Variant::Nft] {
            let report = cleanup_footprint(&IptablesCli::new(family, variant), footprint);
            for applied in &report.applied {
                leftovers.removed.push(format!(
                    "{} {variant:?} {} rules: {} chains, {} jumps",
                    family.label(),
                    applied.table,
                    applied.delete.len(),
                    applied.jumps.len()
                ));
            }
            match real_failures(family, variant, report) {
                Ok(errors) => leftovers.failures.extend(errors),
                Err(tool) => {
                    leftovers
                        .unchecked
                        .push(format!("{} {variant:?} rules: {tool}", family.label()));
                    unrunnable.push(tool);
                }
            }
        }
        if unrunnable.len() == 2 {
            leftovers.nothing_checked.push(format!(
                "{} rules could not be checked at all: {}",
                family.label(),
                unrunnable.join("; ")
            ));
        }
    }
    leftovers
}

/// The errors worth failing for, or `Err(why)` when this flavour's save tool could not be
/// run for any table: then nothing was checked (the flavour is most likely not installed).
/// Once anything was checked, every error counts, a missing restore tool included.
fn real_failures(family: IpFamily, variant: Variant, report: CleanupReport) -> Result<Vec<String>, String> {
    let unsaved: Vec<String> = report
        .errors
        .iter()
        .filter_map(|e| match &e.source {
            ExecError::Spawn { command, source } if is_save_tool(command) => {
                Some(format!("cannot run {}: {source}", program(command)))
            }
            _ => None,
        })
        .collect();
    if unsaved.len() == CLEANUP_TABLES.len() {
        let mut reasons = unsaved;
        reasons.dedup();
        return Err(reasons.join("; "));
    }
    Ok(report
        .errors
        .into_iter()
        .map(|e| format!("{} {variant:?}: {e}", family.label()))
        .collect())
}

/// The program of a command line as ExecError records it ("iptables-nft-save -t nat").
fn program(command: &str) -> &str {
    command.split_whitespace().next().unwrap_or(command)
}

fn is_save_tool(command: &str) -> bool {
    program(command).ends_with("-save")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cleanup::CleanupError;

    fn spawn_error(table: crate::Table, command: &str) -> CleanupError {
        CleanupError {
            table,
            source: ExecError::Spawn {
                command: command.to_string(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
        }
    }

    #[test]
    fn a_flavour_whose_save_tool_never_ran_checked_nothing() {
        let report = CleanupReport {
            applied: Vec::new(),
            errors: CLEANUP_TABLES
                .iter()
                .map(|&t| spawn_error(t, &format!("iptables-legacy-save -t {t}")))
                .collect(),
        };
        let why = real_failures(IpFamily::V4, Variant::Legacy, report).unwrap_err();
        assert!(why.starts_with("cannot run iptables-legacy-save: "), "{why}");
        assert_eq!(why.matches("cannot run").count(), 1, "{why}");
    }

    #[test]
    fn a_missing_restore_tool_after_a_successful_save_is_a_failure() {
        let report = CleanupReport {
            applied: Vec::new(),
            errors: CLEANUP_TABLES
                .iter()
                .map(|&t| spawn_error(t, "iptables-nft-restore --noflush --counters"))
                .collect(),
        };
        let failures = real_failures(IpFamily::V4, Variant::Nft, report).unwrap();
        assert_eq!(failures.len(), CLEANUP_TABLES.len());
        assert!(failures[0].contains("iptables-nft-restore"), "{failures:?}");
    }

    #[test]
    fn a_clean_run_has_no_failures() {
        let failures = real_failures(IpFamily::V6, Variant::Nft, CleanupReport::default()).unwrap();
        assert!(failures.is_empty());
    }
}
