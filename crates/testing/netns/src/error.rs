//! Why building or tearing down a lab failed, naming the command or object and the reason.

use std::io;
use std::process::ExitStatus;

/// Errors of the harness itself (traffic errors are plain [`io::Error`]s, so tests can
/// match on [`io::ErrorKind`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command could not be started at all (missing binary, ...).
    #[error("cannot run `{command}`: {source}")]
    CommandNotRun {
        /// The command line, for the reader.
        command: String,
        /// Why it could not start.
        source: io::Error,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line, for the reader.
        command: String,
        /// How it ended.
        status: ExitStatus,
        /// What it said on stderr, trimmed.
        stderr: String,
    },
    /// A lab was asked for more pods than the pod subnet holds.
    #[error("lab asked for {requested} pods, but the pod subnet holds at most {max}")]
    TooManyPods {
        /// Pods asked for.
        requested: usize,
        /// [`crate::MAX_PODS`].
        max: usize,
    },
    /// A namespace role (the name suffix) is not short lowercase alphanumerics.
    #[error("namespace role {role:?} is invalid: use 1 to 12 lowercase letters or digits")]
    InvalidRole {
        /// The role asked for.
        role: String,
    },
    /// The kernel offers no bridge netfilter in a namespace, so bridged pod traffic would
    /// bypass iptables and Service VIPs between pods could not work.
    #[error(
        "namespace {netns}: {path} is missing, so bridged traffic would bypass iptables \
         (is the br_netfilter module loaded?)"
    )]
    NoBridgeNetfilter {
        /// The namespace checked.
        netns: String,
        /// The sysctl file that should exist.
        path: String,
    },
    /// A file or directory the harness needs could not be used.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the object.
        what: String,
        /// The underlying failure.
        source: io::Error,
    },
}

/// Result of harness operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
