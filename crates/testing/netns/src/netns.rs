//! One named network namespace, owned: created on construction, emptied and deleted on drop.
//!
//! Code runs inside it on a fresh thread that joins it with `setns(2)`: sockets that thread
//! opens (and processes it spawns) belong to the namespace, so clients and backends live
//! inside namespaces without helper processes, and the test's own threads never move.

use std::ffi::OsStr;
use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sched::{CloneFlags, setns};

use crate::error::{Error, Result};
use crate::naming::{namespace_name, next_serial};
use crate::shell::{ip, run_checked};
use crate::sweep::{NETNS_DIR, kill_processes_inside, sweep_once_before_first_create};

/// A named network namespace (`ip netns`), deleted when dropped.
///
/// Dropping it SIGKILLs every process still inside, tells backends started in it to stop
/// and deletes the name; the kernel frees the namespace (and its interfaces) once the last
/// thread using it is gone.
#[derive(Debug)]
pub struct Netns {
    name: String,
    closed: Arc<AtomicBool>,
}

impl Netns {
    /// Creates a stand-alone namespace `kpr<pid>x<serial>-<role>` with `lo` up, for tests
    /// that need one namespace rather than a whole [`crate::Lab`].
    pub fn new(role: &str) -> Result<Self> {
        Self::create(namespace_name(next_serial(), role)?)
    }

