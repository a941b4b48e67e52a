//! What can go wrong before a guest's own result is known. Each variant says what was being
//! done, so a failing test names the step (download, unpack, initramfs, boot) and not only
//! an errno.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{command} could not be run: {source}")]
    NotRun {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Setup(String),
    #[error(
        "the guest did not power off within {after:?}\n{}its whole console:\n{console}",
        crate::console::digest(.console)
    )]
    Timeout { after: Duration, console: String },
    #[error(
        "the guest powered off without reporting a result\n{}its whole console:\n{console}",
        crate::console::digest(.console)
    )]
    NoResult { console: String },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

/// The command line as a person would type it, for error messages.
pub(crate) fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `command` to completion; its stdout on success, an error naming it otherwise.
pub(crate) fn run_checked(command: &mut Command) -> Result<Vec<u8>> {
    let output = command.output().map_err(|source| Error::NotRun {
        command: describe(command),
        source,
    })?;
    if output.status.success() {
        return Ok(output.stdout);
    }
    Err(Error::Failed {
        command: describe(command),
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}
