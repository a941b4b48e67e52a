//! Property tests: whatever the names, ports, addresses and endpoint counts, the restore
//! payload holds exactly the lines the renderer meant to write, and iptables takes it.
//!
//! States are built directly from the model's types, bypassing the sources' validation on
//! purpose: names with newlines, quotes, tabs, unicode and hundreds of bytes must be stopped
//! by the renderer itself (kpr-naming's check), not only by the edge.
//!
//! (a) The payload, read back line by line with iptables-restore's own tokenizer rules,
//!     has only `*table`, `:CHAIN - [0:0]`, `-A <declared chain> ...`, `-X <chain>` and
//!     `COMMIT` lines, and each `-A` line's arguments are exactly the rule's, in order. A
//!     port whose name passes an independent oracle of the check is programmed (its cluster
//!     IP is matched, with its comment cut to 255 bytes); any other is left out and listed.
//! (b) `iptables-restore --test` accepts the payload, in a throw-away network namespace, for
//!     iptables-legacy and iptables-nft (32 cases each; a variant that does not work fails,
//!     unless `KPR_SKIP_IPTABLES_VARIANTS` names it). `--test` alone is weak (the nft
//!     variant does not even resolve jump targets), so each payload is then applied for
//!     real in a fresh namespace, and `iptables-save` must show as many rules per table as
//!     the payload wrote.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns may panic: that fails the test

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::Arc;

use common::{skip_requested, variant_name};
use ipnet::{IpNet, Ipv4Net};
use kpr_host::{LocalDetector, NodePortAddresses};
use kpr_iptables::restore_syntax::{looks_like_table_option, split_args};
use kpr_iptables::{IptablesOptions, Ruleset, Variant, build};
use kpr_model::text::InterfaceName;
use kpr_model::{
    Endpoint, Hints, NamespacedName, NodeView, Protocol, ServicePort, ServicePortName, ServiceType,
};
use kpr_naming::ServiceChains;
use kpr_netns::Netns;
use kpr_state::DesiredState;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

// === the state's building blocks ===

/// Names as hostile as a manifest can make them, and ordinary ones.
fn name_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z][a-z0-9-]{0,20}",
        2 => any::<String>(),
        2 => prop::sample::select(vec![
            "evil\n-A KUBE-SERVICES -j ACCEPT\n#",
            "a\"b",
            "a\\b",
            "-t",
            "-tnat",
            "--table",
            "",
            "x\ty",
            "a\rb",
            "a\u{0}b",
            "a\u{85}b",
            "ünï cödé",
            "名前",
            "#comment",
            "COMMIT",
            "*filter",
            "a b c",
            "\"",
        ])
        .prop_map(String::from),
        1 => "[a-zé名 ]{200,400}",
        1 => "[a-z ]{1,30}",
    ]
}

#[derive(Clone, Debug)]
struct PortSpec {
    namespace: String,
    name: String,
    port_name: String,
    protocol: Protocol,
    port: u16,
    node_port: Option<u16>,
    cluster_ip: Ipv4Addr,
    external_ips: Vec<Ipv4Addr>,
    load_balancer_ips: Vec<Ipv4Addr>,
    source_ranges: Vec<(Ipv4Addr, u8)>,
    affinity: Option<u32>,
    external_local: bool,
    internal_local: bool,
    health_check: Option<u16>,
    /// (port, local, ready, serving/terminating) per endpoint; addresses are made unique.
    endpoints: Vec<(u16, bool, bool, bool)>,
}

fn protocol(kernel: bool) -> impl Strategy<Value = Protocol> {
    // The kernel part leaves SCTP out: the throw-away namespace may lack its match module.
    if kernel {
        prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)].boxed()
    } else {
        prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp), Just(Protocol::Sctp)].boxed()
    }
}

