//! Why the demo stopped early. A proxy that exits or never gets ready is the failure a
//! reader most needs to understand, so those carry the proxy's own log.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

/// How many log lines of the proxy a failure shows (the last ones: where it went wrong).
const LOG_TAIL_LINES: usize = 60;

/// Everything that ends the demo before its verdict.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A flag names something unusable; nothing was created yet.
    #[error("{0}")]
    Usage(String),
    /// The namespaces could not be built.
    #[error("cannot build the lab: {0}")]
    Lab(#[from] kpr_netns::Error),
    /// Starting a backend, the proxy, or asking the node something failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: io::Error,
    },
    /// The proxy ended on its own.
    #[error("kube-proxy-rs exited ({status}) {when}\n{}", log_excerpt(.log))]
    ProxyExited {
        /// How it ended.
        status: ExitStatus,
        /// "before it was ready", "during the traffic", ...
        when: &'static str,
        /// Its stdout and stderr.
        log: String,
    },
    /// The proxy kept running but did not serve `/healthz` 200 and route the ClusterIP.
    #[error("kube-proxy-rs was not ready after {waited:?}: {last}\n{}", log_excerpt(.log))]
    NotReady {
        /// How long the demo waited.
        waited: Duration,
        /// What the last check saw.
        last: String,
        /// Its stdout and stderr so far.
        log: String,
    },
    /// Ctrl-C or SIGTERM.
    #[error("interrupted")]
    Interrupted,
}

impl Failure {
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

/// The proxy's log framed for the terminal, shortened to its last lines.
pub fn log_excerpt(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let shown = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
    let mut text = String::from("----- kube-proxy-rs log -----\n");
    match lines.len() - shown.len() {
        0 if lines.is_empty() => text.push_str("(it wrote nothing)\n"),
        0 => {}
        omitted => text.push_str(&format!("({omitted} earlier lines omitted)\n")),
    }
    for line in shown {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("----- end of log -----");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_log_says_so() {
        assert_eq!(
            log_excerpt(""),
            "----- kube-proxy-rs log -----\n(it wrote nothing)\n----- end of log -----"
        );
    }

    #[test]
    fn a_long_log_keeps_its_last_lines() {
        let log: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let excerpt = log_excerpt(&log);
        assert!(
            excerpt.contains("(40 earlier lines omitted)\nline 40\n"),
            "{excerpt}"
        );
        assert!(excerpt.contains("line 99\n----- end of log -----"), "{excerpt}");
        assert!(!excerpt.contains("line 39\n"), "{excerpt}");
    }
}
