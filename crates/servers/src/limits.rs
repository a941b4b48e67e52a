//! What a server bounds, so that clients that never finish (or never read) cannot exhaust it.
//!
//! Upstream's Go servers set no timeouts and no connection limit: 4,000 connections that
//! each sent half a request head held 4,000 descriptors and ~72 MiB until the clients left.
//! The healthz port (0.0.0.0:10256) and the Service health-check ports are reachable from
//! the network by design, so every server here runs under [`HttpLimits`]. The defaults are
//! the production settings; tests shorten them.

use std::time::Duration;

/// Connection and request bounds of one server (for the Service health-check servers: of
/// one family's set, whose listeners share one budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Connections held at once. A connection beyond it evicts the oldest connection that
    /// has not sent a complete request (a load balancer's probe sends its request at once,
    /// so a flood of half-sent requests evicts its own members first); when every
    /// connection is answering a request, the newcomer is closed at once.
    pub max_connections: usize,
    /// A request head must be complete this long after the connection is accepted, or after
    /// its first byte on a kept-alive connection.
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request (until that request's
    /// head is complete), and how long a response may wait for a client that does not read.
    pub idle_timeout: Duration,
    /// The largest request head (request line and headers); a larger one is answered 431.
    /// Also the connection's read buffer (never below hyper's minimum of 8 KiB).
    pub max_head_bytes: usize,
    /// The largest request body a request may declare; these endpoints read none. A larger
    /// one, or one of undeclared length (chunked), is answered 413 and the connection closed.
    pub max_body_bytes: u64,
}

/// hyper's smallest read buffer: a smaller head limit saves no memory.
const HYPER_MIN_BUFFER: usize = 8192;

/// What every server shares; only the connection cap differs.
const COMMON: HttpLimits = HttpLimits {
    max_connections: 0,
    // A probe's head is one packet sent right after the handshake; 5 s covers two lost
    // packets' retransmissions, and a checker's own timeout (2-10 s) ends the check anyway.
    header_timeout: Duration::from_secs(5),
    // Longer than the interval of any load balancer's checker (1-10 s) with margin, so a
    // checker that reuses its connection never meets one being closed as it sends (closing
    // near the interval would race its next request); scrapers polling every 30 s or more
    // find it closed and reconnect. Idle connections are evicted first under pressure, so a
    // long value costs nothing under attack.
    idle_timeout: Duration::from_secs(30),
    max_head_bytes: HYPER_MIN_BUFFER,
    // Upstream ignores a body; a small one is ignored here too.
    max_body_bytes: 1024,
};

impl HttpLimits {
    /// The healthz port: reachable from the network, probed by every load balancer of a
    /// Service with `externalTrafficPolicy: Cluster` and by kubelet.
    pub const HEALTHZ: Self = Self {
        max_connections: 256,
        ..COMMON
    };

    /// The metrics port: loopback by default, a few scrapers and scripts.
    pub const METRICS: Self = Self {
        max_connections: 64,
        ..COMMON
    };

    /// One family's Service health-check ports, all of them together: the bound does not
    /// grow with the number of Services.
    pub const SERVICE_HEALTH: Self = Self {
        max_connections: 128,
        ..COMMON
    };

    /// hyper's read buffer limit for these bounds.
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.max_head_bytes.max(HYPER_MIN_BUFFER)
    }
}
