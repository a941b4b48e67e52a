//! The cluster that examples/ describes, made real: the lab's pods run the backends the
//! EndpointSlices name, and kube-proxy-rs runs in the node namespace on those manifests.
//!
//! The services are written down here a second time on purpose: the demo checks the proxy
//! against what the manifests say, so it must not learn the answer from the proxy.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kpr_netns::{Backend, Lab, Netns, ProcessGuard, SocketCgroup, pod_ip};

use crate::failure::Failure;
use crate::interrupt::Interrupt;

/// The Node object in examples/node1.yaml.
pub const NODE_NAME: &str = "node1";

/// Where the proxy serves `/healthz`, inside the node namespace.
pub const HEALTHZ: SocketAddr = loopback(10256);

/// Where the proxy serves `/metrics`, inside the node namespace.
pub const METRICS: SocketAddr = loopback(10249);

/// Pods in the lab: every endpoint of examples/ lives on one of them.
pub const PODS: usize = 3;

/// How often the readiness check asks again.
const READY_POLL: Duration = Duration::from_millis(200);

/// Timeout of each readiness request: short, since everything is local.
const READY_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        }
    }

    /// What one request is, for messages.
    pub fn requests(self) -> &'static str {
        match self {
            Self::Tcp => "TCP connections",
            Self::Udp => "UDP datagrams",
        }
    }
}

/// One Service port of examples/ with the pods its EndpointSlice lists.
#[derive(Debug)]
pub struct ExampleService {
    pub name: &'static str,
    pub protocol: Protocol,
    pub cluster_ip: SocketAddr,
    pub node_port: Option<u16>,
    pub target_port: u16,
    /// Lab pod indexes: pod `i` is `10.244.1.(10 + i)`.
    pub pods: &'static [usize],
}

/// examples/web.yaml: NodePort, TCP 80 -> 8080 on all three pods.
pub const WEB: ExampleService = ExampleService {
    name: "default/web",
    protocol: Protocol::Tcp,
    cluster_ip: vip(10, 80),
    node_port: Some(30080),
    target_port: 8080,
    pods: &[0, 1, 2],
};

/// examples/echo-udp.yaml: ClusterIP, UDP 53 -> 5353 on the first two pods.
pub const ECHO_UDP: ExampleService = ExampleService {
    name: "default/echo-udp",
    protocol: Protocol::Udp,
    cluster_ip: vip(53, 53),
    node_port: None,
    target_port: 5353,
    pods: &[0, 1],
};

pub const SERVICES: [&ExampleService; 2] = [&WEB, &ECHO_UDP];

const fn loopback(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

const fn vip(last_octet: u8, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, last_octet), port))
}

/// What pod `index`'s backends answer: how a client learns which pod the proxy picked.
pub fn pod_name(index: usize) -> String {
    format!("pod{index}")
}

/// The pod index in a backend's answer, if it is one.
pub fn pod_index(answer: &str) -> Option<usize> {
    let digits = answer.strip_prefix("pod")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|index| *index < PODS)
}

/// The lab with its backends and the proxy. Fields drop in order: the proxy stops first,
/// then the backends, then the namespaces go.
pub struct Cluster {
    proxy: ProcessGuard,
    _backends: Vec<Backend>,
    pub lab: Lab,
    /// ebpf mode: the cgroup the node's and the pods' threads join (the programs attach
    /// there, not to the machine's cgroup root), and the pin directory; removed last.
    _sockets: Option<SocketCgroup>,
}

impl Cluster {
    /// Starts one backend per endpoint of [`SERVICES`] in an already built lab, then the
    /// proxy in its node namespace.
    pub fn start(lab: Lab, proxy: &Path, manifests: &Path, mode: &str) -> Result<Self, Failure> {
        let backends = start_backends(&lab)?;
        let mut command = proxy_command(proxy, manifests, mode);
        let sockets = if mode == "ebpf" {
            let mut chosen: Vec<&Netns> = vec![lab.node()];
            chosen.extend(lab.pods());
            let sockets = SocketCgroup::create("demo", &chosen).map_err(|err| {
                Failure::io(
                    "cannot create the ebpf mode's cgroup",
                    std::io::Error::other(err.to_string()),
                )
            })?;
            command.arg("--cgroup-root").arg(sockets.path());
            command.arg("--ebpf-pin-root").arg(sockets.pins());
            Some(sockets)
        } else {
            None
        };
        println!("starting  {}", describe(&command));
        let proxy = lab
            .spawn(lab.node(), command)
            .map_err(|err| Failure::io(format!("cannot start {}", proxy.display()), err))?;
        Ok(Self {
            proxy,
            _backends: backends,
            lab,
            _sockets: sockets,
        })
    }

    pub fn node(&self) -> &Netns {
        self.lab.node()
    }

    /// Waits until `/healthz` answers 200 and a web pod answers on the ClusterIP from the
    /// node; fails at once when the proxy exits, and after `timeout` otherwise.
    pub fn wait_ready(&mut self, timeout: Duration, interrupt: &Interrupt) -> Result<Readiness, Failure> {
        let started = Instant::now();
        loop {
            interrupt.check()?;
            self.check_running("before it was ready")?;
            let last = match self.probe_ready() {
                Ok(answer) => {
                    return Ok(Readiness {
                        after: started.elapsed(),
                        answer,
                    });
                }
                Err(last) => last,
            };
            if started.elapsed() >= timeout {
                return Err(Failure::NotReady {
                    waited: timeout,
                    last,
                    log: self.proxy.logs(),
                });
            }
            std::thread::sleep(READY_POLL);
        }
    }

