//! The ipvs mode's ipsets through the `ipset` tool (spawned as kpr-ipvs spawned it:
//! `ipset restore -exist` of the changes, `ipset save` read back) against kpr-nfnetlink's
//! ipset client, both behind kpr-ipvs's `Ipset` trait, in throw-away network namespaces.
//! For N Services (KUBE-CLUSTER-IP holds one member per Service port; the other sixteen
//! sets are created empty, as a first sync does):
//!
//! - cold load: every set created and N members added, into a fresh namespace;
//! - one change: one member deleted and one added (an endpoint or Service change);
//! - read back: the seventeen sets with their members.
//!
//! `cargo bench -p kpr-ipvs --bench ipset` (root, `ipset` installed; `SERVICES=1000,10000`,
//! `RUNS=n` for the runs per figure, median shown). Prints a markdown table.

#![allow(clippy::unwrap_used)] // A benchmark binary: any failure should stop it loudly.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use kpr_ipvs::ipset::{Family, Ipset, IpsetCli, IpsetNetlink, Member, Protocol, SetSpec, Sets, changes};
use kpr_ipvs::sets::SetId;
use kpr_netns::Netns;

fn specs() -> Vec<SetSpec> {
    SetId::ALL.iter().map(|id| id.spec(Family::V4)).collect()
}

fn cluster_ip(i: u32) -> Member {
    Member::IpPort(IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i)), Protocol::Tcp, 80)
}

/// Every set declared, KUBE-CLUSTER-IP holding services `range`.
fn wanted(range: std::ops::Range<u32>) -> Sets {
    let mut sets = Sets::default();
    for spec in specs() {
        sets.declare(spec);
    }
    for i in range {
        sets.insert(SetId::ClusterIp.name(Family::V4), cluster_ip(i))
            .unwrap();
    }
    sets
}

#[derive(Clone, Copy, Debug)]
enum Path {
    Tool,
    Netlink,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Self::Tool => "`ipset` tool (restore -exist / save)",
            Self::Netlink => "netlink (kpr-nfnetlink)",
        }
    }

    fn client(self) -> Box<dyn Ipset> {
        match self {
            Self::Tool => Box::new(IpsetCli),
            Self::Netlink => Box::new(IpsetNetlink::default()),
        }
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let value = f();
    (value, start.elapsed())
}

/// Cold load into a fresh namespace, `runs` times; every load is read back and checked.
fn cold(path: Path, n: u32, runs: usize) -> Duration {
    let all = wanted(0..n);
    let samples = (0..runs)
        .map(|_| {
            let netns = Netns::new("ipsetbench").unwrap();
            netns.run(|| {
                let writes = changes(&all, &Sets::default());
                let ((), took) = timed(|| path.client().write(&writes).unwrap());
                assert_eq!(path.client().read(&specs()).unwrap(), all, "{path:?} cold load");
                took
            })
        })
        .collect();
    median(samples)
}

/// One member out, one in, `runs` times, back and forth; then the read-back, `runs` times.
fn change_and_read(path: Path, n: u32, runs: usize) -> (Duration, Duration) {
    let netns = Netns::new("ipsetbench").unwrap();
    netns.run(|| {
        let before = wanted(0..n);
        let after = wanted(1..n + 1);
        let mut client = path.client();
        client.write(&changes(&before, &Sets::default())).unwrap();
        let mut change = Vec::new();
        for run in 0..runs {
            let (from, to) = if run.is_multiple_of(2) {
                (&before, &after)
            } else {
                (&after, &before)
            };
            let writes = changes(to, from);
            assert_eq!(writes.len(), 2, "one deletion, one addition");
            change.push(timed(|| client.write(&writes).unwrap()).1);
        }
        let current = if runs.is_multiple_of(2) { &before } else { &after };
        let mut read = Vec::new();
        for _ in 0..runs {
            let (sets, took) = timed(|| client.read(&specs()).unwrap());
            assert_eq!(&sets, current, "{path:?} read back");
            read.push(took);
        }
        (median(change), median(read))
    })
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let services: Vec<u32> = std::env::var("SERVICES")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    let runs: usize = std::env::var("RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(11);
    println!(
        "| services (KUBE-CLUSTER-IP members) | path | cold load | one change (1 del + 1 add) | read back (17 sets) |"
    );
    println!("|---:|---|---:|---:|---:|");
    for &n in &services {
        for path in [Path::Tool, Path::Netlink] {
            let cold = cold(path, n, runs);
            let (change, read) = change_and_read(path, n, runs);
            println!(
                "| {n} | {} | {} | {} | {} |",
                path.name(),
                ms(cold),
                ms(change),
                ms(read)
            );
        }
    }
    println!("\nmedian of {runs} runs each");
}
