//! Each bound of [`HttpLimits`] against a real server on loopback, with bounds short enough
//! for a test. Waits have ceilings against hangs; where a bound must not have acted yet, the
//! test checks that the connection still works.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::any;
use kpr_metrics::Metrics;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::{Instant, timeout};

use crate::connections::Budget;
use crate::handle::ServerHandle;
use crate::limits::HttpLimits;
use crate::listen::{BindPolicy, start};
use crate::test_client::raw;

/// Against hangs only: every bound under test is far shorter.
const CEILING: Duration = Duration::from_secs(20);
const POLICY: BindPolicy = BindPolicy {
    hard_fail: true,
    retry_interval: Duration::from_millis(10),
};
/// Long enough that it never acts within a test unless the test is about it.
const NEVER: Duration = Duration::from_secs(3600);
const LIMITS: HttpLimits = HttpLimits {
    max_connections: 100,
    header_timeout: NEVER,
    idle_timeout: NEVER,
    max_head_bytes: 8192,
    max_body_bytes: 1024,
};
const HALF_A_HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: test\r\n";
const KEEP_ALIVE_GET: &[u8] = b"GET / HTTP/1.1\r\nHost: test\r\n\r\n";

struct Server {
    _handle: ServerHandle,
    addr: SocketAddr,
    budget: Arc<Budget>,
    registry: Registry,
}

impl Server {
    async fn start(limits: HttpLimits, router: Router) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let budget = Budget::new("healthz", limits, &metrics);
        let handle = start("127.0.0.1:0", router, POLICY, budget.clone())
            .await
            .unwrap()
            .unwrap();
        let addr = handle.local_addr().unwrap();
        Self {
            _handle: handle,
            addr,
            budget,
            registry,
        }
    }

    async fn ok(limits: HttpLimits) -> Self {
        Self::start(limits, Router::new().route("/", any(|| async { "ok" }))).await
    }

    /// A connection, once the server has admitted it.
    async fn connect(&self) -> TcpStream {
        let before = self.budget.open();
        let stream = TcpStream::connect(self.addr).await.unwrap();
        self.wait_open(before + 1).await;
        stream
    }

    /// Waits until the budget counts `n` connections.
    async fn wait_open(&self, n: usize) {
        let deadline = Instant::now() + CEILING;
        while self.budget.open() != n {
            assert!(
                Instant::now() < deadline,
                "{} connections, want {n}",
                self.budget.open()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `kubeproxy_http_connections_rejected_total{server="healthz",reason}`, 0 when absent.
    fn rejected(&self, reason: &str) -> u64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        let sample =
            format!("kubeproxy_http_connections_rejected_total{{server=\"healthz\",reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&sample)?.parse().ok())
            .unwrap_or(0)
    }

    /// `kubeproxy_http_connections{server="healthz"}`.
    fn gauge(&self) -> i64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines()
            .find_map(|line| {
                line.strip_prefix("kubeproxy_http_connections{server=\"healthz\"} ")?
                    .parse()
                    .ok()
            })
            .unwrap()
    }
}

/// Whether the server closed `stream` within `within` (end of stream or reset); panics on
/// an answer.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    match timeout(within, stream.read(&mut buf)).await {
        Err(_elapsed) => false,
        Ok(Ok(0) | Err(_)) => true,
        Ok(Ok(n)) => panic!("unexpected answer: {:?}", String::from_utf8_lossy(&buf[..n])),
    }
}

/// One answer on a kept-alive connection: its status and body (the body has a
/// Content-Length, as every answer here).
async fn answer(stream: &mut TcpStream) -> (u16, String) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = timeout(CEILING, stream.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "closed mid-answer: {:?}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap();
        if body.len() >= length {
            let status = head.split(' ').nth(1).unwrap().parse().unwrap();
            return (status, body.to_string());
        }
    }
}

#[tokio::test]
async fn a_half_sent_head_is_closed_after_the_header_timeout() {
    let header_timeout = Duration::from_millis(300);
    let server = Server::ok(HttpLimits {
        header_timeout,
        ..LIMITS
    })
    .await;
    let mut silent = server.connect().await;
    // On a new connection, the time runs from the accept.
    let connecting = Instant::now();
    let mut half = server.connect().await;
    half.write_all(HALF_A_HEAD).await.unwrap();
    assert!(closed_within(&mut half, CEILING).await);
    assert!(connecting.elapsed() >= header_timeout);
    // A connection that never sent a byte gets the same time.
    assert!(closed_within(&mut silent, CEILING).await);
    assert_eq!(server.rejected("header_timeout"), 2);
    server.wait_open(0).await;
    assert_eq!(server.gauge(), 0);
}