    /// `Err(Failure::ProxyExited)` if the proxy has ended.
    pub fn check_running(&mut self, when: &'static str) -> Result<(), Failure> {
        let exited = self
            .proxy
            .try_wait()
            .map_err(|err| Failure::io("cannot check on kube-proxy-rs", err))?;
        match exited {
            Some(status) => Err(Failure::ProxyExited {
                status,
                when,
                log: self.proxy.logs(),
            }),
            None => Ok(()),
        }
    }

    /// Stops the proxy (SIGTERM, then SIGKILL after a grace period) and says how it ended.
    pub fn stop_proxy(&mut self) -> String {
        match self.proxy.stop() {
            Ok(status) => status.to_string(),
            Err(err) => format!("cannot be stopped: {err}"),
        }
    }

    /// The answer from the web ClusterIP, or what is still missing.
    fn probe_ready(&self) -> Result<String, String> {
        match self.node().http_get(HEALTHZ, "/healthz", READY_REQUEST_TIMEOUT) {
            Ok((200, _)) => {}
            Ok((status, body)) => return Err(format!("/healthz answered {status}: {}", body.trim())),
            Err(err) => return Err(format!("/healthz on {HEALTHZ}: {err}")),
        }
        match self.node().tcp_request(WEB.cluster_ip, READY_REQUEST_TIMEOUT) {
            Ok(answer) if pod_index(&answer).is_some() => Ok(answer),
            Ok(answer) => Err(format!("{} answered {answer:?}, not a pod", WEB.cluster_ip)),
            Err(err) => Err(format!("/healthz is 200, but {}: {err}", WEB.cluster_ip)),
        }
    }
}

/// When the proxy became ready and which pod answered the first request.
pub struct Readiness {
    pub after: Duration,
    pub answer: String,
}

fn start_backends(lab: &Lab) -> Result<Vec<Backend>, Failure> {
    let mut backends = Vec::new();
    for service in SERVICES {
        for &pod in service.pods {
            let addr = SocketAddr::from((pod_ip(pod), service.target_port));
            let name = pod_name(pod);
            let netns = lab.pod(pod);
            let started = match service.protocol {
                Protocol::Tcp => netns.tcp_backend(addr, &name),
                Protocol::Udp => netns.udp_backend(addr, &name),
            };
            let backend = started.map_err(|err| {
                Failure::io(
                    format!("cannot start the {} backend {addr} in {name}", service.name),
                    err,
                )
            })?;
            backends.push(backend);
        }
        println!(
            "backends  {:<17} {}/{} on {}",
            service.name,
            service.protocol.name(),
            service.target_port,
            service
                .pods
                .iter()
                .map(|&pod| pod_name(pod))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(backends)
}

/// The proxy's command line: upstream's flags, healthz and metrics on the node's loopback.
fn proxy_command(proxy: &Path, manifests: &Path, mode: &str) -> Command {
    let mut command = Command::new(proxy);
    command
        .args(["--proxy-mode", mode])
        .args(["--hostname-override", NODE_NAME])
        .arg("--manifests")
        .arg(manifests)
        .args(["--healthz-bind-address", &HEALTHZ.to_string()])
        .args(["--metrics-bind-address", &METRICS.to_string()])
        .args(["-v", "2"]);
    command
}

/// The command line as a reader would type it.
fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `path` made absolute, or a usage failure naming `flag` when it does not exist.
pub fn existing(flag: &str, path: &Path) -> Result<PathBuf, Failure> {
    path.canonicalize()
        .map_err(|err| Failure::Usage(format!("{flag} {}: {err}", path.display())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn pod_names_round_trip() {
        for pod in 0..PODS {
            assert_eq!(pod_index(&pod_name(pod)), Some(pod));
        }
    }

    #[test]
    fn other_answers_are_not_pods() {
        for answer in ["", "pod", "pod-1", "pod3", "pod1x", "node", "pod+1"] {
            assert_eq!(pod_index(answer), None, "{answer:?}");
        }
    }

    /// The services written down here match the manifests the proxy reads.
    #[test]
    fn services_match_the_example_manifests() {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        for (service, file) in [(&WEB, "web.yaml"), (&ECHO_UDP, "echo-udp.yaml")] {
            let yaml = std::fs::read_to_string(examples.join(file)).unwrap();
            let mut expected = vec![
                format!("clusterIP: {}", service.cluster_ip.ip()),
                format!("port: {}", service.cluster_ip.port()),
                format!("targetPort: {}", service.target_port),
                format!("protocol: {}", service.protocol.name()),
            ];
            expected.extend(service.node_port.map(|port| format!("nodePort: {port}")));
            for text in expected {
                assert!(yaml.contains(&text), "{file} lacks {text:?}");
            }
            for pod in 0..PODS {
                let listed = yaml.contains(&pod_ip(pod).to_string());
                assert_eq!(listed, service.pods.contains(&pod), "{file}: pod {pod}");
            }
        }
        let node = std::fs::read_to_string(examples.join("node1.yaml")).unwrap();
        assert!(node.contains(&format!("name: {NODE_NAME}")), "{node}");
    }

    #[test]
    fn the_proxy_gets_upstreams_flags() {
        let command = proxy_command(Path::new("/bin/kube-proxy-rs"), Path::new("/ex"), "nftables");
        assert_eq!(
            describe(&command),
            "/bin/kube-proxy-rs --proxy-mode nftables --hostname-override node1 --manifests /ex \
             --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 -v 2"
        );
    }
}
