//! nf_tables notifications from the real kernel, in throw-away network namespaces (never
//! the root namespace's): our commits carry our socket's port id and nft's do not, the
//! stopper ends a wait, and a burst bigger than the receive queue reports an overrun.
//! Needs root and nft; fails (never skips) without them.

#![allow(clippy::unwrap_used)] // a panic fails the test

use std::time::{Duration, Instant};

use kpr_netns::Netns;
use kpr_nfnetlink::events::{Change, Commit, EventSocket, Notification, ObjectKind, Operation, Received};
use kpr_nfnetlink::*;

fn table() -> Table {
    Table::new(Family::Ip, "kube-proxy")
}

/// Reads notifications up to and including the next commit (generation).
fn one_transaction(events: &mut EventSocket) -> (Vec<Change>, Commit) {
    let mut changes = Vec::new();
    loop {
        match events.recv().unwrap() {
            Received::Notifications(list) => {
                for notification in list {
                    match notification {
                        Notification::Change(change) => changes.push(change),
                        Notification::Commit(commit) => return (changes, commit),
                        Notification::Other { .. } => {}
                    }
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn our_commits_carry_our_port_id_and_nfts_do_not() {
    let netns = Netns::new("nfev").unwrap();
    let (mut events, _stop, mut socket) = netns.run(|| {
        let (events, stop) = EventSocket::open().unwrap();
        (events, stop, Socket::open().unwrap())
    });
    let ours = socket.port_id().unwrap();
    assert_ne!(ours, 0);

    let mut batch = Batch::new();
    batch.add_table(&table());
    batch.add_chain(&table(), &Chain::regular("services"));
    let generation = socket.send(&batch).unwrap();
    let (changes, commit) = one_transaction(&mut events);
    assert_eq!(
        changes
            .iter()
            .map(|c| (c.object, c.operation, c.table.as_deref(), c.family, c.port_id))
            .collect::<Vec<_>>(),
        [
            (
                ObjectKind::Table,
                Operation::New,
                Some("kube-proxy"),
                Some(Family::Ip),
                ours
            ),
            (
                ObjectKind::Chain,
                Operation::New,
                Some("kube-proxy"),
                Some(Family::Ip),
                ours
            ),
        ]
    );
    assert_eq!((commit.generation, commit.port_id), (generation, ours));

    netns.sh("nft delete chain ip kube-proxy services").unwrap();
    let (changes, commit) = one_transaction(&mut events);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        (changes[0].object, changes[0].operation),
        (ObjectKind::Chain, Operation::Delete)
    );
    assert_ne!(changes[0].port_id, ours);
    assert_eq!(commit.process.as_deref(), Some("nft"));
    assert_eq!(commit.generation, generation + 1);
}

#[test]
fn the_stopper_ends_a_wait_at_once() {
    let netns = Netns::new("nfev").unwrap();
    let (mut events, stop) = netns.run(|| EventSocket::open().unwrap());
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let received = events.recv().unwrap();
        (received, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    stop.stop();
    let (received, waited) = waiter.join().unwrap();
    assert!(matches!(received, Received::Stopped), "{received:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
}

#[test]
fn a_burst_bigger_than_the_receive_queue_reports_an_overrun() {
    let netns = Netns::new("nfev").unwrap();
    let (mut events, _stop, mut socket) = netns.run(|| {
        let (events, stop) = EventSocket::open().unwrap();
        (events, stop, Socket::open().unwrap())
    });
    let mut batch = Batch::new();
    batch.add_table(&table());
    batch.add_set(&table(), &Set::new("addresses", vec![Field::Ipv4Addr]));
    // One notification per element, ~70 bytes each: far more than the 4 MiB queue.
    let elements: Vec<Element> = (0..300_000u32)
        .map(|i| Element::key(Value::new().ipv4(i.into()).build()))
        .collect();
    batch.add_elements(&table(), "addresses", &elements);
    socket.send_split(&batch, SPLIT_TRANSACTION_BYTES).unwrap();
    let mut read = 0usize;
    loop {
        match events.recv().unwrap() {
            Received::Overrun => break,
            Received::Notifications(list) => {
                read += list.len();
                assert!(read < 300_000, "every notification arrived: no overrun");
            }
            Received::Stopped => unreachable!(),
        }
    }
}