fn port_spec(kernel: bool) -> impl Strategy<Value = PortSpec> {
    let names = (name_text(), name_text(), name_text());
    let numbers = (
        protocol(kernel),
        1..=u16::MAX,
        prop::option::of(1..=u16::MAX),
        any::<Ipv4Addr>(),
        prop::option::of(1..=86_400u32),
        prop::option::of(1..=u16::MAX),
    );
    let lists = (
        prop::collection::vec(any::<Ipv4Addr>(), 0..3),
        prop::collection::vec(any::<Ipv4Addr>(), 0..3),
        prop::collection::vec((any::<Ipv4Addr>(), 0..=32u8), 0..3),
    );
    let endpoints = prop::collection::vec((1..=u16::MAX, any::<bool>(), any::<bool>(), any::<bool>()), 0..6);
    (names, numbers, lists, endpoints, any::<bool>(), any::<bool>()).prop_map(
        |(
            (namespace, name, port_name),
            (protocol, port, node_port, cluster_ip, affinity, health_check),
            (external_ips, load_balancer_ips, source_ranges),
            endpoints,
            external_local,
            internal_local,
        )| PortSpec {
            namespace,
            name,
            port_name,
            protocol,
            port,
            node_port,
            cluster_ip,
            external_ips,
            load_balancer_ips,
            source_ranges,
            affinity,
            external_local,
            internal_local,
            health_check,
            endpoints,
        },
    )
}

#[derive(Clone, Debug)]
struct Case {
    ports: Vec<PortSpec>,
    masquerade_all: bool,
    detector: u8,
    localhost_nodeports: bool,
    nodeport_cidrs: bool,
    local_addresses: Vec<Ipv4Addr>,
    node_addresses: Vec<Ipv4Addr>,
    large_threshold: usize,
    tcp_be_liberal: bool,
}

fn case(kernel: bool) -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(port_spec(kernel), 1..5),
        (any::<bool>(), 0..4u8, any::<bool>(), any::<bool>()),
        (
            prop::collection::vec(any::<Ipv4Addr>(), 0..3),
            prop::collection::vec(any::<Ipv4Addr>(), 0..2),
        ),
        (0..12usize, any::<bool>()),
    )
        .prop_map(
            |(
                ports,
                (masquerade_all, detector, localhost_nodeports, nodeport_cidrs),
                (local_addresses, node_addresses),
                (large_threshold, tcp_be_liberal),
            )| Case {
                ports,
                masquerade_all,
                detector,
                localhost_nodeports,
                nodeport_cidrs,
                local_addresses,
                node_addresses,
                large_threshold,
                tcp_be_liberal,
            },
        )
}

impl PortSpec {
    fn port_name(&self) -> ServicePortName {
        ServicePortName::new(&self.namespace, &self.name, &self.port_name, self.protocol)
    }

    fn service_port(&self) -> ServicePort {
        let externally_reachable =
            self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty();
        let ip = |v: &Vec<Ipv4Addr>| v.iter().map(|a| IpAddr::V4(*a)).collect();
        ServicePort {
            name: self.port_name(),
            service_type: if self.load_balancer_ips.is_empty() {
                ServiceType::NodePort
            } else {
                ServiceType::LoadBalancer
            },
            cluster_ip: IpAddr::V4(self.cluster_ip),
            port: self.port,
            node_port: self.node_port,
            external_ips: ip(&self.external_ips),
            load_balancer_ips: ip(&self.load_balancer_ips),
            load_balancer_source_ranges: self
                .source_ranges
                .iter()
                .map(|(a, p)| IpNet::V4(Ipv4Net::new(*a, *p).unwrap().trunc()))
                .collect(),
            session_affinity_seconds: self.affinity,
            external_policy_local: self.external_local && externally_reachable,
            internal_policy_local: self.internal_local,
            health_check_node_port: self.health_check,
        }
    }

    /// Endpoints with addresses unique within the case (`10.<case index>.x.y`).
    fn endpoints(&self, index: usize) -> Vec<Endpoint> {
        self.endpoints
            .iter()
            .enumerate()
            .map(|(i, (port, local, ready, serving))| Endpoint {
                addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, index as u8, 0, i as u8 + 1)), *port),
                is_local: *local,
                ready: *ready,
                serving: *ready || *serving,
                terminating: !*ready && *serving,
                hints: Hints::default(),
            })
            .collect()
    }
}

