//! What a user of the real binary feels: kube-proxy-rs started on a manifest file holding the
//! synthetic cluster, in a fresh network namespace; the time from spawning the process until
//! its metrics report the first successful sync, and the whole process's peak RSS (VmHWM)
//! by then and after the single changes settle.
//!
//! Everything the binary does is in: reading and validating the file, the trackers, the
//! backend's generation and the kernel load.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kpr_netns::Netns;

use crate::cluster::{NODE_NAME, Shape, manifest_json};
use crate::load::Outcome;
use crate::memory::status_field;

const METRICS: &str = "127.0.0.1:10249";
const FIRST_SYNC: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";

#[derive(Clone, Debug)]
pub struct E2eRow {
    pub shape: Shape,
    pub mode: &'static str,
    pub manifest_bytes: usize,
    /// Spawn to the first successful sync, as the metrics report it.
    pub first_sync: Outcome<Duration>,
    /// The whole process's peak RSS at the first sync, in KiB.
    pub peak_rss_kib: Option<u64>,
}

pub struct E2ePlan<'a> {
    pub proxy: &'a Path,
    pub shape: Shape,
    pub mode: &'static str,
    pub timeout: Duration,
}

/// Runs the binary once for `plan`.
pub fn measure(plan: &E2ePlan<'_>) -> Result<E2eRow, String> {
    let manifest = manifest_json(plan.shape).map_err(|e| format!("manifest: {e}"))?;
    let path = ManifestFile::write(&manifest)?;
    let netns = Netns::new("benche2e").map_err(|e| format!("namespace: {e}"))?;
    let mut row = E2eRow {
        shape: plan.shape,
        mode: plan.mode,
        manifest_bytes: manifest.len(),
        first_sync: Outcome::NotAvailable("not reached".to_string()),
        peak_rss_kib: None,
    };
    drop(manifest);
    let started = Instant::now();
    let mut child = Proxy(
        netns
            .run(|| proxy_command(plan, &path.0).spawn())
            .map_err(|e| format!("spawn: {e}"))?,
    );
    row.first_sync = wait_first_sync(&netns, &mut child.0, started, plan.timeout);
    row.peak_rss_kib = status_kib(child.0.id(), "VmHWM");
    Ok(row)
}

fn proxy_command(plan: &E2ePlan<'_>, manifest: &Path) -> Command {
    let mut command = Command::new(plan.proxy);
    command
        .args(["--proxy-mode", plan.mode, "--hostname-override", NODE_NAME])
        .arg("--manifests")
        .arg(manifest)
        .args([
            "--metrics-bind-address",
            METRICS,
            "--healthz-bind-address",
            "127.0.0.1:10256",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn wait_first_sync(
    netns: &Netns,
    child: &mut Child,
    started: Instant,
    timeout: Duration,
) -> Outcome<Duration> {
    let metrics: SocketAddr = METRICS
        .parse()
        .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 10249)));
    while started.elapsed() < timeout {
        if let Ok(Some(status)) = child.try_wait() {
            return Outcome::Failed(format!("kube-proxy-rs exited ({status}) before its first sync"));
        }
        if let Ok((200, body)) = netns.http_get(metrics, "/metrics", Duration::from_secs(2))
            && body.contains(FIRST_SYNC)
        {
            return Outcome::Done(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Outcome::TimedOut(timeout)
}

/// A field of /proc/<pid>/status, in KiB.
fn status_kib(pid: u32, key: &str) -> Option<u64> {
    status_field(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, key)
}

/// The proxy, killed and reaped when the measurement ends (also on an early return).
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The manifest in the temp directory, deleted afterwards.
struct ManifestFile(PathBuf);

impl ManifestFile {
    fn write(text: &str) -> Result<Self, String> {
        let path = std::env::temp_dir().join(format!("kpr-bench-{}.json", std::process::id()));
        let mut file = std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        file.write_all(text.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for ManifestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
