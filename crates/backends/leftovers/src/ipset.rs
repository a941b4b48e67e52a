//! IPVS mode's ipsets (both families' names, from kpr-iptables), destroyed one by one with
//! `IPSET_CMD_DESTROY` (`NFNL_SUBSYS_IPSET`). A set of another name is never named, and a
//! destroy request always carries a name: without one the kernel destroys every set.

use kpr_iptables::ipvs_set_names;
use kpr_netlink::{Channel, ENOENT, NETLINK_NETFILTER, NetlinkError};
use netlink_packet_core::{DefaultNla, Emitable};

use crate::{LeftoverError, Report, subsystem_missing};

/// `NFNL_SUBSYS_IPSET`.
const SUBSYS_IPSET: u16 = 6;
/// `IPSET_CMD_DESTROY`.
const CMD_DESTROY: u16 = 3;
/// `IPSET_ATTR_PROTOCOL` (u8) and `IPSET_ATTR_SETNAME` (NUL-terminated).
const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
/// `IPSET_PROTOCOL_MIN`: every kernel since ipset 6 accepts it.
const PROTOCOL: u8 = 6;
/// `IPSET_MAXNAMELEN` less the NUL.
const NAME_MAX: usize = 31;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
/// Without it the kernel answers "done" for a set that does not exist (ipset's `-exist`).
const NLM_F_EXCL: u16 = 0x200;
/// `IPSET_ERR_BUSY`: a rule still matches the set.
const ERR_BUSY: i32 = 4100;

/// The destroy request for set `name`, or `None` for a name no set can have (an empty
/// name would destroy every set, so it is never sent).
pub fn destroy_request(name: &str, sequence: u32) -> Option<Vec<u8>> {
    if !valid_set_name(name) {
        return None;
    }
    let mut set_name = name.as_bytes().to_vec();
    set_name.push(0);
    let attributes = [
        DefaultNla::new(ATTR_PROTOCOL, vec![PROTOCOL]),
        DefaultNla::new(ATTR_SETNAME, set_name),
    ];
    // nfgenmsg: NFPROTO_IPV4 as the ipset tool sends it, version 0, res_id 0.
    let mut payload = vec![2, 0, 0, 0];
    let start = payload.len();
    payload.resize(start + attributes.as_slice().buffer_len(), 0);
    attributes.as_slice().emit(&mut payload[start..]);
    Some(kpr_netlink::message(
        (SUBSYS_IPSET << 8) | CMD_DESTROY,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL,
        sequence,
        &payload,
    ))
}

fn valid_set_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= NAME_MAX && !name.contains('\0')
}

/// Destroys every IPVS-mode set that exists.
pub fn remove_ipvs_sets(report: &mut Report) {
    let mut channel = match Channel::open(NETLINK_NETFILTER) {
        Ok(channel) => channel,
        Err(error) => {
            report.failed(LeftoverError::netlink("IPVS-mode ipsets", &error));
            return;
        }
    };
    for name in ipvs_set_names().into_iter().filter(|name| valid_set_name(name)) {
        let object = format!("ipset {name}");
        let result = channel.request(|sequence| destroy_request(&name, sequence).unwrap_or_default());
        match result {
            Ok(_) => report.removed(object),
            Err(NetlinkError::Kernel { errno: ENOENT }) => {}
            // No ipset support in this kernel: no set can exist.
            Err(error) if subsystem_missing(&error) => return,
            Err(NetlinkError::Kernel { errno: ERR_BUSY }) => report.failed(LeftoverError {
                object,
                reason: "still in use by a rule that is not kube-proxy's".to_string(),
            }),
            Err(error) => report.failed(LeftoverError::netlink(object, &error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes `ipset destroy KUBE-CLUSTER-IP` sends (libipset), sequence aside.
    #[test]
    fn destroy_request_is_byte_exact_and_always_names_the_set() {
        let mut expected = Vec::new();
        // header + nfgenmsg + protocol (5, padded 8) + name ("KUBE-CLUSTER-IP\0": 16 + 4)
        expected.extend((16u32 + 4 + 8 + 20).to_ne_bytes());
        expected.extend(0x0603u16.to_ne_bytes());
        expected.extend(0x205u16.to_ne_bytes());
        expected.extend(11u32.to_ne_bytes());
        expected.extend([0; 4]);
        expected.extend([2, 0, 0, 0]);
        expected.extend(5u16.to_ne_bytes());
        expected.extend(1u16.to_ne_bytes());
        expected.extend([6, 0, 0, 0]);
        expected.extend(20u16.to_ne_bytes());
        expected.extend(2u16.to_ne_bytes());
        expected.extend(b"KUBE-CLUSTER-IP\0");
        assert_eq!(destroy_request("KUBE-CLUSTER-IP", 11).unwrap(), expected);
        assert_eq!(
            destroy_request("", 1),
            None,
            "an empty name would destroy every set"
        );
        assert_eq!(destroy_request(&"K".repeat(32), 1), None);
        assert_eq!(destroy_request("A\0B", 1), None);
    }

    #[test]
    fn every_ipvs_set_name_can_be_sent() {
        for name in ipvs_set_names() {
            assert!(destroy_request(&name, 1).is_some(), "{name}");
        }
    }
}
