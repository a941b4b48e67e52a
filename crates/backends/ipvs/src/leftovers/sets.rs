//! IPVS mode's ipsets (both families' names, [`crate::sets`]), destroyed one by one
//! through kpr-nfnetlink's ipset client (the messages are built and pinned there). A set
//! of another name is never named, and a destroy request always carries a name: without
//! one the kernel destroys every set (kpr-nfnetlink refuses to build that request).

use kpr_mode::Leftovers;
use kpr_nfnetlink::ipset::IpsetSocket;

use crate::sets::all_names;

/// `ENOENT`: no such set.
const ENOENT: i32 = 2;
/// `EPROTONOSUPPORT`, `EOPNOTSUPP`: no ipset in this kernel, so no set can exist.
const NO_IPSET: [i32; 2] = [93, 95];
/// `IPSET_ERR_BUSY`: a rule still matches the set.
const ERR_BUSY: i32 = 4100;

/// Destroys every IPVS-mode set that exists.
pub(super) fn remove_sets(leftovers: &mut Leftovers) {
    let mut socket = match IpsetSocket::open() {
        Ok(socket) => socket,
        Err(error) => {
            leftovers.failures.push(format!("IPVS-mode ipsets: {error}"));
            return;
        }
    };
    for name in all_names() {
        let object = format!("ipset {name}");
        match socket.destroy(name) {
            Ok(()) => super::removed(leftovers, object),
            Err(error) => match error.errno() {
                Some(ENOENT) => {}
                Some(errno) if NO_IPSET.contains(&errno) => return,
                Some(ERR_BUSY) => leftovers.failures.push(format!(
                    "{object}: still in use by a rule that is not kube-proxy's"
                )),
                _ => leftovers.failures.push(format!("{object}: {error}")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ipvs_set_name_can_be_sent() {
        for name in all_names() {
            assert!(kpr_nfnetlink::ipset::messages::destroy(name).is_ok(), "{name}");
        }
    }
}
