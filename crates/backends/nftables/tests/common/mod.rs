//! Test support: golden-file comparison and the service shapes the tests share.
//! Desired states come from kpr-world (the real conversions and trackers).

#![allow(dead_code)]

use std::path::PathBuf;

use kpr_host::LocalDetector;
use kpr_nftables::NftablesOptions;
use kpr_world::World;
use serde_json::{Value, json};

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with `tests/golden/<name>.nft` (see [`kpr_world::golden`]).
pub fn check_golden(name: &str, actual: &str) {
    kpr_world::golden::check(&golden_dir().join(format!("{name}.nft")), actual);
}

/// Options as a typical cluster runs: pods detected by the cluster CIDR, one Service CIDR.
pub fn options() -> NftablesOptions {
    NftablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec!["10.244.0.0/16".parse().unwrap()]),
        service_cidrs: vec!["10.96.0.0/16".parse().unwrap(), "fd00:96::/112".parse().unwrap()],
        ..NftablesOptions::default()
    }
}

pub fn clusterip(ip: &str, ports: Value) -> Value {
    json!({"type": "ClusterIP", "clusterIP": ip, "ports": ports})
}

pub fn http_port() -> Value {
    json!([{"name": "http", "port": 80, "targetPort": 8080}])
}

pub fn http_slice_port() -> Value {
    json!([{"name": "http", "port": 8080}])
}

/// Service `web` (ClusterIP 10.96.0.10, port `http` 80 -> 8080) with these endpoints.
pub fn web(endpoints: Vec<Value>) -> World {
    let mut world = World::new();
    world
        .service("web", clusterip("10.96.0.10", http_port()))
        .slice("web", http_slice_port(), endpoints);
    world
}

/// `web` as a NodePort Service (NodePort 30080) with extra spec fields.
pub fn nodeport_web(extra: Value) -> Value {
    let mut spec = json!({"type": "NodePort", "clusterIP": "10.96.0.10",
           "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    spec
}

/// Which transport a kernel test drives: `nft -f` (the oracle) or netlink (what the proxy
/// runs). Kernel and traffic tests run through both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Nft,
    Netlink,
}

/// A transport into `netns` (the netlink socket is opened inside it and stays there).
pub fn transport(
    netns: &kpr_netns::Netns,
    via: Via,
    affinity_capacity: u32,
) -> Box<dyn kpr_nftables::Transport> {
    match via {
        Via::Nft => Box::new(kpr_nftables::NftCli::new(affinity_capacity).with_prefix(&[
            "ip",
            "netns",
            "exec",
            netns.name(),
        ])),
        Via::Netlink => {
            Box::new(netns.run(|| kpr_nftables::NetlinkTransport::open(affinity_capacity).unwrap()))
        }
    }
}

/// Makes each named `fn(Via)` two tests, `<name>::nft` and `<name>::netlink`.
#[allow(unused_macros)] // golden and update tests share this module without kernel tests
macro_rules! through_both_transports {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn nft() {
                    super::$name(super::common::Via::Nft)
                }
                #[test]
                fn netlink() {
                    super::$name(super::common::Via::Netlink)
                }
            }
        )*
    };
}
