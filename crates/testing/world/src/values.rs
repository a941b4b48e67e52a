//! Single converted values, for the pure decisions that take them one at a time.

use kpr_model::{
    Endpoint, IpFamily, NodeView, ServicePort, ServiceView, node_view as convert_node, service_view,
    slice_view,
};
use serde_json::{Value, json};

use crate::objects::address_type;
use crate::{NODE, ep, node_object, service_object, slice_object};

/// The target port of every endpoint [`endpoint`] makes.
pub const ENDPOINT_PORT: u16 = 80;

/// The first port of Service `default/<name>` with `spec` (IPv4), as kpr-model converts it.
pub fn service_port(name: &str, spec: Value) -> ServicePort {
    let service = service_object(name, spec);
    let converted = service_view(&service, IpFamily::V4)
        .unwrap_or_else(|rejection| panic!("the test's Service is rejected: {rejection}"));
    match converted.view {
        ServiceView::Proxied(mut ports) => ports.remove(0),
        ServiceView::Skipped(why) => panic!("the test's Service is not proxied: {why:?}"),
    }
}

/// One endpoint from the [`ep`] shorthand on port [`ENDPOINT_PORT`], as a slice of its
/// address family converts it for the proxy on [`NODE`].
pub fn endpoint(spec: &str) -> Endpoint {
    let endpoint = ep(spec);
    let address = endpoint["addresses"][0].as_str().unwrap_or_default();
    let family = match address.parse::<std::net::IpAddr>() {
        Ok(ip) => IpFamily::of(&ip),
        Err(_) => panic!("the endpoint shorthand {spec:?} does not start with an IP address"),
    };
    let ports = json!([{"name": "p", "port": ENDPOINT_PORT}]);
    let slice = slice_object("s-1", "s", address_type(family), ports, vec![endpoint]);
    let converted = slice_view(&slice, family)
        .unwrap_or_else(|rejection| panic!("the test's slice is rejected: {rejection}"));
    assert!(
        converted.ignored.is_empty(),
        "the conversion dropped the test's endpoint {spec:?}: {:?}",
        converted.ignored
    );
    let view = converted
        .view
        .expect("a slice of the address's own family is used");
    Endpoint::new(&view.addresses[0], ENDPOINT_PORT, NODE)
}

/// The proxy's Node ([`NODE`]) as kpr-model converts it, in `zone` if one is given.
pub fn node_view(zone: Option<&str>) -> NodeView {
    convert_node(&node_object(zone))
        .unwrap_or_else(|rejection| panic!("the test's Node is rejected: {rejection}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_what_the_slice_conversion_makes_of_the_shorthand() {
        let e = endpoint("10.0.0.1 serving terminating local hint-zone=z1 hint-node=node-b");
        assert_eq!(e.addr, "10.0.0.1:80".parse().unwrap());
        assert!(e.is_local && e.serving && e.terminating && !e.ready);
        assert_eq!(e.hints.zones(), [std::sync::Arc::from("z1")]);
        assert_eq!(e.hints.nodes(), [std::sync::Arc::from("node-b")]);
        let v6 = endpoint("fd00::1");
        assert_eq!(v6.addr, "[fd00::1]:80".parse().unwrap());
        assert!(!v6.is_local && v6.ready);
    }

    #[test]
    #[should_panic(expected = "dropped the test's endpoint")]
    fn an_endpoint_the_conversion_drops_fails_the_test() {
        endpoint("127.0.0.1");
    }

    #[test]
    fn a_service_port_and_the_node_are_converted() {
        let port = service_port(
            "s",
            json!({"clusterIP": "10.0.0.1", "ports": [{"name": "p", "port": 80}]}),
        );
        assert_eq!(port.name.to_string(), "default/s:p");
        assert_eq!(node_view(Some("z1")).zone(), Some("z1"));
        assert_eq!(node_view(None).name, NODE);
    }
}
