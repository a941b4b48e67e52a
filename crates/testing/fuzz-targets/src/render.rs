//! Target `render`: a structured cluster ([`Scenario`]) through the model, the trackers and
//! the iptables renderer, under varied options.
//!
//! Asserted: nothing panics; every rejection and dropped entry names its object and field;
//! the payload holds only the lines the renderer means to write; rendering is a pure
//! function (same bytes twice, with or without a warm name cache); and the payload does not
//! depend on the order the objects arrived in.
//!
//! When the scenario has a next state, the real iptables backend syncs both states in turn
//! into a [`ModelKernel`] (a full sync, then usually a partial one), and must leave exactly
//! the tables a single full sync of the next state leaves on a fresh node: a partial sync
//! that forgets a stale chain or rule, or jumps to a chain it did not write, is a finding.
//! Every payload of the sequence passes the same payload checks, and a third sync with
//! nothing changed must leave the tables as they are.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use arbitrary::{Arbitrary, Unstructured};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpr_host::{FixedAddresses, LocalDetector, NodePortAddresses};
use kpr_iptables::{IptablesBackend, IptablesOptions, NfacctCounters};
use kpr_model::text::InterfaceName;
use kpr_model::{IpFamily, NamespacedName};
use kpr_state::PendingSync;

use crate::kernel::{ModelKernel, Tables};
use crate::pipeline::{Pipeline, render_checked};
use crate::scenario::{
    BindChoice, Detector, NodePortChoice, OptionChoices, Scenario, ServiceInput, SliceInput, Threshold,
    primary_ip,
};

pub fn render(data: &[u8]) {
    render_payload(data);
}

/// The checks of [`render`]; returns the payload, or `None` when the bytes do not decode
/// to a scenario.
pub fn render_payload(data: &[u8]) -> Option<String> {
    let scenario = Scenario::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    Some(render_scenario(&scenario))
}

/// One state of the cluster, as the API would hold it: one object per identity.
struct Cluster {
    services: BTreeMap<NamespacedName, Service>,
    slices: BTreeMap<NamespacedName, EndpointSlice>,
}

impl Cluster {
    fn new(services: &[&ServiceInput], slices: &[&SliceInput], ipv6: bool) -> Self {
        // Slices name their Service by index into the Services of their own state.
        Self {
            services: services.iter().map(|s| (s.id(), s.to_api(ipv6))).collect(),
            slices: slices.iter().map(|s| s.to_api(services, ipv6)).collect(),
        }
    }

    /// Feeds every object, in key order or reversed.
    fn feed(&self, pipeline: &mut Pipeline, reversed: bool) {
        let mut services: Vec<_> = self.services.iter().collect();
        let mut slices: Vec<_> = self.slices.iter().collect();
        if reversed {
            services.reverse();
            slices.reverse();
            slices
                .iter()
                .for_each(|(id, s)| pipeline.slice((*id).clone(), Some(s)));
            services
                .iter()
                .for_each(|(id, s)| pipeline.service((*id).clone(), Some(s)));
        } else {
            services
                .iter()
                .for_each(|(id, s)| pipeline.service((*id).clone(), Some(s)));
            slices
                .iter()
                .for_each(|(id, s)| pipeline.slice((*id).clone(), Some(s)));
        }
    }

    /// Feeds what changed since `before`: deletions, then every object of this state (the
    /// trackers drop the ones that did not change).
    fn feed_since(&self, before: &Self, pipeline: &mut Pipeline) {
        for id in before
            .services
            .keys()
            .filter(|id| !self.services.contains_key(*id))
        {
            pipeline.service(id.clone(), None);
        }
        for id in before.slices.keys().filter(|id| !self.slices.contains_key(*id)) {
            pipeline.slice(id.clone(), None);
        }
        self.feed(pipeline, false);
    }
}

/// The checks of [`render`] on one decoded scenario; returns the payload of its first state.
pub fn render_scenario(scenario: &Scenario) -> String {
    let family = if scenario.ipv6 { IpFamily::V6 } else { IpFamily::V4 };
    let node = scenario.node.to_api(scenario.ipv6);
    let services: Vec<&ServiceInput> = scenario.services.iter().collect();
    let slices: Vec<&SliceInput> = scenario.slices.iter().collect();
    let first = Cluster::new(&services, &slices, scenario.ipv6);

    let mut forward = pipeline(family, &node);
    first.feed(&mut forward, false);
    let options = options(&scenario.options, family, forward.node_ips());
    let local = local_addresses(family, forward.node_ips());
    let text = render_checked(&forward.take(), &options, &local);

    let mut backward = pipeline(family, &node);
    first.feed(&mut backward, true);
    assert_eq!(
        render_checked(&backward.take(), &options, &local),
        text,
        "the payload depends on the order the objects arrived in"
    );

    if let Some(change) = &scenario.then {
        let kept = |mask: u64, i: usize| i >= 64 || mask & (1 << i) == 0;
        let services: Vec<&ServiceInput> = enumerate_kept(&scenario.services, change.drop_services, kept)
            .chain(&change.services)
            .collect();
        let slices: Vec<&SliceInput> = enumerate_kept(&scenario.slices, change.drop_slices, kept)
            .chain(&change.slices)
            .collect();
        let next = Cluster::new(&services, &slices, scenario.ipv6);
        sync_sequence(&first, &next, family, &node, &options, &local);
    }
    text
}

fn enumerate_kept<'a, T>(
    items: &'a [T],
    mask: u64,
    kept: impl Fn(u64, usize) -> bool + 'a,
) -> impl Iterator<Item = &'a T> + 'a {
    items
        .iter()
        .enumerate()
        .filter(move |(i, _)| kept(mask, *i))
        .map(|(_, item)| item)
}

