//! `kpr-test-apiserver`: the test API server as a program, for running kube-proxy-rs (or
//! kubectl) against it by hand.
//!
//! ```text
//! kpr-test-apiserver --listen 127.0.0.1:6443 --kubeconfig-out /tmp/kubeconfig --load manifests.yaml
//! ```
//!
//! Logs every request at debug level (`RUST_LOG=kpr_apiserver=debug`). Stops on Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kpr_apiserver::{Options, TestApiServer};

#[derive(Debug, Parser)]
#[command(
    name = "kpr-test-apiserver",
    about = "A Kubernetes API server for tests (Services, EndpointSlices, Nodes, Events)."
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Write a kubeconfig pointing at the server to this path.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// YAML/JSON manifests to load at start (multi-document, List kinds); repeatable.
    #[arg(long)]
    load: Vec<PathBuf>,
    /// Changes remembered before older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    history_limit: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 60)]
    bookmark_interval_seconds: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("kpr-test-apiserver: {problem}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let options = Options {
        listen: args.listen,
        history_limit: args.history_limit,
        bookmark_interval: Duration::from_secs(args.bookmark_interval_seconds.max(1)),
    };
    let server = TestApiServer::start_with(options)
        .await
        .map_err(|e| format!("listen on {}: {e}", args.listen))?;
    for path in &args.load {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let loaded = server
            .load_yaml(&text)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(file = %path.display(), objects = loaded.len(), "loaded");
    }
    if let Some(path) = &args.kubeconfig_out {
        server
            .write_kubeconfig(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(path = %path.display(), "kubeconfig written");
    }
    tracing::info!(url = %server.url(), "serving");
    wait_for_termination().await?;
    server.stop().await;
    Ok(())
}

/// Ctrl-C or SIGTERM (what `kill` and test harnesses send).
async fn wait_for_termination() -> Result<(), String> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("installing the SIGTERM handler: {e}"))?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted.map_err(|e| format!("waiting for Ctrl-C: {e}")),
        _ = terminate.recv() => Ok(()),
    }
}
