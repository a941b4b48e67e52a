//! A guest run: what goes in (binaries, tools, the script), the boot, and what came out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::debian::KernelTree;
use crate::error::{Error, Result};
use crate::initramfs::Initramfs;
use crate::qemu::Machine;

/// Set (to `1`) for every process in the guest: a test binary finds itself inside.
pub const GUEST_ENV: &str = "KPR_VM_GUEST";

const INIT: &str = include_str!("init.sh");
const RESULT_MARK: &str = "KPR-VM: RESULT rc=";
/// Written to the result channel by a test body that ran to its end inside the guest: a
/// test binary that matched no test would otherwise exit 0 too.
const PASSED_MARK: &str = "KPR-VM: PASSED ";

/// The host tools a guest gets unless told otherwise: what kube-proxy-rs and its tests run.
const DEFAULT_TOOLS: &[&str] = &[
    "dash",
    "ip",
    "ipset",
    "nft",
    "conntrack",
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "iptables-legacy",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "ip6tables-legacy",
    "ip6tables-legacy-save",
    "ip6tables-legacy-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
];

/// How long a guest may run before it is killed and its console reported. A test that passes
/// here takes 30-75 s (boot included) on a quiet 2-core machine and up to 110 s with two
/// guests and two busy processes on it; this leaves room for more. It stays below the
/// repository's nextest ceiling (`.config/nextest.toml`, 300 s): a hung guest must fail
/// with its console, which says where it hung, and not be killed by the test runner with
/// nothing to show.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(240);

/// What a test's waits ([`kpr_netns::eventually`]) are multiplied by in a guest: under
/// software emulation every process spawn costs about a hundred times the host's (an
/// `iptables` command 300-600 ms with two guests on a loaded 2-core host), so a first sync
/// that takes a second on the host took over 30 s there.
pub const GUEST_TIMEOUT_SCALE: u32 = 3;

/// What one guest boot carries and how big the machine is.
#[derive(Clone, Debug)]
pub struct Guest {
    binaries: Vec<PathBuf>,
    tools: Vec<String>,
    script: String,
    memory_mib: u32,
    cpus: u32,
    timeout: Duration,
}

/// What a guest reported before it powered off.
#[derive(Clone, Debug)]
pub struct GuestRun {
    /// `/payload/run`'s exit status.
    pub status: i32,
    /// Kernel and `/init` messages and everything the payload printed.
    pub console: String,
    /// What the guest wrote to `/dev/ttyS1`, byte for byte.
    pub channel: Vec<u8>,
    /// From starting qemu to its exit.
    pub elapsed: Duration,
}

