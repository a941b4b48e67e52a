use super::*;

fn chain(name: &'static str) -> ChainName {
    ChainName::fixed(name)
}

#[test]
fn rule_quotes_only_what_needs_it() {
    let comment = Comment::new("ns/svc:http cluster IP").unwrap();
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let r = Rule::builder()
        .comment(&comment)
        .arg("-d")
        .arg(ip)
        .jump(chain("KUBE-SVC-X"));
    assert_eq!(
        r.restore_text(),
        r#"-m comment --comment "ns/svc:http cluster IP" -d 10.0.0.1 -j KUBE-SVC-X"#
    );
    assert_eq!(
        r.args().collect::<Vec<_>>(),
        [
            "-m",
            "comment",
            "--comment",
            "ns/svc:http cluster IP",
            "-d",
            "10.0.0.1",
            "-j",
            "KUBE-SVC-X"
        ]
    );
    let plain = Comment::new("ns/svc:http").unwrap();
    assert_eq!(
        Rule::builder().comment(&plain).build().restore_text(),
        "-m comment --comment ns/svc:http"
    );
}

#[test]
fn payload_declares_writes_then_deletes() {
    let mut nat = TableRules::new(Table::Nat);
    nat.declare(&chain("KUBE-SERVICES"), ChainKind::Fixed);
    nat.append(&chain("KUBE-SERVICES"), Rule::builder().jump(chain("KUBE-SVC-A")));
    nat.declare(
        &chain("KUBE-SVC-A"),
        ChainKind::Service(NamespacedName::new("d", "a")),
    );
    nat.append(&chain("KUBE-SVC-A"), Rule::builder().jump(chain("KUBE-SEP-A")));
    let mut b = PayloadBuilder::default();
    b.table(&nat, |c| c.kind == ChainKind::Fixed, &[chain("KUBE-SEP-OLD")]);
    let p = b.finish();
    assert_eq!(
        p.text,
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SEP-OLD - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-A\n-X KUBE-SEP-OLD\nCOMMIT\n"
    );
    assert_eq!(p.written_rules(Table::Nat), 1);
    assert_eq!(p.written_rules(Table::Filter), 0);
}

/// Only chains whose rules changed are written, per table: a chain of the same name in
/// the other table is another chain.
#[test]
fn render_changed_writes_the_changed_chains_only() {
    let mut rs = Ruleset::default();
    for name in ["KUBE-A", "KUBE-B"] {
        rs.nat.declare(&chain(name), ChainKind::Fixed);
        rs.nat.append(&chain(name), Rule::builder().jump("RETURN"));
    }
    rs.filter.declare(&chain("KUBE-A"), ChainKind::Fixed);
    rs.filter.append(&chain("KUBE-A"), Rule::builder().jump("ACCEPT"));
    let written = rs.chain_hashes();
    assert_eq!(rs.render_changed(&written), Payload::default());
    assert_eq!(rs.render_changed(&ChainHashes::new()), rs.render_full());
    rs.nat.append(&chain("KUBE-A"), Rule::builder().jump("ACCEPT"));
    let payload = rs.render_changed(&written);
    assert_eq!(
        payload.text,
        "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j RETURN\n-A KUBE-A -j ACCEPT\nCOMMIT\n"
    );
    assert_eq!(payload.written_rules(Table::Filter), 0);
}

/// nat as a full sync has it, in upstream's order: the shared chains first, then per
/// Service `n`: KUBE-SVC-n jumping to its KUBE-SEP-n-0/1, each of which jumps to the
/// shared KUBE-MARK-MASQ; filter holds one chain. Chains of Service 1 are declared
/// late (after Service 2's), as when a Service's chains are interleaved.
fn split_ruleset(services: usize) -> Ruleset {
    let mut rs = Ruleset::default();
    rs.filter
        .append(&chain("KUBE-FORWARD"), Rule::builder().jump("ACCEPT"));
    rs.filter.declare(&chain("KUBE-PROXY-CANARY"), ChainKind::Canary);
    rs.nat.declare(&chain("KUBE-SERVICES"), ChainKind::Fixed);
    rs.nat.declare(&chain("KUBE-PROXY-CANARY"), ChainKind::Canary);
    rs.nat.append(
        &chain("KUBE-MARK-MASQ"),
        Rule::builder()
            .args(&["-j", "MARK", "--or-mark", "0x4000"])
            .build(),
    );
    rs.nat
        .append(&chain("KUBE-POSTROUTING"), Rule::builder().jump("RETURN"));
    let name = |s: String| ChainName::parse(&s).unwrap();
    let mut order: Vec<usize> = (0..services).collect();
    if services > 2 {
        order.swap(1, 2);
    }
    for n in order {
        let owner = ChainKind::Service(NamespacedName::new("d", &format!("s{n}")));
        let svc = name(format!("KUBE-SVC-{n}"));
        rs.nat
            .append(&chain("KUBE-SERVICES"), Rule::builder().jump(svc.clone()));
        rs.nat.declare(&svc, owner.clone());
        for e in 0..2 {
            let sep = name(format!("KUBE-SEP-{n}-{e}"));
            rs.nat.append(&svc, Rule::builder().jump(sep.clone()));
            rs.nat.declare(&sep, owner.clone());
            rs.nat.append(&sep, Rule::builder().jump(chain("KUBE-MARK-MASQ")));
            rs.nat.append(&sep, Rule::builder().args(&["-j", "DNAT"]).build());
        }
    }
    rs
}

