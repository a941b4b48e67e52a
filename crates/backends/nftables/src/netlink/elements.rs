//! Set and map elements: a model element becomes one kernel element, or two for a CIDR in
//! an interval set, whose bytes are laid out as the set's key type says.

use std::net::IpAddr;

use ipnet::IpNet;
use kpr_naming::text::Comment;
use kpr_nfnetlink::{self as nl, Value};

use super::{addr, proto_number};
use crate::model::{ElemKey, ElemValue};

/// The address after the last one of `net`, or `None` past the top of the space.
fn after_last(net: &IpNet) -> Option<IpAddr> {
    match net {
        IpNet::V4(n) => u32::from(n.broadcast())
            .checked_add(1)
            .map(|a| IpAddr::V4(a.into())),
        IpNet::V6(n) => u128::from(n.broadcast())
            .checked_add(1)
            .map(|a| IpAddr::V6(a.into())),
    }
}

/// The kernel elements of one model element: one, or two for a CIDR in an interval set
/// (its start, and the interval end after its last address); a comment goes into the
/// element's user data as nft writes it.
pub(super) fn elements_of(
    key: &ElemKey,
    value: Option<&ElemValue>,
    comment: Option<&Comment>,
) -> Vec<nl::Element> {
    let mut elements = plain_elements_of(key, value);
    // The model keeps comments within nft's limit; one it could not write is left out.
    if let Some(userdata) = comment.and_then(|c| nl::comment_userdata(c.as_str())) {
        for element in &mut elements {
            element.userdata = userdata.clone();
        }
    }
    elements
}

fn plain_elements_of(key: &ElemKey, value: Option<&ElemValue>) -> Vec<nl::Element> {
    let bytes = match key {
        ElemKey::Addr(ip) => addr(Value::new(), *ip).build(),
        ElemKey::Net(net) => {
            let mut out = vec![nl::Element::key(addr(Value::new(), net.network()).build())];
            if let Some(end) = after_last(net) {
                out.push(nl::Element {
                    interval_end: true,
                    ..nl::Element::key(addr(Value::new(), end).build())
                });
            }
            return out;
        }
        ElemKey::AddrProtoPort(ip, proto, port) => addr(Value::new(), *ip)
            .proto(proto_number(*proto))
            .port(*port)
            .build(),
        ElemKey::ProtoPort(proto, port) => Value::new().proto(proto_number(*proto)).port(*port).build(),
        ElemKey::AddrProtoPortNet(ip, proto, port, net) => {
            let head = || addr(Value::new(), *ip).proto(proto_number(*proto)).port(*port);
            return vec![nl::Element::range(
                addr(head(), net.network()).build(),
                addr(head(), net.broadcast()).build(),
            )];
        }
        ElemKey::AddrPair(a, b) => addr(addr(Value::new(), *a), *b).build(),
        ElemKey::AddrPortSlot(ip, port, slot) => addr(Value::new(), *ip)
            .port(*port)
            .host_u32(u32::from(*slot))
            .build(),
        ElemKey::PortSlot(port, slot) => Value::new().port(*port).host_u32(u32::from(*slot)).build(),
    };
    let element = match value {
        None => nl::Element::key(bytes),
        Some(ElemValue::Endpoint(ep)) => {
            nl::Element::mapping(bytes, addr(Value::new(), ep.ip()).port(ep.port()).build())
        }
    };
    vec![element]
}

#[cfg(test)]
mod tests {
    use super::*;
    use nl::Data;

    #[test]
    fn a_cidr_is_a_start_and_an_interval_end_and_the_top_of_the_space_has_no_end() {
        let net: IpNet = "10.96.0.0/16".parse().unwrap();
        let elements = elements_of(&ElemKey::Net(net), None, None);
        assert_eq!(elements.len(), 2);
        assert_eq!(elements[0].key, vec![10, 96, 0, 0]);
        assert!(!elements[0].interval_end);
        assert_eq!(elements[1].key, vec![10, 97, 0, 0]);
        assert!(elements[1].interval_end);
        let top: IpNet = "255.255.255.0/24".parse().unwrap();
        assert_eq!(elements_of(&ElemKey::Net(top), None, None).len(), 1);
    }

    #[test]
    fn an_endpoint_element_is_vip_port_slot_to_endpoint() {
        let key = ElemKey::AddrPortSlot("10.96.0.10".parse().unwrap(), 80, 2);
        let value = ElemValue::Endpoint("10.244.1.5:8080".parse().unwrap());
        let elements = elements_of(&key, Some(&value), None);
        let mut expected_key = vec![10, 96, 0, 10, 0, 80, 0, 0];
        expected_key.extend_from_slice(&2u32.to_ne_bytes());
        assert_eq!(elements[0].key, expected_key);
        assert_eq!(
            elements[0].data,
            Some(Data::Value(vec![10, 244, 1, 5, 0x1f, 0x90, 0, 0]))
        );
    }
}
