//! What is programmed, and the map writes that take it to a new desired state: pure, so the
//! order of writes (which keeps every connect answered during an update) is tested without
//! a kernel.
//!
//! A Service's changes become writes in four steps, applied in this order over the whole
//! sync: endpoint slots written, Service entries written, Service entries deleted, slots
//! deleted. So a program never reads a count larger than the slots written, and a Service
//! entry never points at an endpoint set that is gone; an address that moves between
//! Services in one sync is written, never deleted. Each endpoint set has an id that lives
//! as long as the set; an id freed in a sync is reused in a later one only.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use kpr_model::{IpFamily, NamespacedName};
use kpr_state::DesiredState;

use crate::entries::{EndpointSet, ServiceEntries, SetName, service_entries};
use crate::maps::{AddrPort, BackendKey, ServiceKey, ServiceValue, family_of};

/// One map write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    PutBackend(BackendKey, AddrPort),
    PutService(ServiceKey, ServiceValue),
    DeleteService(ServiceKey),
    DeleteBackend(BackendKey),
}

/// The ids of endpoint sets, shared by both families (one backend map).
#[derive(Debug, Default)]
pub struct Ids {
    next: u32,
    free: Vec<u32>,
}

impl Ids {
    /// Ids above every id in `taken` (the adopted maps' own).
    pub fn above(taken: impl IntoIterator<Item = u32>) -> Self {
        Self {
            next: taken.into_iter().max().map_or(0, |max| max.saturating_add(1)),
            free: Vec::new(),
        }
    }

    fn take(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            let id = self.next;
            self.next = self.next.saturating_add(1);
            id
        })
    }
}

/// Entries found in the maps at start-up (a previous process's), of one family: deleted
/// by the first full sync unless it writes them.
#[derive(Debug, Default, Clone)]
pub struct Adopted {
    pub services: Vec<ServiceKey>,
    pub backends: Vec<BackendKey>,
}

#[derive(Debug)]
struct Programmed {
    id: u32,
    set: EndpointSet,
}

/// One family's programmed entries.
#[derive(Debug)]
pub struct Table {
    family: IpFamily,
    services: HashMap<NamespacedName, BTreeMap<SetName, Programmed>>,
    /// How many programmed sets use each Service key (an address moving between Services
    /// is used by two for a moment), so a deletion never scans every Service.
    owners: HashMap<ServiceKey, u32>,
    adopted: Option<Adopted>,
    service_entries: usize,
    backend_entries: usize,
}

/// The writes of one sync, in the order they must be applied.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub ops: Vec<Op>,
}

impl Table {
    pub fn new(family: IpFamily, adopted: Adopted) -> Self {
        Self {
            family,
            services: HashMap::new(),
            owners: HashMap::new(),
            adopted: Some(adopted),
            service_entries: 0,
            backend_entries: 0,
        }
    }

    /// Service entries and endpoint slots programmed.
    pub fn sizes(&self) -> (usize, usize) {
        (self.service_entries, self.backend_entries)
    }