fn declared(payload: &Payload) -> Vec<&str> {
    payload
        .text
        .lines()
        .filter_map(|l| Some(l.strip_prefix(':')?.split(' ').next().unwrap()))
        .collect()
}

/// Every line but table headers and COMMITs, sorted: what a restore changes.
fn body_lines<'a>(payloads: impl IntoIterator<Item = &'a Payload>) -> Vec<&'a str> {
    let mut lines: Vec<&str> = payloads
        .into_iter()
        .flat_map(|p| p.text.lines())
        .filter(|l| !l.starts_with('*') && *l != "COMMIT")
        .collect();
    lines.sort_unstable();
    lines
}

#[test]
fn a_large_write_splits_into_whole_services_then_the_shared_chains() {
    let rs = split_ruleset(5);
    let stale = [chain("KUBE-SVC-OLD"), chain("KUBE-SEP-OLD")];
    let all = |_: &Chain| true;
    let split = rs.render_split(all, &stale, Some(7));
    let chunks: Vec<Vec<&str>> = split.iter().map(declared).collect();
    assert_eq!(
        chunks,
        [
            vec![
                "KUBE-MARK-MASQ",
                "KUBE-SVC-0",
                "KUBE-SEP-0-0",
                "KUBE-SEP-0-1",
                "KUBE-SVC-2",
                "KUBE-SEP-2-0",
                "KUBE-SEP-2-1"
            ],
            vec![
                "KUBE-SVC-1",
                "KUBE-SEP-1-0",
                "KUBE-SEP-1-1",
                "KUBE-SVC-3",
                "KUBE-SEP-3-0",
                "KUBE-SEP-3-1"
            ],
            vec!["KUBE-SVC-4", "KUBE-SEP-4-0", "KUBE-SEP-4-1"],
            vec![
                "KUBE-FORWARD",
                "KUBE-PROXY-CANARY",
                "KUBE-SERVICES",
                "KUBE-PROXY-CANARY",
                "KUBE-POSTROUTING",
                "KUBE-SVC-OLD",
                "KUBE-SEP-OLD",
            ],
        ],
        "whole Services of at most 7 chains each (the first with KUBE-MARK-MASQ, which \
         they jump to), then filter, nat's shared chains and the deletions"
    );
    assert_eq!(
        split[2].text,
        "*nat\n:KUBE-SVC-4 - [0:0]\n:KUBE-SEP-4-0 - [0:0]\n:KUBE-SEP-4-1 - [0:0]\n\
         -A KUBE-SVC-4 -j KUBE-SEP-4-0\n-A KUBE-SVC-4 -j KUBE-SEP-4-1\n\
         -A KUBE-SEP-4-0 -j KUBE-MARK-MASQ\n-A KUBE-SEP-4-0 -j DNAT\n\
         -A KUBE-SEP-4-1 -j KUBE-MARK-MASQ\n-A KUBE-SEP-4-1 -j DNAT\nCOMMIT\n"
    );
    assert!(
        split[0].text.starts_with("*nat\n:KUBE-MARK-MASQ - [0:0]\n")
            && split[0]
                .text
                .contains("\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n"),
        "{}",
        split[0].text
    );
    let last = split.last().unwrap();
    assert!(last.text.starts_with("*filter\n"), "{}", last.text);
    assert!(
        last.text.ends_with("-X KUBE-SVC-OLD\n-X KUBE-SEP-OLD\nCOMMIT\n"),
        "{}",
        last.text
    );
    for chunk in &split[..split.len() - 1] {
        assert!(chunk.text.starts_with("*nat\n") && chunk.text.matches("COMMIT").count() == 1);
        assert!(!chunk.text.contains("-X "), "no deletion before the last restore");
    }

    // Nothing lost or duplicated, and the counts add up to the unsplit write's.
    let whole = rs.render_split(all, &stale, None);
    assert_eq!(whole.len(), 1);
    assert_eq!(body_lines(&split), body_lines(&whole));
    assert_eq!(rs.table_counts_of(&split), rs.table_counts(&whole[0]));
    let written = |payloads: &[Payload], table| -> WrittenCount {
        payloads
            .iter()
            .flat_map(|p| &p.written)
            .filter(|(t, _)| *t == table)
            .fold(WrittenCount::default(), |a, (_, w)| WrittenCount {
                chains: a.chains + w.chains,
                rules: a.rules + w.rules,
                deleted_chains: a.deleted_chains + w.deleted_chains,
            })
    };
    assert_eq!(written(&split, Table::Nat), written(&whole, Table::Nat));
    assert_eq!(written(&split, Table::Filter), written(&whole, Table::Filter));
}

