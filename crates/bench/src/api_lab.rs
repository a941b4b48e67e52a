//! A fresh network namespace whose loopback serves the in-repo test API server
//! (`kpr-apiserver`: the real wire protocol, lists, watches, bookmarks) holding the synthetic
//! cluster, and a kubeconfig for it: how the end-to-end and churn measurements feed the real
//! binary from "the API" rather than from a file.
//!
//! The server runs in this process (its tasks on a small tokio runtime), bound on a thread
//! inside the namespace so its socket lives there; changes are written straight into its
//! store, and its watches deliver them to the proxy as a real API server would. It shares the
//! machine's two cores with the proxy, as the control plane of a small test cluster would.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kpr_apiserver::{Options, TestApiServer};
use kpr_netns::Netns;
use tokio::runtime::Runtime;

use crate::cluster::{ClusterObject, Shape, objects};
use crate::scratch::ScratchFile;

/// Where the server listens inside the namespace.
const LISTEN: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 6443);

/// The namespace, the running server with the cluster loaded, and its kubeconfig. Dropping
/// it stops the server, then deletes the namespace (killing whatever still runs inside).
pub struct ApiLab {
    pub api: TestApiServer,
    pub kubeconfig: ScratchFile,
    /// How long loading the cluster into the server took (not part of any figure).
    pub load_time: Duration,
    // Field order is drop order: the server stops before its runtime and namespace go.
    _runtime: Runtime,
    pub netns: Netns,
}

impl ApiLab {
    /// A namespace named after `role`, the server in it, and `shape` loaded; the server
    /// remembers `history` changes (more than a run makes, so no watch is ever sent back to
    /// relist by a `410 Gone`).
    pub fn start(role: &str, shape: Shape, history: usize) -> Result<Self, String> {
        let netns = Netns::new(role).map_err(|e| format!("namespace: {e}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let options = Options {
            listen: LISTEN,
            history_limit: history.max(Options::default().history_limit),
            ..Options::default()
        };
        let api = netns
            .run(|| runtime.block_on(TestApiServer::start_with(options)))
            .map_err(|e| format!("test API server on {LISTEN}: {e}"))?;
        let kubeconfig = ScratchFile::create("kubeconfig", api.kubeconfig_yaml().as_bytes())?;
        let started = Instant::now();
        load(&api, shape)?;
        Ok(Self {
            api,
            kubeconfig,
            load_time: started.elapsed(),
            _runtime: runtime,
            netns,
        })
    }
}

/// Every object of the synthetic cluster, applied one by one (as a controller would create
/// them).
fn load(api: &TestApiServer, shape: Shape) -> Result<(), String> {
    for object in objects(shape) {
        let stored = match &object {
            ClusterObject::Node(node) => api.apply(node.as_ref()).map(drop),
            ClusterObject::Service(service) => api.apply(service.as_ref()).map(drop),
            ClusterObject::Slice(slice) => api.apply(slice.as_ref()).map(drop),
        };
        stored.map_err(|e| format!("loading the cluster into the test API server: {e}"))?;
    }
    Ok(())
}