    /// The writes that take the maps to `state`: every Service when `changed` is `None` (a
    /// full sync), else those named. The table assumes they will be applied; a failed
    /// apply must be followed by [`Table::forget`] and a full sync.
    pub fn sync(
        &mut self,
        state: &DesiredState,
        changed: Option<&BTreeSet<NamespacedName>>,
        node_addresses: &[IpAddr],
        ids: &mut Ids,
    ) -> Batch {
        let names: BTreeSet<NamespacedName> = match changed {
            Some(changed) => changed.clone(),
            None => state
                .services
                .keys()
                .chain(self.services.keys())
                .cloned()
                .collect(),
        };
        let mut put_backends = Vec::new();
        let mut put_services = Vec::new();
        let mut delete_services = Vec::new();
        let mut delete_backends = Vec::new();
        let mut freed = Vec::new();
        for name in &names {
            let desired = match state.services.get(name) {
                Some(ports) => service_entries(state, ports.iter(), node_addresses, self.family),
                None => ServiceEntries::new(),
            };
            let mut old = self.services.remove(name).unwrap_or_default();
            for programmed in old.values() {
                for (key, _) in &programmed.set.addresses {
                    if let Some(count) = self.owners.get_mut(key) {
                        *count -= 1;
                        if *count == 0 {
                            self.owners.remove(key);
                        }
                    }
                }
            }
            let mut programmed = BTreeMap::new();
            for (set_name, set) in desired {
                let previous = old.remove(&set_name);
                let id = previous.as_ref().map_or_else(|| ids.take(), |p| p.id);
                let old_set = previous.as_ref().map(|p| &p.set);
                for (slot, endpoint) in set.endpoints.iter().enumerate() {
                    if old_set.and_then(|o| o.endpoints.get(slot)) != Some(endpoint) {
                        put_backends.push(Op::PutBackend(backend_key(id, slot), AddrPort::new(*endpoint)));
                    }
                }
                let count = u32::try_from(set.endpoints.len()).unwrap_or(u32::MAX);
                let old_count = old_set.map_or(0, |o| o.endpoints.len());
                for slot in set.endpoints.len()..old_count {
                    delete_backends.push(Op::DeleteBackend(backend_key(id, slot)));
                }
                let unchanged_value = old_set.is_some_and(|o| {
                    o.endpoints.len() == set.endpoints.len() && o.affinity_seconds == set.affinity_seconds
                });
                for &(key, flags) in &set.addresses {
                    let already =
                        unchanged_value && old_set.is_some_and(|o| o.addresses.contains(&(key, flags)));
                    if !already {
                        put_services.push(Op::PutService(
                            key,
                            ServiceValue {
                                count,
                                id,
                                affinity_seconds: set.affinity_seconds,
                                flags,
                            },
                        ));
                    }
                }
                if let Some(o) = old_set {
                    for (key, _) in &o.addresses {
                        if !set.addresses.iter().any(|(k, _)| k == key) {
                            delete_services.push(Op::DeleteService(*key));
                        }
                    }
                }
                self.service_entries += set.addresses.len();
                self.backend_entries += set.endpoints.len();
                if let Some(o) = old_set {
                    self.service_entries -= o.addresses.len();
                    self.backend_entries -= o.endpoints.len();
                }
                programmed.insert(set_name, Programmed { id, set });
            }
            // Sets that are gone: their addresses, then their slots.
            for (_, gone) in old {
                for (key, _) in &gone.set.addresses {
                    delete_services.push(Op::DeleteService(*key));
                }
                for slot in 0..gone.set.endpoints.len() {
                    delete_backends.push(Op::DeleteBackend(backend_key(gone.id, slot)));
                }
                self.service_entries -= gone.set.addresses.len();
                self.backend_entries -= gone.set.endpoints.len();
                freed.push(gone.id);
            }
            for p in programmed.values() {
                for (key, _) in &p.set.addresses {
                    *self.owners.entry(*key).or_default() += 1;
                }
            }
            if !programmed.is_empty() {
                self.services.insert(name.clone(), programmed);
            }
        }
        if changed.is_none()
            && let Some(adopted) = self.adopted.take()
        {
            delete_services.extend(
                adopted
                    .services
                    .into_iter()
                    .filter(|k| k.family() == self.family)
                    .map(Op::DeleteService),
            );
            delete_backends.extend(adopted.backends.into_iter().map(Op::DeleteBackend));
        }
        let written_services: BTreeSet<ServiceKey> = put_services
            .iter()
            .filter_map(|op| match op {
                Op::PutService(k, _) => Some(*k),
                _ => None,
            })
            .collect();
        let written_backends: BTreeSet<BackendKey> = put_backends
            .iter()
            .filter_map(|op| match op {
                Op::PutBackend(k, _) => Some(*k),
                _ => None,
            })
            .collect();
        delete_services.retain(
            |op| !matches!(op, Op::DeleteService(k) if written_services.contains(k) || self.owners.contains_key(k)),
        );
        delete_backends.retain(|op| !matches!(op, Op::DeleteBackend(k) if written_backends.contains(k)));
        // An id is reused in a later sync only, never within the batch that frees it.
        ids.free.extend(freed);
        let mut ops = put_backends;
        ops.append(&mut put_services);
        ops.append(&mut delete_services);
        ops.append(&mut delete_backends);
        Batch { ops }
    }

