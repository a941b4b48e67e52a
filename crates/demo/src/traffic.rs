//! The traffic the demo sends: each path a Service is reached by on a real node (from a pod,
//! from the node itself, from outside through the NodePort), and what came back.
//!
//! Requests go out in small batches so Ctrl-C is noticed within one batch.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use kpr_netns::{Lab, NODE_IP, Netns, spread, spread_udp};

use crate::cluster::{ECHO_UDP, ExampleService, Protocol, WEB, pod_index};
use crate::failure::Failure;
use crate::interrupt::Interrupt;

/// Requests per batch between two looks at the interrupt flag.
const BATCH: usize = 25;

/// The pod every pod-side request comes from: not a UDP endpoint, so its UDP answers can
/// only come through the proxy. A third of its TCP requests hairpin back to itself.
const CLIENT_POD: usize = 2;

/// Where requests start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Pod(usize),
    Node,
    Client,
}

impl Source {
    fn netns(self, lab: &Lab) -> &Netns {
        match self {
            Self::Pod(index) => lab.pod(index),
            Self::Node => lab.node(),
            Self::Client => lab.client(),
        }
    }

    pub fn label(self) -> String {
        match self {
            Self::Pod(index) => format!("pod{index}"),
            Self::Node => "node".to_owned(),
            Self::Client => "client".to_owned(),
        }
    }
}

/// One way to reach a Service, and how many requests to send that way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrafficPath {
    pub source: Source,
    /// "ClusterIP" or "NodePort".
    pub kind: &'static str,
    pub target: SocketAddr,
    pub protocol: Protocol,
    /// The pods that must answer (the Service's endpoints).
    pub expected: &'static [usize],
    pub requests: usize,
}

impl TrafficPath {
    fn to(service: &ExampleService, source: Source, requests: usize) -> Self {
        Self {
            source,
            kind: "ClusterIP",
            target: service.cluster_ip,
            protocol: service.protocol,
            expected: service.pods,
            requests,
        }
    }

    pub fn destination(&self) -> String {
        format!("{} {}/{}", self.kind, self.target, self.protocol.name())
    }
}

/// The demo's paths: the web Service from a pod, the node and the outside client (through
/// its NodePort), and the UDP Service from a pod.
pub fn paths(connections: usize, datagrams: usize) -> Vec<TrafficPath> {
    let node_port = WEB.node_port.map(|port| TrafficPath {
        kind: "NodePort",
        target: SocketAddr::from((NODE_IP, port)),
        ..TrafficPath::to(&WEB, Source::Client, connections)
    });
    [
        Some(TrafficPath::to(&WEB, Source::Pod(CLIENT_POD), connections)),
        Some(TrafficPath::to(&WEB, Source::Node, connections)),
        node_port,
        Some(TrafficPath::to(&ECHO_UDP, Source::Pod(CLIENT_POD), datagrams)),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// What one path's requests got back.
#[derive(Debug)]
pub struct PathResult {
    pub path: TrafficPath,
    /// Answers per pod index.
    pub answers: BTreeMap<usize, usize>,
    /// Failed requests per error kind ("timed out", "connection refused", ...).
    pub failures: BTreeMap<String, usize>,
    /// Answers that name no pod.
    pub strangers: BTreeMap<String, usize>,
}

impl PathResult {
    /// Sorts `spread`'s counts into pods, failures and anything else.
    fn from_counts(path: TrafficPath, counts: BTreeMap<String, usize>) -> Self {
        let mut result = Self {
            path,
            answers: BTreeMap::new(),
            failures: BTreeMap::new(),
            strangers: BTreeMap::new(),
        };
        for (reply, n) in counts {
            if let Some(kind) = reply.strip_prefix("error: ") {
                *result.failures.entry(kind.to_owned()).or_default() += n;
            } else if let Some(pod) = pod_index(&reply) {
                *result.answers.entry(pod).or_default() += n;
            } else {
                *result.strangers.entry(reply).or_default() += n;
            }
        }
        result
    }

    pub fn failed(&self) -> usize {
        self.failures.values().sum()
    }

    /// What is wrong with this path; empty when every endpoint answered and nothing else
    /// happened.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for pod in self.path.expected {
            if !self.answers.contains_key(pod) {
                problems.push(format!("pod{pod} never answered"));
            }
        }
        for (pod, n) in &self.answers {
            if !self.path.expected.contains(pod) {
                problems.push(format!("pod{pod} answered {n} times but is no endpoint"));
            }
        }
        for (kind, n) in &self.failures {
            problems.push(format!("{n} requests failed: {kind}"));
        }
        for (reply, n) in &self.strangers {
            problems.push(format!("{n} unexpected answers {reply:?}"));
        }
        problems
    }

    pub fn ok(&self) -> bool {
        self.problems().is_empty()
    }
}

/// Sends `path`'s requests and sorts what came back.
pub fn send(lab: &Lab, path: &TrafficPath, interrupt: &Interrupt) -> Result<PathResult, Failure> {
    let netns = path.source.netns(lab);
    let mut counts = BTreeMap::new();
    let mut left = path.requests;
    while left > 0 {
        interrupt.check()?;
        let batch = left.min(BATCH);
        let replies = match path.protocol {
            Protocol::Tcp => spread(netns, path.target, batch),
            Protocol::Udp => spread_udp(netns, path.target, batch),
        };
        for (reply, n) in replies {
            *counts.entry(reply).or_insert(0) += n;
        }
        left -= batch;
    }
    Ok(PathResult::from_counts(path.clone(), counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn web_from_node() -> TrafficPath {
        TrafficPath::to(&WEB, Source::Node, 10)
    }

    #[test]
    fn the_paths_cover_pod_node_client_and_udp() {
        let paths = paths(300, 200);
        let shown: Vec<_> = paths
            .iter()
            .map(|p| format!("{} -> {} x{}", p.source.label(), p.destination(), p.requests))
            .collect();
        assert_eq!(
            shown,
            [
                "pod2 -> ClusterIP 10.96.0.10:80/TCP x300",
                "node -> ClusterIP 10.96.0.10:80/TCP x300",
                "client -> NodePort 192.168.77.1:30080/TCP x300",
                "pod2 -> ClusterIP 10.96.0.53:53/UDP x200",
            ]
        );
        assert_eq!(paths[3].expected, [0, 1]);
    }

    #[test]
    fn answers_from_every_endpoint_are_ok() {
        let result =
            PathResult::from_counts(web_from_node(), counts(&[("pod0", 3), ("pod1", 4), ("pod2", 3)]));
        assert_eq!(result.answers, [(0, 3), (1, 4), (2, 3)].into());
        assert!(result.ok(), "{:?}", result.problems());
    }

    #[test]
    fn a_silent_endpoint_failures_and_strangers_are_problems() {
        let result = PathResult::from_counts(
            web_from_node(),
            counts(&[("pod0", 5), ("pod1", 2), ("error: timed out", 2), ("hello", 1)]),
        );
        assert_eq!(result.failed(), 2);
        assert_eq!(
            result.problems(),
            [
                "pod2 never answered",
                "2 requests failed: timed out",
                "1 unexpected answers \"hello\""
            ]
        );
        assert!(!result.ok());
    }

    #[test]
    fn an_answer_from_a_pod_that_is_no_endpoint_is_a_problem() {
        let udp = TrafficPath::to(&ECHO_UDP, Source::Pod(2), 10);
        let result = PathResult::from_counts(udp, counts(&[("pod0", 4), ("pod1", 4), ("pod2", 2)]));
        assert_eq!(result.problems(), ["pod2 answered 2 times but is no endpoint"]);
    }
}
