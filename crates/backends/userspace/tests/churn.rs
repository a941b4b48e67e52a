//! Nothing userspace mode keeps between syncs grows with the number of changes (issue 12):
//! after rounds of kpr_world's churn, which end where they started, the backend's sizes,
//! its metric series and the process's descriptors are what they were after a warm-up
//! round. The listeners are real sockets (in a namespace this test creates); the portals go
//! to an iptables that only accepts, since their text is the golden tests' business.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Accepting, in_netns, open_descriptors};
use kpr_model::IpFamily;
use kpr_state::Backend;
use kpr_userspace::metrics::UserspaceMetrics;
use kpr_userspace::{UserspaceBackend, UserspaceOptions};
use kpr_world::World;
use kpr_world::churn::{Change, churn};
use prometheus_client::registry::Registry;

/// Syncs at every [`Change::Sync`]; returns the most ports open at once.
fn run(world: &mut World, backend: &mut UserspaceBackend, changes: &[Change]) -> usize {
    let mut most = 0;
    for change in changes {
        world.apply(change);
        if matches!(change, Change::Sync) {
            backend.sync(&world.pending().request(false)).unwrap();
            most = most.max(backend.footprint().get("open_ports").unwrap());
        }
    }
    most
}

fn series(registry: &Registry) -> usize {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines().filter(|line| line.contains("service_port=")).count()
}

#[test]
fn sizes_series_and_descriptors_come_back_after_churn_in_both_families() {
    in_netns("uschurn", 2, |rt| {
        for family in [IpFamily::V4, IpFamily::V6] {
            let mut registry = Registry::default();
            let metrics = UserspaceMetrics::register(&mut registry);
            let host = match family {
                IpFamily::V4 => "127.0.0.1".parse().unwrap(),
                IpFamily::V6 => "::1".parse().unwrap(),
            };
            let mut backend = UserspaceBackend::new(
                UserspaceOptions::new(family, host),
                Box::new(Accepting),
                rt.handle().clone(),
            )
            .with_metrics(metrics);
            let mut world = World::with_family(family);
            backend.sync(&world.pending().request(false)).unwrap();
            let most = run(&mut world, &mut backend, &churn(0, 1));
            // Closed listeners end on the runtime a moment after the sync.
            std::thread::sleep(std::time::Duration::from_millis(200));
            let before = (backend.footprint(), series(&registry), open_descriptors());
            run(&mut world, &mut backend, &churn(1, 20));
            std::thread::sleep(std::time::Duration::from_millis(200));
            let after = (backend.footprint(), series(&registry), open_descriptors());
            assert_eq!(
                before.0.differences(&after.0),
                [],
                "{family:?}: sizes grew with churn:\n{}",
                after.0
            );
            assert_eq!(before.1, after.1, "{family:?}: metric series");
            assert_eq!(before.2, after.2, "{family:?}: open descriptors");
            assert!(
                most > before.0.get("open_ports").unwrap(),
                "{family:?}: the churn never opened a port"
            );
        }
    });
}
