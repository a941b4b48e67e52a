//! Chain names, computed once per service port and endpoint and kept across syncs.
//!
//! Every name is a SHA-256 hash; at 10k services x 10 endpoints that is 110k hashes per
//! sync if recomputed. The cache keeps the names used by the previous build and drops the
//! rest, so it never grows beyond two builds' worth of services.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use kpr_model::{ServicePortName, Sizes};
use kpr_naming::{ChainName, ServiceChains, endpoint_chain};

#[derive(Debug, Default)]
struct Generation {
    services: HashMap<ServicePortName, Arc<ServiceChains>>,
    endpoints: HashMap<(ServicePortName, SocketAddr), ChainName>,
}

/// Two generations of names: the ones used by the build in progress and by the one before.
#[derive(Debug, Default)]
pub struct NameCache {
    current: Generation,
    previous: Generation,
}

impl NameCache {
    /// Starts a build: names not used since the previous `begin` are forgotten.
    pub fn begin(&mut self) {
        self.previous = std::mem::take(&mut self.current);
    }

    pub fn service(&mut self, name: &ServicePortName) -> Arc<ServiceChains> {
        if let Some(found) = self.current.services.get(name) {
            return found.clone();
        }
        let chains = self
            .previous
            .services
            .remove(name)
            .unwrap_or_else(|| Arc::new(ServiceChains::new(name)));
        self.current.services.insert(name.clone(), chains.clone());
        chains
    }

    pub fn endpoint(&mut self, name: &ServicePortName, addr: SocketAddr) -> ChainName {
        let key = (name.clone(), addr);
        if let Some(found) = self.current.endpoints.get(&key) {
            return found.clone();
        }
        let chain = self
            .previous
            .endpoints
            .remove(&key)
            .unwrap_or_else(|| endpoint_chain(name, &addr.to_string()));
        self.current.endpoints.insert(key, chain.clone());
        chain
    }

    /// Names held, per generation (kpr_model::Sizes): at most two builds' worth.
    pub fn footprint(&self) -> Sizes {
        let generation = |g: &Generation| {
            Sizes::new()
                .with("services", g.services.len())
                .with("endpoints", g.endpoints.len())
        };
        Sizes::new()
            .nested("current", generation(&self.current))
            .nested("previous", generation(&self.previous))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.current.services.len() + self.previous.services.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_model::Protocol;

    #[test]
    fn names_match_kpr_naming_and_unused_ones_expire() {
        let web = ServicePortName::new("default", "web", "http", Protocol::Tcp);
        let api = ServicePortName::new("default", "api", "http", Protocol::Tcp);
        let mut cache = NameCache::default();
        cache.begin();
        assert_eq!(*cache.service(&web), ServiceChains::new(&web));
        cache.service(&api);
        let addr: SocketAddr = "10.0.0.1:80".parse().unwrap();
        assert_eq!(cache.endpoint(&web, addr), endpoint_chain(&web, "10.0.0.1:80"));
        cache.begin();
        cache.service(&web);
        cache.begin();
        assert_eq!(cache.len(), 1, "api was not used in the last build");
    }
}
