use super::*;

/// The datagrams of a fixture file (hex, one per line).
fn datagrams(hex: &str) -> Vec<Vec<u8>> {
    hex.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|line| {
            (0..line.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect()
}

fn notifications(hex: &str) -> Vec<Notification> {
    datagrams(hex).iter().flat_map(|d| parse(d).unwrap()).collect()
}

fn change(
    object: ObjectKind,
    operation: Operation,
    family: Family,
    table: &str,
    port_id: u32,
) -> Notification {
    Notification::Change(Change {
        object,
        operation,
        family: Some(family),
        table: Some(table.to_string()),
        port_id,
    })
}

fn commit(generation: u32, pid: u32, port_id: u32) -> Notification {
    Notification::Commit(Commit {
        generation,
        pid: Some(pid),
        process: Some("nft".to_string()),
        port_id,
    })
}

#[test]
fn one_transaction_lists_every_object_then_its_generation() {
    use ObjectKind::*;
    use Operation::New;
    let nft = 20044;
    assert_eq!(
        notifications(include_str!("fixtures/load.hex")),
        [
            change(Table, New, Family::Ip, "kube-proxy", nft),
            change(Chain, New, Family::Ip, "kube-proxy", nft),
            change(Rule, New, Family::Ip, "kube-proxy", nft),
            change(Set, New, Family::Ip, "kube-proxy", nft),
            change(Elements, New, Family::Ip, "kube-proxy", nft),
            change(Elements, New, Family::Ip, "kube-proxy", nft),
            commit(2, nft, nft),
        ]
    );
}

#[test]
fn flushes_and_deletions_name_the_table_and_its_family() {
    use ObjectKind::*;
    use Operation::Delete;
    let cases = [
        (include_str!("fixtures/flush-table.hex"), vec![Rule], 3, 20328),
        (include_str!("fixtures/delete-chain.hex"), vec![Chain], 4, 20720),
        (
            include_str!("fixtures/delete-element.hex"),
            vec![Elements],
            5,
            20937,
        ),
        (
            include_str!("fixtures/delete-table.hex"),
            vec![Set, Table],
            8,
            21443,
        ),
    ];
    for (hex, objects, generation, nft) in cases {
        let mut want: Vec<Notification> = objects
            .into_iter()
            .map(|object| change(object, Delete, Family::Ip, "kube-proxy", nft))
            .collect();
        want.push(commit(generation, nft, nft));
        assert_eq!(notifications(hex), want);
    }
}

#[test]
fn other_families_and_tables_say_so() {
    use ObjectKind::Table;
    use Operation::New;
    assert_eq!(
        notifications(include_str!("fixtures/ip6-table.hex")),
        [
            change(Table, New, Family::Ip6, "kube-proxy", 21088),
            commit(6, 21088, 21088)
        ]
    );
    assert_eq!(
        notifications(include_str!("fixtures/other-table.hex")),
        [
            change(Table, New, Family::Inet, "filter", 21317),
            commit(7, 21317, 21317)
        ]
    );
}

#[test]
fn a_message_of_another_subsystem_or_kind_is_other() {
    // A GETGEN answer's shape (nf_tables message 16) and an ipset message (subsystem 6).
    for message_type in [(10u16 << 8) | 16, (6 << 8) | 1] {
        let mut datagram = Vec::new();
        datagram.extend_from_slice(&20u32.to_ne_bytes());
        datagram.extend_from_slice(&message_type.to_ne_bytes());
        datagram.extend_from_slice(&[0; 10]);
        datagram.extend_from_slice(&[2, 0, 0, 1]);
        assert_eq!(parse(&datagram).unwrap(), [Notification::Other { message_type }]);
    }
}

#[test]
fn truncated_or_cut_notifications_are_malformed_not_a_panic() {
    let whole = &datagrams(include_str!("fixtures/load.hex"))[0];
    for cut in [1, 15, 17, 19, whole.len() - 1] {
        assert!(parse(&whole[..cut]).is_err(), "cut at {cut}");
    }
    // A header claiming the whole datagram, its attributes cut short.
    let mut short = whole[..28].to_vec();
    short[..4].copy_from_slice(&28u32.to_ne_bytes());
    short[24..26].copy_from_slice(&200u16.to_ne_bytes());
    assert!(parse(&short).is_err());
    // A NEWGEN without its generation id.
    let mut gen_only = Vec::new();
    gen_only.extend_from_slice(&20u32.to_ne_bytes());
    gen_only.extend_from_slice(&((10u16 << 8) | 15).to_ne_bytes());
    gen_only.extend_from_slice(&[0; 10]);
    gen_only.extend_from_slice(&[0, 0, 0, 1]);
    assert!(parse(&gen_only).is_err());
}
