//! The demo binary when the proxy does not work: it must say why, show the proxy's log,
//! exit non-zero, never hang, and leave no namespace or process behind. Needs root (the
//! demo builds a real namespace lab); a fake proxy script stands in for kube-proxy-rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A ceiling against a hung demo, not a speed check.
const PATIENCE: Duration = Duration::from_secs(60);

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// An executable shell script `body` in `dir`, used as `--proxy`.
fn fake_proxy(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("fake-proxy");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn start_demo(proxy: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kpr-demo"))
        .arg("--proxy")
        .arg(proxy)
        .arg("--manifests")
        .arg(examples())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child) -> (Output, String) {
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_no_namespaces_of(pid, &text);
    (output, text)
}

/// The lab names its namespaces `kpr<pid>x<serial>-<role>` after the creating process.
fn assert_no_namespaces_of(pid: u32, text: &str) {
    let prefix = format!("kpr{pid}x");
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .filter(|name| name.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "namespaces left behind: {left:?}\n{text}");
    assert!(
        text.contains("5 namespaces deleted, nothing left behind"),
        "{text}"
    );
}

/// Waits for the fake proxy to write its pid to `file`.
fn wait_for_pid(file: &Path) -> u32 {
    let started = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(started.elapsed() < PATIENCE, "the fake proxy never started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_gone(pid: u32) {
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the fake proxy {pid} survived the demo"
    );
}

#[test]
fn a_proxy_that_exits_is_reported_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = fake_proxy(
        dir.path(),
        "echo \"started with $*\"\necho 'fatal: no such flag' >&2\nexit 3",
    );
    let (output, text) = finish(start_demo(&proxy, &[]));
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("kube-proxy-rs exited (exit status: 3) before it was ready"),
        "{text}"
    );
    assert!(text.contains("fatal: no such flag"), "{text}");
    assert!(
        text.contains("started with --proxy-mode iptables --hostname-override node1 --manifests"),
        "{text}"
    );
}

#[test]
fn a_proxy_that_never_gets_ready_times_out_and_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let proxy = fake_proxy(
        dir.path(),
        &format!(
            "echo $$ > {}\necho 'still starting'\nexec sleep 600",
            pid_file.display()
        ),
    );
    let (output, text) = finish(start_demo(&proxy, &["--ready-timeout", "2"]));
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("kube-proxy-rs was not ready after 2s"), "{text}");
    assert!(text.contains("/healthz on 127.0.0.1:10256"), "{text}");
    assert!(text.contains("still starting"), "{text}");
    assert_gone(wait_for_pid(&pid_file));
}

#[test]
fn ctrl_c_while_waiting_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let proxy = fake_proxy(
        dir.path(),
        &format!("echo $$ > {}\nexec sleep 600", pid_file.display()),
    );
    let demo = start_demo(&proxy, &[]);
    let proxy_pid = wait_for_pid(&pid_file);
    let status = Command::new("kill")
        .args(["-INT", &demo.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (output, text) = finish(demo);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains("SIGINT received: stopping and cleaning up"),
        "{text}"
    );
    assert!(text.contains("kpr-demo: interrupted"), "{text}");
    assert_gone(proxy_pid);
}
