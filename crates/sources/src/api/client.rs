//! The API client, set up as upstream kube-proxy sets up its own: `--kubeconfig` (or the
//! config file's `clientConnection.kubeconfig`), `--master` overriding the server address,
//! and the pod's service account when neither is given.

use std::path::PathBuf;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    pub kubeconfig: Option<PathBuf>,
    /// `--master`: the API server URL, overriding the kubeconfig's.
    pub master: Option<String>,
    /// `clientConnection.contentType`. kube-rs speaks JSON only, so protobuf (upstream's
    /// default) falls back to JSON; the server answers JSON to every client.
    pub content_type: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {detail}")]
    Kubeconfig { path: String, detail: String },
    #[error("--master {url:?}: {detail}")]
    Master { url: String, detail: String },
    #[error("no --kubeconfig or --master given, and not running in a pod with a service account: {0}")]
    InCluster(String),
    #[error("cannot build the API client: {0}")]
    Build(String),
}

/// A client for the configured API server. Does not contact the server: an unreachable
/// server is the watchers' problem (they retry with backoff).
pub async fn build_client(options: &ClientOptions) -> Result<Client, ClientError> {
    let mut config = match (&options.kubeconfig, &options.master) {
        (Some(path), _) => from_kubeconfig(path).await?,
        (None, Some(master)) => Config::new(parse_master(master)?),
        (None, None) => Config::incluster().map_err(|e| ClientError::InCluster(e.to_string()))?,
    };
    if let Some(master) = &options.master {
        config.cluster_url = parse_master(master)?;
    }
    if options.content_type.contains("protobuf") {
        tracing::debug!(
            content_type = %options.content_type,
            "the API client speaks JSON (kube-rs has no protobuf codec); the server answers it the same"
        );
    }
    // A watch is a long-lived read: kube-rs's default read timeout would cut quiet watches.
    config.read_timeout = Some(Duration::from_secs(330));
    Client::try_from(config).map_err(|e| ClientError::Build(e.to_string()))
}

async fn from_kubeconfig(path: &PathBuf) -> Result<Config, ClientError> {
    let error = |detail: String| ClientError::Kubeconfig {
        path: path.display().to_string(),
        detail,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| error(e.to_string()))?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| error(e.to_string()))
}

fn parse_master(master: &str) -> Result<http::Uri, ClientError> {
    master
        .parse()
        .map_err(|e: http::uri::InvalidUri| ClientError::Master {
            url: master.to_string(),
            detail: e.to_string(),
        })
}
