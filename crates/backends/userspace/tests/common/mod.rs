//! Test support: an iptables that accepts every command, for tests whose subject is not
//! the portals' text (the golden tests check that); a namespace with a runtime to run a
//! backend in; the process's open descriptors.

use kpr_iptables::{ExecError, Iptables, IptablesVersion, Table};

/// Accepts every command.
pub struct Accepting;

impl Iptables for Accepting {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        Ok(IptablesVersion {
            major: 1,
            minor: 8,
            patch: 9,
        })
    }
    fn restore(&self, _: &[u8]) -> Result<(), ExecError> {
        Ok(())
    }
    fn save(&self, _: Table) -> Result<String, ExecError> {
        Ok(String::new())
    }
    fn chain_exists(&self, _: Table, _: &str) -> Result<bool, ExecError> {
        Ok(true)
    }
    fn rule_exists(&self, _: Table, _: &str, _: &[String]) -> Result<bool, ExecError> {
        Ok(true)
    }
    fn insert_rule(&self, _: Table, _: &str, _: &[String]) -> Result<(), ExecError> {
        Ok(())
    }
    fn delete_rule(&self, _: Table, _: &str, _: &[String]) -> Result<(), ExecError> {
        Ok(())
    }
    fn create_chain(&self, _: Table, _: &str) -> Result<(), ExecError> {
        Ok(())
    }
}

/// Runs `test` in a namespace of its own (loopback up), with a runtime of `workers` threads
/// for the backend's UDP listeners.
pub fn in_netns(name: &str, workers: usize, test: impl FnOnce(&tokio::runtime::Runtime) + Send) {
    in_netns_with(name, workers, &[], test);
}

/// [`in_netns`] with the namespace's `sysctls` (key, value) set first.
pub fn in_netns_with(
    name: &str,
    workers: usize,
    sysctls: &[(&str, &str)],
    test: impl FnOnce(&tokio::runtime::Runtime) + Send,
) {
    let ns = kpr_netns::Netns::new(name).unwrap();
    ns.ip(&["link", "set", "lo", "up"]).unwrap();
    for (key, value) in sysctls {
        ns.set_sysctl(key, value).unwrap();
    }
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        test(&rt);
    });
}

/// Descriptors the process holds now.
pub fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}
