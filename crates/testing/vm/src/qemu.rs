//! One boot of the guest under qemu's software emulation (TCG), to power-off or timeout.
//!
//! `-nodefaults` gives the guest no network device, so nothing it sends can leave it. Two
//! serial ports: the console (kernel and `/init` messages, the test's output) and a raw
//! second one, a clean byte channel for results. Both go to files that are read after the
//! guest is gone.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result, describe};

const QEMU: &str = "qemu-system-x86_64";
const POLL: Duration = Duration::from_millis(20);

pub(crate) struct Machine<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub memory_mib: u32,
    pub cpus: u32,
    pub timeout: Duration,
    /// The guest's uptime at which its `/init` reports every thread of a payload still
    /// running (see `init.sh`).
    pub watchdog: Duration,
    /// Where the two serial ports' files go.
    pub dir: &'a Path,
}

pub(crate) struct Boot {
    pub console: String,
    pub channel: Vec<u8>,
    pub elapsed: Duration,
}

impl Machine<'_> {
    pub(crate) fn boot(&self) -> Result<Boot> {
        let console_path = self.dir.join("console.log");
        let channel_path = self.dir.join("channel.out");
        let mut command = self.command(&console_path, &channel_path);
        let started = Instant::now();
        let mut child = command.spawn().map_err(|source| Error::NotRun {
            command: format!(
                "{} (install qemu-system-x86; scripts/ensure-packages does)",
                describe(&command)
            ),
            source,
        })?;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|e| Error::io("waiting for", QEMU, e))? {
                break Some(status);
            }
            if started.elapsed() > self.timeout {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(POLL);
        };
        let elapsed = started.elapsed();
        let console = read_lossy(&console_path);
        let Some(status) = status else {
            return Err(Error::Timeout {
                after: self.timeout,
                console,
            });
        };
        if !status.success() {
            let stderr = read_lossy(&self.dir.join("qemu.err"));
            return Err(Error::Failed {
                command: describe(&command),
                status: status.to_string(),
                stderr: format!("{stderr}\nconsole:\n{console}"),
            });
        }
        let channel = fs::read(&channel_path).unwrap_or_default();
        Ok(Boot {
            console,
            channel,
            elapsed,
        })
    }

    fn command(&self, console: &Path, channel: &Path) -> Command {
        let mut command = Command::new(QEMU);
        command
            .args(["-M", "pc", "-accel", "tcg", "-cpu", "max"])
            .args(["-m", &self.memory_mib.to_string(), "-smp", &self.cpus.to_string()])
            .args([
                "-nodefaults",
                "-no-user-config",
                "-display",
                "none",
                "-monitor",
                "none",
            ])
            .arg("-no-reboot")
            .args([
                "-serial",
                &file_backend(console),
                "-serial",
                &file_backend(channel),
            ])
            .arg("-kernel")
            .arg(self.kernel)
            .arg("-initrd")
            .arg(self.initrd)
            .args(["-append", &kernel_command_line(self.watchdog)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.dir.join("qemu.err")).map_or_else(|_| Stdio::null(), Stdio::from));
        command
    }
}

/// The dotted `kpr_vm.watchdog` is a parameter of no module, so the kernel keeps it out of
/// `/init`'s arguments and environment; `/init` reads it from `/proc/cmdline`.
fn kernel_command_line(watchdog: Duration) -> String {
    format!(
        "console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init kpr_vm.watchdog={}",
        watchdog.as_secs().max(1)
    )
}

fn file_backend(path: &Path) -> String {
    format!("file:{}", PathBuf::from(path).display())
}

fn read_lossy(path: &Path) -> String {
    fs::read(path).map_or_else(
        |_| String::new(),
        |bytes| String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_goes_to_the_kernel_command_line_in_whole_seconds() {
        let line = kernel_command_line(Duration::from_millis(160_900));
        assert!(line.ends_with(" kpr_vm.watchdog=160"), "{line}");
        let line = kernel_command_line(Duration::from_millis(200));
        assert!(line.ends_with(" kpr_vm.watchdog=1"), "{line}");
    }
}
