//! Upstream's nftables mode keeps everything in one table per family, `ip kube-proxy` and
//! `ip6 kube-proxy`; deleting the table deletes its chains, sets, maps and rules, as
//! upstream's `CleanupLeftovers` does. Tables of other names or families (`inet
//! kube-proxy` is not upstream's) stay.
//!
//! nf_tables changes only in batches: `NFNL_MSG_BATCH_BEGIN`, `NFT_MSG_DELTABLE`,
//! `NFNL_MSG_BATCH_END`, sent as one datagram; an absent table is refused with ENOENT.

use kpr_netlink::{Channel, ENOENT, NETLINK_NETFILTER, NetlinkError};
use netlink_packet_core::{DefaultNla, Emitable};

use crate::{LeftoverError, Report, subsystem_missing};

/// The table name upstream's nftables mode uses in both families.
pub const NFTABLES_TABLE: &str = "kube-proxy";

/// `NFNL_SUBSYS_NFTABLES`.
const SUBSYS_NFTABLES: u16 = 10;
const BATCH_BEGIN: u16 = 0x10;
const BATCH_END: u16 = 0x11;
/// `NFT_MSG_DELTABLE`.
const MSG_DELTABLE: u16 = 2;
/// `NFTA_TABLE_NAME`.
const ATTR_TABLE_NAME: u16 = 1;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;

/// The families upstream's nftables mode uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NftFamily {
    Ip,
    Ip6,
}

impl NftFamily {
    /// `NFPROTO_IPV4` / `NFPROTO_IPV6`.
    fn nfproto(self) -> u8 {
        match self {
            Self::Ip => 2,
            Self::Ip6 => 10,
        }
    }

    /// As `nft` names it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ip => "ip",
            Self::Ip6 => "ip6",
        }
    }
}

/// The batch deleting `family`'s `kube-proxy` table; every message carries `sequence`.
pub fn delete_table_batch(family: NftFamily, sequence: u32) -> Vec<u8> {
    // A batch's nfgenmsg names the subsystem it is for in res_id (big-endian).
    let mut batch_header = vec![0, 0];
    batch_header.extend(SUBSYS_NFTABLES.to_be_bytes());
    let mut name = NFTABLES_TABLE.as_bytes().to_vec();
    name.push(0);
    let attribute = DefaultNla::new(ATTR_TABLE_NAME, name);
    let mut delete = vec![family.nfproto(), 0, 0, 0];
    let start = delete.len();
    delete.resize(start + attribute.buffer_len(), 0);
    attribute.emit(&mut delete[start..]);

    let mut bytes = kpr_netlink::message(BATCH_BEGIN, NLM_F_REQUEST, sequence, &batch_header);
    bytes.extend(kpr_netlink::message(
        (SUBSYS_NFTABLES << 8) | MSG_DELTABLE,
        NLM_F_REQUEST | NLM_F_ACK,
        sequence,
        &delete,
    ));
    bytes.extend(kpr_netlink::message(
        BATCH_END,
        NLM_F_REQUEST,
        sequence,
        &batch_header,
    ));
    bytes
}

/// Deletes upstream's table in each family where it exists.
pub(crate) fn remove_tables(report: &mut Report) {
    for family in [NftFamily::Ip, NftFamily::Ip6] {
        let object = format!("nftables table {} {NFTABLES_TABLE}", family.label());
        match delete_table(family) {
            Ok(true) => report.removed(object),
            Ok(false) => {}
            Err(error) => report.failed(LeftoverError::netlink(object, &error)),
        }
    }
}

/// Whether the table was there (and is now gone).
fn delete_table(family: NftFamily) -> Result<bool, NetlinkError> {
    let mut channel = Channel::open(NETLINK_NETFILTER)?;
    match channel.request(|sequence| delete_table_batch(family, sequence)) {
        Ok(_) => Ok(true),
        Err(NetlinkError::Kernel { errno: ENOENT }) => Ok(false),
        Err(error) if subsystem_missing(&error) => Ok(false),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(length: u32, message_type: u16, flags: u16, sequence: u32) -> Vec<u8> {
        let mut bytes = length.to_ne_bytes().to_vec();
        bytes.extend(message_type.to_ne_bytes());
        bytes.extend(flags.to_ne_bytes());
        bytes.extend(sequence.to_ne_bytes());
        bytes.extend([0; 4]);
        bytes
    }

    /// The bytes `nft delete table ip6 kube-proxy` sends (libnftnl), sequence numbers aside.
    #[test]
    fn delete_batch_is_byte_exact() {
        let mut expected = header(20, 0x10, 0x1, 3);
        expected.extend([0, 0, 0, 10]);
        // nfgenmsg (family ip6) + NFTA_TABLE_NAME "kube-proxy\0" (15 bytes, padded to 16).
        expected.extend(header(16 + 4 + 16, 0x0a02, 0x5, 3));
        expected.extend([10, 0, 0, 0]);
        expected.extend(15u16.to_ne_bytes());
        expected.extend(1u16.to_ne_bytes());
        expected.extend(b"kube-proxy\0\0");
        expected.extend(header(20, 0x11, 0x1, 3));
        expected.extend([0, 0, 0, 10]);
        assert_eq!(delete_table_batch(NftFamily::Ip6, 3), expected);
        assert_eq!(delete_table_batch(NftFamily::Ip, 3)[36], 2, "NFPROTO_IPV4");
    }
}