fn pipeline(family: IpFamily, node: &Node) -> Pipeline {
    let mut pipeline = Pipeline::new(family);
    pipeline.node(Some(node));
    pipeline
}

/// `first` then `next` through one backend, against `next` alone through another: the
/// kernels must end up the same, and a sync without changes must change nothing.
fn sync_sequence(
    first: &Cluster,
    next: &Cluster,
    family: IpFamily,
    node: &Node,
    options: &IptablesOptions,
    local: &[IpAddr],
) {
    let mut updated = pipeline(family, node);
    first.feed(&mut updated, false);
    let (kernel, mut backend) = new_backend(options, local);
    sync(&mut backend, &updated.take_pending());
    next.feed_since(first, &mut updated);
    sync(&mut backend, &updated.take_pending());
    let after_update = kernel.tables();

    let mut fresh = pipeline(family, node);
    next.feed(&mut fresh, false);
    let (fresh_kernel, mut fresh_backend) = new_backend(options, local);
    sync(&mut fresh_backend, &fresh.take_pending());
    let what = "an update left other rules than a fresh sync";
    assert_tables_eq(&after_update, &fresh_kernel.tables(), what);

    sync(&mut backend, &updated.take_pending());
    let what = "a sync without changes changed the rules";
    assert_tables_eq(&after_update, &kernel.tables(), what);
}

fn new_backend(options: &IptablesOptions, local: &[IpAddr]) -> (ModelKernel, IptablesBackend) {
    let kernel = ModelKernel::default();
    let Ok(backend) = IptablesBackend::new(options.clone(), Box::new(kernel.clone())) else {
        panic!("options the target builds are valid: {options:?}");
    };
    let backend = backend.with_local_addresses(Box::new(FixedAddresses(local.to_vec())));
    (kernel, backend)
}

fn sync(backend: &mut IptablesBackend, pending: &PendingSync) {
    if let Err(error) = backend.sync_rules(&pending.request(false)) {
        panic!("sync into the model kernel failed: {error}");
    }
}

/// Panics with `what` and the differing chains unless both kernels hold the same rules.
pub fn assert_tables_eq(actual: &Tables, expected: &Tables, what: &str) {
    if actual == expected {
        return;
    }
    let mut differences = Vec::new();
    let keys: BTreeSet<_> = actual.keys().chain(expected.keys()).collect();
    for table in keys {
        let (a, e) = (actual.get(table), expected.get(table));
        let chains: BTreeSet<&String> = a.into_iter().chain(e).flat_map(|c| c.keys()).collect();
        for chain in chains {
            let (ra, re) = (a.and_then(|c| c.get(chain)), e.and_then(|c| c.get(chain)));
            if ra != re {
                differences.push(format!("{table} {chain}:\n  got      {ra:?}\n  expected {re:?}"));
            }
        }
    }
    panic!("{what}:\n{}", differences.join("\n"));
}

/// Options as flags could set them, for `family`; `node_ips` as the Node lists them.
fn options(choices: &OptionChoices, family: IpFamily, node_ips: &[IpAddr]) -> IptablesOptions {
    let ipv6 = family == IpFamily::V6;
    let primary = primary_ip(node_ips, ipv6);
    let net = |text: &str| text.parse::<IpNet>().into_iter().collect::<Vec<_>>();
    let interface = |name: &str, prefix: bool| {
        let checked = if prefix {
            InterfaceName::prefix(name)
        } else {
            InterfaceName::new(name)
        };
        checked.unwrap_or_else(|error| panic!("interface name {name:?}: {error}"))
    };
    let local_detector = match choices.detector {
        Detector::None => LocalDetector::None,
        Detector::ClusterCidr if ipv6 => LocalDetector::ClusterCidr(net("fd00:10:244::/56")),
        Detector::ClusterCidr => LocalDetector::ClusterCidr(net("10.244.0.0/16")),
        Detector::Bridge => LocalDetector::BridgeInterface(interface("cbr0", false)),
        Detector::InterfacePrefix => LocalDetector::InterfaceNamePrefix(interface("veth", true)),
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
    let bind_address = match choices.bind_address {
        BindChoice::Unset => None,
        BindChoice::Any if ipv6 => Some(IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED)),
        BindChoice::Any => Some(IpAddr::from(std::net::Ipv4Addr::UNSPECIFIED)),
        BindChoice::NodeIp => Some(primary),
    };
    IptablesOptions {
        family,
        masquerade_bit: choices.masquerade_bit % 32,
        masquerade_all: choices.masquerade_all,
        masquerade_random_fully: choices.random_fully,
        local_detector,
        localhost_nodeports: choices.localhost_nodeports,
        nodeport_addresses,
        bind_address,
        conntrack_tcp_be_liberal: choices.tcp_be_liberal,
        // Derived from a choice already decoded, so committed corpus inputs keep their meaning.
        nfacct: if choices.masquerade_bit.is_multiple_of(2) {
            NfacctCounters::ALL
        } else {
            NfacctCounters::default()
        },
        large_cluster_endpoints_threshold,
    }
}

/// The host's addresses of `family`: the Node's, or the fallback primary address.
fn local_addresses(family: IpFamily, node_ips: &[IpAddr]) -> Vec<IpAddr> {
    let mut local: Vec<IpAddr> = node_ips.iter().copied().filter(|ip| family.matches(ip)).collect();
    if local.is_empty() {
        local.push(primary_ip(node_ips, family == IpFamily::V6));
    }
    local
}
