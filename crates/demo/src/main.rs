//! The README's main job: a one-node cluster in network namespaces (a node, three pods, an
//! outside client), real backends in the pods, kube-proxy-rs in the node on the manifests in
//! examples/, and real traffic through the ClusterIPs and the NodePort, counted per pod.
//!
//! Everything lives in namespaces the demo creates and deletes again, also on failure and
//! Ctrl-C. Exits 0 only when every path was answered by every endpoint and by nothing else.

mod cluster;
mod failure;
mod interrupt;
mod report;
mod traffic;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use kpr_netns::{CLIENT_IP, Lab, NODE_IP, POD_GATEWAY, pod_ip};

use crate::cluster::{Cluster, METRICS, PODS, existing};
use crate::failure::Failure;
use crate::interrupt::Interrupt;
use crate::traffic::{PathResult, paths, send};

/// Where `ip netns` keeps named namespaces: one left here after the demo is a leak.
const NETNS_DIR: &str = "/run/netns";

#[derive(Debug, Parser)]
#[command(
    name = "kpr-demo",
    about = "Runs kube-proxy-rs on a one-node cluster made of network namespaces and shows \
             which pods answer the ClusterIPs and the NodePort."
)]
struct Args {
    /// The kube-proxy-rs binary, run inside the node namespace.
    #[arg(long, value_name = "FILE")]
    proxy: PathBuf,
    /// The manifests describing the example cluster (the repository's examples/).
    #[arg(long, value_name = "DIR")]
    manifests: PathBuf,
    /// TCP connections sent on each TCP path.
    #[arg(long, value_name = "N", default_value_t = 300, value_parser = at_least_one)]
    connections: usize,
    /// UDP datagrams sent to the UDP Service.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = at_least_one)]
    datagrams: usize,
    /// The proxy mode kube-proxy-rs runs in (`--proxy-mode`).
    #[arg(long, value_name = "MODE", default_value = "iptables", value_parser = ["iptables", "nftables", "userspace", "ebpf"])]
    proxy_mode: String,
    /// How long kube-proxy-rs gets to serve /healthz and route the ClusterIP.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    ready_timeout: u64,
}

fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(err) => Err(err.to_string()),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // First, before any other thread exists (see `interrupt`).
    let interrupt = match Interrupt::watch() {
        Ok(interrupt) => interrupt,
        Err(failure) => {
            eprintln!("kpr-demo: {failure}");
            return ExitCode::FAILURE;
        }
    };
    let mut namespaces = Vec::new();
    let outcome = run(&args, &interrupt, &mut namespaces);
    if let Err(failure) = &outcome {
        if interrupt.raised() && !matches!(failure, Failure::Interrupted) {
            eprintln!("\nkpr-demo: interrupted ({failure})\n");
        } else {
            eprintln!("\nkpr-demo: {failure}\n");
        }
    }
    // The lab is gone by now: `run` owned it.
    let clean = report_cleanup(&namespaces);
    match outcome {
        Ok(true) if clean => {
            println!("\nevery path was answered by every endpoint");
            ExitCode::SUCCESS
        }
        Ok(_) => {
            println!("\nFAILED: see above");
            ExitCode::FAILURE
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// The whole demo; `Ok(true)` when every path passed. Records the lab's namespaces in
/// `namespaces` so the caller can check that they are gone.
fn run(args: &Args, interrupt: &Interrupt, namespaces: &mut Vec<String>) -> Result<bool, Failure> {
    let proxy = existing("--proxy", &args.proxy)?;
    let manifests = existing("--manifests", &args.manifests)?;
    println!(
        "kube-proxy-rs demo: one node in network namespaces, manifests from {}\n",
        manifests.display()
    );

    let lab = Lab::new(PODS)?;
    namespaces.extend(namespace_names(&lab));
    describe_lab(&lab);
    interrupt.check()?;
    let mut cluster = Cluster::start(lab, &proxy, &manifests, &args.proxy_mode)?;
    let ready = cluster.wait_ready(Duration::from_secs(args.ready_timeout), interrupt)?;
    println!(
        "ready     after {:.1}s: /healthz 200, {} answered from the node\n",
        ready.after.as_secs_f64(),
        ready.answer
    );

    let results = send_traffic(&cluster, args, interrupt)?;
    cluster.check_running("while the traffic flowed")?;
    println!("\n{}", report::answer_table(&results));
    show_proxy_view(&cluster, args);
    println!("stopping  kube-proxy-rs: {}", cluster.stop_proxy());
    Ok(results.iter().all(PathResult::ok))
}

fn namespace_names(lab: &Lab) -> Vec<String> {
    let mut names = vec![lab.node().name().to_owned(), lab.client().name().to_owned()];
    names.extend(lab.pods().iter().map(|pod| pod.name().to_owned()));
    names
}

fn describe_lab(lab: &Lab) {
    println!(
        "lab       node   {:<16} {NODE_IP} (pods' gateway {POD_GATEWAY})",
        lab.node().name()
    );
    for (index, pod) in lab.pods().iter().enumerate() {
        println!("          pod{index}   {:<16} {}", pod.name(), pod_ip(index));
    }
    println!("          client {:<16} {CLIENT_IP}", lab.client().name());
}

fn send_traffic(cluster: &Cluster, args: &Args, interrupt: &Interrupt) -> Result<Vec<PathResult>, Failure> {
    let mut results = Vec::new();
    for path in paths(args.connections, args.datagrams) {
        println!(
            "sending   {} {} from {} to {}",
            path.requests,
            path.protocol.requests(),
            path.source.label(),
            path.destination()
        );
        results.push(send(&cluster.lab, &path, interrupt)?);
    }
    Ok(results)
}

/// The proxy's own account: its metrics and the rules it wrote. Informational: a failure
/// here is shown, the verdict stays with the traffic.
fn show_proxy_view(cluster: &Cluster, args: &Args) {
    println!("metrics   GET http://{METRICS}/metrics (in the node namespace)");
    match cluster
        .node()
        .http_get(METRICS, "/metrics", Duration::from_secs(2))
    {
        Ok((200, body)) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |since| since.as_secs_f64());
            for line in report::metric_lines(&body, now) {
                println!("          {line}");
            }
        }
        Ok((status, body)) => println!("          answered {status}: {}", body.trim()),
        Err(err) => println!("          cannot read: {err}"),
    }
    let (dump, count): (&str, fn(&str) -> usize) = match args.proxy_mode.as_str() {
        "nftables" | "ebpf" => ("nft list table ip kube-proxy", report::nft_element_count),
        _ => ("iptables-save -t nat", report::kube_line_count),
    };
    match cluster.node().sh(dump) {
        Ok(rules) => println!(
            "rules     {dump}   ->   {}",
            count_text(&args.proxy_mode, count(&rules))
        ),
        Err(err) => println!("rules     {dump} failed: {err}"),
    }
}

fn count_text(mode: &str, count: usize) -> String {
    match mode {
        "nftables" | "ebpf" => format!("{count} map/set elements"),
        _ => format!("{count} lines mention a KUBE- chain"),
    }
}

/// Says whether the lab's namespaces are gone; `true` when none is left.
fn report_cleanup(namespaces: &[String]) -> bool {
    if namespaces.is_empty() {
        return true;
    }
    let left: Vec<&String> = namespaces
        .iter()
        .filter(|name| Path::new(NETNS_DIR).join(name).exists())
        .collect();
    if left.is_empty() {
        println!(
            "cleanup   {} namespaces deleted, nothing left behind",
            namespaces.len()
        );
        true
    } else {
        eprintln!("cleanup   namespaces LEFT BEHIND: {left:?} (delete with `ip netns del`)");
        false
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn zero_requests_are_refused() {
        assert!(at_least_one("0").is_err());
        assert!(at_least_one("x").is_err());
        assert_eq!(at_least_one("7"), Ok(7));
    }
}
