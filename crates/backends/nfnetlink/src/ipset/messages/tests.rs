//! Our bytes against the `ipset` tool's (v7.17, protocol 7), captured in a throw-away
//! namespace with `strace -f -e trace=sendto -e write=3 ipset ...` (requests) and
//! `-e trace=recvmsg -e read=3` (the kernel's list answers, Debian's 6.1 kernel). Sequence
//! numbers are zeroed on both sides; everything else must match byte for byte.

use super::*;
use crate::captured::{hex, without_sequence};

fn same(ours: Vec<u8>, tools: &str) {
    assert_eq!(without_sequence(ours), without_sequence(hex(tools)));
}

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

/// `ipset create -exist NAME TYPE ...` after the tool's type query for TYPE.
#[test]
fn type_queries_and_creations_are_the_tools() {
    let cases = [
        (
            SetDef {
                name: "KUBE-CLUSTER-IP",
                set_type: SetType::HashIpPort,
                options: hash(SetFamily::Inet),
            },
            7,
            "380000000d0601000fec076b0000000002000000050001000700000011000300686173683a69702c706f7274000000000500050002000000",
            "680000000206050410ec076b00000000020000000500010007000000140002004b5542452d434c55535445522d49500011000300686173683a69702c706f727400000000050004000700000005000500020000001400078008001240000004000800134000010000",
        ),
        (
            SetDef {
                name: "KUBE-6-LOOP-BACK",
                set_type: SetType::HashIpPortIp,
                options: hash(SetFamily::Inet6),
            },
            6,
            "380000000d0601000fec076b0000000002000000050001000700000014000300686173683a69702c706f72742c6970000500050002000000",
            "6c0000000206050410ec076b00000000020000000500010007000000150002004b5542452d362d4c4f4f502d4241434b0000000014000300686173683a69702c706f72742c6970000500040006000000050005000a0000001400078008001240000004000800134000010000",
        ),
        (
            SetDef {
                name: "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                set_type: SetType::HashIpPortNet,
                options: hash(SetFamily::Inet),
            },
            8,
            "3c0000000d0601000fec076b0000000002000000050001000700000015000300686173683a69702c706f72742c6e6574000000000500050002000000",
            "7c0000000206050410ec076b00000000020000000500010007000000230002004b5542452d4c4f41442d42414c414e4345522d534f555243452d43494452000015000300686173683a69702c706f72742c6e657400000000050004000800000005000500020000001400078008001240000004000800134000010000",
        ),
        (
            SetDef {
                name: "KUBE-6-IPVS-IPS",
                set_type: SetType::HashIp,
                options: hash(SetFamily::Inet6),
            },
            6,
            "300000000d0601000fec076b000000000200000005000100070000000c000300686173683a6970000500050002000000",
            "600000000206050410ec076b00000000020000000500010007000000140002004b5542452d362d495056532d495053000c000300686173683a6970000500040006000000050005000a0000001400078008001240000004000800134000010000",
        ),
        (
            SetDef {
                name: "KUBE-NODE-PORT-TCP",
                set_type: SetType::BitmapPort,
                options: CreateOptions::Ports { from: 0, to: 65535 },
            },
            3,
            "340000000d0601000fec076b00000000020000000500010007000000100003006269746d61703a706f7274000500050000000000",
            "680000000206050410ec076b00000000020000000500010007000000170002004b5542452d4e4f44452d504f52542d5443500000100003006269746d61703a706f7274000500040003000000050005000000000014000780060004400000000006000540ffff0000",
        ),
    ];
    for (set, revision, query, creation) in cases {
        same(type_query(set.set_type), query);
        same(create(&set, revision).unwrap(), creation);
    }
}

