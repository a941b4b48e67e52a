//! The guest's whole root filesystem: an uncompressed `newc` cpio the kernel unpacks into
//! memory before running `/init`.
//!
//! Only what a test needs goes in: a root of a few tens of MiB unpacks in well under a
//! second under emulation. Binaries keep their host paths (host and guest userland are the
//! same Debian release, so the dynamic loader finds the libraries `ldd` listed where they
//! were); the test's own binaries lose their debug info on the way in (a debug build of
//! kube-proxy-rs is ~250 MiB, stripped ~30 MiB).

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::debian::KernelTree;
use crate::error::{Error, Result, describe, run_checked};

/// Kernel modules the guest may load, as paths under `lib/modules/<release>/kernel`; the
/// kernel loads them on demand. Directories take every module below them.
const MODULES: &[&str] = &[
    "net/netfilter",
    "net/ipv4/netfilter",
    "net/ipv6/netfilter",
    "net/bridge",
    "drivers/net/veth.ko",
    "drivers/net/dummy.ko",
    // libcrc32c (nf_conntrack's) needs it through a softdep that modules.dep does not list.
    "crypto/crc32c_generic.ko",
];

/// Directories of plug-ins loaded with `dlopen` (so `ldd` does not list them), copied whole
/// when a tool from the same package is added.
const PLUGIN_DIRS: &[(&str, &str)] = &[("xtables", "/usr/lib/x86_64-linux-gnu/xtables")];

/// Small host files the tools read (protocol and service names).
const HOST_FILES: &[&str] = &["/etc/protocols", "/etc/services"];

pub(crate) struct Initramfs {
    root: PathBuf,
    libraries: BTreeSet<PathBuf>,
}

impl Initramfs {
    /// A root in `root` (an empty directory) with busybox, the modules and `/init`.
    pub(crate) fn new(root: &Path, tree: &KernelTree, init: &str) -> Result<Self> {
        let mut initramfs = Self {
            root: root.to_path_buf(),
            libraries: BTreeSet::new(),
        };
        for dir in ["bin", "sbin", "proc", "sys", "dev", "run", "tmp", "payload/bin"] {
            initramfs.mkdir(Path::new(dir))?;
        }
        copy(&tree.busybox(), &root.join("bin/busybox"))?;
        // The kernel runs /sbin/modprobe to load a module on demand.
        link("/bin/busybox", &root.join("sbin/modprobe"))?;
        initramfs.add_modules(tree)?;
        initramfs.add_tree_binary(tree, &tree.ipvsadm())?;
        for file in HOST_FILES {
            if Path::new(file).exists() {
                initramfs.add_host_file(Path::new(file))?;
            }
        }
        initramfs.add_file(Path::new("init"), init.as_bytes(), 0o755)?;
        Ok(initramfs)
    }

    /// A tool from this host's `PATH`, at its real path, with the name it was called by
    /// linked to it (the iptables flavours dispatch on that name), and its libraries.
    pub(crate) fn add_host_tool(&mut self, name: &str) -> Result<()> {
        let found = which(name).ok_or_else(|| {
            Error::Setup(format!(
                "{name} is not installed on this host, so it cannot go into the guest \
                 (scripts/ensure-packages installs the kernel tools)"
            ))
        })?;
        let real = fs::canonicalize(&found).map_err(|e| Error::io("resolving", &found, e))?;
        if !self.guest_path(&real).exists() {
            self.add_host_file(&real)?;
            self.add_libraries(&real)?;
        }
        let called = usr_path(&found);
        if called != real && !self.guest_path(&called).exists() {
            link(&real, &self.guest_path(&called))?;
        }
        let package_dir = real.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        for (marker, dir) in PLUGIN_DIRS {
            if package_dir.starts_with(marker) {
                self.add_plugin_dir(Path::new(dir))?;
            }
        }
        Ok(())
    }