impl Case {
    fn state(&self) -> DesiredState {
        let mut services: HashMap<NamespacedName, Vec<ServicePort>> = HashMap::new();
        let mut endpoints: HashMap<NamespacedName, BTreeMap<kpr_tracking::PortKey, Arc<[Endpoint]>>> =
            HashMap::new();
        for (i, spec) in self.ports.iter().enumerate() {
            let port = spec.service_port();
            let service = port.name.service.clone();
            let key = (port.name.port.clone(), port.name.protocol);
            endpoints
                .entry(service.clone())
                .or_default()
                .insert(key, Arc::from(spec.endpoints(i)));
            services.entry(service).or_default().push(port);
        }
        DesiredState {
            services: Arc::new(services.into_iter().map(|(k, v)| (k, Arc::from(v))).collect()),
            endpoints: Arc::new(
                endpoints
                    .into_iter()
                    .map(|(k, v)| (k, Arc::new(v.into_iter().collect())))
                    .collect(),
            ),
            node: Arc::new(NodeView {
                name: "node-a".into(),
                addresses: self.node_addresses.iter().map(|a| IpAddr::V4(*a)).collect(),
                ..NodeView::default()
            }),
            ..DesiredState::default()
        }
    }

    fn options(&self) -> IptablesOptions {
        let local_detector = match self.detector {
            0 => LocalDetector::None,
            1 => LocalDetector::ClusterCidr(vec!["10.0.0.0/8".parse().unwrap()]),
            2 => LocalDetector::BridgeInterface(InterfaceName::new("cbr0").unwrap()),
            _ => LocalDetector::InterfaceNamePrefix(InterfaceName::prefix("veth").unwrap()),
        };
        IptablesOptions {
            masquerade_all: self.masquerade_all,
            local_detector,
            localhost_nodeports: self.localhost_nodeports,
            nodeport_addresses: if self.nodeport_cidrs {
                NodePortAddresses::Cidrs(vec!["0.0.0.0/1".parse().unwrap(), "127.0.0.0/8".parse().unwrap()])
            } else {
                NodePortAddresses::All
            },
            large_cluster_endpoints_threshold: self.large_threshold,
            conntrack_tcp_be_liberal: self.tcp_be_liberal,
            ..IptablesOptions::default()
        }
    }

    fn local_addresses(&self) -> Vec<IpAddr> {
        self.local_addresses.iter().map(|a| IpAddr::V4(*a)).collect()
    }

    /// The ruleset and its full restore payload.
    fn render(&self) -> (Ruleset, String) {
        let ruleset = build(&self.state(), &self.options(), &self.local_addresses());
        let text = ruleset.render_full().text;
        (ruleset, text)
    }
}

// === iptables-restore, as it reads its input ===

/// The oracle: what kpr-naming's check must refuse, written independently of it.
fn is_safe_text(text: &str) -> bool {
    !text.is_empty()
        && !text.starts_with('-')
        && !text.chars().any(|c| c.is_control() || c == '"' || c == '\\')
}

fn cut_to_comment(text: &str) -> &str {
    let mut end = text.len().min(255);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Property (a): see the module doc.
fn check_payload(case: &Case, ruleset: &Ruleset, payload: &str) -> Result<(), TestCaseError> {
    // What the renderer meant: every line, as arguments, in payload order.
    let mut meant: Vec<Vec<String>> = Vec::new();
    for table in ruleset.tables() {
        meant.push(vec![format!("*{}", table.table)]);
        for chain in table.chains() {
            meant.push(vec![format!(":{}", chain.name), "-".into(), "[0:0]".into()]);
        }
        for chain in table.chains() {
            for rule in &chain.rules {
                let mut line = vec!["-A".to_string(), chain.name.to_string()];
                line.extend(rule.args().map(str::to_string));
                meant.push(line);
            }
        }
        meant.push(vec!["COMMIT".into()]);
    }
    prop_assert!(payload.ends_with('\n'));
    let lines: Vec<&str> = payload.lines().collect();
    prop_assert_eq!(lines.len(), meant.len(), "one line per meant line");
    let mut declared: HashSet<String> = HashSet::new();
    for (line, meant) in lines.iter().zip(&meant) {
        prop_assert!(line.len() < 4096, "line of {} bytes", line.len());
        let args = split_args(line).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&args, meant, "line {:?}", line);
        let first = args[0].as_str();
        match first {
            "COMMIT" => {
                prop_assert_eq!(args.len(), 1);
                declared.clear();
            }
            "-A" => {
                prop_assert!(declared.contains(&args[1]), "-A to undeclared chain {}", args[1]);
                for arg in &args[2..] {
                    prop_assert!(!arg.is_empty() && arg.len() < 1024, "argument {:?}", arg);
                    prop_assert!(!looks_like_table_option(arg), "argument {:?}", arg);
                }
                prop_assert!(args.len() < 255);
                if let Some(at) = args.iter().position(|a| a == "--comment") {
                    prop_assert!(
                        args[at + 1].len() <= 255,
                        "comment of {} bytes",
                        args[at + 1].len()
                    );
                }
            }
            _ if first.starts_with('*') => {
                prop_assert!(first == "*filter" || first == "*nat", "{}", first);
            }
            _ if first.starts_with(':') => {
                prop_assert_eq!(args.len(), 3);
                let name = &first[1..];
                prop_assert!(
                    name.len() <= 28 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
                    "chain {:?}",
                    name
                );
                declared.insert(name.to_string());
            }
            _ => prop_assert!(false, "unexpected line {:?}", line),
        }
    }
    check_ports(case, ruleset, &lines)
}