    /// Creates namespace `name` with `lo` up.
    pub(crate) fn create(name: String) -> Result<Self> {
        sweep_once_before_first_create();
        ip(&["netns", "add", &name])?;
        // From here on, Drop deletes it whatever fails next.
        let netns = Self {
            name,
            closed: Arc::default(),
        };
        netns.ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    /// The namespace's name, as `ip netns list` shows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file that pins the namespace (`/run/netns/<name>`).
    pub fn path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// Runs `f` on a fresh thread inside this namespace and returns its result; a panic in
    /// `f` is resumed on the caller's thread.
    ///
    /// # Panics
    /// When the thread cannot join the namespace (it was deleted, or we are not root).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = self.path();
        std::thread::scope(|scope| {
            let worker = scope.spawn(move || {
                if let Err(err) = enter(&path) {
                    panic!("{err}");
                }
                if let Err(err) = crate::cgroup::join_if_chosen(&path) {
                    panic!("{err}");
                }
                f()
            });
            worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// `ip netns exec <name> <program>`: a command that runs inside this namespace, with
    /// `/sys` remounted to match it.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Runs the shell line `script` inside this namespace and returns its stdout; the error
    /// carries the exit status and stderr.
    pub fn sh(&self, script: &str) -> Result<String> {
        run_checked(self.command("sh").args(["-c", script]))
    }

    /// `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Sets sysctl `key` (dotted, e.g. `net.ipv4.ip_forward`) to `value` in this namespace.
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = sysctl_path(key);
        // Path and value travel as arguments, never as shell text.
        run_checked(
            self.command("sh")
                .args(["-c", r#"printf '%s\n' "$1" > "$2""#, "sh", value, &path]),
        )?;
        Ok(())
    }

    /// Reads sysctl `key` in this namespace, trimmed.
    pub fn sysctl(&self, key: &str) -> Result<String> {
        let path = sysctl_path(key);
        let out = run_checked(self.command("cat").arg(&path))?;
        Ok(out.trim().to_owned())
    }

    /// Whether sysctl `key` exists in this namespace.
    pub(crate) fn has_sysctl(&self, key: &str) -> bool {
        self.command("test")
            .args(["-e", &sysctl_path(key)])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Set when the namespace is being deleted: backends started in it stop.
    pub(crate) fn closed_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.closed)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        kill_processes_inside(&self.name);
        if let Err(err) = ip(&["netns", "del", &self.name]) {
            eprintln!("kpr-netns: cannot delete namespace {}: {err}", self.name);
        }
    }
}

/// `/run/netns/<name>`.
pub(crate) fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Moves the calling thread into the namespace pinned at `path` ([`Netns::path`]) for good.
///
/// For threads that must live there, such as the worker threads of an async runtime whose
/// tasks open sockets in the namespace (call it from the runtime's `on_thread_start`, which
/// can hold the path but not the [`Netns`]). Everything else should use [`Netns::run`],
/// which leaves the caller's thread where it is.
pub fn enter(path: &std::path::Path) -> Result<()> {
    let what = || format!("cannot enter network namespace {}", path.display());
    let file = File::open(path).map_err(|source| Error::Io { what: what(), source })?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| Error::Io {
        what: what(),
        source: errno.into(),
    })
}

/// `net.ipv4.ip_forward` -> `/proc/sys/net/ipv4/ip_forward`.
fn sysctl_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(name: &str) -> bool {
        netns_path(name).exists()
    }

    #[test]
    fn sysctl_keys_map_to_proc_paths() {
        assert_eq!(
            sysctl_path("net.bridge.bridge-nf-call-iptables"),
            "/proc/sys/net/bridge/bridge-nf-call-iptables"
        );
    }

    #[test]
    fn a_namespace_exists_until_dropped() {
        let netns = Netns::new("solo").unwrap();
        let name = netns.name().to_owned();
        assert!(exists(&name));
        assert!(ip(&["netns", "list"]).unwrap().contains(&name));
        drop(netns);
        assert!(!exists(&name));
        assert!(!ip(&["netns", "list"]).unwrap().contains(&name));
    }

    #[test]
    fn run_happens_inside_the_namespace() {
        let netns = Netns::new("run").unwrap();
        netns.ip(&["link", "add", "kprprobe0", "type", "bridge"]).unwrap();
        let inside = netns.run(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap());
        let outside = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
        assert!(inside.contains("kprprobe0"), "{inside}");
        assert!(!outside.contains("kprprobe0"), "{outside}");
    }

    #[test]
    fn a_thread_that_enters_stays_inside() {
        let netns = Netns::new("enter").unwrap();
        netns.ip(&["link", "add", "kprprobe1", "type", "bridge"]).unwrap();
        let inside = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    enter(&netns.path()).unwrap();
                    std::fs::read_to_string("/proc/thread-self/net/dev").unwrap()
                })
                .join()
                .unwrap()
        });
        assert!(inside.contains("kprprobe1"), "{inside}");
        let outside = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
        assert!(!outside.contains("kprprobe1"), "{outside}");
    }

    #[test]
    fn run_resumes_panics_on_the_caller() {
        let netns = Netns::new("panic").unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| netns.run(|| panic!("boom"))));
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    }

    #[test]
    fn sh_returns_stdout_and_reports_stderr() {
        let netns = Netns::new("sh").unwrap();
        assert_eq!(netns.sh("echo hello").unwrap(), "hello\n");
        let err = netns.sh("echo broken >&2; exit 2").unwrap_err().to_string();
        assert!(err.contains("broken"), "{err}");
    }

    #[test]
    fn sysctls_are_per_namespace() {
        let netns = Netns::new("sysctl").unwrap();
        netns.set_sysctl("net.ipv4.ip_forward", "1").unwrap();
        assert_eq!(netns.sysctl("net.ipv4.ip_forward").unwrap(), "1");
        netns.set_sysctl("net.ipv4.ip_forward", "0").unwrap();
        assert_eq!(netns.sysctl("net.ipv4.ip_forward").unwrap(), "0");
        assert!(netns.has_sysctl("net.ipv4.ip_forward"));
        assert!(!netns.has_sysctl("net.ipv4.no_such_knob"));
    }

    #[test]
    fn dropping_kills_processes_left_inside() {
        let netns = Netns::new("procs").unwrap();
        let mut child = netns.command("sleep").arg("600").spawn().unwrap();
        crate::eventually(
            std::time::Duration::from_secs(5),
            std::time::Duration::from_millis(20),
            || {
                let pids = ip(&["netns", "pids", netns.name()]).map_err(|e| e.to_string())?;
                if pids.trim().is_empty() {
                    Err("sleep not in the namespace yet".to_owned())
                } else {
                    Ok(())
                }
            },
        );
        drop(netns);
        let status = child.wait().unwrap();
        assert!(!status.success(), "sleep should have been killed: {status}");
    }
}
