//! ebpf mode's start-up, end to end: the real binary refuses what it cannot run on with
//! status 1 and a message naming what is missing, leaving nothing attached or pinned; and
//! `--dry-run` shows the socket map entries beside nftables mode's script. Its traffic is
//! the feature suite's (`tests/features`, every scenario in ebpf mode).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use kpr_netns::Netns;
use support::*;

/// Runs the binary to completion in a namespace of its own, with `flags` and a manifest
/// directory holding `yaml`.
fn run(flags: &[&str], yaml: &str) -> Output {
    let ns = Netns::new("ebpf").unwrap();
    let manifests = tempfile::tempdir().unwrap();
    std::fs::write(manifests.path().join("web.yaml"), yaml).unwrap();
    let mut command = Command::new(proxy_binary());
    command
        .arg(format!("--hostname-override={NODE_NAME}"))
        .arg(format!("--manifests={}", manifests.path().display()))
        .arg("--proxy-mode=ebpf")
        .args(flags);
    ns.run(|| command.output().unwrap())
}

fn pins() -> PathBuf {
    PathBuf::from(format!("/sys/fs/bpf/kpr-e2e-ebpf-{}", std::process::id()))
}

#[test]
fn a_cgroup_root_that_is_not_cgroup_v2_is_refused_with_status_1_and_nothing_attached() {
    let pins = pins();
    let output = run(
        &[
            "--cgroup-root=/tmp",
            &format!("--ebpf-pin-root={}", pins.display()),
        ],
        &web_yaml(&[0, 1], None),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("/tmp is not a cgroup v2 directory"), "{stderr}");
    assert!(!pins.exists(), "nothing pinned");
}

#[test]
fn dry_run_shows_the_socket_entries_after_the_nftables_script() {
    let output = run(
        &["--dry-run", "--cluster-cidr=10.244.0.0/16"],
        &web_yaml(&[0, 1], None),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("table ip kube-proxy"), "{stdout}");
    assert!(stdout.contains("# IPv4 socket map entries"), "{stdout}");
    assert!(stdout.contains("TCP 10.96.0.10:80 -> "), "{stdout}");
}

/// A cgroup of the test's own under the cgroup v2 root, removed on drop.
struct TestCgroup(PathBuf);

impl TestCgroup {
    fn create(tag: &str) -> Self {
        let root = kpr_ebpf::host::cgroup2_root().expect("a cgroup v2 hierarchy");
        let path = root.join(format!("kpr-e2e-ebpf-{}-{tag}", std::process::id()));
        std::fs::create_dir(&path).unwrap();
        Self(path)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Removes a pin directory the test named, whatever the binary left.
struct TestPins(PathBuf);

impl Drop for TestPins {
    fn drop(&mut self) {
        let _ = kpr_ebpf::layer::remove(&kpr_ebpf::Pins::new(&self.0));
    }
}

#[test]
fn a_cluster_larger_than_the_maps_is_refused_at_start_up_with_status_1_and_nothing_attached() {
    let cgroup = TestCgroup::create("capacity");
    let pins = TestPins(PathBuf::from(format!(
        "/sys/fs/bpf/kpr-e2e-ebpf-{}-capacity",
        std::process::id()
    )));
    let yaml = web_yaml(&[0, 1], None)
        + "\n---\n"
        + &service("api", "10.96.0.11", 80, 8080, "TCP", None)
        + &slice("api", &[0], 8080, "TCP");
    let output = run(
        &[
            &format!("--cgroup-root={}", cgroup.0.display()),
            &format!("--ebpf-pin-root={}", pins.0.display()),
            "--ebpf-max-service-addresses=1",
            "--cluster-cidr=10.244.0.0/16",
            "--healthz-bind-address=",
            "--metrics-bind-address=",
        ],
        &yaml,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "map capacity exceeded: map kpr_services holds 1 Service addresses, the cluster needs 2; \
             --ebpf-max-service-addresses (ebpf.maxServiceAddresses in the config file) sizes it"
        ),
        "{stderr}"
    );
    assert!(!pins.0.exists(), "nothing left pinned or attached");
}

/// `--cleanup` removes what was pinned at `--ebpf-pin-root`, not only the default directory.
#[test]
fn cleanup_removes_the_layer_pinned_at_the_given_pin_root() {
    let cgroup = TestCgroup::create("cleanup");
    let pins = TestPins(PathBuf::from(format!(
        "/sys/fs/bpf/kpr-e2e-ebpf-{}-cleanup",
        std::process::id()
    )));
    let layer = kpr_ebpf::SocketLayer::start(
        kpr_ebpf::Pins::new(&pins.0),
        &cgroup.0,
        kpr_ebpf::Capacities::default(),
    )
    .unwrap();
    drop(layer);
    assert!(pins.0.join("links").exists());
    // In a namespace of its own: --cleanup also removes every mode's firewall objects.
    let ns = Netns::new("ebpf").unwrap();
    let mut command = Command::new(proxy_binary());
    command
        .arg("--cleanup")
        .arg(format!("--ebpf-pin-root={}", pins.0.display()));
    let output = ns.run(|| command.output().unwrap());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!pins.0.exists(), "unpinned and detached: {stderr}");
}