    /// A binary of the unpacked packages at its packaged path, with its libraries (the
    /// packaged ones where the tree has them).
    pub(crate) fn add_tree_binary(&mut self, tree: &KernelTree, binary: &Path) -> Result<()> {
        let Some(guest) = tree.guest_path(binary) else {
            return Err(Error::Setup(format!(
                "{} is not in the unpacked packages",
                binary.display()
            )));
        };
        let to = self.guest_path(&usr_path(&guest));
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io("creating", parent, e))?;
        }
        copy(binary, &to)?;
        let mut ldd = Command::new("ldd");
        ldd.arg(binary).env("LD_LIBRARY_PATH", tree.library_path());
        for library in ldd_paths(&String::from_utf8_lossy(&run_checked(&mut ldd)?)) {
            let guest = tree.guest_path(&library);
            let to = self.guest_path(guest.as_deref().unwrap_or(&library));
            if self.libraries.insert(to.clone()) {
                if let Some(parent) = to.parent() {
                    fs::create_dir_all(parent).map_err(|e| Error::io("creating", parent, e))?;
                }
                copy(&library, &to)?;
            }
        }
        Ok(())
    }

    /// A test binary, without its debug info, at `/payload/bin/<name>`.
    pub(crate) fn add_payload_binary(&mut self, host: &Path, name: &str) -> Result<()> {
        let to = self.root.join("payload/bin").join(name);
        let mut strip = Command::new("strip");
        strip.arg("--strip-debug").arg("-o").arg(&to).arg(host);
        run_checked(&mut strip)?;
        self.add_libraries(host)
    }

    pub(crate) fn add_file(&mut self, guest: &Path, contents: &[u8], mode: u32) -> Result<()> {
        let to = self.root.join(guest);
        if let Some(parent) = to.parent() {
            self.mkdir(parent.strip_prefix(&self.root).unwrap_or(parent))?;
        }
        fs::write(&to, contents).map_err(|e| Error::io("writing", &to, e))?;
        fs::set_permissions(&to, fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("setting the mode of", &to, e))
    }

    /// Writes the cpio archive of the whole root to `to`.
    pub(crate) fn write_cpio(&self, busybox: &Path, to: &Path) -> Result<()> {
        let mut entries = Vec::new();
        list_tree(&self.root, Path::new("."), &mut entries)?;
        let archive = fs::File::create(to).map_err(|e| Error::io("creating", to, e))?;
        let mut command = Command::new(busybox);
        command
            .args(["cpio", "-o", "-H", "newc", "-R", "0:0"])
            .current_dir(&self.root)
            .stdin(Stdio::piped())
            .stdout(archive)
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|source| Error::NotRun {
            command: describe(&command),
            source,
        })?;
        let mut names = entries.join("\n");
        names.push('\n');
        child
            .stdin
            .take()
            .expect("stdin was piped")
            .write_all(names.as_bytes())
            .map_err(|e| Error::io("listing files for", to, e))?;
        let output = child
            .wait_with_output()
            .map_err(|e| Error::io("waiting for cpio writing", to, e))?;
        if output.status.success() {
            return Ok(());
        }
        Err(Error::Failed {
            command: describe(&command),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    fn add_modules(&mut self, tree: &KernelTree) -> Result<()> {
        let modules = tree.modules();
        let dep_path = modules.join("modules.dep");
        let deps = fs::read_to_string(&dep_path).map_err(|e| Error::io("reading", &dep_path, e))?;
        let dependencies = parse_modules_dep(&deps);
        let wanted = dependencies
            .iter()
            .map(|(module, _)| module.as_str())
            .filter(|module| is_wanted(module));
        let closure = dependency_closure(wanted, &dependencies);
        let guest_modules = Path::new("lib/modules").join(tree.release());
        for module in &closure {
            let from = modules.join(module);
            let to = self.root.join(&guest_modules).join(module);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent).map_err(|e| Error::io("creating", parent, e))?;
            }
            copy(&from, &to)?;
        }
        for index in ["modules.builtin", "modules.order"] {
            let from = modules.join(index);
            if from.exists() {
                copy(&from, &self.root.join(&guest_modules).join(index))?;
            }
        }
        let mut depmod = Command::new(tree.busybox());
        depmod.arg("depmod").arg("-b").arg(&self.root).arg(tree.release());
        run_checked(&mut depmod).map(drop)
    }

    fn add_plugin_dir(&mut self, dir: &Path) -> Result<()> {
        if self.guest_path(dir).exists() || !dir.exists() {
            return Ok(());
        }
        let entries = fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() {
                self.add_host_file(&path)?;
                self.add_libraries(&path)?;
            }
        }
        Ok(())
    }

    /// Every shared library `ldd` lists for `binary` (nothing for a static one).
    fn add_libraries(&mut self, binary: &Path) -> Result<()> {
        let Ok(output) = Command::new("ldd").arg(binary).output() else {
            return Err(Error::Setup("ldd is not installed on this host".into()));
        };
        for library in ldd_paths(&String::from_utf8_lossy(&output.stdout)) {
            if self.libraries.insert(self.guest_path(&library)) {
                self.add_host_file(&library)?;
            }
        }
        Ok(())
    }

    /// `host` copied (symlinks followed) to the same path in the guest.
    fn add_host_file(&mut self, host: &Path) -> Result<()> {
        let to = self.guest_path(host);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io("creating", parent, e))?;
        }
        copy(host, &to)
    }

    fn guest_path(&self, host: &Path) -> PathBuf {
        self.root.join(host.strip_prefix("/").unwrap_or(host))
    }

    fn mkdir(&self, dir: &Path) -> Result<()> {
        let path = self.root.join(dir);
        fs::create_dir_all(&path).map_err(|e| Error::io("creating", &path, e))
    }
}

