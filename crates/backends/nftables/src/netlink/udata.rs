//! nft's `typeof` user data on sets, which the kernel stores and never reads: only `nft
//! list` does, to print keys as the expressions they came from and slots as numbers
//! rather than as raw integers. Written so a table looks the same whichever transport
//! wrote it.

use kpr_model::{IpFamily, Protocol};

use crate::names::EndpointMap;

// nft's `typeof` user data (libnftnl udata TLVs: type byte, length byte, value; numbers
// host-order u32), so `nft list` prints endpoint maps and affinity sets as nft wrote them:
// slots as numbers, keys as `ip daddr . tcp dport . numgen random mod 1`. The numbers are
// nft's expression kinds (payload 7, concat 13, numgen 23) and its header and field ids.

fn tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

pub(super) fn tlv_u32(out: &mut Vec<u8>, kind: u8, value: u32) {
    tlv(out, kind, &value.to_ne_bytes());
}

/// `<header> <field>` (e.g. `ip daddr`: header 12, field 12).
fn typeof_payload(header: u32, field: u32) -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 7);
    let mut desc = Vec::new();
    tlv_u32(&mut desc, 0, header);
    tlv_u32(&mut desc, 1, field);
    tlv(&mut out, 1, &desc);
    out
}

/// `numgen random mod 1`.
fn typeof_numgen() -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 23);
    let mut args = Vec::new();
    tlv_u32(&mut args, 0, 1);
    tlv_u32(&mut args, 1, 1);
    tlv_u32(&mut args, 2, 0);
    tlv(&mut out, 1, &args);
    out
}

fn typeof_concat(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 13);
    let mut list = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        tlv(&mut list, i as u8, part);
    }
    tlv(&mut out, 1, &list);
    out
}

/// The user data of an endpoint map (`[daddr .] <proto> dport . numgen : daddr . <proto>
/// dport`) or, with `source`, an affinity set (`saddr . [daddr .] <proto> dport . numgen`).
pub(super) fn typeof_udata(family: IpFamily, source: Option<()>, map: EndpointMap, is_map: bool) -> Vec<u8> {
    let (header, saddr, daddr) = match family {
        IpFamily::V4 => (12, 11, 12),
        IpFamily::V6 => (13, 8, 9),
    };
    let transport = match map.proto {
        Protocol::Tcp => 8,
        Protocol::Udp => 6,
        Protocol::Sctp => 10,
    };
    let dport = typeof_payload(transport, 2);
    let mut key = Vec::new();
    if source.is_some() {
        key.push(typeof_payload(header, saddr));
    }
    if map.space.keyed_by_address() {
        key.push(typeof_payload(header, daddr));
    }
    key.push(dport.clone());
    key.push(typeof_numgen());
    let mut out = Vec::new();
    tlv_u32(&mut out, 0, 0);
    if is_map {
        tlv_u32(&mut out, 1, 0);
    }
    tlv(&mut out, 3, &typeof_concat(&key));
    if is_map {
        tlv(
            &mut out,
            4,
            &typeof_concat(&[typeof_payload(header, daddr), dport]),
        );
        tlv_u32(&mut out, 6, 0);
    }
    out
}
