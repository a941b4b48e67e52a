//! Long-running programs (the kube-proxy-rs binary) started inside a namespace, with their
//! output in a log file, stopped and reaped when the guard goes away.
//!
//! Each program gets its own process group, so stopping it also stops what it spawned
//! (`iptables-restore`, ...). When a test panics, the guard prints the logs: the proxy's
//! own account of what went wrong lands next to the failed assertion.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::netns::Netns;

/// How long a program gets to exit after SIGTERM before it is SIGKILLed.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

const EXIT_POLL: Duration = Duration::from_millis(20);

/// Process groups started through a lab and not yet reaped, so the lab can kill them even
/// if their guards were leaked.
pub(crate) type Registry = Arc<Mutex<BTreeSet<u32>>>;

/// A running program; SIGTERMed (then SIGKILLed) and reaped on drop.
#[derive(Debug)]
pub struct ProcessGuard {
    child: Child,
    label: String,
    log_path: PathBuf,
    exit: Option<ExitStatus>,
    registry: Registry,
    // Keeps the log directory alive as long as any guard may read from it.
    _log_dir: Arc<TempDir>,
}

/// Where a spawned program's output goes.
pub(crate) struct LogTarget {
    pub(crate) dir: Arc<TempDir>,
    pub(crate) path: PathBuf,
}

/// Starts `command` inside `ns` with stdin closed and stdout/stderr appended to the log.
pub(crate) fn spawn_in(
    ns: &Netns,
    mut command: Command,
    log: LogTarget,
    registry: Registry,
) -> io::Result<ProcessGuard> {
    let file = File::options().create(true).append(true).open(&log.path)?;
    command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .process_group(0);
    let label = format!("{} in {}", program_name(&command), ns.name());
    // A child starts in the network namespace of the thread that forks it.
    let child = ns.run(move || command.spawn())?;
    lock(&registry).insert(child.id());
    Ok(ProcessGuard {
        child,
        label,
        log_path: log.path,
        exit: None,
        registry,
        _log_dir: log.dir,
    })
}

impl ProcessGuard {
    /// The program's pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything it has written to stdout and stderr so far.
    pub fn logs(&self) -> String {
        match std::fs::read(&self.log_path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(err) => format!("<cannot read {}: {err}>", self.log_path.display()),
        }
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Its exit status if it has exited (on its own or stopped), without waiting.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait()?;
            if self.exit.is_some() {
                self.forget_group();
            }
        }
        Ok(self.exit)
    }

    /// SIGTERMs its process group, waits up to [`STOP_GRACE`], then SIGKILLs it; returns
    /// how the program ended. Calling it again returns the same status.
    pub fn stop(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.try_wait()? {
            return Ok(status);
        }
        self.signal_group(Signal::SIGTERM);
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait()? {
                self.signal_group(Signal::SIGKILL); // whatever it left behind
                return Ok(status);
            }
            std::thread::sleep(EXIT_POLL);
        }
        self.signal_group(Signal::SIGKILL);
        let status = self.child.wait()?;
        self.exit = Some(status);
        self.forget_group();
        Ok(status)
    }

    fn signal_group(&self, signal: Signal) {
        // ESRCH only means the group is already gone.
        let _ = killpg(Pid::from_raw(self.child.id() as i32), signal);
    }

    fn forget_group(&self) {
        lock(&self.registry).remove(&self.child.id());
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- logs of {} (pid {}) -----\n{}\n----- end of logs of {} -----",
                self.label,
                self.pid(),
                self.logs(),
                self.label
            );
        }
        if let Err(err) = self.stop() {
            eprintln!(
                "kpr-netns: cannot stop {} (pid {}): {err}",
                self.label,
                self.pid()
            );
        }
    }
}

/// SIGKILLs every group still registered (guards leaked or outliving their lab); their
/// guards, if any, still reap them.
pub(crate) fn kill_registered(registry: &Registry) {
    for pid in lock(registry).iter() {
        let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
    }
}

fn lock(registry: &Registry) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
    registry.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// The program's file name, for log names and messages.
pub(crate) fn program_name(command: &Command) -> String {
    let program = Path::new(command.get_program());
    program
        .file_name()
        .unwrap_or(program.as_os_str())
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_drop_the_directory() {
        assert_eq!(
            program_name(&Command::new("/usr/bin/kube-proxy-rs")),
            "kube-proxy-rs"
        );
        assert_eq!(program_name(&Command::new("sleep")), "sleep");
    }
}
