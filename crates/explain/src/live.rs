//! Reading the live kernel of the calling thread's network namespace: every mode's
//! [`Explainer`] is asked for its objects of the query's family, beside this host's
//! addresses (NodePorts are served on them).
//!
//! The readers live with their modes (a mode's crate knows how it writes its objects, so it
//! is the one to read them back); this is only the part that is the same for all of them.

use std::net::IpAddr;

use kpr_host::{InterfaceAddresses, LocalAddresses};
use kpr_model::IpFamily;

use crate::query::Query;
use crate::report::{Explanation, Section};

/// One mode's reader of its own kernel objects.
pub trait Explainer: Sync {
    /// What this mode's objects are called, for the answer when no mode has any here
    /// ("table ip kube-proxy").
    fn looks_for(&self, family: IpFamily) -> String;

    /// This mode's objects of `query`'s family in the calling thread's network namespace,
    /// and what they do with `query` (`local_addresses`: this host's addresses of that
    /// family). `Ok(None)` when the mode has no objects here; `Err` says what could not be
    /// read.
    fn explain(&self, query: &Query, local_addresses: &[IpAddr]) -> Result<Option<Section>, String>;

    /// Whether this mode writes its objects beside another mode's (ebpf mode beside
    /// nftables mode's tables): its section then does not count as another mode's.
    fn builds_on_another_mode(&self) -> bool {
        false
    }
}

/// Explains `query` from the kernel objects of this network namespace, in every mode whose
/// objects exist. Read failures are reported in [`Explanation::problems`], beside what
/// could be read.
///
/// Modes can share object names (ipvs mode writes iptables mode's `KUBE-SERVICES` chain),
/// so a mode whose objects say nothing about the query is left out when another mode's
/// objects do map it.
pub fn explain_live(query: &Query, explainers: &[&dyn Explainer]) -> Explanation {
    let family = query.family();
    let mut explanation = Explanation {
        query: *query,
        sections: Vec::new(),
        problems: Vec::new(),
        looked_for: explainers.iter().map(|e| e.looks_for(family)).collect(),
        add_ons: 0,
    };
    let mut add_on = Vec::new();
    let local = match InterfaceAddresses.addresses(family) {
        Ok(addresses) => addresses,
        Err(error) => {
            explanation.problems.push(error.to_string());
            Vec::new()
        }
    };
    for explainer in explainers {
        match explainer.explain(query, &local) {
            Ok(Some(section)) => {
                explanation.sections.push(section);
                add_on.push(explainer.builds_on_another_mode());
            }
            Ok(None) => {}
            Err(problem) => explanation.problems.push(problem),
        }
    }
    if explanation.found() {
        let (sections, kept): (Vec<Section>, Vec<bool>) = std::mem::take(&mut explanation.sections)
            .into_iter()
            .zip(add_on)
            .filter(|(section, _)| !section.findings.is_empty())
            .unzip();
        explanation.sections = sections;
        add_on = kept;
    }
    explanation.add_ons = add_on.iter().filter(|a| **a).count();
    explanation
}