impl Default for Guest {
    fn default() -> Self {
        Self {
            binaries: Vec::new(),
            tools: DEFAULT_TOOLS.iter().map(|t| (*t).to_owned()).collect(),
            script: "true".to_owned(),
            memory_mib: 1024,
            cpus: 2,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Guest {
    pub fn new() -> Self {
        Self::default()
    }

    /// A host binary, stripped, at `/payload/bin/<its file name>`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binaries.push(path.into());
        self
    }

    /// One more host tool by name (looked up in `PATH`).
    pub fn tool(mut self, name: &str) -> Self {
        self.tools.push(name.to_owned());
        self
    }

    /// The body of `/payload/run` (busybox `sh`, run in `/payload`); its exit status is
    /// [`GuestRun::status`].
    pub fn script(mut self, script: impl Into<String>) -> Self {
        self.script = script.into();
        self
    }

    pub fn memory_mib(mut self, memory_mib: u32) -> Self {
        self.memory_mib = memory_mib;
        self
    }

    pub fn cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    /// How long the guest may run; at two thirds of it, the guest writes every thread of the
    /// payload still running, with its kernel stack, to its console (which a timeout error
    /// carries).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Builds the initramfs, boots, and returns what the guest reported.
    pub fn run(&self) -> Result<GuestRun> {
        let tree = KernelTree::prepare()?;
        let scratch =
            tempfile::tempdir().map_err(|e| Error::io("creating a directory in", std::env::temp_dir(), e))?;
        let root = scratch.path().join("root");
        let mut initramfs = Initramfs::new(&root, &tree, INIT)?;
        for tool in &self.tools {
            initramfs.add_host_tool(tool)?;
        }
        for binary in &self.binaries {
            initramfs.add_payload_binary(binary, &file_name(binary)?)?;
        }
        let run = format!("#!/bin/sh\n{}\n", self.script);
        initramfs.add_file(Path::new("payload/run"), run.as_bytes(), 0o755)?;
        let initrd = scratch.path().join("initrd.cpio");
        initramfs.write_cpio(&tree.busybox(), &initrd)?;
        let machine = Machine {
            kernel: tree.kernel(),
            initrd: &initrd,
            memory_mib: self.memory_mib,
            cpus: self.cpus,
            timeout: self.timeout,
            watchdog: self.timeout * 2 / 3,
            dir: scratch.path(),
        };
        let boot = machine.boot()?;
        let status = reported_status(&boot.console).ok_or_else(|| Error::NoResult {
            console: boot.console.clone(),
        })?;
        Ok(GuestRun {
            status,
            console: boot.console,
            channel: boot.channel,
            elapsed: boot.elapsed,
        })
    }

    /// Runs `body` inside a guest: on the host, boots one that runs this same test binary
    /// with `--exact test` and panics unless the body ran there to its end; inside the
    /// guest, runs `body`. `test` is the name libtest gives the calling test
    /// (`module::name`, without the crate).
    pub fn in_guest(self, test: &str, body: impl FnOnce()) {
        self.in_guest_console(test, body);
    }

    /// [`Guest::in_guest`], returning on the host the guest's console of the passed run
    /// (`None` inside the guest): for a test that reports what its body printed there.
    pub fn in_guest_console(self, test: &str, body: impl FnOnce()) -> Option<String> {
        if std::env::var_os(GUEST_ENV).is_some() {
            body();
            report_passed(test);
            return None;
        }
        assert!(
            test.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "test name {test:?} must be a libtest path"
        );
        let exe = std::env::current_exe().expect("the test binary's own path");
        let name = file_name(&exe).expect("the test binary has a file name");
        let script = format!(
            "{}={GUEST_TIMEOUT_SCALE} exec ./bin/{name} --exact {test} --nocapture --test-threads 1",
            kpr_netns::TIMEOUT_SCALE_ENV
        );
        let run = self
            .binary(exe)
            .script(script)
            .run()
            .unwrap_or_else(|e| panic!("the guest for {test} did not run: {e}"));
        let passed = String::from_utf8_lossy(&run.channel).contains(&format!("{PASSED_MARK}{test}\n"));
        assert!(
            run.status == 0 && passed,
            "{test} failed in the guest (status {}, body {}, after {:.0?})\n{}the guest's whole console:\n{}",
            run.status,
            if passed { "finished" } else { "did not finish" },
            run.elapsed,
            crate::console::digest(&run.console),
            run.console
        );
        Some(run.console)
    }
}

/// [`Guest::in_guest`] with the default guest.
pub fn in_guest(test: &str, body: impl FnOnce()) {
    Guest::new().in_guest(test, body);
}

fn report_passed(test: &str) {
    let line = format!("{PASSED_MARK}{test}\n");
    std::fs::write("/dev/ttyS1", line).expect("writing the result channel /dev/ttyS1");
}

fn reported_status(console: &str) -> Option<i32> {
    let line = console.lines().rev().find(|l| l.contains(RESULT_MARK))?;
    let after = &line[line.find(RESULT_MARK)? + RESULT_MARK.len()..];
    after.split_whitespace().next()?.parse().ok()
}

fn file_name(path: &Path) -> Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| Error::Setup(format!("{} has no file name", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_result_line_gives_the_status() {
        let console = "boot\nKPR-VM: RESULT rc=3 uptime=2.1 s\n[ 2.5] reboot: Power down\n";
        assert_eq!(reported_status(console), Some(3));
        assert_eq!(reported_status("no result here\n"), None);
    }
}
