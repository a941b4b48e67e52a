//! Nothing in the trackers grows with the number of changes: after rounds of churn that
//! end where they started (kpr_world::churn), every size is back to its starting value.

use kpr_model::IpFamily;
use kpr_world::World;
use kpr_world::churn::{Change, churn};

fn run(world: &mut World, changes: &[Change]) {
    for change in changes {
        world.apply(change);
        if matches!(change, Change::Sync) {
            world.pending();
        }
    }
}

#[test]
fn tracker_sizes_come_back_after_churn_in_both_families() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let mut world = World::with_family(family);
        run(&mut world, &churn(0, 1));
        let before = world.footprint();
        run(&mut world, &churn(1, 40));
        let after = world.footprint();
        assert_eq!(
            before.differences(&after),
            [],
            "{family:?}: sizes grew with churn:\n{after}"
        );
        assert_eq!(
            before.get("endpoints.slices"),
            Some(1),
            "each round ends with the steady Service's slice of this family:\n{before}"
        );
    }
}

#[test]
fn the_churn_holds_state_midway_so_the_sizes_can_differ() {
    // The check above would pass trivially if the workload left nothing in the trackers
    // at any point: between two syncs it must hold Services, slices and pending changes.
    let mut world = World::new();
    let changes = churn(0, 1);
    let first_sync = changes.iter().position(|c| matches!(c, Change::Sync)).unwrap();
    run(&mut world, &changes[..first_sync]);
    let midway = world.footprint();
    for name in [
        "services.pending",
        "endpoints.slices",
        "endpoints.slices_by_service",
        "endpoints.dirty",
    ] {
        assert!(
            midway.get(name).unwrap_or(0) > 0,
            "{name} is empty midway:\n{midway}"
        );
    }
    world.pending();
    let synced = world.footprint();
    assert!(synced.get("services.applied").unwrap_or(0) > 0, "{synced}");
    assert!(synced.get("endpoints.applied").unwrap_or(0) > 0, "{synced}");
}
