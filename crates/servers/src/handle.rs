//! A running server: its address, its shutdown switch, and its errors.

use std::io;
use std::net::SocketAddr;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{server} server: invalid bind address {address:?}: {reason}")]
    InvalidAddress {
        server: &'static str,
        address: String,
        reason: String,
    },
    #[error("{server} server: cannot listen on {address}: {source}")]
    Bind {
        server: &'static str,
        address: String,
        source: io::Error,
    },
    #[error("{server} server on {address} stopped with an error: {source}")]
    Serve {
        server: &'static str,
        address: SocketAddr,
        source: io::Error,
    },
    #[error("{server} server task on {address} ended abnormally: {detail}")]
    Task {
        server: &'static str,
        address: SocketAddr,
        detail: String,
    },
}

/// A server serving on a spawned task. Dropping the handle stops the server too, so keep it
/// for as long as the server should run.
#[derive(Debug)]
pub struct ServerHandle {
    server: &'static str,
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl ServerHandle {
    pub(crate) fn new(
        server: &'static str,
        local_addr: SocketAddr,
        stop: oneshot::Sender<()>,
        task: JoinHandle<io::Result<()>>,
    ) -> Self {
        Self {
            server,
            local_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// "healthz" or "metrics".
    pub fn name(&self) -> &'static str {
        self.server
    }

    /// Stops accepting, lets requests in flight finish, and waits for the task.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            // The task may already be gone; then there is nothing to stop.
            let _ = stop.send(());
        }
        self.wait().await
    }

    /// Waits until the server stops by itself (it only does on an error).
    pub async fn wait(&mut self) -> Result<(), ServeError> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(ServeError::Serve {
                server: self.server,
                address: self.local_addr,
                source,
            }),
            Err(join_error) => Err(ServeError::Task {
                server: self.server,
                address: self.local_addr,
                detail: join_error.to_string(),
            }),
        }
    }
}
