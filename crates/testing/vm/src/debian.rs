//! Debian's stock kernel and static busybox, downloaded as packages and unpacked into a
//! cache, never installed on this host.
//!
//! The kernel package is whatever `linux-image-amd64` depends on now, so the guest follows
//! Debian's security updates. A stale package list makes `apt-get download` fail; one
//! `apt-get update` and a retry fix that. Concurrent test processes share the cache under
//! an exclusive file lock; an unpacked tree is published by renaming it into place, so a
//! killed process never leaves a half-unpacked tree that looks complete.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result, describe, run_checked};

/// Environment variable naming the cache directory (default `/var/cache/kpr-vm`).
pub const CACHE_ENV: &str = "KPR_VM_CACHE";
const DEFAULT_CACHE: &str = "/var/cache/kpr-vm";
const KERNEL_META_PACKAGE: &str = "linux-image-amd64";
/// Unpacked with the kernel: static busybox (the guest's base system) and `ipvsadm` with
/// its libraries (the admin's view of IPVS, which tests compare with what the proxy did;
/// this host has no IPVS, so it has no ipvsadm either).
const GUEST_PACKAGES: &[&str] = &[
    "busybox-static",
    "ipvsadm",
    "libnl-3-200",
    "libnl-genl-3-200",
    "libpopt0",
];
/// Names the unpacked tree in the cache: a new set of packages must not reuse an old tree.
const TREE_LAYOUT: &str = "guest-tools-1";
/// Start of an XZ stream: the bzImage's payload is one, holding the ELF `vmlinux`.
const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
const ELF_MAGIC: &[u8] = b"\x7fELF";
const COMPLETE_MARK: &str = ".complete";

/// An unpacked Debian kernel package (with its modules) and busybox.
#[derive(Clone, Debug)]
pub struct KernelTree {
    root: PathBuf,
    release: String,
    kernel: PathBuf,
}

impl KernelTree {
    /// Downloads and unpacks what is missing from the cache, then returns the tree.
    pub fn prepare() -> Result<Self> {
        let cache = cache_dir();
        fs::create_dir_all(&cache).map_err(|e| Error::io("creating the cache", &cache, e))?;
        let _lock = lock(&cache)?;
        let package = kernel_package()?;
        let root = cache.join(format!("{package}+{TREE_LAYOUT}"));
        if !root.join(COMPLETE_MARK).exists() {
            let packages: Vec<&str> = std::iter::once(package.as_str())
                .chain(GUEST_PACKAGES.iter().copied())
                .collect();
            let debs = download(&cache.join("debs"), &packages)?;
            unpack(&debs, &root)?;
        }
        Self::open(root)
    }

    fn open(root: PathBuf) -> Result<Self> {
        let release = only_release(&root)?;
        let vmlinux = root.join("vmlinux");
        let kernel = if vmlinux.exists() {
            vmlinux
        } else {
            root.join("boot").join(format!("vmlinuz-{release}"))
        };
        Ok(Self {
            root,
            release,
            kernel,
        })
    }

    /// The kernel's release, as `uname -r` prints it in the guest.
    pub fn release(&self) -> &str {
        &self.release
    }

    /// The image qemu boots: the uncompressed ELF `vmlinux` when it could be cut out of the
    /// bzImage (its PVH entry skips ~2 s of in-guest decompression under emulation).
    pub fn kernel(&self) -> &Path {
        &self.kernel
    }

    pub fn busybox(&self) -> PathBuf {
        self.root.join("bin/busybox")
    }

    /// Debian's `ipvsadm`, unpacked.
    pub fn ipvsadm(&self) -> PathBuf {
        self.root.join("sbin/ipvsadm")
    }

    /// Where a path of the unpacked tree goes in the guest (`None`: not from the tree).
    pub(crate) fn guest_path(&self, path: &Path) -> Option<PathBuf> {
        path.strip_prefix(&self.root)
            .ok()
            .map(|rest| Path::new("/").join(rest))
    }

    /// The tree's library directories, searched before the host's for its binaries.
    pub(crate) fn library_path(&self) -> String {
        ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"]
            .map(|dir| self.root.join(dir).display().to_string())
            .join(":")
    }

    /// `lib/modules/<release>` of the unpacked package, with the `modules.dep` made for it.
    pub fn modules(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }
}

fn cache_dir() -> PathBuf {
    std::env::var_os(CACHE_ENV).map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
}

fn lock(cache: &Path) -> Result<Flock<File>> {
    let path = cache.join(".lock");
    let file = File::create(&path).map_err(|e| Error::io("creating the lock", &path, e))?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| Error::io("locking", &path, errno.into()))
}

/// The versioned kernel package `linux-image-amd64` depends on; refreshes the package
/// lists once if they do not know it.
fn kernel_package() -> Result<String> {
    if let Some(package) = depended_kernel()? {
        return Ok(package);
    }
    apt_update()?;
    depended_kernel()?.ok_or_else(|| {
        Error::Setup(format!(
            "apt-cache depends {KERNEL_META_PACKAGE} names no linux-image-<version> package"
        ))
    })
}

fn depended_kernel() -> Result<Option<String>> {
    let mut command = Command::new("apt-cache");
    command.args(["depends", KERNEL_META_PACKAGE]);
    let Ok(stdout) = run_checked(&mut command) else {
        return Ok(None);
    };
    Ok(versioned_kernel_dependency(&String::from_utf8_lossy(&stdout)))
}

