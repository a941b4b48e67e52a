//! Which endpoint the next connection of a service port goes to: upstream's `LoadBalancerRR`
//! (roundrobin.go) for one service port, pure (time and randomness come from the caller).
//!
//! Round robin over the ready endpoints. A new endpoint list restarts the rotation at a
//! position the caller chooses at random, as upstream shuffles the list: otherwise every
//! node's proxy would send its first connection to the same pod. With `ClientIP` affinity a
//! client keeps its endpoint while it keeps coming back within the timeout (each use
//! refreshes it); a client whose endpoint left the list, or whose connect failed (the
//! caller asks for `reset_affinity`), picks anew. Upstream prunes expired clients on each
//! sync; so does [`PortBalancer::prune`], so the map never outgrows the active clients.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// One client's sticky endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sticky {
    endpoint: SocketAddr,
    last_used: Instant,
}

/// Round robin with optional ClientIP affinity, for one service port.
#[derive(Debug, Default)]
pub struct PortBalancer {
    endpoints: Vec<SocketAddr>,
    next: usize,
    /// `Some(timeout)` with ClientIP affinity.
    affinity: Option<Duration>,
    clients: HashMap<IpAddr, Sticky>,
}

impl PortBalancer {
    pub fn new(affinity: Option<Duration>) -> Self {
        Self {
            affinity,
            ..Self::default()
        }
    }

    /// Replaces the endpoints. An unchanged list (in any order) keeps the rotation and every
    /// client's endpoint; a changed one restarts the rotation at `start` (modulo its length)
    /// and forgets the clients whose endpoint is gone.
    pub fn set_endpoints(&mut self, mut endpoints: Vec<SocketAddr>, start: usize) {
        endpoints.sort_unstable();
        endpoints.dedup();
        if endpoints == self.endpoints {
            return;
        }
        self.clients
            .retain(|_, sticky| endpoints.binary_search(&sticky.endpoint).is_ok());
        self.next = if endpoints.is_empty() {
            0
        } else {
            start % endpoints.len()
        };
        self.endpoints = endpoints;
    }

    /// Changes the affinity; turning it off or changing the timeout forgets every client, as
    /// upstream recreates the service's state then.
    pub fn set_affinity(&mut self, affinity: Option<Duration>) {
        if affinity != self.affinity {
            self.affinity = affinity;
            self.clients.clear();
        }
    }

    /// The endpoints, sorted.
    pub fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    /// The endpoint for `client`'s next connection, `None` when there is none.
    /// `reset_affinity` (after a failed connect) ignores and replaces the client's sticky
    /// endpoint.
    pub fn next(&mut self, client: IpAddr, reset_affinity: bool, now: Instant) -> Option<SocketAddr> {
        if self.endpoints.is_empty() {
            return None;
        }
        let Some(timeout) = self.affinity else {
            return Some(self.rotate());
        };
        if !reset_affinity
            && let Some(sticky) = self.clients.get_mut(&client)
            && now.saturating_duration_since(sticky.last_used) < timeout
        {
            sticky.last_used = now;
            return Some(sticky.endpoint);
        }
        let endpoint = self.rotate();
        self.clients.insert(
            client,
            Sticky {
                endpoint,
                last_used: now,
            },
        );
        Some(endpoint)
    }

    /// Forgets clients quiet for the affinity timeout or longer.
    pub fn prune(&mut self, now: Instant) {
        if let Some(timeout) = self.affinity {
            self.clients
                .retain(|_, sticky| now.saturating_duration_since(sticky.last_used) < timeout);
        }
    }

    /// Clients with a sticky endpoint (for size checks).
    pub fn sticky_clients(&self) -> usize {
        self.clients.len()
    }

