//! Target `render`: a structured cluster ([`Scenario`]) through the model, the trackers and
//! the iptables renderer, under varied options.
//!
//! Asserted: nothing panics; every rejection and dropped entry names its object and field;
//! the payload holds only the lines the renderer means to write; rendering is a pure
//! function (same bytes twice, with or without a warm name cache); and the payload does not
//! depend on the order the objects arrived in.

use std::collections::BTreeMap;
use std::net::IpAddr;

use arbitrary::{Arbitrary, Unstructured};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_iptables::{IptablesOptions, LocalDetector, NodePortAddresses};
use kpr_model::{IpFamily, NamespacedName};

use crate::pipeline::{Pipeline, render_checked};
use crate::scenario::{Detector, NodePortChoice, OptionChoices, Scenario, Threshold, primary_ip};

pub fn render(data: &[u8]) {
    render_payload(data);
}

/// The checks of [`render`]; returns the payload, or `None` when the bytes do not decode
/// to a scenario.
pub fn render_payload(data: &[u8]) -> Option<String> {
    let scenario = Scenario::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(render_scenario(&scenario))
}

/// The checks of [`render`] on one decoded scenario; returns the payload.
pub fn render_scenario(scenario: &Scenario) -> String {
    let family = if scenario.ipv6 { IpFamily::V6 } else { IpFamily::V4 };
    let node = scenario.node.to_api(scenario.ipv6);
    // The API holds one object per identity: the last one given wins.
    let services: BTreeMap<NamespacedName, Service> = scenario
        .services
        .iter()
        .map(|s| (s.id(), s.to_api(scenario.ipv6)))
        .collect();
    let slices: BTreeMap<NamespacedName, EndpointSlice> = scenario
        .slices
        .iter()
        .map(|s| s.to_api(&scenario.services, scenario.ipv6))
        .collect();

    let mut forward = Pipeline::new(family);
    forward.node(Some(&node));
    services
        .iter()
        .for_each(|(id, s)| forward.service(id.clone(), Some(s)));
    slices
        .iter()
        .for_each(|(id, s)| forward.slice(id.clone(), Some(s)));
    let options = options(&scenario.options, family, forward.node_ips());
    let text = render_checked(&forward.take(), &options);

    let mut backward = Pipeline::new(family);
    slices
        .iter()
        .rev()
        .for_each(|(id, s)| backward.slice(id.clone(), Some(s)));
    services
        .iter()
        .rev()
        .for_each(|(id, s)| backward.service(id.clone(), Some(s)));
    backward.node(Some(&node));
    assert_eq!(
        render_checked(&backward.take(), &options),
        text,
        "the payload depends on the order the objects arrived in"
    );
    text
}

/// Options as flags could set them, for `family`; `node_ips` as the Node lists them.
fn options(choices: &OptionChoices, family: IpFamily, node_ips: &[IpAddr]) -> IptablesOptions {
    let ipv6 = family == IpFamily::V6;
    let primary = primary_ip(node_ips, ipv6);
    let net = |text: &str| text.parse::<IpNet>().into_iter().collect::<Vec<_>>();
    let local_detector = match choices.detector {
        Detector::None => LocalDetector::None,
        Detector::ClusterCidr if ipv6 => LocalDetector::ClusterCidr(net("fd00:10:244::/56")),
        Detector::ClusterCidr => LocalDetector::ClusterCidr(net("10.244.0.0/16")),
        Detector::Bridge => LocalDetector::BridgeInterface("cbr0".to_owned()),
        Detector::InterfacePrefix => LocalDetector::InterfaceNamePrefix("veth".to_owned()),
    };
    let nodeport_addresses = match choices.nodeport_addresses {
        NodePortChoice::All => NodePortAddresses::All,
        NodePortChoice::NodeIp => NodePortAddresses::Cidrs(vec![IpNet::from(primary)]),
        NodePortChoice::Loopback => {
            NodePortAddresses::Cidrs(net(if ipv6 { "::1/128" } else { "127.0.0.0/8" }))
        }
        NodePortChoice::Elsewhere => {
            NodePortAddresses::Cidrs(net(if ipv6 { "2001:db8::/64" } else { "203.0.113.0/24" }))
        }
    };
    let large_cluster_endpoints_threshold = match choices.large_cluster_threshold {
        Threshold::Default => IptablesOptions::default().large_cluster_endpoints_threshold,
        Threshold::Small(n) => usize::from(n % 8),
    };
    let mut node_ips: Vec<IpAddr> = node_ips.iter().copied().filter(|ip| family.matches(ip)).collect();
    if node_ips.is_empty() {
        node_ips.push(primary);
    }
    IptablesOptions {
        family,
        masquerade_bit: choices.masquerade_bit % 32,
        masquerade_all: choices.masquerade_all,
        masquerade_random_fully: choices.random_fully,
        local_detector,
        localhost_nodeports: choices.localhost_nodeports,
        nodeport_addresses,
        node_ips,
        large_cluster_endpoints_threshold,
    }
}
