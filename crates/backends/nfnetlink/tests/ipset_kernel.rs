//! The ipset client against the real kernel in a throw-away network namespace, with the
//! `ipset` tool's `ipset save` as the independent view: sets of every type created,
//! members added, deleted and listed back, refusals naming their member, and enough
//! members to need several datagrams and several dump messages. Needs root and the
//! `ipset` tool; fails (never skips) without them.

#![allow(clippy::unwrap_used)] // helpers and closures in tests may panic: that fails the test

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use kpr_netns::Netns;
use kpr_nfnetlink::ipset::*;

const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn hash(family: SetFamily) -> CreateOptions {
    CreateOptions::Hash {
        family,
        hash_size: 1024,
        max_elements: 65536,
    }
}

/// One set of each type, with members and how `ipset save` prints each.
fn every_type() -> Vec<(SetDef<'static>, Vec<(Entry, &'static str)>)> {
    vec![
        (
            SetDef {
                name: "KUBE-CLUSTER-IP",
                set_type: SetType::HashIpPort,
                options: hash(SetFamily::Inet),
            },
            vec![
                (
                    Entry::IpPort {
                        ip: ip("10.96.0.1"),
                        protocol: TCP,
                        port: 443,
                    },
                    "10.96.0.1,tcp:443",
                ),
                (
                    Entry::IpPort {
                        ip: ip("10.96.0.10"),
                        protocol: UDP,
                        port: 53,
                    },
                    "10.96.0.10,udp:53",
                ),
            ],
        ),
        (
            SetDef {
                name: "KUBE-6-LOOP-BACK",
                set_type: SetType::HashIpPortIp,
                options: hash(SetFamily::Inet6),
            },
            vec![(
                Entry::IpPortIp {
                    ip: ip("fd00::5"),
                    protocol: SCTP,
                    port: 8080,
                    ip2: ip("fd00::5"),
                },
                "fd00::5,sctp:8080,fd00::5",
            )],
        ),
        (
            SetDef {
                name: "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                set_type: SetType::HashIpPortNet,
                options: hash(SetFamily::Inet),
            },
            vec![
                (
                    Entry::IpPortNet {
                        ip: ip("203.0.113.1"),
                        protocol: TCP,
                        port: 80,
                        net: ip("192.0.2.0"),
                        prefix: 24,
                    },
                    "203.0.113.1,tcp:80,192.0.2.0/24",
                ),
                (
                    Entry::IpPortNet {
                        ip: ip("203.0.113.1"),
                        protocol: TCP,
                        port: 80,
                        net: ip("198.51.100.7"),
                        prefix: 32,
                    },
                    "203.0.113.1,tcp:80,198.51.100.7",
                ),
            ],
        ),
        (
            SetDef {
                name: "KUBE-6-IPVS-IPS",
                set_type: SetType::HashIp,
                options: hash(SetFamily::Inet6),
            },
            vec![(Entry::Ip(ip("fd00:96::1")), "fd00:96::1")],
        ),
        (
            SetDef {
                name: "KUBE-NODE-PORT-TCP",
                set_type: SetType::BitmapPort,
                options: CreateOptions::Ports { from: 0, to: 65535 },
            },
            vec![(Entry::Port(30080), "30080"), (Entry::Port(32767), "32767")],
        ),
    ]
}

/// Every `add` line of `ipset save`, as (set, member).
fn saved(netns: &Netns) -> BTreeSet<(String, String)> {
    let text = netns
        .sh("ipset save")
        .expect("ipset save (is the ipset tool installed?)");
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("add")).then(|| {
                let set = words.next().unwrap().to_string();
                (set, words.next().unwrap().to_string())
            })
        })
        .collect()
}

/// The `create` lines of `ipset save`, as (set, type).
fn saved_sets(netns: &Netns) -> BTreeSet<(String, String)> {
    let text = netns
        .sh("ipset save")
        .expect("ipset save (is the ipset tool installed?)");
    text.lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            (words.first() == Some(&"create")).then(|| (words[1].to_string(), words[2].to_string()))
        })
        .collect()
}

fn adds<'a>(sets: &'a [(SetDef<'static>, Vec<(Entry, &'static str)>)]) -> Vec<Change<'a>> {
    sets.iter()
        .flat_map(|(set, members)| {
            members.iter().map(|(entry, _)| Change {
                op: Op::Add,
                set: set.name,
                entry: *entry,
            })
        })
        .collect()
}

