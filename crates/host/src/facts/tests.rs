use super::*;
use crate::node::NodeIps;

/// A node whose Node object lists `addresses`, with `pod_cidrs`.
fn node(addresses: &[&str], pod_cidrs: &[&str]) -> NodeFacts {
    let raw: Vec<IpAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    NodeFacts {
        name: "node1".into(),
        ips: NodeIps::detect(&raw, "0.0.0.0"),
        pod_cidrs: pod_cidrs.iter().map(|c| c.parse().unwrap()).collect(),
    }
}

fn unknown_node() -> NodeFacts {
    node(&[], &[])
}

fn settings(args: &[&str]) -> Settings {
    let mut all = vec!["kube-proxy-rs", "--manifests=x"];
    all.extend_from_slice(args);
    kpr_config::load(all).unwrap()
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// A sysctl tree with only nf_conntrack_tcp_be_liberal, set to `value`.
fn sysctl_tree(value: &str) -> (tempfile::TempDir, ProcSysctl) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(crate::sysctl::TCP_BE_LIBERAL);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, format!("{value}\n")).unwrap();
    let sysctl = ProcSysctl::at(dir.path());
    (dir, sysctl)
}

fn facts(args: &[&str], node: &NodeFacts) -> Result<HostFacts, InvalidSetting> {
    let (_dir, sysctl) = sysctl_tree("0");
    HostFacts::read_with(&settings(args), node, &sysctl)
}

#[test]
fn nodeport_addresses_from_config() {
    let unknown = unknown_node();
    assert_eq!(nodeport_addresses(&[], &unknown).unwrap(), NodePortAddresses::All);
    let cidrs = nodeport_addresses(&["192.168.0.0/16".to_string()], &unknown).unwrap();
    assert_eq!(cidrs, NodePortAddresses::Cidrs(vec![net("192.168.0.0/16")]));
    let bad = nodeport_addresses(&["eth0".to_string()], &unknown).unwrap_err();
    assert!(
        bad.0
            .starts_with("nodePortAddresses: \"eth0\" is neither a CIDR nor a keyword"),
        "{bad}"
    );
}

/// Upstream rewrites `primary` into the node IPs: /32 and /128 of those known.
#[test]
fn primary_nodeport_addresses_are_the_node_ips() {
    let primary = ["primary".to_string()];
    let dual = node(&["192.168.77.1", "fd00:77::1"], &[]);
    assert_eq!(
        nodeport_addresses(&primary, &dual).unwrap(),
        NodePortAddresses::Cidrs(vec![net("192.168.77.1/32"), net("fd00:77::1/128")])
    );
    assert_eq!(
        nodeport_addresses(&primary, &unknown_node()).unwrap(),
        NodePortAddresses::All,
        "no node IP known: every address, as upstream's empty list"
    );
}

/// 1.37's keywords, mixed with each other and with CIDRs.
#[test]
fn keywords_expand_as_upstream_and_mix_with_cidrs() {
    let entries = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let dual = node(&["192.168.77.1", "fd00:77::1"], &[]);
    let cidrs = |list: &[&str]| NodePortAddresses::Cidrs(list.iter().map(|c| net(c)).collect());
    assert_eq!(
        nodeport_addresses(&entries(&["primary", "localhost"]), &dual).unwrap(),
        cidrs(&["192.168.77.1/32", "fd00:77::1/128", "127.0.0.0/8", "::1/128"])
    );
    assert_eq!(
        nodeport_addresses(&entries(&["all", "10.0.0.0/8"]), &dual).unwrap(),
        cidrs(&["0.0.0.0/0", "::/0", "10.0.0.0/8"])
    );
    let v4 = node(&["192.168.77.1"], &[]);
    let mixed = nodeport_addresses(&entries(&["primary", "localhost"]), &v4).unwrap();
    assert!(mixed.contains_explicit_loopback(kpr_model::IpFamily::V4));
    assert!(
        !nodeport_addresses(&entries(&["all"]), &v4)
            .unwrap()
            .contains_explicit_loopback(kpr_model::IpFamily::V4)
    );
}

/// NodeCIDR: the detector is the node's pod CIDRs; none: no detection.
#[test]
fn node_cidr_mode_detects_pods_by_the_nodes_pod_cidrs() {
    let dual = node(&["192.168.77.1"], &["10.244.1.0/24", "fd00:10:244:1::/64"]);
    let detector = facts(&["--detect-local-mode=NodeCIDR"], &dual)
        .unwrap()
        .local_detector;
    assert_eq!(
        detector,
        LocalDetector::ClusterCidr(vec![net("10.244.1.0/24"), net("fd00:10:244:1::/64")])
    );
    let none = facts(&["--detect-local-mode=NodeCIDR"], &unknown_node()).unwrap();
    assert_eq!(none.local_detector, LocalDetector::None);
}

#[test]
fn cluster_cidr_mode_uses_the_cluster_cidrs() {
    let with = facts(&["--cluster-cidr=10.244.0.0/16"], &unknown_node()).unwrap();
    assert_eq!(
        with.local_detector,
        LocalDetector::ClusterCidr(vec![net("10.244.0.0/16")])
    );
    let without = facts(&[], &unknown_node()).unwrap();
    assert_eq!(without.local_detector, LocalDetector::None);
}

#[test]
fn detect_local_interfaces_become_checked_names() {
    let prefix = facts(
        &[
            "--detect-local-mode=InterfaceNamePrefix",
            "--pod-interface-name-prefix=veth",
        ],
        &unknown_node(),
    )
    .unwrap();
    assert_eq!(
        prefix.local_detector,
        LocalDetector::InterfaceNamePrefix(InterfaceName::prefix("veth").unwrap())
    );
    let bad = interface("detectLocal.bridgeInterface", "br\n0", InterfaceName::new).unwrap_err();
    assert!(bad.0.contains("detectLocal.bridgeInterface"), "{bad}");
}

#[test]
fn unspecified_bind_address_is_no_node_ip() {
    assert_eq!(specific_address("0.0.0.0"), None);
    assert_eq!(specific_address("::"), None);
    assert_eq!(specific_address("10.0.0.1"), Some("10.0.0.1".parse().unwrap()));
    let facts = facts(&["--bind-address=192.168.0.10"], &unknown_node()).unwrap();
    assert_eq!(facts.bind_address, Some("192.168.0.10".parse().unwrap()));
}

/// The INVALID drop goes when the config or the kernel makes conntrack liberal.
#[test]
fn tcp_be_liberal_comes_from_the_config_or_the_kernel() {
    let (_off_dir, off) = sysctl_tree("0");
    let (_on_dir, on) = sysctl_tree("1");
    let liberal = |args: &[&str], sysctl: &ProcSysctl| {
        HostFacts::read_with(&settings(args), &unknown_node(), sysctl)
            .unwrap()
            .conntrack_tcp_be_liberal
    };
    assert!(!liberal(&[], &off));
    assert!(liberal(&["--conntrack-tcp-be-liberal"], &off));
    assert!(liberal(&[], &on), "the kernel's setting, as upstream reads it");
}
