//! Kernel parameters (`/proc/sys`), read and written through a trait so tests never touch
//! the sysctls of the namespace they run in.
//!
//! Several modes read or set the same keys (conntrack's liberal TCP tracking decides whether
//! a mode drops ctstate INVALID packets; the conntrack table size and timeouts are the
//! node's), so the access lives here rather than in any one mode.

use std::io;
use std::path::PathBuf;

/// Conntrack marks only out-of-window RSTs INVALID when this is on.
pub const TCP_BE_LIBERAL: &str = "net/netfilter/nf_conntrack_tcp_be_liberal";

/// Reads and writes kernel parameters (`/proc/sys` paths, with `/` separators).
pub trait Sysctl {
    fn get(&self, key: &str) -> io::Result<String>;
    fn set(&self, key: &str, value: &str) -> io::Result<()>;
}

/// The real `/proc/sys`.
#[derive(Clone, Debug)]
pub struct ProcSysctl {
    root: PathBuf,
}

impl Default for ProcSysctl {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/proc/sys"),
        }
    }
}

impl ProcSysctl {
    /// A sysctl tree rooted elsewhere (tests).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

impl Sysctl for ProcSysctl {
    fn get(&self, key: &str) -> io::Result<String> {
        Ok(std::fs::read_to_string(self.root.join(key))?.trim().to_string())
    }

    fn set(&self, key: &str, value: &str) -> io::Result<()> {
        std::fs::write(self.root.join(key), value)
    }
}

/// Whether `nf_conntrack_tcp_be_liberal` is on, read as upstream reads it at start-up (a
/// missing or unreadable key counts as off). Upstream then leaves out the rule dropping
/// ctstate INVALID packets.
pub fn conntrack_tcp_be_liberal(sysctl: &dyn Sysctl) -> bool {
    sysctl
        .get(TCP_BE_LIBERAL)
        .ok()
        .and_then(|value| value.parse::<i64>().ok())
        .is_some_and(|value| value != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_be_liberal_is_read_from_the_sysctl() {
        let dir = tempfile::tempdir().unwrap();
        let sysctl = ProcSysctl::at(dir.path());
        assert!(!conntrack_tcp_be_liberal(&sysctl), "missing counts as off");
        let file = dir.path().join(TCP_BE_LIBERAL);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "1\n").unwrap();
        assert!(conntrack_tcp_be_liberal(&sysctl));
        std::fs::write(&file, "0\n").unwrap();
        assert!(!conntrack_tcp_be_liberal(&sysctl));
    }
}