/// Every port the oracle finds safe is programmed; every other one is left out and listed.
fn check_ports(case: &Case, ruleset: &Ruleset, lines: &[&str]) -> Result<(), TestCaseError> {
    let refused: HashSet<&ServicePortName> = ruleset.refused.iter().map(|r| &r.port).collect();
    let parsed: Vec<Vec<String>> = lines.iter().map(|l| split_args(l).unwrap()).collect();
    for spec in &case.ports {
        let name = spec.port_name();
        let svc = name.to_string();
        let chains = ServiceChains::new(&name);
        if !is_safe_text(&svc) {
            prop_assert!(refused.contains(&name), "{:?} not refused", svc);
            for chain in [&chains.cluster, &chains.local, &chains.external, &chains.firewall] {
                prop_assert!(
                    lines.iter().all(|l| !l.contains(chain.as_str())),
                    "chain of refused {:?} written",
                    svc
                );
            }
            continue;
        }
        prop_assert!(!refused.contains(&name), "{:?} refused", svc);
        let dest = spec.cluster_ip.to_string();
        let dport = spec.port.to_string();
        // Captured with an endpoint chain, or REJECTed/DROPped, and named in the comment.
        let comments: Vec<String> = [" cluster IP", " has no endpoints", " has no local endpoints"]
            .iter()
            .map(|suffix| cut_to_comment(&format!("{svc}{suffix}")).to_string())
            .collect();
        let has =
            |args: &[String], flag: &str, value: &str| args.windows(2).any(|w| w[0] == flag && w[1] == value);
        let captured = parsed.iter().any(|args| {
            args.get(1).map(String::as_str) == Some("KUBE-SERVICES")
                && has(args, "-d", &dest)
                && has(args, "--dport", &dport)
                && comments.iter().any(|c| has(args, "--comment", c))
        });
        prop_assert!(captured, "cluster IP of {:?} not captured", svc);
    }
    Ok(())
}

// === the properties ===

/// Random cases on every run; a failure prints its minimal input (nothing is written into
/// the source tree).
fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn payload_has_only_the_lines_the_renderer_meant(case in case(false)) {
        let (ruleset, payload) = case.render();
        check_payload(&case, &ruleset, &payload)?;
    }
}

/// Runs this variant's `iptables-restore <args>` inside `netns` with `payload` as input.
fn restore(netns: &Netns, variant: Variant, args: &[&str], payload: &str) -> Result<(), String> {
    let program = format!("iptables-{}-restore", variant_name(variant));
    let mut child = netns
        .command(&program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(payload.as_bytes())
        .map_err(|e| format!("writing to {program}: {e}"))?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?} refused the payload ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// `-A` lines per table in `text` (restore input or `iptables-save` output).
fn rules_per_table(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut table = String::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
        } else if line.starts_with("-A ") {
            *counts.entry(table.clone()).or_insert(0) += 1;
        }
    }
    counts
}

