//! What one conntrack reconcile costs with many UDP entries, in a throw-away namespace lab:
//! `cargo run --release -p kpr-conntrack --example reconcile_cost -- 100000 10` makes
//! 100,000 real UDP flows DNATed by the node (10% to an endpoint that then leaves) and
//! times the listing, a reconcile that deletes nothing, one that deletes the stale 10%,
//! and, for comparison, the `conntrack -D` run the proxy used before (one per flow set).
//! Needs root; prints figures, asserts nothing about time.

#![allow(clippy::unwrap_used)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use nix::sys::resource::{UsageWho, getrusage};

use kpr_conntrack::{ConntrackTable, NetlinkTable, Reconciler, Scope};
use kpr_model::IpFamily;
use kpr_netns::{CLIENT_IP, Lab};
use kpr_world::{World, ep};
use support::{OTHER_VIP, PORT, VIP, dns_service, dns_slice_ports, pod, restore, send_from};

const FIRST_PORT: u16 = 1024;
const PORTS_PER_ADDRESS: usize = 65535 - FIRST_PORT as usize + 1;

fn main() {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().map_or(10_000, |a| a.parse().unwrap());
    let stale_percent: usize = args.next().map_or(10, |a| a.parse().unwrap());
    let stale = total * stale_percent / 100;
    let kept = total - stale;

    let lab = Lab::new(2).unwrap();
    let node = lab.node();
    node.set_sysctl("net.netfilter.nf_conntrack_udp_timeout", "3600")
        .unwrap();
    // Kept flows come from the client's own address and more; stale ones from others.
    let kept_sources = addresses(lab.client(), 0, kept.div_ceil(PORTS_PER_ADDRESS));
    let stale_sources = addresses(
        lab.client(),
        kept_sources.len(),
        stale.div_ceil(PORTS_PER_ADDRESS),
    );
    let mut rules = String::from("*nat\n:KPR-CT-COST - [0:0]\n-A PREROUTING -j KPR-CT-COST\n");
    for (sources, endpoint) in [(&kept_sources, pod(0)), (&stale_sources, pod(1))] {
        for source in sources {
            rules.push_str(&format!(
                "-A KPR-CT-COST -s {source}/32 -d {VIP}/32 -p udp --dport {PORT} -j DNAT --to-destination {endpoint}\n"
            ));
        }
    }
    rules.push_str("COMMIT\n");
    restore(node, &rules);

    let make_flows = || {
        let started = Instant::now();
        flows(lab.client(), &kept_sources, kept);
        flows(lab.client(), &stale_sources, stale);
        started.elapsed()
    };
    println!("created {total} flows in {:?}", make_flows());

    let pods_of_dns = |pods: &[usize]| {
        let mut world = World::new();
        let endpoints = pods.iter().map(|&i| ep(&pod(i).ip().to_string())).collect();
        world
            .service("dns", dns_service())
            .slice("dns", dns_slice_ports(pod(0).port()), endpoints);
        world.pending()
    };
    let both = pods_of_dns(&[0, 1]);
    let one = pods_of_dns(&[0]);

    node.run(|| {
        for round in 1..=3 {
            let (started, cpu) = (Instant::now(), cpu_time());
            let listing = NetlinkTable::new().udp_entries(IpFamily::V4, Scope::All).unwrap();
            let (user, system) = cpu_since(cpu);
            println!(
                "list #{round}: {} entries in {:?} (CPU: user {user:?}, kernel {system:?})",
                listing.entries.len(),
                started.elapsed()
            );
        }
        for round in 1..=3 {
            let done = Reconciler::netlink(IpFamily::V4).reconcile(&both.state).unwrap();
            println!(
                "reconcile, nothing stale #{round}: listed {} deleted {} in {:?}",
                done.listed, done.deleted, done.duration
            );
        }
        // A sync that changed only another UDP Service: its frontends (cluster IP, external
        // IP, NodePort) are dumped with kernel-side filters over the same big table.
        let mut other = World::new();
        other.service("other", serde_json::json!({"type": "NodePort", "clusterIP": OTHER_VIP.to_string(),
            "externalIPs": ["192.0.2.99"],
            "ports": [{"name": "dns", "port": PORT, "protocol": "UDP", "nodePort": 30099}]}));
        let other = other.pending();
        for round in 1..=3 {
            let (started, cpu) = (Instant::now(), cpu_time());
            let done = Reconciler::netlink(IpFamily::V4)
                .reconcile_services(&other.state, &other.changed)
                .unwrap();
            let (user, system) = cpu_since(cpu);
            println!(
                "targeted reconcile of one other service #{round}: {} dumps, listed {} in {:?} (CPU: user {user:?}, kernel {system:?})",
                done.listings,
                done.listed,
                started.elapsed()
            );
        }
        let done = Reconciler::netlink(IpFamily::V4).reconcile(&one.state).unwrap();
        println!(
            "reconcile, {stale} stale: listed {} deleted {} (gone {}, failed {}) in {:?}",
            done.listed, done.deleted, done.gone, done.failed, done.duration
        );
    });

    println!("re-created the stale flows in {:?}", {
        let started = Instant::now();
        flows(lab.client(), &stale_sources, stale);
        started.elapsed()
    });
    let started = Instant::now();
    let out = node
        .command("conntrack")
        .args([
            "-D",
            "-p",
            "udp",
            "--orig-dst",
            &VIP.to_string(),
            "--orig-port-dst",
            &PORT.to_string(),
        ])
        .args(["--dst-nat", &pod(1).ip().to_string()])
        .output()
        .unwrap();
    println!(
        "conntrack -D (the previous way, one run per endpoint and VIP): {:?}: {}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `count` client addresses from the `skip`th on: the client's own, then 192.168.77.100+.
fn addresses(client: &kpr_netns::Netns, skip: usize, count: usize) -> Vec<Ipv4Addr> {
    (skip..skip + count)
        .map(|index| {
            if index == 0 {
                return CLIENT_IP;
            }
            let address = Ipv4Addr::new(192, 168, 77, 100 + index as u8);
            client
                .ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"])
                .unwrap();
            address
        })
        .collect()
}

/// `count` flows to the VIP, one per source port of `sources`.
fn flows(client: &kpr_netns::Netns, sources: &[Ipv4Addr], mut count: usize) {
    for &source in sources {
        let here = count.min(PORTS_PER_ADDRESS);
        let ports = (FIRST_PORT..=u16::MAX).take(here);
        send_from(client, source, ports, SocketAddr::from((VIP, PORT)));
        count -= here;
    }
}

/// This thread's (user, kernel) CPU time so far.
fn cpu_time() -> (Duration, Duration) {
    let usage = getrusage(UsageWho::RUSAGE_THREAD).unwrap();
    let as_duration = |t: nix::sys::time::TimeVal| {
        Duration::from_micros(t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64)
    };
    (as_duration(usage.user_time()), as_duration(usage.system_time()))
}

fn cpu_since(before: (Duration, Duration)) -> (Duration, Duration) {
    let now = cpu_time();
    (now.0 - before.0, now.1 - before.1)
}
