//! A lab whose node namespace runs the in-repo test API server, and the kubeconfig that
//! points the proxy at it: the API source tested with the real kube-rs client, never with
//! in-process fakes.

use std::time::Duration;

use kpr_apiserver::{Options, TestApiServer};
use serde_json::json;
use tokio::runtime::Runtime;

use super::{Cluster, node_object};

pub const API_ADDR: &str = "127.0.0.1:6443";

/// A lab, a test API server listening inside its node namespace (holding this node's Node,
/// as a real cluster does), and the kubeconfig for it.
pub struct ApiCluster {
    pub cluster: Cluster,
    /// Drives the API server's tasks.
    pub runtime: Runtime,
    pub api: TestApiServer,
    pub kubeconfig: tempfile::NamedTempFile,
}

impl ApiCluster {
    pub fn new(pods: usize) -> Self {
        let cluster = Cluster::new(pods);
        let runtime = Runtime::new().unwrap();
        let options = Options {
            listen: API_ADDR.parse().unwrap(),
            bookmark_interval: Duration::from_secs(5),
            ..Options::default()
        };
        // Bound on a thread inside the node namespace, so the socket lives there.
        let api = cluster
            .node()
            .run(|| runtime.block_on(TestApiServer::start_with(options)))
            .unwrap();
        let kubeconfig = tempfile::NamedTempFile::new().unwrap();
        api.write_kubeconfig(kubeconfig.path()).unwrap();
        // The proxy reads its node IP from its Node at start-up (and would wait for it, as
        // upstream does).
        api.apply(&node_object(json!([]))).unwrap();
        Self {
            cluster,
            runtime,
            api,
            kubeconfig,
        }
    }

    /// Starts the proxy on this API server, with `extra` flags.
    pub fn start_proxy(&mut self, extra: &[&str]) {
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig.path().display());
        let mut args = vec![kubeconfig.as_str()];
        args.extend_from_slice(extra);
        self.cluster.start_proxy_with(&args, false);
    }
}