/// Between requests a load balancer's checker may keep its connection for seconds: the
/// short header timeout starts at the next request's first byte, the idle timeout bounds
/// the wait.
#[tokio::test]
async fn a_kept_alive_connection_waits_the_idle_timeout_not_the_header_timeout() {
    let header_timeout = Duration::from_millis(200);
    let idle_timeout = Duration::from_millis(1500);
    let server = Server::ok(HttpLimits {
        header_timeout,
        idle_timeout,
        ..LIMITS
    })
    .await;
    let mut stream = server.connect().await;
    stream.write_all(KEEP_ALIVE_GET).await.unwrap();
    assert_eq!(answer(&mut stream).await, (200, "ok".into()));
    // Idle for three header timeouts: still served.
    tokio::time::sleep(header_timeout * 3).await;
    stream.write_all(KEEP_ALIVE_GET).await.unwrap();
    assert_eq!(answer(&mut stream).await, (200, "ok".into()));
    let answered = Instant::now();
    assert!(closed_within(&mut stream, CEILING).await);
    // The server's timer starts after its answer was sent, before it was read here.
    assert!(answered.elapsed() >= idle_timeout - header_timeout);
    assert_eq!(server.rejected("header_timeout"), 0);
    server.wait_open(0).await;
}

#[tokio::test]
async fn on_a_kept_alive_connection_the_header_timeout_starts_at_the_first_byte() {
    let header_timeout = Duration::from_millis(300);
    let server = Server::ok(HttpLimits {
        header_timeout,
        ..LIMITS
    })
    .await;
    let mut stream = server.connect().await;
    stream.write_all(KEEP_ALIVE_GET).await.unwrap();
    assert_eq!(answer(&mut stream).await, (200, "ok".into()));
    tokio::time::sleep(header_timeout * 2).await;
    stream.write_all(HALF_A_HEAD).await.unwrap();
    let sent = Instant::now();
    assert!(closed_within(&mut stream, CEILING).await);
    assert!(sent.elapsed() >= header_timeout);
    assert_eq!(server.rejected("header_timeout"), 1);
}

/// A flood of half-sent requests evicts its own oldest members: a probe that sends its
/// request at once is answered, and so are the flood's newest.
#[tokio::test]
async fn at_the_cap_a_newcomer_evicts_the_oldest_connection_without_a_request() {
    let server = Server::ok(HttpLimits {
        max_connections: 3,
        ..LIMITS
    })
    .await;
    let mut flood = Vec::new();
    for _ in 0..3 {
        let mut stream = server.connect().await;
        stream.write_all(HALF_A_HEAD).await.unwrap();
        flood.push(stream);
    }
    // A kept-alive connection after its answer is idle: it goes before the newer flood.
    let mut idle = flood.remove(2);
    idle.write_all(b"\r\n").await.unwrap();
    assert_eq!(answer(&mut idle).await, (200, "ok".into()));

    let probe = || {
        raw(
            server.addr,
            b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
        )
    };
    let reply = probe().await;
    assert_eq!(reply.map(|r| (r.status, r.body)), Some((200, "ok".into())));
    assert!(
        closed_within(&mut flood[0], CEILING).await,
        "the oldest goes first"
    );
    assert!(!closed_within(&mut flood[1], Duration::from_millis(200)).await);
    assert!(!closed_within(&mut idle, Duration::from_millis(200)).await);

    // The flood goes on: at the cap again, the next probe evicts the next oldest.
    server.wait_open(2).await;
    let mut newer = server.connect().await;
    newer.write_all(HALF_A_HEAD).await.unwrap();
    assert_eq!(probe().await.map(|r| r.status), Some(200));
    assert!(closed_within(&mut flood[1], CEILING).await);
    assert!(!closed_within(&mut idle, Duration::from_millis(200)).await);
    // Idle since its answer, which came before the newer one's first byte.
    server.wait_open(2).await;
    let mut newest = server.connect().await;
    newest.write_all(HALF_A_HEAD).await.unwrap();
    assert_eq!(probe().await.map(|r| r.status), Some(200));
    assert!(closed_within(&mut idle, CEILING).await);
    assert!(!closed_within(&mut newer, Duration::from_millis(200)).await);
    assert_eq!(server.rejected("evicted"), 3);
    assert_eq!(server.rejected("refused"), 0);
    drop((newer, newest));
    server.wait_open(0).await;
    assert_eq!(server.gauge(), 0);
}

