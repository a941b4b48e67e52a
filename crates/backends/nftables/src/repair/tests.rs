//! The repair filter on notifications the kernel sent (kpr-nfnetlink's captured fixtures:
//! `nft` commands in a throw-away namespace, see their README).

use kpr_nfnetlink::events::{Commit, ObjectKind, Operation, parse};

use super::*;

/// The notifications of a fixture file (hex datagrams, one per line).
fn notifications(hex: &str) -> Vec<Notification> {
    hex.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .flat_map(|line| {
            let bytes: Vec<u8> = (0..line.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
                .collect();
            parse(&bytes).unwrap()
        })
        .collect()
}

/// The port id of the socket that sent the fixture's transaction (nft's).
fn sender(notifications: &[Notification]) -> u32 {
    let ports: Vec<u32> = notifications
        .iter()
        .filter_map(|n| match n {
            Notification::Change(c) => Some(c.port_id),
            _ => None,
        })
        .collect();
    assert!(!ports.is_empty(), "a fixture with changes");
    assert!(ports.iter().all(|p| *p == ports[0]), "one sender: {ports:?}");
    ports[0]
}

const FLUSH_TABLE: &str = include_str!("../../../nfnetlink/src/events/fixtures/flush-table.hex");
const DELETE_CHAIN: &str = include_str!("../../../nfnetlink/src/events/fixtures/delete-chain.hex");
const DELETE_ELEMENT: &str = include_str!("../../../nfnetlink/src/events/fixtures/delete-element.hex");
const DELETE_TABLE: &str = include_str!("../../../nfnetlink/src/events/fixtures/delete-table.hex");
const IP6_TABLE: &str = include_str!("../../../nfnetlink/src/events/fixtures/ip6-table.hex");
const OTHER_TABLE: &str = include_str!("../../../nfnetlink/src/events/fixtures/other-table.hex");

#[test]
fn someone_elses_change_to_our_table_asks_for_a_repair() {
    for (name, hex) in [
        ("flush table", FLUSH_TABLE),
        ("delete chain", DELETE_CHAIN),
        ("delete element", DELETE_ELEMENT),
        ("delete table", DELETE_TABLE),
    ] {
        let seen = notifications(hex);
        let nft = sender(&seen);
        assert_eq!(verdict(&seen, IpFamily::V4, nft + 1), Verdict::Repair, "{name}");
    }
}

#[test]
fn our_own_changes_are_ignored() {
    for hex in [FLUSH_TABLE, DELETE_CHAIN, DELETE_ELEMENT, DELETE_TABLE] {
        let seen = notifications(hex);
        // Had our transport sent these, they would carry its port id.
        assert_eq!(verdict(&seen, IpFamily::V4, sender(&seen)), Verdict::Ignore);
    }
}

#[test]
fn only_our_family_and_our_table_count() {
    let ip6 = notifications(IP6_TABLE);
    let nft = sender(&ip6);
    assert_eq!(
        verdict(&ip6, IpFamily::V4, nft + 1),
        Verdict::Ignore,
        "ip6 kube-proxy is not IPv4's"
    );
    assert_eq!(
        verdict(&ip6, IpFamily::V6, nft + 1),
        Verdict::Repair,
        "but IPv6's"
    );
    let other = notifications(OTHER_TABLE);
    let nft = sender(&other);
    for family in [IpFamily::V4, IpFamily::V6] {
        assert_eq!(verdict(&other, family, nft + 1), Verdict::Ignore, "inet filter");
    }
}

#[test]
fn the_kernels_own_changes_and_commits_alone() {
    let change = |table: Option<&str>, port_id| Change {
        object: ObjectKind::Chain,
        operation: Operation::Delete,
        family: Some(Family::Ip),
        table: table.map(str::to_string),
        port_id,
    };
    assert!(
        is_foreign(&change(Some("kube-proxy"), 0), IpFamily::V4, 7),
        "port 0: the kernel"
    );
    assert!(!is_foreign(&change(Some("kube-proxy-x"), 0), IpFamily::V4, 7));
    assert!(
        is_foreign(&change(None, 9), IpFamily::V4, 7),
        "no name: assume ours"
    );
    let commit = Notification::Commit(Commit {
        generation: 3,
        pid: Some(1),
        process: Some("nft".into()),
        port_id: 9,
    });
    assert_eq!(
        verdict(&[commit], IpFamily::V4, 7),
        Verdict::Ignore,
        "a commit alone changes nothing of ours"
    );
}
