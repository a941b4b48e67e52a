//! Nothing the nftables backend keeps between syncs grows with the number of changes:
//! after rounds of kpr_world's churn (ending where they started, a sync wherever the
//! workload says), every size of its footprint is back to its starting value. Driven
//! through partial syncs only, the path a long-running proxy takes, with a transport that
//! records nothing and reports no foreign commits (no kernel needed).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::options;
use kpr_model::IpFamily;
use kpr_nftables::{NftablesBackend, NftablesOptions, NoKernel};
use kpr_state::Backend;
use kpr_world::World;
use kpr_world::churn::{Change, churn};

struct Harness {
    world: World,
    backend: NftablesBackend,
}

impl Harness {
    fn new(family: IpFamily) -> Self {
        let opts = NftablesOptions { family, ..options() };
        let hour = Duration::from_secs(3600);
        let backend = NftablesBackend::new(opts, Box::new(NoKernel))
            .unwrap()
            .with_full_sync_period(hour)
            .with_reconcile_period(hour);
        let mut h = Self {
            world: World::with_family(family),
            backend,
        };
        assert!(h.sync(), "the first sync is full");
        h
    }

    /// Syncs; whether the sync was full.
    fn sync(&mut self) -> bool {
        let pending = self.world.pending();
        self.backend.sync(&pending.request(false)).unwrap().full
    }

    fn run(&mut self, changes: &[Change]) {
        for change in changes {
            self.world.apply(change);
            if matches!(change, Change::Sync) {
                assert!(!self.sync(), "churn must take the partial path");
            }
        }
    }
}

#[test]
fn backend_sizes_come_back_after_churn_in_both_families() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut h = Harness::new(family);
        h.run(&churn(0, 1));
        let before = h.backend.footprint();
        h.run(&churn(1, 40));
        let after = h.backend.footprint();
        assert_eq!(
            before.differences(&after),
            [],
            "{family:?}: sizes grew with churn:\n{after}"
        );
    }
}

#[test]
fn the_churn_fills_the_ledger_midway() {
    // Without this the check above could compare two empty ledgers.
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut h = Harness::new(family);
        let empty = h.backend.footprint();
        let changes = churn(0, 1);
        let first_sync = changes.iter().position(|c| matches!(c, Change::Sync)).unwrap();
        h.run(&changes[..=first_sync]);
        let midway = h.backend.footprint();
        for name in [
            "ledger.claims",
            "ledger.cluster_ips",
            "ledger.hairpin",
            "ledger.owned_elements",
            "bundles",
            "ports",
        ] {
            assert!(
                midway.get(name).unwrap() > empty.get(name).unwrap(),
                "{family:?}: {name} did not grow midway:\n{midway}"
            );
        }
    }
}