    fn rotate(&mut self) -> SocketAddr {
        let endpoint = self.endpoints[self.next % self.endpoints.len()];
        self.next = (self.next + 1) % self.endpoints.len();
        endpoint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 8080))
    }

    fn client(last: u8) -> IpAddr {
        IpAddr::from([192, 168, 0, last])
    }

    #[test]
    fn round_robin_visits_every_endpoint_in_turn() {
        let now = Instant::now();
        let mut lb = PortBalancer::new(None);
        lb.set_endpoints(vec![ep(3), ep(1), ep(2)], 0);
        let picks: Vec<_> = (0..6).map(|_| lb.next(client(1), false, now).unwrap()).collect();
        assert_eq!(picks, [ep(1), ep(2), ep(3), ep(1), ep(2), ep(3)]);
    }

    #[test]
    fn a_new_list_starts_where_the_caller_says_and_an_unchanged_one_keeps_turning() {
        let now = Instant::now();
        let mut lb = PortBalancer::new(None);
        lb.set_endpoints(vec![ep(1), ep(2), ep(3)], 4);
        assert_eq!(lb.next(client(1), false, now), Some(ep(2)), "start 4 mod 3");
        lb.set_endpoints(vec![ep(3), ep(2), ep(1)], 0);
        assert_eq!(
            lb.next(client(1), false, now),
            Some(ep(3)),
            "same set: rotation kept"
        );
        lb.set_endpoints(vec![ep(1), ep(2)], 1);
        assert_eq!(lb.next(client(1), false, now), Some(ep(2)));
    }

    #[test]
    fn no_endpoints_means_no_pick() {
        let mut lb = PortBalancer::new(Some(Duration::from_secs(10)));
        assert_eq!(lb.next(client(1), false, Instant::now()), None);
        lb.set_endpoints(vec![ep(1)], 0);
        lb.set_endpoints(Vec::new(), 0);
        assert_eq!(lb.next(client(1), false, Instant::now()), None);
    }

    #[test]
    fn a_client_sticks_while_it_comes_back_within_the_timeout() {
        let start = Instant::now();
        let timeout = Duration::from_secs(10);
        let mut lb = PortBalancer::new(Some(timeout));
        lb.set_endpoints(vec![ep(1), ep(2), ep(3)], 0);
        let first = lb.next(client(1), false, start).unwrap();
        // Other clients turn the rotation meanwhile.
        assert_ne!(lb.next(client(2), false, start), Some(first));
        // Each use refreshes: 9 s apart, 5 times, is 45 s of stickiness.
        for i in 1..=5 {
            let now = start + Duration::from_secs(9 * i);
            assert_eq!(lb.next(client(1), false, now), Some(first), "use {i}");
        }
        // Quiet for the whole timeout: picks anew, the rotation's next (ep1 and ep2 went
        // to the first two picks).
        let later = start + Duration::from_secs(45 + 10);
        assert_eq!(first, ep(1));
        assert_eq!(lb.next(client(1), false, later), Some(ep(3)));
    }

    #[test]
    fn clients_spread_and_a_failed_connect_moves_the_client() {
        let now = Instant::now();
        let mut lb = PortBalancer::new(Some(Duration::from_secs(10)));
        lb.set_endpoints(vec![ep(1), ep(2), ep(3)], 0);
        let picks: Vec<_> = (1..=3).map(|c| lb.next(client(c), false, now).unwrap()).collect();
        assert_eq!(picks, [ep(1), ep(2), ep(3)]);
        assert_eq!(lb.next(client(4), false, now), Some(ep(1)));
        // Client 4's connect to ep1 failed: the retry takes the rotation's next, and sticks.
        assert_eq!(lb.next(client(4), true, now), Some(ep(2)));
        assert_eq!(lb.next(client(4), false, now), Some(ep(2)));
    }

    #[test]
    fn a_removed_endpoint_releases_its_clients_only() {
        let now = Instant::now();
        let mut lb = PortBalancer::new(Some(Duration::from_secs(10)));
        lb.set_endpoints(vec![ep(1), ep(2)], 0);
        assert_eq!(lb.next(client(1), false, now), Some(ep(1)));
        assert_eq!(lb.next(client(2), false, now), Some(ep(2)));
        lb.set_endpoints(vec![ep(2), ep(3)], 0);
        assert_eq!(lb.sticky_clients(), 1);
        assert_eq!(lb.next(client(2), false, now), Some(ep(2)), "kept");
        assert_ne!(lb.next(client(1), false, now), Some(ep(1)), "gone");
    }

    #[test]
    fn prune_forgets_quiet_clients_and_affinity_changes_forget_all() {
        let start = Instant::now();
        let mut lb = PortBalancer::new(Some(Duration::from_secs(10)));
        lb.set_endpoints(vec![ep(1), ep(2)], 0);
        lb.next(client(1), false, start);
        lb.next(client(2), false, start + Duration::from_secs(5));
        lb.prune(start + Duration::from_secs(10));
        assert_eq!(lb.sticky_clients(), 1);
        lb.set_affinity(Some(Duration::from_secs(20)));
        assert_eq!(lb.sticky_clients(), 0);
        lb.set_affinity(None);
        lb.next(client(1), false, start);
        assert_eq!(lb.sticky_clients(), 0, "no affinity, nothing kept");
    }
}
