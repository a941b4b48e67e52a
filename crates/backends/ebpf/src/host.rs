//! The two filesystems the mode needs: a cgroup v2 hierarchy to attach to, and a bpffs to
//! pin in. Either is mounted when the host has none, as Cilium does.

use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};

/// `BPF_FS_MAGIC` (include/uapi/linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where the mode mounts a cgroup v2 hierarchy when the host has none mounted.
pub const OWN_CGROUP2_MOUNT: &str = "/run/kube-proxy-rs/cgroupv2";

/// The mount points of every `fstype` mount in `mountinfo` (the text of
/// `/proc/self/mountinfo`): field 5 is the mount point, the field after ` - ` the type.
pub fn mount_points(mountinfo: &str, fstype: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == fstype).then(|| PathBuf::from(unescape(mount_point)))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The node's cgroup v2 root: the first cgroup2 mount (`/sys/fs/cgroup` on a unified host,
/// `/sys/fs/cgroup/unified` on a hybrid one), or one mounted at [`OWN_CGROUP2_MOUNT`].
pub fn cgroup2_root() -> Result<PathBuf, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    if let Some(root) = mount_points(&mountinfo, "cgroup2").into_iter().next() {
        return Ok(root);
    }
    let target = Path::new(OWN_CGROUP2_MOUNT);
    std::fs::create_dir_all(target).map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    mount(Some("cgroup2"), target, Some("cgroup2"), MsFlags::empty(), None::<&str>).map_err(|e| {
        format!(
            "no cgroup v2 hierarchy is mounted and mounting one at {} failed: {e} (the kernel needs cgroup v2)",
            target.display()
        )
    })?;
    tracing::info!(path = %target.display(), "mounted a cgroup v2 hierarchy");
    Ok(target.to_owned())
}

/// Fails unless `path` is a directory of a cgroup v2 hierarchy.
pub fn check_cgroup2(path: &Path) -> Result<(), String> {
    let fs = statfs(path).map_err(|e| format!("cgroup {}: {e}", path.display()))?;
    if fs.filesystem_type() == CGROUP2_SUPER_MAGIC {
        Ok(())
    } else {
        Err(format!(
            "{} is not a cgroup v2 directory (the ebpf mode attaches to cgroup v2 only)",
            path.display()
        ))
    }
}

/// Makes sure the directory that will hold `pin_root` is on a bpffs, mounting one at
/// `/sys/fs/bpf` when `pin_root` is under it and nothing is mounted there.
pub fn ensure_bpffs(pin_root: &Path) -> Result<(), String> {
    let parent = pin_root.parent().unwrap_or(pin_root);
    if is_bpffs(parent) {
        return Ok(());
    }
    let default = Path::new("/sys/fs/bpf");
    if pin_root.starts_with(default) && !is_bpffs(default) {
        std::fs::create_dir_all(default).map_err(|e| format!("cannot create {}: {e}", default.display()))?;
        mount(
            Some("bpf"),
            default,
            Some("bpf"),
            MsFlags::empty(),
            Some("mode=0700"),
        )
        .map_err(|e| format!("cannot mount bpffs at {}: {e}", default.display()))?;
        tracing::info!(path = %default.display(), "mounted bpffs");
    }
    if is_bpffs(parent) {
        Ok(())
    } else {
        Err(format!(
            "{} is not on a bpffs, where the mode pins its maps and links",
            parent.display()
        ))
    }
}

// `f_type` is a C long: i64 here, i32 on 32-bit targets.
#[allow(clippy::unnecessary_cast)]
fn is_bpffs(path: &Path) -> bool {
    statfs(path).is_ok_and(|fs| fs.filesystem_type().0 as i64 == BPF_FS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_on_a_hybrid_host() {
        let mountinfo = "\
25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
";
        assert_eq!(
            mount_points(mountinfo, "cgroup2"),
            [PathBuf::from("/sys/fs/cgroup/unified")]
        );
        assert!(mount_points(mountinfo, "bpf").is_empty());
    }

    #[test]
    fn unescapes_mount_points() {
        let mountinfo = "40 25 0:40 / /tmp/a\\040b rw - cgroup2 none rw\n";
        assert_eq!(mount_points(mountinfo, "cgroup2"), [PathBuf::from("/tmp/a b")]);
    }
}
