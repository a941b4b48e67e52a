//! Binding a listener from a configured "IP:port", with errors that name the address.

use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::handle::{ServeError, ServerHandle};

/// Binds `address`; `Ok(None)` when it is blank (the server is disabled).
pub(crate) async fn bind(server: &'static str, address: &str) -> Result<Option<TcpListener>, ServeError> {
    let address = address.trim();
    if address.is_empty() {
        return Ok(None);
    }
    let socket_addr: SocketAddr = address.parse().map_err(|e| ServeError::InvalidAddress {
        server,
        address: address.to_string(),
        reason: format!("{e} (expected IP:port, e.g. 0.0.0.0:10256 or [::]:10256)"),
    })?;
    let listener = TcpListener::bind(socket_addr)
        .await
        .map_err(|source| ServeError::Bind {
            server,
            address: address.to_string(),
            source,
        })?;
    Ok(Some(listener))
}

/// Serves `router` on `listener` from a spawned task until the handle says stop.
pub(crate) fn spawn(
    server: &'static str,
    listener: TcpListener,
    router: Router,
) -> Result<ServerHandle, ServeError> {
    let local_addr = listener.local_addr().map_err(|source| ServeError::Bind {
        server,
        address: "(bound socket)".to_string(),
        source,
    })?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                // A dropped handle counts as "stop" too.
                let _ = stopped.await;
            })
            .await
    });
    Ok(ServerHandle::new(server, local_addr, stop, task))
}
