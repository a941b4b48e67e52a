//! Socket-layer sandboxes: a cgroup v2 pair in which chosen namespaces' threads live, for
//! a mode whose programs attach to a cgroup (ebpf mode).
//!
//! The lab's "pods", "node" and "client" are threads of the test process, so whether a
//! socket is translated must be decided per thread: cgroup v2's threaded mode does that.
//! The test process moves into a fresh domain cgroup; a threaded child of it is the cgroup
//! the programs attach to; every thread that [`crate::Netns::run`] starts in a chosen
//! namespace (and every process such a thread spawns) joins the child first. So the pods'
//! and the node's sockets are translated and the outside client's are not, as on a node.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::netns::Netns;

/// (namespace path, threaded cgroup) of every live sandbox of this process.
static CHOSEN: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

/// One sandbox per process at a time: each moves the whole process (cargo-nextest runs each
/// test in a process of its own; under `cargo test` ebpf mode's tests wait for each other).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A cgroup pair and a bpffs pin directory of a test's own, removed on drop (after the
/// process left the cgroups; pins are removed, which detaches what they held).
#[derive(Debug)]
pub struct SocketCgroup {
    domain: PathBuf,
    threads: PathBuf,
    home: PathBuf,
    pins: PathBuf,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl SocketCgroup {
    /// Creates the cgroups, moves this process into the domain one and chooses `netns`
    /// (their threads from now on join the threaded one).
    pub fn create(tag: &str, netns: &[&Netns]) -> Result<Self> {
        let turn = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let root = cgroup2_root()?;
        let name = format!("kpr-sockets-{}-{tag}", std::process::id());
        let domain = root.join(&name);
        let threads = domain.join("sockets");
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(io("read /proc/self/cgroup"))?;
        let relative = own
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .ok_or_else(|| Error::Io {
                what: "this process's cgroup v2 path".to_owned(),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
        let home = root.join(relative.trim_start_matches('/'));
        let sandbox = Self {
            domain: domain.clone(),
            threads: threads.clone(),
            home,
            pins: PathBuf::from(format!("/sys/fs/bpf/{name}")),
            _turn: turn,
        };
        std::fs::create_dir(&domain).map_err(io(&format!("create {}", domain.display())))?;
        write(&domain.join("cgroup.procs"), &std::process::id().to_string())?;
        std::fs::create_dir(&threads).map_err(io(&format!("create {}", threads.display())))?;
        write(&threads.join("cgroup.type"), "threaded")?;
        let mut chosen = lock();
        for ns in netns {
            chosen.push((ns.path(), threads.clone()));
        }
        Ok(sandbox)
    }

    /// The threaded cgroup: the socket programs' `--cgroup-root`.
    pub fn path(&self) -> &Path {
        &self.threads
    }

    /// A bpffs directory for the programs' pins (`--ebpf-pin-root`), removed on drop.
    pub fn pins(&self) -> &Path {
        &self.pins
    }
}

impl Drop for SocketCgroup {
    fn drop(&mut self) {
        lock().retain(|(_, threads)| threads != &self.threads);
        let _ = std::fs::write(self.home.join("cgroup.procs"), std::process::id().to_string());
        let _ = std::process::Command::new("rm")
            .arg("-rf")
            .arg(&self.pins)
            .status();
        let _ = std::fs::remove_dir(&self.threads);
        let _ = std::fs::remove_dir(&self.domain);
    }
}

/// Called by a thread that just entered the namespace at `netns`: joins the threaded
/// cgroup if a sandbox chose that namespace.
pub(crate) fn join_if_chosen(netns: &Path) -> Result<()> {
    let target = lock()
        .iter()
        .find(|(path, _)| path == netns)
        .map(|(_, threads)| threads.clone());
    match target {
        Some(threads) => write(
            &threads.join("cgroup.threads"),
            &nix::unistd::gettid().to_string(),
        ),
        None => Ok(()),
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<(PathBuf, PathBuf)>> {
    CHOSEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(io(&format!("write {text} to {}", path.display())))
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: what.to_owned(),
        source,
    }
}

/// The first cgroup2 mount of this process's mount namespace.
fn cgroup2_root() -> Result<PathBuf> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(io("read /proc/self/mountinfo"))?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .ok_or_else(|| Error::Io {
            what: "no cgroup v2 hierarchy is mounted".to_owned(),
            source: std::io::ErrorKind::NotFound.into(),
        })
}