/// `ipset add -exist` / `ipset del -exist`, one member of each shape.
#[test]
fn member_changes_are_the_tools() {
    let tcp = 6;
    let cases = [
        (
            Op::Add,
            "KUBE-CLUSTER-IP",
            Entry::IpPort {
                ip: ip("10.96.0.1"),
                protocol: tcp,
                port: 443,
            },
            "580000000906050010ec076b00000000020000000500010007000000140002004b5542452d434c55535445522d495000280007800c000180080001400a6000010600044001bb000005000700060000000800094000000000",
        ),
        (
            Op::Delete,
            "KUBE-CLUSTER-IP",
            Entry::IpPort {
                ip: ip("10.96.0.1"),
                protocol: tcp,
                port: 443,
            },
            "580000000a06050010ec076b00000000020000000500010007000000140002004b5542452d434c55535445522d495000280007800c000180080001400a6000010600044001bb000005000700060000000800094000000000",
        ),
        (
            Op::Add,
            "KUBE-6-LOOP-BACK",
            Entry::IpPortIp {
                ip: ip("fd00::5"),
                protocol: 17,
                port: 53,
                ip2: ip("fd00::5"),
            },
            "800000000906050010ec076b00000000020000000500010007000000150002004b5542452d362d4c4f4f502d4241434b000000004c0007801800018014000240fd000000000000000000000000000005060004400035000005000700110000001800148014000240fd0000000000000000000000000000050800094000000000",
        ),
        (
            Op::Add,
            "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            Entry::IpPortNet {
                ip: ip("203.0.113.1"),
                protocol: tcp,
                port: 80,
                net: ip("192.0.2.0"),
                prefix: 24,
            },
            "7c0000000906050010ec076b00000000020000000500010007000000230002004b5542452d4c4f41442d42414c414e4345522d534f555243452d4349445200003c0007800c00018008000140cb007101060004400050000005000700060000000c00148008000140c000020005001500180000000800094000000000",
        ),
        (
            Op::Add,
            "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            Entry::IpPortNet {
                ip: ip("203.0.113.1"),
                protocol: 132,
                port: 80,
                net: ip("192.0.2.7"),
                prefix: 32,
            },
            "740000000906050010ec076b00000000020000000500010007000000230002004b5542452d4c4f41442d42414c414e4345522d534f555243452d434944520000340007800c00018008000140cb007101060004400050000005000700840000000c00148008000140c00002070800094000000000",
        ),
        (
            Op::Add,
            "KUBE-6-IPVS-IPS",
            Entry::Ip(ip("fd00:96::1")),
            "540000000906050010ec076b00000000020000000500010007000000140002004b5542452d362d495056532d49505300240007801800018014000240fd0000960000000000000000000000010800094000000000",
        ),
        (
            Op::Add,
            "KUBE-NODE-PORT-TCP",
            Entry::Port(30080),
            "480000000906050010ec076b00000000020000000500010007000000170002004b5542452d4e4f44452d504f52542d54435000001400078006000440758000000800094000000000",
        ),
    ];
    for (op, set, entry, tools) in cases {
        same(change(&Change { op, set, entry }).unwrap(), tools);
    }
}

#[test]
fn lists_and_destroy_are_the_tools() {
    same(
        list(None).unwrap(),
        "1c000000070605030fec076b00000000020000000500010007000000",
    );
    same(
        list(Some("KUBE-CLUSTER-IP")).unwrap(),
        "30000000070605030fec076b00000000020000000500010007000000140002004b5542452d434c55535445522d495000",
    );
    same(
        destroy("KUBE-6-IPVS-IPS").unwrap(),
        "30000000030605020fec076b00000000020000000500010007000000140002004b5542452d362d495056532d49505300",
    );
}

#[test]
fn changes_append_one_message_each_to_a_datagram() {
    let mut datagram = Vec::new();
    let one = Change {
        op: Op::Add,
        set: "KUBE-NODE-PORT-TCP",
        entry: Entry::Port(30080),
    };
    let two = Change {
        op: Op::Delete,
        ..one
    };
    assert_eq!(append_change(&mut datagram, &one).unwrap(), 0);
    let second = append_change(&mut datagram, &two).unwrap();
    assert_eq!(second, 0x48, "the first message's length, 4-byte aligned");
    assert_eq!(datagram[second + 4], CMD_DEL as u8);
    assert_eq!(datagram.len(), 2 * 0x48);
}