    /// After a failed apply: what the maps hold is unknown, so everything programmed is
    /// treated as adopted (deleted by the next full sync unless written again).
    pub fn forget(&mut self) {
        let mut adopted = self.adopted.take().unwrap_or_default();
        for sets in self.services.values() {
            for p in sets.values() {
                adopted.services.extend(p.set.addresses.iter().map(|(k, _)| *k));
                adopted
                    .backends
                    .extend((0..p.set.endpoints.len()).map(|slot| backend_key(p.id, slot)));
            }
        }
        self.services.clear();
        self.owners.clear();
        self.service_entries = 0;
        self.backend_entries = 0;
        self.adopted = Some(adopted);
    }

    /// After a sync whose `ops` were computed but not written (they did not fit): the maps
    /// still hold the previous sync's entries, including those `ops` would have deleted,
    /// which the table no longer knows; they are adopted with the rest, so the next full
    /// sync deletes them unless written again.
    pub fn forget_unwritten(&mut self, ops: &[Op]) {
        self.forget();
        let adopted = self.adopted.get_or_insert_with(Adopted::default);
        for op in ops {
            match op {
                Op::DeleteService(key) => adopted.services.push(*key),
                Op::DeleteBackend(key) => adopted.backends.push(*key),
                Op::PutBackend(..) | Op::PutService(..) => {}
            }
        }
    }
}

fn backend_key(id: u32, slot: usize) -> BackendKey {
    BackendKey {
        id,
        slot: u32::try_from(slot).unwrap_or(u32::MAX),
    }
}

