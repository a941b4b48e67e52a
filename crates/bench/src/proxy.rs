//! The real `kube-proxy-rs` binary inside a network namespace, as the end-to-end, churn,
//! soak and L4 measurements run it: the one place that spawns it, waits for its first sync,
//! reads its metrics, memory and CPU time, kills it (also on an early return or a panic), and
//! removes the rules it left (`--cleanup`) when the namespace is used again.
//!
//! Its output goes to a log file whose last lines are shown when it dies, so a failed run
//! says why.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kpr_netns::{Netns, SocketCgroup};

use crate::cluster::NODE_NAME;
use crate::load::Outcome;
use crate::memory::status_field;
use crate::scratch::ScratchFile;

/// Where the proxy serves `/metrics`, inside its namespace.
const METRICS: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 10249);
/// Present once the first sync of the IPv4 family succeeded.
const FIRST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
const POLL: Duration = Duration::from_millis(20);
/// Polling waits at least this many times as long as a scrape took, so that the waiting
/// costs the proxy at most a tenth of a core: the userspace mode exposes series per service
/// port (about 70,000 at 10,000 Services), and scraping them every 20 ms took a fifth of the
/// proxy's CPU until its first sync.
const POLL_PER_SCRAPE: u32 = 10;
/// One scrape of /metrics; a proxy busy loading 50k Services may answer slowly.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
const LOG_TAIL_LINES: usize = 5;
/// The mode whose programs attach to a cgroup: it gets a cgroup and a pin directory of the
/// run's own, never the node's root cgroup (where it would translate every process's
/// connections on this machine).
const SOCKET_MODE: &str = "ebpf";

/// Where the proxy reads the cluster from.
pub enum Source<'a> {
    /// `--manifests FILE`.
    Manifest(&'a Path),
    /// `--kubeconfig FILE` (the test API server).
    Api { kubeconfig: &'a Path },
}

/// How to start the proxy.
pub struct Launch<'a> {
    pub binary: &'a Path,
    pub mode: &'static str,
    pub source: Source<'a>,
    /// `--iptables-min-sync-period` (both modes read it); `None`: the product's default.
    pub min_sync_period: Option<&'a str>,
}

/// The proxy's memory, from `/proc/<pid>/status`, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `VmHWM`: the peak resident set since start.
    pub peak_kib: Option<u64>,
    /// `VmRSS`: resident now.
    pub rss_kib: Option<u64>,
    /// `RssAnon`: the part of `VmRSS` that is the process's own memory (heap, stacks), not
    /// pages of its binary and libraries, which come in as code paths are first used.
    pub anon_kib: Option<u64>,
}

/// A running proxy; killed and reaped when dropped.
pub struct RunningProxy<'a> {
    netns: &'a Netns,
    child: Child,
    started: Instant,
    log: ScratchFile,
    /// ebpf mode's cgroup and pins, removed after the child is killed (which detaches
    /// its programs).
    sockets: Option<SocketCgroup>,
}

impl<'a> RunningProxy<'a> {
    /// Spawns the proxy inside `netns`; the clock for [`Self::wait_first_sync`] starts here.
    pub fn spawn(netns: &'a Netns, launch: &Launch<'_>) -> Result<Self, String> {
        let log = ScratchFile::create("proxy.log", b"")?;
        let sockets = (launch.mode == SOCKET_MODE)
            .then(|| SocketCgroup::create("bench", &[]))
            .transpose()
            .map_err(|e| format!("ebpf mode's cgroup: {e}"))?;
        let mut command = command(launch, sockets.as_ref().map(|s| (s.path(), s.pins())));
        let file = std::fs::File::options()
            .append(true)
            .open(log.path())
            .map_err(|e| format!("{}: {e}", log.path().display()))?;
        let stderr = file
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.path().display()))?;
        command.stdout(file).stderr(stderr);
        let started = Instant::now();
        let child = netns
            .run(|| command.spawn())
            .map_err(|e| format!("spawning {}: {e}", launch.binary.display()))?;
        Ok(Self {
            netns,
            child,
            started,
            log,
            sockets,
        })
    }

    /// The cgroup ebpf mode's programs are attached to: threads moved there have their
    /// connections translated.
    pub fn socket_cgroup(&self) -> Option<&Path> {
        self.sockets.as_ref().map(SocketCgroup::path)
    }

    /// Waits until the metrics report the first successful sync: the time since spawning,
    /// or why it did not come within `timeout`.
    pub fn wait_first_sync(&mut self, timeout: Duration) -> Outcome<Duration> {
        while self.started.elapsed() < timeout {
            if let Err(why) = self.check_alive() {
                return Outcome::Failed(why);
            }
            let scrape = Instant::now();
            if self.metrics().is_ok_and(|body| body.contains(FIRST_SYNC)) {
                return Outcome::Done(self.started.elapsed());
            }
            std::thread::sleep(poll_after(scrape.elapsed()));
        }
        Outcome::TimedOut(timeout)
    }

    /// The `/metrics` page.
    pub fn metrics(&self) -> Result<String, String> {
        match self.netns.http_get(METRICS, "/metrics", SCRAPE_TIMEOUT) {
            Ok((200, body)) => Ok(body),
            Ok((status, _)) => Err(format!("/metrics answered {status}")),
            Err(e) => Err(format!("/metrics: {e}")),
        }
    }

    /// `Err` with the exit status and the log's last lines once the proxy has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!("kube-proxy-rs exited ({status}): {}", self.log_tail())),
            Err(e) => Err(format!("cannot wait for kube-proxy-rs: {e}")),
        }
    }

    pub fn memory(&self) -> Memory {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        Memory {
            peak_kib: status_field(&status, "VmHWM"),
            rss_kib: status_field(&status, "VmRSS"),
            anon_kib: status_field(&status, "RssAnon"),
        }
    }

    /// CPU time the proxy has used so far (user + system, all threads): beside a wall-clock
    /// figure, it tells the proxy's own work from waiting for others (the API server).
    pub fn cpu_time(&self) -> Option<Duration> {
        crate::cpu::process(self.child.id())
    }

    /// The last lines the proxy logged, on one line.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join(" / ")
    }
}

