//! Host settings iptables mode depends on, set once at start-up.
//!
//! Behind a trait so tests never write the sysctls of the namespace they run in.

use std::io;
use std::path::PathBuf;

use crate::options::IptablesOptions;

/// Lets NodePorts answer on 127.0.0.1 (upstream's `route_localnet=1`).
pub const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";
/// Conntrack marks only out-of-window RSTs INVALID when this is on.
pub const TCP_BE_LIBERAL: &str = "net/netfilter/nf_conntrack_tcp_be_liberal";

/// Reads and writes kernel parameters (`/proc/sys` paths, with `/` separators).
pub trait Sysctl {
    fn get(&self, key: &str) -> io::Result<String>;
    fn set(&self, key: &str, value: &str) -> io::Result<()>;
}

/// The real `/proc/sys`.
#[derive(Clone, Debug)]
pub struct ProcSysctl {
    root: PathBuf,
}

impl Default for ProcSysctl {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/proc/sys"),
        }
    }
}

impl ProcSysctl {
    /// A sysctl tree rooted elsewhere (tests).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

impl Sysctl for ProcSysctl {
    fn get(&self, key: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.root.join(key))?.trim().to_string())
    }

    fn set(&self, key: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.root.join(key), value)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("setting sysctl {key} to {value}: {source}")]
pub struct HostError {
    pub key: &'static str,
    pub value: &'static str,
    #[source]
    pub source: io::Error,
}

/// Applies the host settings `opts` need; writes only what differs.
pub fn prepare_host(opts: &IptablesOptions, sysctl: &dyn Sysctl) -> Result<(), HostError> {
    if opts.localhost_nodeports_enabled() {
        tracing::info!(
            "setting route_localnet=1 so NodePorts answer on localhost; turn off localhost NodePorts (or exclude loopback from the NodePort addresses) to avoid it"
        );
        ensure(sysctl, ROUTE_LOCALNET, "1")?;
    }
    Ok(())
}

/// Whether `nf_conntrack_tcp_be_liberal` is on, read as upstream reads it at start-up (a
/// missing or unreadable key counts as off). Upstream then leaves out the rule dropping
/// ctstate INVALID packets.
pub fn conntrack_tcp_be_liberal(sysctl: &dyn Sysctl) -> bool {
    sysctl
        .get(TCP_BE_LIBERAL)
        .ok()
        .and_then(|value| value.parse::<i64>().ok())
        .is_some_and(|value| value != 0)
}

fn ensure(sysctl: &dyn Sysctl, key: &'static str, value: &'static str) -> Result<(), HostError> {
    let error = |source| HostError { key, value, source };
    if sysctl.get(key).map_err(error)? != value {
        sysctl.set(key, value).map_err(error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_model::IpFamily;

    fn tree(value: &str) -> (PathBuf, ProcSysctl) {
        let dir = std::env::temp_dir().join(format!("kpr-sysctl-{}-{value}", std::process::id()));
        let file = dir.join(ROUTE_LOCALNET);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, format!("{value}\n")).unwrap();
        (dir.clone(), ProcSysctl::at(dir))
    }

    #[test]
    fn sets_route_localnet_only_when_localhost_nodeports_apply() {
        let (dir, sysctl) = tree("0");
        prepare_host(&IptablesOptions::default(), &sysctl).unwrap();
        assert_eq!(sysctl.get(ROUTE_LOCALNET).unwrap(), "1");

        sysctl.set(ROUTE_LOCALNET, "0").unwrap();
        let v6 = IptablesOptions {
            family: IpFamily::V6,
            ..Default::default()
        };
        prepare_host(&v6, &sysctl).unwrap();
        let off = IptablesOptions {
            localhost_nodeports: false,
            ..Default::default()
        };
        prepare_host(&off, &sysctl).unwrap();
        assert_eq!(sysctl.get(ROUTE_LOCALNET).unwrap(), "0");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tcp_be_liberal_is_read_from_the_sysctl() {
        let dir = std::env::temp_dir().join(format!("kpr-sysctl-liberal-{}", std::process::id()));
        let sysctl = ProcSysctl::at(&dir);
        assert!(!conntrack_tcp_be_liberal(&sysctl), "missing counts as off");
        let file = dir.join(TCP_BE_LIBERAL);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "1\n").unwrap();
        assert!(conntrack_tcp_be_liberal(&sysctl));
        std::fs::write(&file, "0\n").unwrap();
        assert!(!conntrack_tcp_be_liberal(&sysctl));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn missing_sysctl_is_an_error_naming_it() {
        let err = prepare_host(&IptablesOptions::default(), &ProcSysctl::at("/nonexistent")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("setting sysctl net/ipv4/conf/all/route_localnet to 1")
        );
    }
}