fn is_wanted(module: &str) -> bool {
    let Some(path) = module.strip_prefix("kernel/") else {
        return false;
    };
    MODULES
        .iter()
        .any(|want| path == *want || path.starts_with(&format!("{want}/")))
}

/// `modules.dep` lines (`kernel/a.ko: kernel/b.ko kernel/c.ko`) as (module, dependencies).
fn parse_modules_dep(text: &str) -> Vec<(String, Vec<String>)> {
    text.lines()
        .filter_map(|line| {
            let (module, deps) = line.split_once(':')?;
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            Some((module.trim().to_owned(), deps))
        })
        .collect()
}

fn dependency_closure<'a>(
    wanted: impl Iterator<Item = &'a str>,
    dependencies: &[(String, Vec<String>)],
) -> BTreeSet<String> {
    let mut closure = BTreeSet::new();
    let mut todo: Vec<String> = wanted.map(str::to_owned).collect();
    while let Some(module) = todo.pop() {
        if !closure.insert(module.clone()) {
            continue;
        }
        if let Some((_, deps)) = dependencies.iter().find(|(m, _)| *m == module) {
            todo.extend(deps.iter().cloned());
        }
    }
    closure
}

/// The absolute paths in `ldd` output: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x..)`
/// and the loader's own line `/lib64/ld-linux-x86-64.so.2 (0x..)`.
fn ldd_paths(output: &str) -> Vec<PathBuf> {
    output
        .lines()
        .filter_map(|line| {
            let target = line.split_once("=>").map_or(line, |(_, to)| to).trim();
            let path = target.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Debian merged `/bin` into `/usr/bin` (and `/sbin`, `/lib`): the guest's `/bin` is
/// busybox's, so host tools go to their `/usr` paths.
fn usr_path(path: &Path) -> PathBuf {
    for merged in ["/bin", "/sbin", "/lib"] {
        if let Ok(rest) = path.strip_prefix(merged) {
            return Path::new("/usr").join(merged.trim_start_matches('/')).join(rest);
        }
    }
    path.to_path_buf()
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .map(drop)
        .map_err(|e| Error::io("copying into the initramfs", from, e))
}

fn link(target: impl AsRef<Path>, at: &Path) -> Result<()> {
    if let Some(parent) = at.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io("creating", parent, e))?;
    }
    symlink(target, at).map_err(|e| Error::io("linking", at, e))
}

/// Every path below `dir`, relative and starting with `./`, parents before children.
fn list_tree(dir: &Path, relative: &Path, out: &mut Vec<String>) -> Result<()> {
    out.push(relative.to_string_lossy().into_owned());
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(|e| Error::io("listing", dir, e))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        list_tree(&entry.path(), &relative.join(entry.file_name()), out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_library_and_loader_paths() {
        let output = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                      \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                      \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n\
                      \tnot a dynamic executable\n";
        assert_eq!(
            ldd_paths(output),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }

    #[test]
    fn the_closure_follows_dependencies_of_dependencies() {
        let deps = parse_modules_dep(
            "kernel/net/netfilter/ipvs/ip_vs_rr.ko: kernel/net/netfilter/ipvs/ip_vs.ko\n\
             kernel/net/netfilter/ipvs/ip_vs.ko: kernel/net/netfilter/nf_conntrack.ko\n\
             kernel/net/netfilter/nf_conntrack.ko: kernel/lib/libcrc32c.ko\n\
             kernel/lib/libcrc32c.ko:\n\
             kernel/sound/unrelated.ko:\n",
        );
        let closure = dependency_closure(["kernel/net/netfilter/ipvs/ip_vs_rr.ko"].into_iter(), &deps);
        assert_eq!(closure.len(), 4);
        assert!(closure.contains("kernel/lib/libcrc32c.ko"));
        assert!(!closure.contains("kernel/sound/unrelated.ko"));
    }

    #[test]
    fn modules_are_chosen_by_directory_or_exact_file() {
        assert!(is_wanted("kernel/net/netfilter/ipvs/ip_vs.ko"));
        assert!(is_wanted("kernel/drivers/net/dummy.ko"));
        assert!(!is_wanted("kernel/drivers/net/dummy2.ko"));
        assert!(!is_wanted("kernel/net/netfilterx/a.ko"));
    }

    #[test]
    fn merged_usr_paths_move_under_usr() {
        assert_eq!(usr_path(Path::new("/sbin/ip")), Path::new("/usr/sbin/ip"));
        assert_eq!(usr_path(Path::new("/usr/sbin/nft")), Path::new("/usr/sbin/nft"));
    }
}