impl Drop for RunningProxy<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `binary --cleanup` inside `netns`: removes every rule any mode of kube-proxy-rs left
/// there (a proxy killed by [`RunningProxy`]'s drop leaves its rules), so the next proxy run
/// in the same namespace starts from a clean slate.
pub fn cleanup(netns: &Netns, binary: &Path) -> Result<(), String> {
    let output = netns
        .command(binary)
        .arg("--cleanup")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {} --cleanup: {e}", binary.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "kube-proxy-rs --cleanup failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}

/// The proxy's command line; `sockets` is ebpf mode's (cgroup, pin directory).
fn command(launch: &Launch<'_>, sockets: Option<(&Path, &Path)>) -> Command {
    let mut command = Command::new(launch.binary);
    command.args(["--proxy-mode", launch.mode, "--hostname-override", NODE_NAME]);
    if let Some((cgroup, pins)) = sockets {
        command.arg("--cgroup-root").arg(cgroup);
        command.arg("--ebpf-pin-root").arg(pins);
    }
    match launch.source {
        Source::Manifest(path) => command.arg("--manifests").arg(path),
        Source::Api { kubeconfig } => command.arg("--kubeconfig").arg(kubeconfig),
    };
    if let Some(period) = launch.min_sync_period {
        command.args(["--iptables-min-sync-period", period]);
    }
    command
        .args([
            "--metrics-bind-address",
            &METRICS.to_string(),
            "--healthz-bind-address",
            "127.0.0.1:10256",
        ])
        .stdin(Stdio::null());
    command
}

/// How long to wait before the next scrape after one that took `scrape`.
fn poll_after(scrape: Duration) -> Duration {
    POLL.max(scrape * POLL_PER_SCRAPE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(launch: &Launch<'_>) -> Vec<String> {
        args_with(launch, None)
    }

    fn args_with(launch: &Launch<'_>, sockets: Option<(&Path, &Path)>) -> Vec<String> {
        command(launch, sockets)
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// A quick scrape is repeated every 20 ms; a slow one (a large page) waits ten times as
    /// long, so polling never takes more than a tenth of the proxy's core.
    #[test]
    fn polling_slows_down_with_the_scrape() {
        assert_eq!(poll_after(Duration::from_millis(1)), POLL);
        assert_eq!(poll_after(Duration::from_millis(50)), Duration::from_millis(500));
    }

    #[test]
    fn the_command_line_names_the_source_mode_and_sync_period() {
        let binary = Path::new("/bin/kube-proxy-rs");
        let from_api = args(&Launch {
            binary,
            mode: "nftables",
            source: Source::Api {
                kubeconfig: Path::new("/tmp/kc"),
            },
            min_sync_period: Some("0s"),
        });
        let joined = from_api.join(" ");
        assert!(joined.starts_with("--proxy-mode nftables --hostname-override bench-node-0 --kubeconfig /tmp/kc --iptables-min-sync-period 0s"), "{joined}");
        assert!(
            joined.contains("--metrics-bind-address 127.0.0.1:10249"),
            "{joined}"
        );
        let from_file = args(&Launch {
            binary,
            mode: "iptables",
            source: Source::Manifest(Path::new("/tmp/m.json")),
            min_sync_period: None,
        })
        .join(" ");
        assert!(from_file.contains("--manifests /tmp/m.json"), "{from_file}");
        assert!(!from_file.contains("min-sync-period"), "{from_file}");
        assert!(!from_file.contains("--cgroup-root"), "{from_file}");
    }

    /// ebpf mode is given the run's own cgroup and pins, never left to default to the
    /// machine's root cgroup.
    #[test]
    fn ebpf_mode_gets_the_runs_cgroup_and_pin_directory() {
        let launch = Launch {
            binary: Path::new("/bin/kube-proxy-rs"),
            mode: SOCKET_MODE,
            source: Source::Manifest(Path::new("/tmp/m.json")),
            min_sync_period: None,
        };
        let joined = args_with(
            &launch,
            Some((Path::new("/cg/kpr"), Path::new("/sys/fs/bpf/kpr"))),
        )
        .join(" ");
        assert!(
            joined.contains("--proxy-mode ebpf --hostname-override bench-node-0 --cgroup-root /cg/kpr --ebpf-pin-root /sys/fs/bpf/kpr"),
            "{joined}"
        );
    }
}