/// Connections being answered are never evicted: at the cap a newcomer is closed at once.
#[tokio::test]
async fn at_the_cap_with_every_connection_answering_a_newcomer_is_refused() {
    let gate = Arc::new(Semaphore::new(0));
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let router = {
        let gate = gate.clone();
        Router::new().route(
            "/",
            any(move || {
                let gate = gate.clone();
                let entered = entered_tx.clone();
                async move {
                    let _ = entered.send(());
                    gate.acquire().await.unwrap().forget();
                    "ok"
                }
            }),
        )
    };
    let server = Server::start(
        HttpLimits {
            max_connections: 2,
            ..LIMITS
        },
        router,
    )
    .await;
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut stream = server.connect().await;
        stream.write_all(KEEP_ALIVE_GET).await.unwrap();
        timeout(CEILING, entered.recv()).await.unwrap().unwrap();
        busy.push(stream);
    }
    let refused = raw(
        server.addr,
        b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(refused.is_none(), "closed without an answer");
    assert_eq!(server.rejected("refused"), 1);
    assert_eq!(server.rejected("evicted"), 0);

    gate.add_permits(2);
    for stream in &mut busy {
        assert_eq!(answer(stream).await, (200, "ok".into()));
    }
    // Now idle: a newcomer evicts one of them and is answered.
    gate.add_permits(1);
    let reply = raw(
        server.addr,
        b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(reply.map(|r| r.status), Some(200));
    assert_eq!(server.rejected("evicted"), 1);
}

#[tokio::test]
async fn a_head_beyond_the_limit_is_answered_431() {
    let server = Server::ok(LIMITS).await;
    let big = format!(
        "GET / HTTP/1.1\r\nHost: test\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(LIMITS.max_head_bytes)
    );
    let reply = raw(server.addr, big.as_bytes()).await.unwrap();
    assert_eq!(reply.status, 431);
    assert_eq!(server.rejected("head_too_large"), 1);
    // Just within the limit: answered.
    let fits = format!(
        "GET / HTTP/1.1\r\nHost: test\r\nX-Filler: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(LIMITS.max_head_bytes - 200)
    );
    assert_eq!(raw(server.addr, fits.as_bytes()).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_declared_body_beyond_the_limit_or_of_unknown_length_is_answered_413() {
    let server = Server::ok(LIMITS).await;
    let long = format!(
        "POST / HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        LIMITS.max_body_bytes + 1
    );
    let reply = raw(server.addr, long.as_bytes()).await.unwrap();
    assert_eq!(reply.status, 413);
    assert_eq!(reply.header("connection"), Some("close"));
    let chunked = b"POST / HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
    assert_eq!(raw(server.addr, chunked).await.unwrap().status, 413);
    assert_eq!(server.rejected("body_too_large"), 2);
    // A small body is ignored, as upstream's handlers do.
    let small = b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    assert_eq!(raw(server.addr, small).await.unwrap().status, 200);
}

/// A client that asks for a large answer and never reads it holds the connection for the
/// idle timeout, no longer.
#[tokio::test]
async fn an_answer_the_client_does_not_read_is_dropped_after_the_idle_timeout() {
    // Far more than loopback's socket buffers hold.
    let body = axum::body::Bytes::from(vec![b'x'; 64 << 20]);
    let router = Router::new().route("/", any(move || async move { Body::from(body.clone()) }));
    let server = Server::start(
        HttpLimits {
            idle_timeout: Duration::from_millis(500),
            ..LIMITS
        },
        router,
    )
    .await;
    let mut stream = server.connect().await;
    stream.write_all(KEEP_ALIVE_GET).await.unwrap();
    // The stream stays open (and unread) here: only the server can end the connection.
    server.wait_open(0).await;
    assert_eq!(server.rejected("write_timeout"), 1);
    drop(stream);
}