#[test]
fn sets_of_every_type_hold_what_was_sent_as_ipset_save_shows_it() {
    let netns = Netns::new("ipset").unwrap();
    let sets = every_type();
    let listed = netns.run(|| {
        let mut socket = IpsetSocket::open().unwrap();
        for (set, _) in &sets {
            socket.create(set).unwrap();
            socket.create(set).unwrap(); // -exist: the same set again is no error
        }
        socket.apply(&adds(&sets)).unwrap();
        socket.apply(&adds(&sets)).unwrap(); // -exist: members that are there
        socket.list(None).unwrap()
    });
    let created: BTreeSet<(String, String)> = sets
        .iter()
        .map(|(set, _)| (set.name.to_string(), set.set_type.name().to_string()))
        .collect();
    assert_eq!(saved_sets(&netns), created);
    let wanted: BTreeSet<(String, String)> = sets
        .iter()
        .flat_map(|(set, members)| {
            members
                .iter()
                .map(|(_, text)| (set.name.to_string(), text.to_string()))
        })
        .collect();
    assert_eq!(saved(&netns), wanted, "what ipset save shows");
    for (set, members) in &sets {
        let listed = listed.iter().find(|l| l.name == set.name).unwrap();
        assert_eq!(listed.set_type, Some(set.set_type));
        let ours: BTreeSet<Entry> = listed.entries.iter().copied().collect();
        let sent: BTreeSet<Entry> = members.iter().map(|(entry, _)| *entry).collect();
        assert_eq!(ours, sent, "{} listed through netlink", set.name);
    }
}

#[test]
fn deletions_remove_exactly_their_members() {
    let netns = Netns::new("ipset").unwrap();
    let sets = every_type();
    let listed = netns.run(|| {
        let mut socket = IpsetSocket::open().unwrap();
        for (set, _) in &sets {
            socket.create(set).unwrap();
        }
        socket.apply(&adds(&sets)).unwrap();
        let deletions: Vec<Change<'_>> = sets
            .iter()
            .map(|(set, members)| Change {
                op: Op::Delete,
                set: set.name,
                entry: members[0].0,
            })
            .collect();
        socket.apply(&deletions).unwrap();
        socket.apply(&deletions).unwrap(); // -exist: members that are gone
        socket.list(Some("KUBE-CLUSTER-IP")).unwrap()
    });
    let wanted: BTreeSet<(String, String)> = sets
        .iter()
        .flat_map(|(set, members)| {
            members[1..]
                .iter()
                .map(|(_, text)| (set.name.to_string(), text.to_string()))
        })
        .collect();
    assert_eq!(saved(&netns), wanted);
    assert_eq!(listed.len(), 1, "one set asked for");
    assert_eq!(listed[0].entries, vec![sets[0].1[1].0]);
}

#[test]
fn a_refused_member_is_named_and_the_others_are_applied() {
    let netns = Netns::new("ipset").unwrap();
    let sets = every_type();
    let (error, missing) = netns.run(|| {
        let mut socket = IpsetSocket::open().unwrap();
        socket.create(&sets[0].0).unwrap();
        let good = |port| Change {
            op: Op::Add,
            set: "KUBE-CLUSTER-IP",
            entry: Entry::IpPort {
                ip: ip("10.96.0.1"),
                protocol: TCP,
                port,
            },
        };
        let wrong_family = Change {
            op: Op::Add,
            set: "KUBE-CLUSTER-IP",
            entry: Entry::IpPort {
                ip: ip("fd00::1"),
                protocol: TCP,
                port: 80,
            },
        };
        let no_such_set = Change {
            set: "KUBE-NOT-THERE",
            ..good(81)
        };
        let error = socket
            .apply(&[good(1), wrong_family, good(2), no_such_set, good(3)])
            .unwrap_err();
        let missing = socket.destroy("KUBE-NOT-THERE").unwrap_err();
        (error, missing)
    });
    let text = error.to_string();
    assert!(
        text.contains("adding fd00::1,tcp:80 to set KUBE-CLUSTER-IP"),
        "{text}"
    );
    assert!(text.contains("1 more refused"), "{text}");
    assert!(error.errno().is_some_and(|errno| errno >= 4096), "{text}");
    assert_eq!(missing.errno(), Some(2), "ENOENT: {missing}");
    let members: Vec<String> = saved(&netns).into_iter().map(|(_, member)| member).collect();
    assert_eq!(
        members,
        ["10.96.0.1,tcp:1", "10.96.0.1,tcp:2", "10.96.0.1,tcp:3"],
        "no transactions: the good changes stay"
    );
}

#[test]
fn thousands_of_members_go_out_in_several_datagrams_and_list_back_in_several_messages() {
    let netns = Netns::new("ipset").unwrap();
    let set = every_type().remove(0).0;
    let entries: Vec<Entry> = (0..5000u32)
        .map(|i| Entry::IpPort {
            ip: IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + i)),
            protocol: TCP,
            port: 443,
        })
        .collect();
    let listed = netns.run(|| {
        let mut socket = IpsetSocket::open().unwrap();
        socket.create(&set).unwrap();
        let changes: Vec<Change<'_>> = entries
            .iter()
            .map(|entry| Change {
                op: Op::Add,
                set: set.name,
                entry: *entry,
            })
            .collect();
        socket.apply(&changes).unwrap();
        socket.list(Some(set.name)).unwrap()
    });
    assert_eq!(listed.len(), 1);
    let ours: BTreeSet<Entry> = listed[0].entries.iter().copied().collect();
    assert_eq!(ours, entries.iter().copied().collect::<BTreeSet<_>>());
    assert_eq!(saved(&netns).len(), 5000);
    netns.run(|| IpsetSocket::open().unwrap().destroy(set.name).unwrap());
    assert!(saved_sets(&netns).is_empty(), "destroyed");
}