/// `  Depends: linux-image-6.1.0-56-amd64` -> `linux-image-6.1.0-56-amd64`.
fn versioned_kernel_dependency(depends: &str) -> Option<String> {
    depends.lines().find_map(|line| {
        let package = line.trim().strip_prefix("Depends:")?.trim();
        let version = package.strip_prefix("linux-image-")?;
        version
            .starts_with(|c: char| c.is_ascii_digit())
            .then(|| package.to_owned())
    })
}

fn apt_update() -> Result<()> {
    run_checked(Command::new("apt-get").args(["update", "-qq"])).map(drop)
}

/// The `.deb` of each package, downloaded into `dir` unless already there.
fn download(dir: &Path, packages: &[&str]) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| downloaded(dir, p).is_none())
        .collect();
    if !missing.is_empty() && apt_download(dir, &missing).is_err() {
        apt_update()?;
        apt_download(dir, &missing)?;
    }
    packages
        .iter()
        .map(|p| {
            downloaded(dir, p).ok_or_else(|| {
                Error::Setup(format!("apt-get download {p} left no .deb in {}", dir.display()))
            })
        })
        .collect()
}

fn downloaded(dir: &Path, package: &str) -> Option<PathBuf> {
    let prefix = format!("{package}_");
    fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).find(|path| {
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
    })
}

fn apt_download(dir: &Path, packages: &[&str]) -> Result<()> {
    let mut command = Command::new("apt-get");
    command
        .current_dir(dir)
        .args(["download", "-q", "-o", "APT::Sandbox::User=root"])
        .args(packages);
    run_checked(&mut command).map(drop)
}

/// Unpacks the packages next to `root`, makes `modules.dep` (the package ships none: depmod
/// runs at install time) and cuts out `vmlinux`, then moves the tree into place.
fn unpack(debs: &[PathBuf], root: &Path) -> Result<()> {
    let staging = root.with_extension("partial");
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| Error::io("removing", &staging, e))?;
    }
    fs::create_dir_all(&staging).map_err(|e| Error::io("creating", &staging, e))?;
    for deb in debs {
        run_checked(Command::new("dpkg").arg("-x").arg(deb).arg(&staging))?;
    }
    let release = only_release(&staging)?;
    run_checked(
        Command::new(staging.join("bin/busybox"))
            .arg("depmod")
            .arg("-b")
            .arg(&staging)
            .arg(&release),
    )?;
    let bzimage = staging.join("boot").join(format!("vmlinuz-{release}"));
    extract_vmlinux(&bzimage, &staging.join("vmlinux"))?;
    let mark = staging.join(COMPLETE_MARK);
    File::create(&mark).map_err(|e| Error::io("creating", &mark, e))?;
    fs::rename(&staging, root).map_err(|e| Error::io("moving into place", root, e))
}

fn only_release(root: &Path) -> Result<String> {
    let modules = root.join("lib/modules");
    let mut releases: Vec<String> = fs::read_dir(&modules)
        .map_err(|e| Error::io("listing", &modules, e))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    match releases.len() {
        1 => Ok(releases.remove(0)),
        n => Err(Error::Setup(format!(
            "{} holds {n} kernel releases, expected one: {releases:?}",
            modules.display()
        ))),
    }
}

/// Writes the ELF inside `bzimage` to `to`; leaves nothing when the image is not the one
/// XZ stream this expects (the caller then boots the bzImage itself).
fn extract_vmlinux(bzimage: &Path, to: &Path) -> Result<()> {
    let image = fs::read(bzimage).map_err(|e| Error::io("reading", bzimage, e))?;
    let Some(start) = find(&image, XZ_MAGIC) else {
        return Ok(());
    };
    let mut command = Command::new("xz");
    command
        .args(["-dc", "--single-stream"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = command.spawn().map_err(|source| Error::NotRun {
        command: describe(&command),
        source,
    })?;
    let mut stdin = child.stdin.take().expect("stdin was piped");
    let payload = image[start..].to_vec();
    // xz stops reading after its one stream: a broken pipe here is expected.
    let writer = std::thread::spawn(move || drop(stdin.write_all(&payload)));
    let output = child
        .wait_with_output()
        .map_err(|e| Error::io("running xz on", bzimage, e))?;
    let _ = writer.join();
    if output.stdout.starts_with(ELF_MAGIC) {
        fs::write(to, &output.stdout).map_err(|e| Error::io("writing", to, e))?;
    }
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versioned_kernel_is_read_from_apt_cache_depends() {
        let depends = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n  Depends: linux-base\n";
        assert_eq!(
            versioned_kernel_dependency(depends).as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
    }

    #[test]
    fn a_meta_package_without_a_versioned_kernel_gives_none() {
        let depends = "linux-image-amd64\n  Depends: linux-image-cloud-amd64\n  Recommends: firmware\n";
        assert_eq!(versioned_kernel_dependency(depends), None);
    }

    #[test]
    fn find_returns_the_first_occurrence() {
        assert_eq!(find(b"ab\xfd7zXZ\x00cd\xfd7zXZ\x00", XZ_MAGIC), Some(2));
        assert_eq!(find(b"nothing here", XZ_MAGIC), None);
    }
}
