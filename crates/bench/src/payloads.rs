//! What the product's backend writes, found without a kernel.
//!
//! The partial payload of a change depends only on the backend's bookkeeping (chain hashes
//! of the previous sync), not on the iptables flavour. Running the real `IptablesBackend`
//! against a recording stand-in for iptables yields the exact bytes a node would restore,
//! so the partial restore can be timed even where the backend's own full load could not
//! finish in time.

use std::sync::{Arc, Mutex, PoisonError};

use kpr_iptables::{
    ExecError, Iptables, IptablesBackend, IptablesCli, IptablesOptions, IptablesVersion, Table, Variant,
};
use kpr_model::IpFamily;

use crate::cluster::Snapshot;

/// Accepts everything, as a freshly created namespace would, and keeps every restore input.
#[derive(Default)]
struct Recorder {
    restores: Arc<Mutex<Vec<String>>>,
}

impl Iptables for Recorder {
    /// The host's own iptables decides `--random-fully`, as on a real node.
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        IptablesCli::new(IpFamily::V4, Variant::Plain).version()
    }

    fn create_chain(&self, _table: Table, _chain: &str) -> Result<(), ExecError> {
        Ok(())
    }

    fn restore(&self, payload: &[u8]) -> Result<(), ExecError> {
        self.restores
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(String::from_utf8_lossy(payload).into_owned());
        Ok(())
    }

    /// Nothing stale to delete: the namespace starts empty.
    fn save(&self, _table: Table) -> Result<String, ExecError> {
        Ok(String::new())
    }

    /// The canary the full sync created is still there, so the next sync may be partial.
    fn chain_exists(&self, _table: Table, _chain: &str) -> Result<bool, ExecError> {
        Ok(true)
    }

    fn rule_exists(&self, _table: Table, _chain: &str, _args: &[String]) -> Result<bool, ExecError> {
        Ok(true)
    }

    fn insert_rule(&self, _table: Table, _chain: &str, _args: &[String]) -> Result<(), ExecError> {
        Ok(())
    }

    fn delete_rule(&self, _table: Table, _chain: &str, _args: &[String]) -> Result<(), ExecError> {
        Ok(())
    }
}

/// The restore input of the backend's partial sync from `base` to `changed`.
pub fn partial_payload(
    options: &IptablesOptions,
    base: &Snapshot,
    changed: &Snapshot,
) -> Result<String, String> {
    let recorder = Recorder::default();
    let restores = Arc::clone(&recorder.restores);
    let mut backend = IptablesBackend::new(options.clone(), Box::new(recorder)).map_err(|e| e.to_string())?;
    let first = backend
        .sync_rules(&base.request(false))
        .map_err(|e| e.to_string())?;
    let second = backend
        .sync_rules(&changed.request(false))
        .map_err(|e| e.to_string())?;
    if !first.full || second.full {
        return Err("the backend did not make a full then a partial sync".to_string());
    }
    let mut restores = restores.lock().unwrap_or_else(PoisonError::into_inner);
    match restores.len() {
        2 => Ok(restores.swap_remove(1)),
        n => Err(format!("the backend made {n} restores instead of 2")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Shape, SyntheticCluster};
    use crate::options::bench_options;

    #[test]
    fn the_partial_payload_rewrites_only_the_changed_service() {
        let mut cluster = SyntheticCluster::new(Shape {
            services: 4,
            endpoints: 2,
        })
        .expect("valid");
        let base = cluster.take();
        cluster.replace_one_endpoint().expect("valid");
        let changed = cluster.take();
        let partial = partial_payload(&bench_options(), &base, &changed).expect("two syncs");
        let service_chains: Vec<&str> = partial
            .lines()
            .filter(|l| l.starts_with(":KUBE-SVC-") || l.starts_with(":KUBE-SEP-"))
            .collect();
        // svc-0's KUBE-SVC chain, its new KUBE-SEP chain, and the old one being deleted.
        assert_eq!(service_chains.len(), 3, "{partial}");
        assert_eq!(
            partial.lines().filter(|l| l.starts_with("-X KUBE-SEP-")).count(),
            1
        );
        assert!(
            partial.contains("-A KUBE-SERVICES "),
            "fixed chains are rewritten"
        );
        assert!(
            !partial.contains("KUBE-PROXY-CANARY"),
            "the canary is written on full syncs only"
        );
    }
}
