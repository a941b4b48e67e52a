//! The load generator: an async client whose worker threads live in the lab's client
//! namespace (every socket it opens is the outside client's), measuring on its own side.
//!
//! - **Bulk**: N streams to the bulk port, all connected first, then read for a warm-up
//!   (not counted: it drains what the socket buffers collected meanwhile) and for the
//!   measured window; the bytes read in the window over its length.
//! - **Connections**: a fixed number of tasks, each in a loop: connect, send one byte, read
//!   the one byte back, close; every completed round's time from the start of the connect
//!   to the answer is one latency sample. The same loop with one task gives the latency of
//!   an unloaded path; with many, the rate of new connections the path sustains.
//!
//! Request bytes and the bulk block come from a fixed seed, and every answer is checked
//! against what was sent, so a figure can only come from a real round trip to a pod.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kpr_netns::Netns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::servers::BLOCK;
use crate::cpu::Threads;

/// The client's worker threads: as many as the proxy's, so the client keeps pace with it.
pub const WORKERS: usize = 2;
/// One connect, or one round of connect + request + answer, longer than this failed.
pub const ROUND_TIMEOUT: Duration = Duration::from_secs(5);

/// The client's runtime, its threads inside the client namespace.
pub struct Client {
    runtime: tokio::runtime::Runtime,
    pub threads: Threads,
    /// Threads that could not enter the namespace (their sockets would be in the wrong one).
    entry_errors: Arc<Mutex<Vec<String>>>,
}

/// What the bulk streams read in the measured window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bulk {
    pub streams: usize,
    pub bytes: u64,
    pub window: Duration,
}

/// What a connection loop did.
#[derive(Clone, Debug, Default)]
pub struct Rounds {
    pub concurrency: usize,
    /// Connect + request + answer, per completed round.
    pub latencies: Vec<Duration>,
    pub failed: usize,
    pub first_error: Option<String>,
    /// From the start to the end of the last round.
    pub elapsed: Duration,
}

impl Client {
    pub fn start(netns: &Netns) -> Result<Self, String> {
        let threads = Threads::default();
        let registered = threads.clone();
        let entry_errors = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::clone(&entry_errors);
        let path = netns.path();
        let name = netns.name().to_string();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("l4-client")
            .on_thread_start(move || {
                if let Err(e) = enter(&path) {
                    lock(&errors).push(format!("cannot enter {name}: {e}"));
                }
                registered.register_this_thread();
            })
            .enable_all()
            .build()
            .map_err(|e| format!("client's runtime: {e}"))?;
        let client = Self {
            runtime,
            threads,
            entry_errors,
        };
        client.check_threads()?;
        Ok(client)
    }

