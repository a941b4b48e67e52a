//! The pods' servers: in every pod of the lab, a bulk server (sends the same seeded block
//! again and again until the client goes away) and a request/response server (echoes what it
//! reads, so one byte in is one byte out, until the client closes).
//!
//! The listening sockets are opened inside the pods' namespaces (a socket belongs to the
//! namespace its thread was in when it was made, and so do the connections it accepts); one
//! async runtime serves them all from kpr-bench's process, its worker threads counted apart
//! so the report shows the servers' CPU beside the client's and the proxy's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kpr_netns::Netns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::cpu::Threads;

/// What a bulk server writes per call: large enough that a write is never the limit.
pub const BLOCK: usize = 256 * 1024;
/// The servers' worker threads.
const WORKERS: usize = 2;

/// Every pod's servers, running until dropped.
pub struct Servers {
    runtime: tokio::runtime::Runtime,
    pub threads: Threads,
    /// Connections accepted per pod (bulk and request/response together), pod 0 first.
    accepted: Vec<Arc<AtomicUsize>>,
}

impl Servers {
    /// Starts a bulk server on `bulk` and a request/response server on `rr` in each pod of
    /// `pods` (pod `i` on its own address), sending `block`.
    pub fn start(pods: &[(&Netns, SocketAddr, SocketAddr)], block: Arc<[u8]>) -> Result<Self, String> {
        let threads = Threads::default();
        let registered = threads.clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("l4-servers")
            .on_thread_start(move || registered.register_this_thread())
            .enable_all()
            .build()
            .map_err(|e| format!("servers' runtime: {e}"))?;
        let mut accepted = Vec::new();
        for &(netns, bulk, rr) in pods {
            let count = Arc::new(AtomicUsize::new(0));
            let bulk_listener = listen(netns, bulk)?;
            let rr_listener = listen(netns, rr)?;
            let block = Arc::clone(&block);
            let (bulk_count, rr_count) = (Arc::clone(&count), Arc::clone(&count));
            runtime.spawn(async move {
                serve(bulk_listener, bulk_count, move |stream| {
                    send_forever(stream, Arc::clone(&block))
                })
                .await;
            });
            runtime.spawn(async move { serve(rr_listener, rr_count, echo).await });
            accepted.push(count);
        }
        Ok(Self {
            runtime,
            threads,
            accepted,
        })
    }

    /// Connections each pod has accepted so far.
    pub fn accepted(&self) -> Vec<usize> {
        self.accepted.iter().map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// Stops every server (their connections end with the runtime).
    pub fn stop(self) {
        self.runtime.shutdown_background();
    }
}

/// A listening socket opened inside `netns`, ready for the runtime.
fn listen(netns: &Netns, addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let listener = netns
        .run(|| std::net::TcpListener::bind(addr))
        .map_err(|e| format!("listening on {addr} in {}: {e}", netns.name()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("{addr}: {e}"))?;
    Ok(listener)
}

/// Accepts until the runtime ends, one task per connection.
async fn serve<F, Fut>(listener: std::net::TcpListener, accepted: Arc<AtomicUsize>, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let Ok(listener) = TcpListener::from_std(listener) else {
        return;
    };
    loop {
        // A failed accept (a connection reset before it was taken) is the client's business.
        if let Ok((stream, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(handle(stream));
        }
    }
}

/// Writes `block` until the peer is gone.
async fn send_forever(mut stream: TcpStream, block: Arc<[u8]>) {
    while stream.write_all(&block).await.is_ok() {}
}

/// Echoes what it reads until the peer closes. Each request is answered at once
/// (`TCP_NODELAY`), as a request/response server does.
async fn echo(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