#[test]
fn names_that_cannot_be_sent_are_refused_before_anything_is_built() {
    for name in ["", "A\0B", &"K".repeat(32)] {
        assert!(destroy(name).is_err(), "{name:?}");
        assert!(list(Some(name)).is_err(), "{name:?}");
        let change = Change {
            op: Op::Add,
            set: name,
            entry: Entry::Port(1),
        };
        assert!(append_change(&mut Vec::new(), &change).is_err(), "{name:?}");
    }
    assert!(destroy(&"K".repeat(31)).is_ok());
}

/// The kernel's answers to `ipset save NAME` (one message per set here), read back.
#[test]
fn list_answers_read_back_every_shape() {
    let answers = [
        "dc00000007060200a0eb076bb2110000020000000500010007000000140002004b5542452d434c55535445522d49500011000300686173683a69702c706f7274000000000500050002000000050004000700000006000b40000000003c00078008001240000004000800134000010000050015000c00000008001140b4fed3e4080019400000000008001a4000000138080018400000000244000880200007800c000180080001000a60000206000440003500000500070011000000200007800c000180080001000a6000010600044001bb00000500070006000000",
        "2801000007060200a0eb076bb3110000020000000500010007000000150002004b5542452d362d4c4f4f502d4241434b0000000014000300686173683a69702c706f72742c697000050005000a000000050004000600000006000b40000100003c00078008001240000004000800134000010000050015000c000000080011405084701f080019400000000008001a40000001b808001840000000028c000880440007801800018014000200fd0000000000000000000000000000051800148014000200fd00000000000000000000000000000506000440003500000500070011000000440007801800018014000200fd0000000000000000000000000000061800148014000200fd00000000000000000000000000000606000440005000000500070084000000",
        "1801000007060200a1eb076bb4110000020000000500010007000000230002004b5542452d4c4f41442d42414c414e4345522d534f555243452d43494452000015000300686173683a69702c706f72742c6e6574000000000500050002000000050004000800000006000b40000200003c00078008001240000004000800134000010000050015000c00000008001140e7c6ec9c080019400000000008001a400000024008001840000000026c000880340007800c00018008000100cb0071010c00148008000100c0000207060004400050000005001500200000000500070084000000340007800c00018008000100cb0071010c00148008000100c0000200060004400050000005001500180000000500070006000000",
        "9800000007060200a1eb076bb5110000020000000500010007000000170002004b5542452d4e4f44452d504f52542d5443500000100003006269746d61703a706f7274000500050000000000050004000300000006000b40000400002c000780060004400000000006000540ffff0000080019400000000008001a40000020480800184000000001100008800c0007800600044075800000",
    ];
    let mut sets = Vec::new();
    for answer in answers {
        parse_list_answer(&hex(answer)[16..], &mut sets).unwrap();
    }
    let shown: Vec<(String, Vec<String>)> = sets
        .iter()
        .map(|s| (s.name.clone(), s.entries.iter().map(Entry::to_string).collect()))
        .collect();
    let expected = [
        ("KUBE-CLUSTER-IP", vec!["10.96.0.2,udp:53", "10.96.0.1,tcp:443"]),
        (
            "KUBE-6-LOOP-BACK",
            vec!["fd00::5,udp:53,fd00::5", "fd00::6,sctp:80,fd00::6"],
        ),
        (
            "KUBE-LOAD-BALANCER-SOURCE-CIDR",
            vec![
                "203.0.113.1,sctp:80,192.0.2.7/32",
                "203.0.113.1,tcp:80,192.0.2.0/24",
            ],
        ),
        ("KUBE-NODE-PORT-TCP", vec!["30080"]),
    ];
    let expected: Vec<(String, Vec<String>)> = expected
        .into_iter()
        .map(|(n, e)| (n.to_string(), e.into_iter().map(String::from).collect()))
        .collect();
    assert_eq!(shown, expected);
    assert_eq!(sets[1].family, Some(SetFamily::Inet6));
    assert_eq!(sets[1].set_type, Some(SetType::HashIpPortIp));
    assert_eq!(sets[3].family, None, "bitmaps have no family");
    assert_eq!(sets[0].revision, 7);
}

