//! Host settings iptables mode depends on, set once at start-up.
//!
//! Through kpr-host's `Sysctl`, so tests never write the sysctls of the namespace they run in.

use std::io;

use kpr_host::Sysctl;

use crate::options::IptablesOptions;

/// Lets NodePorts answer on 127.0.0.1 (upstream's `route_localnet=1`).
pub const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";

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

fn ensure(sysctl: &dyn Sysctl, key: &'static str, value: &'static str) -> Result<(), HostError> {
    let error = |source| HostError { key, value, source };
    if sysctl.get(key).map_err(error)? != value {
        sysctl.set(key, value).map_err(error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use kpr_host::ProcSysctl;
    use kpr_model::IpFamily;

    use super::*;

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
    fn missing_sysctl_is_an_error_naming_it() {
        let err = prepare_host(&IptablesOptions::default(), &ProcSysctl::at("/nonexistent")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("setting sysctl net/ipv4/conf/all/route_localnet to 1")
        );
    }
}
