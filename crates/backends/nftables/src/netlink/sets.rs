//! Set and map declarations, as [`crate::render::set_body`] spells them for nft: the key
//! and data types decide how the kernel compares elements, so they must be those nft
//! would declare, or `nft list` and the text transport would disagree with this one.

use kpr_model::IpFamily;
use kpr_nfnetlink::{Field, Set, SetData};

use super::udata::typeof_udata;
use crate::names::{EndpointMap, EntryKind, SetName};

fn addr_field(family: IpFamily) -> Field {
    match family {
        IpFamily::V4 => Field::Ipv4Addr,
        IpFamily::V6 => Field::Ipv6Addr,
    }
}

/// A set's declaration, as [`crate::render::set_body`] spells it for nft.
pub(super) fn set_of(family: IpFamily, set: SetName, affinity_capacity: u32) -> Set {
    let a = addr_field(family);
    let name = set.to_string();
    let (proto, port) = (Field::InetProto, Field::InetService);
    match set {
        SetName::ClusterIps | SetName::NodePortIps => Set::new(name, vec![a]),
        SetName::ServiceCidrs => Set {
            interval: true,
            ..Set::new(name, vec![a])
        },
        SetName::Entries { kind, .. } | SetName::NoEndpoint { kind, .. } => match kind {
            EntryKind::Address => Set::new(name, vec![a, proto, port]),
            EntryKind::NodePort => Set::new(name, vec![proto, port]),
        },
        SetName::FirewallIps => Set::new(name, vec![a, proto, port]),
        SetName::LocalhostNodePorts => Set::new(name, vec![proto, port]),
        SetName::FirewallAllow => Set {
            interval: true,
            ..Set::new(name, vec![a, proto, port, a])
        },
        SetName::Hairpin => Set::new(name, vec![a, a]),
        SetName::Endpoints(choice) => {
            let map = choice.map;
            let mut key = endpoint_key_fields(family, map);
            key.push(SLOT);
            Set {
                userdata: typeof_udata(family, None, map, true),
                ..Set::map(name, key, SetData::Value(vec![a, port]))
            }
        }
        SetName::Affinity(map) => {
            let mut key = vec![a];
            key.extend(endpoint_key_fields(family, map));
            key.push(SLOT);
            Set {
                dynamic: true,
                timeouts: true,
                size: Some(affinity_capacity),
                userdata: typeof_udata(family, Some(()), map, false),
                ..Set::new(name, key)
            }
        }
    }
}

/// An endpoint slot: nft's `numgen` type (an integer of 4 bytes, host order).
const SLOT: Field = Field::Integer { bytes: 4 };

fn endpoint_key_fields(family: IpFamily, map: EndpointMap) -> Vec<Field> {
    if map.space.keyed_by_address() {
        vec![addr_field(family), Field::InetService]
    } else {
        vec![Field::InetService]
    }
}
