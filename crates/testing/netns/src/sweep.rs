//! Removing namespaces left behind by test processes that died without running `Drop`
//! (killed by a timeout, SIGKILL, an abort in another thread).

use std::io;
use std::path::Path;
use std::sync::Once;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::naming::owner_pid;
use crate::shell::ip;

/// Part of a lab's log directory name after `kpr<pid>x<serial>`.
pub(crate) const LOG_DIR_MARKER: &str = "-logs-";

/// Where `ip netns` keeps the named namespaces.
pub(crate) const NETNS_DIR: &str = "/run/netns";

/// Deletes every harness namespace whose creating process no longer runs, killing whatever
/// still runs inside it first. Returns the names deleted. Namespaces of live processes
/// (other tests running in parallel) are left alone.
pub fn sweep_stale_namespaces() -> Vec<String> {
    sweep(|pid| !is_alive(pid))
}

/// Before this process creates its first namespace: removes namespaces named after our own
/// pid too. They can only be leftovers of an earlier, dead process that had the same pid,
/// and they would make our `ip netns add` fail.
pub(crate) fn sweep_once_before_first_create() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let own = std::process::id() as i32;
        sweep(|pid| pid == own || !is_alive(pid));
    });
}

fn sweep(is_stale: impl Fn(i32) -> bool) -> Vec<String> {
    let mut deleted = Vec::new();
    for name in harness_namespaces() {
        if owner_pid(&name).is_some_and(&is_stale) {
            kill_processes_inside(&name);
            match ip(&["netns", "del", &name]) {
                Ok(_) => deleted.push(name),
                // Another test process may have swept it a moment earlier.
                Err(err) if !Path::new(NETNS_DIR).join(&name).exists() => drop(err),
                Err(err) => eprintln!("kpr-netns: cannot delete stale namespace {name}: {err}"),
            }
        }
    }
    deleted
}

/// Names in [`NETNS_DIR`] that the harness could have created.
fn harness_namespaces() -> Vec<String> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(err) => {
            eprintln!("kpr-netns: cannot list {NETNS_DIR}: {err}");
            return Vec::new();
        }
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| owner_pid(name).is_some())
        .collect()
}

/// SIGKILLs every process whose network namespace is `name`, except this one.
pub(crate) fn kill_processes_inside(name: &str) {
    let own = std::process::id() as i32;
    let Ok(listing) = ip(&["netns", "pids", name]) else {
        return;
    };
    for pid in listing
        .split_whitespace()
        .filter_map(|pid| pid.parse::<i32>().ok())
    {
        if pid != own && pid > 0 {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Deletes the log directories ([`crate::Lab::log_dir`]) of test processes that no longer
/// run; a killed process never got to delete its own.
pub(crate) fn sweep_stale_log_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let stale = name.contains(LOG_DIR_MARKER) && owner_pid(&name).is_some_and(|pid| !is_alive(pid));
        if stale {
            // Another process may be removing it at the same time.
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether `pid` names a running (or not yet reaped) process.
fn is_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // EPERM means it exists but belongs to someone we may not signal.
    !matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_an_impossible_pid_is_not() {
        assert!(is_alive(std::process::id() as i32));
        assert!(!is_alive(dead_pid()));
        assert!(!is_alive(0));
        assert!(!is_alive(-1));
    }

    /// A pid that can never be alive: pids are always below `pid_max`.
    pub(crate) fn dead_pid() -> i32 {
        std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}