/// Property (b) for one payload: `--test`, then a real restore into a fresh namespace
/// holding nothing else, read back with `iptables-save`.
fn kernel_takes(variant: Variant, payload: &str) -> Result<(), String> {
    let netns =
        Netns::new("iptprop").map_err(|e| format!("creating a network namespace (needs root): {e}"))?;
    restore(&netns, variant, &["--test", "--noflush"], payload)?;
    restore(&netns, variant, &["--noflush"], payload)?;
    let save = format!("iptables-{}-save", variant_name(variant));
    let out = netns
        .command(&save)
        .output()
        .map_err(|e| format!("{save}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{save} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let saved = rules_per_table(&String::from_utf8_lossy(&out.stdout));
    let written = rules_per_table(payload);
    for (table, count) in &written {
        let held = saved.get(table).copied().unwrap_or(0);
        if held != *count {
            return Err(format!(
                "table {table}: wrote {count} rules, the kernel holds {held}"
            ));
        }
    }
    Ok(())
}

/// Property (b) for one variant: 32 cases.
fn kernel_accepts_every_payload(variant: Variant) {
    if skip_requested(variant) {
        return;
    }
    let mut runner = TestRunner::new(config(32));
    let result = runner.run(&case(true), |case| {
        let (_, payload) = case.render();
        kernel_takes(variant, &payload).map_err(TestCaseError::fail)
    });
    if let Err(failure) = result {
        panic!("iptables-{} refused a payload: {failure}", variant_name(variant));
    }
}

#[test]
fn iptables_legacy_accepts_every_payload() {
    kernel_accepts_every_payload(Variant::Legacy);
}

#[test]
fn iptables_nft_accepts_every_payload() {
    kernel_accepts_every_payload(Variant::Nft);
}

/// kpr-iptables' reader splits lines as iptables-restore does: spot checks of the cases
/// this test relies on.
#[test]
fn tokenizer_reads_like_iptables_restore() {
    assert_eq!(
        split_args(r#"-A C -m comment --comment "a b" -j X"#).unwrap(),
        ["-A", "C", "-m", "comment", "--comment", "a b", "-j", "X"]
    );
    assert_eq!(split_args(r#""a\"b""#).unwrap(), [r#"a"b"#]);
    assert_eq!(
        split_args(r#""ab"cd"#).unwrap(),
        ["ab", "cd"],
        "a closing quote ends the argument"
    );
    assert_eq!(split_args("a\tb  c").unwrap(), ["a", "b", "c"]);
    assert!(split_args(r#""open"#).is_err());
    assert!(looks_like_table_option("-t"));
    assert!(looks_like_table_option("-tnat"));
    assert!(looks_like_table_option("--ta"));
    assert!(!looks_like_table_option("--to-destination"));
    assert!(!looks_like_table_option("-m"));
    assert!(!looks_like_table_option("--set"));
}

/// The issue's example: a Service named with newlines is left out, and nothing of it
/// reaches the payload.
#[test]
fn the_issue_example_cannot_add_a_rule() {
    let spec = PortSpec {
        namespace: "default".into(),
        name: "evil\n-A KUBE-SERVICES -j ACCEPT\n#".into(),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
        port: 80,
        node_port: None,
        cluster_ip: Ipv4Addr::new(10, 96, 0, 66),
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        source_ranges: Vec::new(),
        affinity: None,
        external_local: false,
        internal_local: false,
        health_check: None,
        endpoints: vec![(8080, false, true, true)],
    };
    let mut good = spec.clone();
    good.name = "web".into();
    good.cluster_ip = Ipv4Addr::new(10, 96, 0, 10);
    let case = Case {
        ports: vec![spec, good],
        masquerade_all: false,
        detector: 1,
        localhost_nodeports: true,
        nodeport_cidrs: false,
        local_addresses: Vec::new(),
        node_addresses: Vec::new(),
        large_threshold: 1000,
        tcp_be_liberal: false,
    };
    let (ruleset, payload) = case.render();
    assert!(!payload.contains("-A KUBE-SERVICES -j ACCEPT"), "{payload}");
    assert!(!payload.contains("10.96.0.66"), "{payload}");
    assert!(payload.contains("default/web:http cluster IP"), "{payload}");
    assert_eq!(ruleset.refused.len(), 1);
    assert_eq!(ruleset.refused[0].field, "metadata.name");
    check_payload(&case, &ruleset, &payload).unwrap();
}
