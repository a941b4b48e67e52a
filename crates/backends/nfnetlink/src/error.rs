//! What can go wrong talking nf_tables: the socket, a malformed answer, or the kernel
//! refusing a request or a batch (naming the message that failed and why).

use crate::batch::Operation;

/// One message of a batch the kernel refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFailure {
    /// Its position in the batch (`None`: the batch as a whole, e.g. the commit).
    pub index: Option<usize>,
    /// What it did.
    pub operation: Option<Operation>,
    /// The errno (positive).
    pub errno: i32,
    /// The kernel's own explanation (extended ack), when it gave one.
    pub message: Option<String>,
}

impl std::fmt::Display for MessageFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.index, &self.operation) {
            (Some(index), Some(operation)) => write!(f, "message {index} ({operation})")?,
            _ => write!(f, "the batch")?,
        }
        write!(
            f,
            " failed: {} (errno {})",
            std::io::Error::from_raw_os_error(self.errno),
            self.errno
        )?;
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

/// A batch the kernel refused as a whole: nothing of it was applied. The failures are in
/// batch order; the first is usually the cause, later ones often follow from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    pub failures: Vec<MessageFailure>,
}

impl BatchError {
    /// The first failure (the batch has at least one).
    pub fn first(&self) -> Option<&MessageFailure> {
        self.failures.first()
    }
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the kernel refused the nf_tables batch: ")?;
        match self.failures.first() {
            Some(first) => write!(f, "{first}")?,
            None => write!(f, "no reason given")?,
        }
        if self.failures.len() > 1 {
            write!(f, " (and {} more failing message(s))", self.failures.len() - 1)?;
        }
        Ok(())
    }
}

impl std::error::Error for BatchError {}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open an nf_tables netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("nf_tables netlink I/O failed: {0}")]
    Io(#[source] std::io::Error),
    #[error(transparent)]
    Malformed(#[from] crate::attr::Malformed),
    #[error(transparent)]
    Rejected(#[from] BatchError),
    #[error("the kernel refused {request}: {} (errno {errno}){}", std::io::Error::from_raw_os_error(*.errno), .message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Kernel {
        request: String,
        errno: i32,
        message: Option<String>,
    },
    #[error("refusing to send a batch: {operation}: {problem}")]
    InvalidName { operation: Operation, problem: String },
    #[error("refusing to read {what}: {problem}")]
    InvalidQuery { what: String, problem: String },
    /// An ipset request the kernel refused: what it was (a member change names the set
    /// and the member), ipset's errno and its meaning; for a list of changes, how many
    /// others were refused too.
    #[error("the kernel refused {request}: {reason} (errno {errno}){}", if *.others > 0 { format!(" (and {} more refused change(s))", .others) } else { String::new() })]
    IpsetRefused {
        request: String,
        errno: i32,
        reason: String,
        others: usize,
    },
    #[error("refusing to send {what}: {problem}")]
    InvalidIpsetName { what: String, problem: String },
    #[error("a {bytes}-byte transaction is over the {limit}-byte limit; split the batch")]
    TooLarge { bytes: usize, limit: usize },
    #[error("the dump of {what} was interrupted by concurrent changes {attempts} times in a row")]
    DumpInterrupted { what: String, attempts: u32 },
    #[error(
        "{} of {} transactions were committed before one failed: {error}",
        .committed, .total
    )]
    PartlyCommitted {
        committed: usize,
        total: usize,
        #[source]
        error: Box<Error>,
    },
}

impl Error {
    /// The errno of the kernel's refusal (of a request, or the first of a batch).
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { errno, .. } | Self::IpsetRefused { errno, .. } => Some(*errno),
            Self::Rejected(batch) => batch.first().map(|f| f.errno),
            Self::PartlyCommitted { error, .. } => error.errno(),
            _ => None,
        }
    }
}
