//! Logs to stderr as upstream's component-base does: human-readable text by default, or, with
//! `--logging-format=json` (or the config file's `logging.format: json`), one JSON object per
//! line in component-base's shape (see [`json`]), so log pipelines built for upstream keep
//! working. `-v` picks the level as upstream's klog levels roughly do (0-1 info, 2-4 debug,
//! 5+ trace), and `RUST_LOG` overrides it for finer control.

mod json;

use std::io::IsTerminal;

use kpr_config::LogFormat;
use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The lowest `-v` that shows debug lines, and the lowest that shows trace lines.
const DEBUG_FROM_V: u32 = 2;
const TRACE_FROM_V: u32 = 5;

pub fn init(verbosity: u32, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(max_level(verbosity).as_str()));
    match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(filter)
            .with(json::JsonLayer::new(std::io::stderr))
            .init(),
    }
}

/// The most detailed level `-v` shows.
fn max_level(verbosity: u32) -> Level {
    match verbosity {
        v if v >= TRACE_FROM_V => Level::TRACE,
        v if v >= DEBUG_FROM_V => Level::DEBUG,
        _ => Level::INFO,
    }
}

/// The klog verbosity a line of this level stands for: the lowest `-v` that shows it. Error
/// lines have none, as klog's `ErrorS`; klog has no warning verbosity, warnings are `V(0)`.
fn verbosity_of(level: Level) -> Option<u32> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(DEBUG_FROM_V),
        Level::TRACE => Some(TRACE_FROM_V),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lines_verbosity_is_the_lowest_v_that_shows_it() {
        for level in [Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE] {
            let v = verbosity_of(level).unwrap();
            assert!(max_level(v) >= level, "-v={v} hides {level}");
            if v > 0 {
                assert!(max_level(v - 1) < level, "-v={} shows {level}", v - 1);
            }
        }
        assert_eq!(verbosity_of(Level::ERROR), None);
        assert_eq!(max_level(0), Level::INFO);
        assert_eq!(max_level(1), Level::INFO);
        assert_eq!(max_level(4), Level::DEBUG);
        assert_eq!(max_level(9), Level::TRACE);
    }
}
