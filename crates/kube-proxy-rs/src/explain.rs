//! `kube-proxy-rs explain <ip>:<port>[/proto]`: the one subcommand. Upstream has no
//! subcommands and every one of its flags starts with `-`, so a first argument `explain`
//! cannot be a flag of a drop-in invocation; it is dispatched before flag parsing.

use std::ffi::OsString;
use std::process::ExitCode;

use kpr_explain::{Query, explain_live, render};

use crate::mode;

const USAGE: &str = "\
Usage: kube-proxy-rs explain [--ebpf-pin-root=PATH] <ip>:<port>[/tcp|udp|sctp]

Explains what this node's kube-proxy rules do with a new connection to the address: the
Service port it maps to (cluster IP, NodePort on a node address, external IP, load-balancer
IP), its endpoints with their weights (iptables: statistic shares; nftables: slots), the
policy decisions (REJECT without endpoints, DROP for a Local policy without local
endpoints or a source outside loadBalancerSourceRanges, local endpoints, affinity,
masquerading) and the kernel objects behind them.

Reads the live kernel of the current network namespace: table ip/ip6 kube-proxy over
netlink (nftables mode), iptables-save (iptables mode), the IPVS table and kube-ipvs0
(ipvs mode), the socket maps pinned under bpffs (ebpf mode: at --ebpf-pin-root, as the
proxy was started with, default /sys/fs/bpf/kube-proxy-rs); each whose objects exist. IPv6
as [addr]:port. TCP when no protocol is given.

Exit status: 0 when something maps the address, 1 when nothing does, 2 on a usage error.
";

/// Whether the command line asks for the subcommand.
pub fn requested(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|a| a == "explain")
}

/// Runs `explain` with the arguments after it.
pub fn run(args: &[OsString]) -> ExitCode {
    let mut rest: Vec<String> = args
        .iter()
        .skip(2)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut pin_root = None;
    if let Some(at) = rest.iter().position(|a| a.starts_with("--ebpf-pin-root")) {
        let flag = rest.remove(at);
        pin_root = match flag.strip_prefix("--ebpf-pin-root=") {
            Some(path) => Some(path.to_owned()),
            None if flag == "--ebpf-pin-root" && at < rest.len() => Some(rest.remove(at)),
            None => return usage_error("--ebpf-pin-root needs a path"),
        };
    }
    let ebpf = pin_root.map(kpr_ebpf::EbpfExplainer::at);
    match rest.as_slice() {
        [flag] if flag == "--help" || flag == "-h" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        [address] => match Query::parse(address) {
            Ok(query) => {
                let explainers = mode::explainers(ebpf.as_ref());
                let explanation = explain_live(&query, &explainers);
                print!("{}", render(&explanation));
                if explanation.found() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(error) => usage_error(&error.to_string()),
        },
        _ => usage_error("expected one address"),
    }
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("kube-proxy-rs explain: {message}\n\n{USAGE}");
    ExitCode::from(2)
}
