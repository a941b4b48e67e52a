//! IPVS mode's ipsets (both families' names, from kpr-iptables), destroyed one by one
//! through kpr-nfnetlink's ipset client (the messages are built and pinned there). A set
//! of another name is never named, and a destroy request always carries a name: without
//! one the kernel destroys every set (kpr-nfnetlink refuses to build that request).

use kpr_iptables::ipvs_set_names;
use kpr_nfnetlink::ipset::IpsetSocket;

use crate::{LeftoverError, Report};

/// `ENOENT`: no such set.
const ENOENT: i32 = 2;
/// `EPROTONOSUPPORT`, `EOPNOTSUPP`: no ipset in this kernel, so no set can exist.
const NO_IPSET: [i32; 2] = [93, 95];
/// `IPSET_ERR_BUSY`: a rule still matches the set.
const ERR_BUSY: i32 = 4100;

/// Destroys every IPVS-mode set that exists.
pub fn remove_ipvs_sets(report: &mut Report) {
    let mut socket = match IpsetSocket::open() {
        Ok(socket) => socket,
        Err(error) => {
            report.failed(LeftoverError {
                object: "IPVS-mode ipsets".to_string(),
                reason: error.to_string(),
            });
            return;
        }
    };
    for name in ipvs_set_names() {
        let object = format!("ipset {name}");
        match socket.destroy(&name) {
            Ok(()) => report.removed(object),
            Err(error) => match error.errno() {
                Some(ENOENT) => {}
                Some(errno) if NO_IPSET.contains(&errno) => return,
                Some(ERR_BUSY) => report.failed(LeftoverError {
                    object,
                    reason: "still in use by a rule that is not kube-proxy's".to_string(),
                }),
                _ => report.failed(LeftoverError {
                    object,
                    reason: error.to_string(),
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ipvs_set_name_can_be_sent() {
        for name in ipvs_set_names() {
            assert!(kpr_nfnetlink::ipset::messages::destroy(&name).is_ok(), "{name}");
        }
    }
}
