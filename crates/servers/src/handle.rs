//! A running server: its address once bound, its shutdown switch, and its errors.

use std::io;
use std::net::SocketAddr;

use tokio::sync::watch;
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
        address: String,
        source: io::Error,
    },
    #[error("{server} server task on {address} ended abnormally: {detail}")]
    Task {
        server: &'static str,
        address: String,
        detail: String,
    },
}

/// A server serving (or still trying to bind) on a spawned task. Dropping the handle stops
/// the server too, so keep it for as long as the server should run.
#[derive(Debug)]
pub struct ServerHandle {
    server: &'static str,
    address: String,
    bound: watch::Receiver<Option<SocketAddr>>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl ServerHandle {
    pub(crate) fn new(
        server: &'static str,
        address: String,
        bound: watch::Receiver<Option<SocketAddr>>,
        stop: watch::Sender<bool>,
        task: JoinHandle<Result<(), ServeError>>,
    ) -> Self {
        Self {
            server,
            address,
            bound,
            stop,
            task: Some(task),
        }
    }

    /// The address actually listened on (useful with port 0); `None` while the port is
    /// still busy and the server keeps retrying.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        *self.bound.borrow()
    }

    /// Waits until the server listens and returns the address; `None` if it stopped first.
    pub async fn listening(&self) -> Option<SocketAddr> {
        let mut bound = self.bound.clone();
        let address = bound.wait_for(Option::is_some).await.ok()?;
        *address
    }

    /// "healthz", "metrics" or "service-healthcheck".
    pub fn name(&self) -> &'static str {
        self.server
    }

    /// Stops accepting, lets requests in flight finish, and waits for the task.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        self.stop.send_replace(true);
        self.wait().await
    }

    /// Stops at once, as Go's `Server.Close`: the port is free again when this returns,
    /// however slow the clients still connected are (each connection runs on its own task
    /// and ends by itself). For servers that come and go with Services, where waiting for
    /// a client must not hold up anything else.
    pub async fn close(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
            // The task's future (and with it the listening socket) is dropped once this
            // resolves; cancelled or finished, there is nothing left to report.
            let _ = task.await;
        }
    }

    /// Waits until the server stops by itself (it only does on a fatal error).
    pub async fn wait(&mut self) -> Result<(), ServeError> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        match task.await {
            Ok(result) => result,
            Err(join_error) => Err(ServeError::Task {
                server: self.server,
                address: self.address.clone(),
                detail: join_error.to_string(),
            }),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}