#[test]
fn a_set_continued_in_a_second_message_is_one_set_and_foreign_types_list_without_members() {
    let mut sets = Vec::new();
    let mut first = vec![2, 0, 0, 0];
    let mut w = Writer::new(&mut first);
    w.string(ATTR_SETNAME, "S");
    w.string(ATTR_TYPENAME, "bitmap:port");
    let adt = w.begin(ATTR_ADT);
    let data = w.begin(ATTR_DATA);
    w.bytes(ATTR_PORT | NLA_F_NET_BYTEORDER, &80u16.to_be_bytes());
    w.end(data);
    w.end(adt);
    let mut second = vec![2, 0, 0, 0];
    let mut w = Writer::new(&mut second);
    w.string(ATTR_SETNAME, "S");
    let adt = w.begin(ATTR_ADT);
    let data = w.begin(ATTR_DATA);
    w.bytes(ATTR_PORT | NLA_F_NET_BYTEORDER, &443u16.to_be_bytes());
    w.end(data);
    w.end(adt);
    let mut foreign = vec![2, 0, 0, 0];
    let mut w = Writer::new(&mut foreign);
    w.string(ATTR_SETNAME, "user");
    w.string(ATTR_TYPENAME, "hash:mac");
    let adt = w.begin(ATTR_ADT);
    let data = w.begin(ATTR_DATA);
    w.bytes(17, &[0; 6]);
    w.end(data);
    w.end(adt);
    for payload in [&first, &second, &foreign] {
        parse_list_answer(payload, &mut sets).unwrap();
    }
    assert_eq!(sets.len(), 2);
    assert_eq!(sets[0].entries, vec![Entry::Port(80), Entry::Port(443)]);
    assert_eq!((sets[1].type_name.as_str(), sets[1].set_type), ("hash:mac", None));
    assert!(sets[1].entries.is_empty());
}

#[test]
fn malformed_answers_are_errors_not_panics() {
    let mut sets = Vec::new();
    assert!(parse_list_answer(&[2, 0], &mut sets).is_err());
    let mut nameless = vec![2, 0, 0, 0];
    Writer::new(&mut nameless).string(ATTR_TYPENAME, "hash:ip");
    assert!(parse_list_answer(&nameless, &mut sets).is_err());
    let mut portless = vec![2, 0, 0, 0];
    let mut w = Writer::new(&mut portless);
    w.string(ATTR_SETNAME, "S");
    w.string(ATTR_TYPENAME, "hash:ip,port");
    let adt = w.begin(ATTR_ADT);
    let data = w.begin(ATTR_DATA);
    let nest = w.begin(ATTR_IP);
    w.bytes(ATTR_IPADDR_IPV4, &[10, 0, 0, 1]);
    w.end(nest);
    w.end(data);
    w.end(adt);
    let error = parse_list_answer(&portless, &mut sets).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("hash:ip,port member without a protocol"),
        "{error}"
    );
}

#[test]
fn type_answers_give_the_newest_revision() {
    let mut answer = vec![2, 0, 0, 0];
    let mut w = Writer::new(&mut answer);
    w.bytes(ATTR_PROTOCOL, &[PROTOCOL]);
    w.string(ATTR_TYPENAME, "hash:ip,port");
    w.bytes(ATTR_REVISION, &[7]);
    w.bytes(ATTR_FAMILY, &[2]);
    w.bytes(10, &[0]);
    assert_eq!(parse_type_answer(&answer).unwrap(), (7, 0));
    assert!(parse_type_answer(&[2, 0, 0, 0]).is_err());
}

#[test]
fn ipset_errnos_are_named() {
    assert!(reason(4103).contains("exists already"), "{}", reason(4103));
    assert!(reason(4352).contains("full"));
    assert_eq!(reason(2), std::io::Error::from_raw_os_error(2).to_string());
}
