//! The ipvs mode's sync cost beside the iptables mode's, in the same throw-away guest with
//! Debian's kernel (this host has no IPVS): N Services x E endpoints, the first (full) sync
//! and one endpoint change (partial), with what each wrote to the kernel. Times under
//! emulation mean little alone; the two modes in the same guest compare.
//!
//! `cargo run --release -p kpr-ipvs --example vm_bench -- [--services 1000,10000] [--endpoints 10]
//! [--iptables-services 1000]` prints a markdown table (BENCHMARKS.md's ipvs section). Needs
//! root and qemu (kpr-vm). The iptables mode runs only at the `--iptables-services` sizes:
//! its 10k load alone outlasts half an hour under emulation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kpr_host::{LocalDetector, NodePortAddresses};
use kpr_iptables::{IptablesBackend, IptablesCli, IptablesOptions, Variant};
use kpr_ipvs::rules::RuleOptions;
use kpr_ipvs::{IpsetNetlink, IpvsBackend, IpvsOptions};
use kpr_ipvs_netlink::Scheduler;
use kpr_model::IpFamily;
use kpr_netns::Netns;
use kpr_state::Backend;
use kpr_vm::{GUEST_ENV, Guest};
use kpr_world::{World, ep};
use serde_json::json;

const HEADER: &str = "| services × endpoints | mode | first sync | its kernel writes | one endpoint change | its kernel writes |\n|---|---|---:|---|---:|---|";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str, default: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let services: Vec<usize> = value("--services", "1000,10000")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    let endpoints: usize = value("--endpoints", "10").parse().unwrap();
    let iptables_services = value("--iptables-services", "1000");
    if std::env::var_os(GUEST_ENV).is_some() {
        for &n in &services {
            let with_iptables = iptables_services.split(',').any(|s| s == n.to_string());
            for row in measure(n, endpoints, with_iptables) {
                std::fs::write("/dev/ttyS1", format!("{row}\n")).unwrap();
            }
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let script = format!(
        "exec ./bin/{name} --services {} --endpoints {endpoints} --iptables-services {iptables_services} > /dev/null",
        value("--services", "1000,10000")
    );
    let started = Instant::now();
    let run = Guest::new()
        .binary(&exe)
        .memory_mib(3072)
        .timeout(Duration::from_secs(3600))
        .script(script)
        .run()
        .expect("the guest runs");
    assert_eq!(run.status, 0, "the guest failed:\n{}", run.console);
    println!("{HEADER}");
    print!("{}", String::from_utf8_lossy(&run.channel));
    eprintln!("(guest ran {:.0} s)", started.elapsed().as_secs_f64());
}

fn world(services: usize, endpoints: usize, generation: usize) -> World {
    let mut world = World::new();
    for s in 0..services {
        let name = format!("svc{s}");
        let ip = format!("10.96.{}.{}", s / 250, s % 250 + 1);
        world.service(
            &name,
            json!({"type": "ClusterIP", "clusterIP": ip, "ports": [{"name": "p", "port": 80, "targetPort": 8080}]}),
        );
        let first = if s == 0 { generation } else { 0 };
        let eps = (0..endpoints)
            .map(|e| {
                let n = s * endpoints + e + if e == 0 { first * 100_000 } else { 0 };
                ep(&format!(
                    "10.{}.{}.{}",
                    128 + n / 65536 % 64,
                    n / 256 % 256,
                    n % 256
                ))
            })
            .collect();
        world.slice(&name, json!([{"name": "p", "port": 8080}]), eps);
    }
    world
}

fn time(f: impl FnOnce()) -> Duration {
    let started = Instant::now();
    f();
    started.elapsed()
}

fn measure(services: usize, endpoints: usize, with_iptables: bool) -> Vec<String> {
    let shape = format!("{services} × {endpoints}");
    let node = Netns::new("bench").unwrap();
    node.sh("modprobe ip_vs && ip link add eth0 type dummy && ip addr add 192.168.0.10/24 dev eth0 && ip link set eth0 up")
        .unwrap();
    let options = IpvsOptions {
        scheduler: Scheduler::new("rr").unwrap(),
        rules: RuleOptions {
            family: IpFamily::V4,
            masquerade_bit: 14,
            masquerade_all: false,
            local_detector: LocalDetector::ClusterCidr(vec!["10.128.0.0/10".parse().unwrap()]),
            random_fully: true,
        },
        node_port_addresses: NodePortAddresses::All,
        exclude_cidrs: vec![],
        node_ip: Some("192.168.0.10".parse().unwrap()),
    };
    let mut ipvs = IpvsBackend::new(
        options,
        Box::new(IptablesCli::in_netns(IpFamily::V4, Variant::Auto, node.name())),
        Box::new(IpsetNetlink::default()),
    );
    let mut state = world(services, endpoints, 0);
    let first = state.pending();
    let first_time = time(|| node.run(|| ipvs.sync(&first.request(false))).map(drop).unwrap());
    let first_stats = ipvs.last_stats();
    let mut changed = world(services, endpoints, 1);
    let change = changed.pending();
    // The changed world holds every Service anew: only svc0's endpoint differs, which the
    // plan diff (not the request's list) decides; the request says one Service changed.
    let mut one = std::collections::BTreeSet::new();
    one.insert(kpr_model::NamespacedName::new("default", "svc0"));
    let request = kpr_state::SyncRequest {
        state: &change.state,
        changed: &one,
        service_changes: &[],
        endpoint_changes: &[],
        force_full: false,
    };
    let change_time = time(|| node.run(|| ipvs.sync(&request)).map(drop).unwrap());
    let change_stats = ipvs.last_stats();
    let writes = |s: kpr_ipvs::SyncStats| {
        format!(
            "{} IPVS requests + {} dumps, {} ipset changes, {} addresses, rules {}",
            s.ipvs_operations,
            s.ipvs_dumps,
            s.set_changes,
            s.address_changes,
            if s.rules_written { "written" } else { "unchanged" }
        )
    };
    let ipvs_row = format!(
        "| {shape} | ipvs | {:.2} s | {} | {:.1} ms | {} |",
        first_time.as_secs_f64(),
        writes(first_stats),
        change_time.as_secs_f64() * 1000.0,
        writes(change_stats)
    );
    drop(node);
    if !with_iptables {
        return vec![
            ipvs_row,
            format!("| {shape} | iptables | not run (see --iptables-services) | | | |"),
        ];
    }

    let node = Netns::new("bench").unwrap();
    let options = IptablesOptions {
        family: IpFamily::V4,
        local_detector: LocalDetector::ClusterCidr(vec!["10.128.0.0/10".parse().unwrap()]),
        ..IptablesOptions::default()
    };
    let mut iptables = IptablesBackend::new(
        options,
        Box::new(IptablesCli::in_netns(IpFamily::V4, Variant::Auto, node.name())),
    )
    .unwrap();
    let mut state = world(services, endpoints, 0);
    let first = state.pending();
    let mut first_report = None;
    let first_time = time(|| first_report = Some(node.run(|| iptables.sync(&first.request(false))).unwrap()));
    let change_request = kpr_state::SyncRequest {
        state: &change.state,
        changed: &one,
        service_changes: &[],
        endpoint_changes: &[],
        force_full: false,
    };
    let mut change_report = None;
    let change_time = time(|| change_report = Some(node.run(|| iptables.sync(&change_request)).unwrap()));
    let rules = |r: &kpr_state::SyncReport| {
        let written: usize = r.objects.written;
        format!("iptables-restore of {written} rules")
    };
    let iptables_row = format!(
        "| {shape} | iptables | {:.2} s | {} | {:.1} ms | {} |",
        first_time.as_secs_f64(),
        rules(first_report.as_ref().unwrap()),
        change_time.as_secs_f64() * 1000.0,
        rules(change_report.as_ref().unwrap())
    );
    vec![ipvs_row, iptables_row]
}