/// A Service with more chains than the bound still goes whole, in a restore of its own.
#[test]
fn a_service_larger_than_the_bound_stays_whole() {
    let rs = split_ruleset(3);
    let split = rs.render_split(|_| true, &[], Some(2));
    let chunks: Vec<Vec<&str>> = split.iter().map(declared).collect();
    assert_eq!(
        chunks[..4],
        [
            vec!["KUBE-MARK-MASQ"],
            vec!["KUBE-SVC-0", "KUBE-SEP-0-0", "KUBE-SEP-0-1"],
            vec!["KUBE-SVC-2", "KUBE-SEP-2-0", "KUBE-SEP-2-1"],
            vec!["KUBE-SVC-1", "KUBE-SEP-1-0", "KUBE-SEP-1-1"],
        ]
    );
    assert_eq!(split.len(), 5);
    assert_eq!(
        body_lines(&split),
        body_lines(&rs.render_split(|_| true, &[], None))
    );
}

/// At or below the bound, or without one, a write is one restore, exactly as before;
/// so is a write of shared chains only (a partial sync of no Service).
#[test]
fn a_small_write_is_one_restore() {
    let rs = split_ruleset(5);
    let total = rs.filter.chains().len() + rs.nat.chains().len();
    assert_eq!(total, 21);
    let full = rs.render_full();
    assert_eq!(
        rs.render_split(|_| true, &[], Some(total)),
        std::slice::from_ref(&full)
    );
    assert_eq!(rs.render_split(|_| true, &[], None), [full]);
    let shared_only = |c: &Chain| !matches!(c.kind, ChainKind::Service(_));
    let split = rs.render_split(shared_only, &[], Some(2));
    assert_eq!(split.len(), 1);
    assert!(
        declared(&split[0])
            .iter()
            .all(|c| !c.starts_with("KUBE-SVC-") && !c.starts_with("KUBE-SEP-")),
        "{}",
        split[0].text
    );
}

/// A shared chain that Service chains jump to and that jumps into a Service cannot be
/// written before or after the Services: such a ruleset is not split.
#[test]
fn a_shared_chain_needing_a_service_keeps_one_restore() {
    let mut rs = split_ruleset(4);
    rs.nat.append(
        &chain("KUBE-MARK-MASQ"),
        Rule::builder().jump(chain("KUBE-SVC-0")),
    );
    assert_eq!(rs.render_split(|_| true, &[], Some(4)), [rs.render_full()]);
}

/// A Service's chain jumping into another Service's chain: not split either.
#[test]
fn a_jump_between_services_keeps_one_restore() {
    let mut rs = split_ruleset(4);
    rs.nat
        .append(&chain("KUBE-SEP-3-1"), Rule::builder().jump(chain("KUBE-SVC-0")));
    assert_eq!(rs.render_split(|_| true, &[], Some(4)), [rs.render_full()]);
}

#[test]
fn jump_targets() {
    let r = Rule::builder().args(&["-p", "tcp"]).jump(chain("KUBE-SVC-A"));
    assert_eq!(r.jump_target(), Some("KUBE-SVC-A"));
    let g = Rule::builder().args(&["-g", "KUBE-X"]).build();
    assert_eq!(g.jump_target(), Some("KUBE-X"));
    assert_eq!(Rule::builder().args(&["-p", "tcp"]).build().jump_target(), None);
}

#[test]
fn content_hash_follows_rules() {
    let c = chain("C");
    let mut a = TableRules::new(Table::Nat);
    a.append(&c, Rule::builder().jump("ACCEPT"));
    let mut b = a.clone();
    assert_eq!(a.chains()[0].content_hash(), b.chains()[0].content_hash());
    b.append(&c, Rule::builder().jump("DROP"));
    assert_ne!(a.chains()[0].content_hash(), b.chains()[0].content_hash());
    a.declare(&c, ChainKind::Canary);
    assert_eq!(
        a.chains()[0].kind,
        ChainKind::Fixed,
        "declare keeps the first kind"
    );
}
