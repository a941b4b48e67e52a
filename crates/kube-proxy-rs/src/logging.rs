//! Logs to stderr as structured text; `-v` picks the level as upstream's klog levels roughly
//! do (0-1 info, 2-4 debug, 5+ trace), and `RUST_LOG` overrides it for finer control.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init(verbosity: u32) {
    let level = match verbosity {
        0 | 1 => "info",
        2..=4 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