    /// `Err` when a thread of the client is not inside the client namespace.
    pub fn check_threads(&self) -> Result<(), String> {
        match lock(&self.entry_errors).first() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    /// One round to `target` until it succeeds or `timeout` passes: whether the path works.
    pub fn probe(&self, target: SocketAddr, timeout: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let result = self
                .runtime
                .block_on(self.runtime.spawn(round(target, 0x5a)))
                .map_err(|e| format!("probe task: {e}"))?;
            match result {
                Ok(()) => return self.check_threads(),
                Err(e) if started.elapsed() >= timeout => {
                    return Err(format!(
                        "{target} did not answer within {} s: {e}",
                        timeout.as_secs()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// `targets.len()` bulk streams, read for `warm_up` and then counted for `window`.
    pub fn bulk(
        &self,
        targets: &[SocketAddr],
        block: Arc<[u8]>,
        warm_up: Duration,
        window: Duration,
    ) -> Result<Bulk, String> {
        let targets = targets.to_vec();
        let streams = targets.len();
        let task = async move {
            let mut connected = Vec::new();
            for target in targets {
                let stream = tokio::time::timeout(ROUND_TIMEOUT, TcpStream::connect(target))
                    .await
                    .map_err(|_| format!("connecting to {target}: timed out"))?
                    .map_err(|e| format!("connecting to {target}: {e}"))?;
                connected.push((target, stream));
            }
            let counted_from = tokio::time::Instant::now() + warm_up;
            let until = counted_from + window;
            let readers: Vec<_> = connected
                .into_iter()
                .map(|(target, stream)| {
                    tokio::spawn(read_stream(
                        target,
                        stream,
                        Arc::clone(&block),
                        counted_from,
                        until,
                    ))
                })
                .collect();
            let mut bytes = 0;
            for reader in readers {
                bytes += reader.await.map_err(|e| format!("bulk reader: {e}"))??;
            }
            Ok::<u64, String>(bytes)
        };
        let bytes = self
            .runtime
            .block_on(self.runtime.spawn(task))
            .map_err(|e| format!("bulk task: {e}"))??;
        self.check_threads()?;
        Ok(Bulk {
            streams,
            bytes,
            window,
        })
    }

    /// `concurrency` tasks making rounds for `duration`; round `n` goes to `target(n)`, its
    /// request byte is `requests[n % len]`.
    pub fn rounds(
        &self,
        target: impl Fn(usize) -> SocketAddr + Send + Sync + 'static,
        requests: Arc<[u8]>,
        concurrency: usize,
        duration: Duration,
    ) -> Result<Rounds, String> {
        let target = Arc::new(target);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let until = started + duration;
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (target, next, requests) =
                    (Arc::clone(&target), Arc::clone(&next), Arc::clone(&requests));
                self.runtime.spawn(async move {
                    let mut done = Rounds::default();
                    while Instant::now() < until {
                        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let byte = requests.get(n % requests.len().max(1)).copied().unwrap_or(0);
                        let begun = Instant::now();
                        match round(target(n), byte).await {
                            Ok(()) => done.latencies.push(begun.elapsed()),
                            Err(e) => {
                                done.failed += 1;
                                done.first_error.get_or_insert(e);
                            }
                        }
                    }
                    done
                })
            })
            .collect();
        let mut all = Rounds {
            concurrency,
            ..Rounds::default()
        };
        for worker in workers {
            let done = self
                .runtime
                .block_on(worker)
                .map_err(|e| format!("connection task: {e}"))?;
            all.latencies.extend(done.latencies);
            all.failed += done.failed;
            if all.first_error.is_none() {
                all.first_error = done.first_error;
            }
        }
        all.elapsed = started.elapsed();
        self.check_threads()?;
        Ok(all)
    }
}

/// Connect, one byte out, the same byte back, close.
async fn round(target: SocketAddr, byte: u8) -> Result<(), String> {
    let exchange = async {
        let mut stream = TcpStream::connect(target)
            .await
            .map_err(|e| format!("connect {target}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| format!("{target}: {e}"))?;
        stream
            .write_all(&[byte])
            .await
            .map_err(|e| format!("send to {target}: {e}"))?;
        let mut answer = [0u8; 1];
        stream
            .read_exact(&mut answer)
            .await
            .map_err(|e| format!("answer from {target}: {e}"))?;
        if answer[0] != byte {
            return Err(format!("{target} answered {:#04x} to {byte:#04x}", answer[0]));
        }
        Ok(())
    };
    tokio::time::timeout(ROUND_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("{target}: no answer within {} s", ROUND_TIMEOUT.as_secs()))?
}

/// Reads one bulk stream until `until`; the bytes read from `counted_from` on. Its first
/// bytes must be the start of `block` (what the pods send), or the data came from elsewhere.
async fn read_stream(
    target: SocketAddr,
    mut stream: TcpStream,
    block: Arc<[u8]>,
    counted_from: tokio::time::Instant,
    until: tokio::time::Instant,
) -> Result<u64, String> {
    let mut buf = vec![0u8; BLOCK];
    let mut checked = 0;
    let mut counted = 0u64;
    loop {
        let read = match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return Ok(counted),
            Ok(Ok(0)) => return Err(format!("{target} closed the bulk stream")),
            Ok(Err(e)) => return Err(format!("reading from {target}: {e}")),
            Ok(Ok(n)) => n,
        };
        if checked < block.len() {
            let n = read.min(block.len() - checked);
            if buf[..n] != block[checked..checked + n] {
                return Err(format!("{target} sent bytes that are not the pods' block"));
            }
            checked += n;
        }
        if tokio::time::Instant::now() >= counted_from {
            counted += read as u64;
        }
    }
}

fn enter(path: &std::path::Path) -> Result<(), String> {
    kpr_netns::enter_thread(path).map_err(|e| e.to_string())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