/// The adopted entries of `family`, from everything found in the maps: its Service keys,
/// and the slots whose endpoint is of the family.
pub fn adopted_of(family: IpFamily, services: &[ServiceKey], backends: &[(BackendKey, AddrPort)]) -> Adopted {
    Adopted {
        services: services
            .iter()
            .filter(|k| k.family() == family)
            .copied()
            .collect(),
        backends: backends
            .iter()
            .filter(|(_, v)| family_of(v.addr) == family)
            .map(|(k, _)| *k)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpr_world::{World, ep};
    use serde_json::json;

    use crate::maps::{FLAG_EXTERNAL, PROTO_TCP};

    fn key(ip: &str, port: u16) -> ServiceKey {
        ServiceKey::new(ip.parse().unwrap(), port, kpr_model::Protocol::Tcp).unwrap()
    }

    fn endpoint(addr: &str) -> AddrPort {
        AddrPort::new(addr.parse().unwrap())
    }

    fn value(count: u32, id: u32, flags: u32) -> ServiceValue {
        ServiceValue {
            count,
            id,
            affinity_seconds: 0,
            flags,
        }
    }

    fn web(world: &mut World, spec: serde_json::Value, endpoints: &[&str]) {
        let mut full =
            json!({"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
        for (k, v) in spec.as_object().unwrap() {
            full[k] = v.clone();
        }
        world.service("web", full);
        let eps: Vec<_> = endpoints.iter().map(|e| ep(e)).collect();
        world.slice("web", json!([{"name": "http", "port": 8080}]), eps);
    }

    struct Fixture {
        world: World,
        table: Table,
        ids: Ids,
    }

    impl Fixture {
        fn new() -> Self {
            Self::adopting(Adopted::default())
        }

        fn adopting(adopted: Adopted) -> Self {
            Self {
                world: World::new(),
                table: Table::new(IpFamily::V4, adopted),
                ids: Ids::default(),
            }
        }

        fn sync(&mut self, full: bool) -> Vec<Op> {
            let (state, changed) = self.world.take();
            let node: Vec<IpAddr> = vec!["192.168.1.5".parse().unwrap(), "127.0.0.1".parse().unwrap()];
            self.table
                .sync(&state, (!full).then_some(&changed), &node, &mut self.ids)
                .ops
        }
    }

    #[test]
    fn a_new_service_writes_its_slots_before_the_address_that_uses_them() {
        let mut f = Fixture::new();
        web(&mut f.world, json!({}), &["10.0.0.3 ready", "10.0.0.2 ready"]);
        let ops = f.sync(true);
        assert_eq!(
            ops,
            [
                Op::PutBackend(BackendKey { id: 0, slot: 0 }, endpoint("10.0.0.2:8080")),
                Op::PutBackend(BackendKey { id: 0, slot: 1 }, endpoint("10.0.0.3:8080")),
                Op::PutService(key("10.96.0.10", 80), value(2, 0, 0)),
            ]
        );
        assert_eq!(key("10.96.0.10", 80).proto, PROTO_TCP);
        assert_eq!(f.table.sizes(), (1, 2));
        assert!(f.sync(false).is_empty(), "nothing changed, nothing written");
    }

    #[test]
    fn a_shrinking_set_lowers_the_count_before_deleting_the_slot() {
        let mut f = Fixture::new();
        web(&mut f.world, json!({}), &["10.0.0.2 ready", "10.0.0.3 ready"]);
        f.sync(true);
        web(&mut f.world, json!({}), &["10.0.0.2 ready"]);
        assert_eq!(
            f.sync(false),
            [
                Op::PutService(key("10.96.0.10", 80), value(1, 0, 0)),
                Op::DeleteBackend(BackendKey { id: 0, slot: 1 }),
            ]
        );
    }

    #[test]
    fn no_endpoints_removes_the_address_so_nftables_rejects() {
        let mut f = Fixture::new();
        web(&mut f.world, json!({}), &["10.0.0.2 ready"]);
        f.sync(true);
        web(&mut f.world, json!({}), &["10.0.0.2 notready"]);
        assert_eq!(
            f.sync(false),
            [
                Op::DeleteService(key("10.96.0.10", 80)),
                Op::DeleteBackend(BackendKey { id: 0, slot: 0 }),
            ]
        );
        assert_eq!(f.table.sizes(), (0, 0));
        // The freed id is reused by a later sync.
        web(&mut f.world, json!({}), &["10.0.0.4 ready"]);
        assert_eq!(
            f.sync(false)[0],
            Op::PutBackend(BackendKey { id: 0, slot: 0 }, endpoint("10.0.0.4:8080"))
        );
    }

    #[test]
    fn terminating_endpoints_serve_when_none_is_ready() {
        let mut f = Fixture::new();
        web(
            &mut f.world,
            json!({}),
            &["10.0.0.2 serving terminating", "10.0.0.3 terminating"],
        );
        let ops = f.sync(true);
        assert_eq!(
            ops,
            [
                Op::PutBackend(BackendKey { id: 0, slot: 0 }, endpoint("10.0.0.2:8080")),
                Op::PutService(key("10.96.0.10", 80), value(1, 0, 0)),
            ]
        );
    }

    #[test]
    fn internal_policy_local_uses_this_nodes_endpoints_only() {
        let mut f = Fixture::new();
        web(
            &mut f.world,
            json!({"internalTrafficPolicy": "Local"}),
            &["10.0.0.2 ready", "10.0.0.3 ready local"],
        );
        let ops = f.sync(true);
        assert_eq!(
            ops,
            [
                Op::PutBackend(BackendKey { id: 0, slot: 0 }, endpoint("10.0.0.3:8080")),
                Op::PutService(key("10.96.0.10", 80), value(1, 0, 0)),
            ]
        );
        web(
            &mut f.world,
            json!({"internalTrafficPolicy": "Local"}),
            &["10.0.0.2 ready"],
        );
        assert_eq!(
            f.sync(false),
            [
                Op::DeleteService(key("10.96.0.10", 80)),
                Op::DeleteBackend(BackendKey { id: 0, slot: 0 }),
            ],
            "no local endpoint: left to nftables, which drops it"
        );
    }

    #[test]
    fn external_addresses_use_every_endpoint_and_source_ranges_are_left_to_nftables() {
        let mut f = Fixture::new();
        web(
            &mut f.world,
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                   "externalIPs": ["192.0.2.7"],
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
                   "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}]}}}),
            &["10.0.0.2 ready"],
        );
        let ops = f.sync(true);
        let external = value(1, 1, FLAG_EXTERNAL);
        assert!(
            ops.contains(&Op::PutService(key("10.96.0.10", 80), value(1, 0, 0))),
            "{ops:?}"
        );
        assert!(
            ops.contains(&Op::PutService(key("192.168.1.5", 30080), external)),
            "{ops:?}"
        );
        assert!(
            ops.contains(&Op::PutService(key("192.0.2.7", 80), external)),
            "{ops:?}"
        );
        assert!(
            ops.contains(&Op::PutService(key("203.0.113.9", 80), external)),
            "{ops:?}"
        );
        assert!(
            !ops.iter()
                .any(|op| matches!(op, Op::PutService(k, _) if k.ip().is_loopback())),
            "no loopback NodePort"
        );
        web(
            &mut f.world,
            json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
                   "externalIPs": ["192.0.2.7"],
                   "loadBalancerSourceRanges": ["198.51.100.0/24"],
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}],
                   "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}]}}}),
            &["10.0.0.2 ready"],
        );
        assert_eq!(f.sync(false), [Op::DeleteService(key("203.0.113.9", 80))]);
    }

    #[test]
    fn affinity_is_carried_in_the_service_value() {
        let mut f = Fixture::new();
        web(
            &mut f.world,
            json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}),
            &["10.0.0.2 ready"],
        );
        let ops = f.sync(true);
        assert!(ops.contains(&Op::PutService(
            key("10.96.0.10", 80),
            ServiceValue {
                count: 1,
                id: 0,
                affinity_seconds: 60,
                flags: 0
            }
        )));
    }

    #[test]
    fn an_address_moving_between_services_in_one_sync_is_written_not_deleted() {
        let mut f = Fixture::new();
        web(&mut f.world, json!({}), &["10.0.0.2 ready"]);
        f.sync(true);
        f.world.delete_service("web");
        f.world.service(
            "api",
            json!({"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        );
        f.world.slice(
            "api",
            json!([{"name": "http", "port": 8080}]),
            vec![ep("10.0.0.9 ready")],
        );
        let ops = f.sync(false);
        assert!(
            ops.contains(&Op::PutService(key("10.96.0.10", 80), value(1, 1, 0))),
            "{ops:?}"
        );
        assert!(
            !ops.contains(&Op::DeleteService(key("10.96.0.10", 80))),
            "{ops:?}"
        );
        assert!(
            ops.contains(&Op::DeleteBackend(BackendKey { id: 0, slot: 0 })),
            "{ops:?}"
        );
    }

    #[test]
    fn a_restart_rewrites_under_new_ids_then_deletes_what_it_adopted() {
        let adopted = adopted_of(
            IpFamily::V4,
            &[key("10.96.0.10", 80), key("10.96.0.99", 80)],
            &[(BackendKey { id: 7, slot: 0 }, endpoint("10.0.0.2:8080"))],
        );
        let mut f = Fixture::adopting(adopted);
        f.ids = Ids::above([7]);
        web(&mut f.world, json!({}), &["10.0.0.2 ready"]);
        assert_eq!(
            f.sync(true),
            [
                Op::PutBackend(BackendKey { id: 8, slot: 0 }, endpoint("10.0.0.2:8080")),
                Op::PutService(key("10.96.0.10", 80), value(1, 8, 0)),
                Op::DeleteService(key("10.96.0.99", 80)),
                Op::DeleteBackend(BackendKey { id: 7, slot: 0 }),
            ]
        );
    }

    #[test]
    fn a_failed_apply_is_repaired_by_the_next_full_sync() {
        let mut f = Fixture::new();
        web(&mut f.world, json!({}), &["10.0.0.2 ready"]);
        f.sync(true);
        f.table.forget();
        let ops = f.sync(true);
        assert_eq!(
            ops,
            [
                Op::PutBackend(BackendKey { id: 1, slot: 0 }, endpoint("10.0.0.2:8080")),
                Op::PutService(key("10.96.0.10", 80), value(1, 1, 0)),
                Op::DeleteBackend(BackendKey { id: 0, slot: 0 }),
            ]
        );
    }

    /// A sync whose writes were not made (they did not fit the maps) removed a Service: its
    /// entries are still in the maps though the table's new state lacks them, so they must
    /// be adopted for the next full sync to delete them (a plain `forget` would leave them).
    #[test]
    fn what_an_unwritten_sync_would_have_deleted_the_next_full_sync_deletes() {
        let mut f = Fixture::new();
        web(&mut f.world, json!({}), &["10.0.0.2 ready"]);
        f.sync(true);
        f.world.delete_service("web");
        let unwritten = f.sync(false);
        assert!(
            unwritten.contains(&Op::DeleteService(key("10.96.0.10", 80))),
            "{unwritten:?}"
        );
        f.table.forget_unwritten(&unwritten);
        assert_eq!(
            f.sync(true),
            [
                Op::DeleteService(key("10.96.0.10", 80)),
                Op::DeleteBackend(BackendKey { id: 0, slot: 0 }),
            ]
        );
    }
}
