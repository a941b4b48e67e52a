//! The D3 example table of shared/docs/KERNEL-COSTS.md (two ClusterIP/TCP services,
//! no per-service chain or set) built through the crate's API, for both families.

#![allow(dead_code)]
#![allow(clippy::unwrap_used)] // test helpers may panic: that fails the test

use std::net::IpAddr;

use kpr_nfnetlink::*;

pub const MASQ_MARK: u32 = 0x4000;

/// Addresses of the example in one family.
pub struct Example {
    pub family: Family,
    pub vip_a: IpAddr,
    pub vip_b: IpAddr,
    /// Endpoints of service A (port 80 -> 8080) and B (port 53 -> 5353).
    pub endpoints_a: Vec<IpAddr>,
    pub endpoints_b: Vec<IpAddr>,
    pub pod_cidr: (IpAddr, u8),
    /// `service-ips` maps to the endpoint count (data), and a small `lb-chains` verdict
    /// map picks the chain: adding a Service then adds no jump/goto element.
    pub two_stage: bool,
}

pub fn example(family: Family) -> Example {
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    match family {
        Family::Ip6 => Example {
            family,
            vip_a: ip("fd00:96::10"),
            vip_b: ip("fd00:96::20"),
            endpoints_a: vec![ip("fd00:244::11"), ip("fd00:244::12"), ip("fd00:244::13")],
            endpoints_b: vec![ip("fd00:244::21"), ip("fd00:244::22")],
            pod_cidr: (ip("fd00:244::"), 64),
            two_stage: false,
        },
        _ => Example {
            family,
            vip_a: ip("10.96.0.10"),
            vip_b: ip("10.96.0.20"),
            endpoints_a: vec![ip("10.244.0.11"), ip("10.244.0.12"), ip("10.244.0.13")],
            endpoints_b: vec![ip("10.244.0.21"), ip("10.244.0.22")],
            pod_cidr: (ip("10.244.0.0"), 16),
            two_stage: false,
        },
    }
}

pub fn table(family: Family) -> Table {
    Table::new(family, "kube-proxy")
}

fn addr_field(family: Family) -> Field {
    if family == Family::Ip6 {
        Field::Ipv6Addr
    } else {
        Field::Ipv4Addr
    }
}

pub fn addr(value: Value, ip: IpAddr) -> Value {
    match ip {
        IpAddr::V4(v4) => value.ipv4(v4),
        IpAddr::V6(v6) => value.ipv6(v6),
    }
}

/// Registers after an address: 1 for IPv4, 4 for IPv6.
fn after_addr(family: Family) -> u8 {
    if family == Family::Ip6 { 4 } else { 1 }
}

fn addr_len(family: Family) -> u32 {
    if family == Family::Ip6 { 16 } else { 4 }
}

/// Payload offsets of the source and destination address in the network header.
fn saddr_offset(family: Family) -> u32 {
    if family == Family::Ip6 { 8 } else { 12 }
}

fn daddr_offset(family: Family) -> u32 {
    if family == Family::Ip6 { 24 } else { 16 }
}

fn network(offset: u32, len: u32, dreg: Register) -> Expr {
    Expr::Payload {
        base: PayloadBase::Network,
        offset,
        len,
        dreg,
    }
}

fn transport(offset: u32, len: u32, dreg: Register) -> Expr {
    Expr::Payload {
        base: PayloadBase::Transport,
        offset,
        len,
        dreg,
    }
}

pub fn sets(family: Family) -> Vec<Set> {
    let a = addr_field(family);
    vec![
        Set::new("cluster-ips", vec![a]),
        Set::map(
            "service-ips",
            vec![a, Field::InetProto, Field::InetService],
            SetData::Verdict,
        ),
        Set::map(
            "service-endpoints-tcp",
            vec![a, Field::InetService, Field::Mark],
            SetData::Value(vec![a, Field::InetService]),
        ),
        Set::new("hairpin", vec![a, a]),
    ]
}

pub fn chains() -> Vec<Chain> {
    let nat = |hook, priority| BaseChain {
        chain_type: ChainType::Nat,
        hook,
        priority,
        policy: Policy::Accept,
    };
    vec![
        Chain::base("nat-prerouting", nat(Hook::Prerouting, -100)),
        Chain::base("nat-output", nat(Hook::Output, -100)),
        Chain::base("nat-postrouting", nat(Hook::Postrouting, 100)),
        Chain::regular("services"),
        Chain::regular("mark-for-masquerade"),
        Chain::regular("masquerading"),
        Chain::regular("lb-tcp-2"),
        Chain::regular("lb-tcp-3"),
    ]
}

/// The sets of `example`: [`sets`], or its two-stage variant.
pub fn sets_for(example: &Example) -> Vec<Set> {
    let mut all = sets(example.family);
    if example.two_stage {
        all[1].data = Some(SetData::Value(vec![Field::Mark]));
        all.push(Set::map("lb-chains", vec![Field::Mark], SetData::Verdict));
    }
    all
}

/// The `service-ips` element of `example`'s design: a verdict, or a count.
pub fn service_entry(example: &Example, vip: IpAddr, port: u16, count: usize) -> Element {
    if example.two_stage {
        Element::mapping(
            addr(Value::new(), vip).proto(6).port(port).build(),
            Value::new().host_u32(count as u32).build(),
        )
    } else {
        service_element(vip, port, count)
    }
}

/// `lb-chains` elements (two-stage): `count : goto lb-tcp-<count>`.
pub fn lb_chain_elements(counts: &[u32]) -> Vec<Element> {
    counts
        .iter()
        .map(|m| {
            Element::verdict(
                Value::new().host_u32(*m).build(),
                Verdict::Goto(format!("lb-tcp-{m}")),
            )
        })
        .collect()
}

/// `service-ips` element: `vip . tcp . port : goto lb-tcp-<count>`.
pub fn service_element(vip: IpAddr, port: u16, count: usize) -> Element {
    Element::verdict(
        addr(Value::new(), vip).proto(6).port(port).build(),
        Verdict::Goto(format!("lb-tcp-{count}")),
    )
}

/// `service-endpoints-tcp` element: `vip . port . slot : endpoint . target_port`.
pub fn endpoint_element(vip: IpAddr, port: u16, slot: u32, endpoint: IpAddr, target: u16) -> Element {
    Element::mapping(
        addr(Value::new(), vip).port(port).host_u32(slot).build(),
        addr(Value::new(), endpoint).port(target).build(),
    )
}

pub fn hairpin_element(endpoint: IpAddr) -> Element {
    Element::key(addr(addr(Value::new(), endpoint), endpoint).build())
}

/// The prefix mask of `prefix` bits over `len` bytes.
fn prefix_mask(len: u32, prefix: u8) -> Vec<u8> {
    (0..len)
        .map(|byte| {
            let bits = u32::from(prefix).saturating_sub(byte * 8).min(8);
            (0xffu16 << (8 - bits)) as u8
        })
        .collect()
}

/// `(chain, rule)` pairs, in order.
pub fn rules(example: &Example) -> Vec<(&'static str, Vec<Expr>)> {
    let family = example.family;
    let r0 = Register::r32(0);
    let second = Register::r32(after_addr(family));
    let third = Register::r32(after_addr(family) + 1);
    // Two-stage: the count goes to a register of its own (nft 1.0.6 aborts listing a
    // rule whose map result overwrites the key's first register).
    let count = Register::r32(after_addr(family) + 2);
    let len = addr_len(family);
    let load_mark = Expr::Meta {
        key: MetaKey::Mark,
        dreg: r0,
    };
    let set_mark = Expr::MetaSet {
        key: MetaKey::Mark,
        sreg: r0,
    };
    let bitwise = |mask: u32, xor: u32| Expr::Bitwise {
        sreg: r0,
        dreg: r0,
        mask: mask.to_ne_bytes().to_vec(),
        xor: xor.to_ne_bytes().to_vec(),
    };
    let jump = |chain: &str| Expr::verdict(Verdict::Jump(chain.into()));
    let masquerade = Expr::Masquerade {
        flags: nat_flags::PROTO_RANDOM_FULLY,
    };
    let (cidr, prefix) = example.pod_cidr;
    let not_from_pods = vec![
        network(saddr_offset(family), len, r0),
        Expr::Bitwise {
            sreg: r0,
            dreg: r0,
            mask: prefix_mask(len, prefix),
            xor: vec![0; len as usize],
        },
        Expr::Cmp {
            op: CmpOp::Neq,
            sreg: r0,
            data: addr(Value::new(), cidr).build(),
        },
        jump("mark-for-masquerade"),
    ];
    let dnat = |count: u32| {
        vec![
            Expr::Meta {
                key: MetaKey::L4Proto,
                dreg: r0,
            },
            Expr::Cmp {
                op: CmpOp::Eq,
                sreg: r0,
                data: vec![6],
            },
            network(daddr_offset(family), len, r0),
            transport(2, 2, second),
            Expr::Numgen {
                kind: NumgenKind::Random,
                modulus: count,
                offset: 0,
                dreg: third,
            },
            Expr::Lookup {
                set: "service-endpoints-tcp".into(),
                sreg: r0,
                dreg: Some(r0),
                invert: false,
            },
            Expr::Nat {
                kind: NatKind::Dnat,
                family,
                addr_min: Some(r0),
                addr_max: None,
                proto_min: Some(second),
                proto_max: None,
                flags: 0,
            },
        ]
    };
    vec![
        ("nat-prerouting", vec![jump("services")]),
        ("nat-output", vec![jump("services")]),
        ("nat-postrouting", vec![jump("masquerading")]),
        (
            "nat-postrouting",
            vec![
                Expr::Ct {
                    key: CtKey::Status,
                    dreg: r0,
                    direction: None,
                },
                bitwise(ct_status::DNAT, 0),
                Expr::Cmp {
                    op: CmpOp::Neq,
                    sreg: r0,
                    data: vec![0; 4],
                },
                network(saddr_offset(family), len, r0),
                network(daddr_offset(family), len, second),
                Expr::Lookup {
                    set: "hairpin".into(),
                    sreg: r0,
                    dreg: None,
                    invert: false,
                },
                masquerade.clone(),
            ],
        ),
        (
            "services",
            vec![
                network(daddr_offset(family), len, r0),
                Expr::Meta {
                    key: MetaKey::L4Proto,
                    dreg: second,
                },
                transport(2, 2, third),
                Expr::Lookup {
                    set: "service-ips".into(),
                    sreg: r0,
                    dreg: Some(if example.two_stage {
                        count
                    } else {
                        Register::Verdict
                    }),
                    invert: false,
                },
            ]
            .into_iter()
            .chain(example.two_stage.then(|| Expr::Lookup {
                set: "lb-chains".into(),
                sreg: count,
                dreg: Some(Register::Verdict),
                invert: false,
            }))
            .collect(),
        ),
        (
            "mark-for-masquerade",
            vec![
                load_mark.clone(),
                bitwise(!MASQ_MARK, MASQ_MARK),
                set_mark.clone(),
            ],
        ),
        (
            "masquerading",
            vec![
                load_mark.clone(),
                bitwise(MASQ_MARK, 0),
                Expr::Cmp {
                    op: CmpOp::Eq,
                    sreg: r0,
                    data: vec![0; 4],
                },
                Expr::verdict(Verdict::Return),
            ],
        ),
        (
            "masquerading",
            vec![load_mark, bitwise(u32::MAX, MASQ_MARK), set_mark],
        ),
        ("masquerading", vec![masquerade]),
        ("lb-tcp-2", not_from_pods.clone()),
        ("lb-tcp-2", dnat(2)),
        ("lb-tcp-3", not_from_pods),
        ("lb-tcp-3", dnat(3)),
    ]
}

/// The whole example table as one batch: table, chains, sets, elements, rules.
pub fn batch(example: &Example) -> Batch {
    let table = table(example.family);
    let mut batch = Batch::new();
    batch.add_table(&table);
    for chain in chains() {
        batch.add_chain(&table, &chain);
    }
    for set in sets_for(example) {
        batch.add_set(&table, &set);
    }
    if example.two_stage {
        batch.add_elements(&table, "lb-chains", &lb_chain_elements(&[2, 3]));
    }
    batch.add_elements(
        &table,
        "cluster-ips",
        &[
            Element::key(addr(Value::new(), example.vip_a).build()),
            Element::key(addr(Value::new(), example.vip_b).build()),
        ],
    );
    batch.add_elements(
        &table,
        "service-ips",
        &[
            service_entry(example, example.vip_a, 80, example.endpoints_a.len()),
            service_entry(example, example.vip_b, 53, example.endpoints_b.len()),
        ],
    );
    let mut endpoints = Vec::new();
    for (slot, ep) in example.endpoints_a.iter().enumerate() {
        endpoints.push(endpoint_element(example.vip_a, 80, slot as u32, *ep, 8080));
    }
    for (slot, ep) in example.endpoints_b.iter().enumerate() {
        endpoints.push(endpoint_element(example.vip_b, 53, slot as u32, *ep, 5353));
    }
    batch.add_elements(&table, "service-endpoints-tcp", &endpoints);
    let hairpin: Vec<_> = example
        .endpoints_a
        .iter()
        .chain(&example.endpoints_b)
        .map(|ep| hairpin_element(*ep))
        .collect();
    batch.add_elements(&table, "hairpin", &hairpin);
    for (chain, exprs) in rules(example) {
        batch.add_rule(&table, chain, &exprs);
    }
    batch
}

/// `nft list` output with each `elements = { ... }` block on one line, its entries
/// sorted: hash sets list in an order that depends on a per-set random seed.
pub fn normalized(listing: &str) -> String {
    let mut out = String::new();
    let mut rest = listing;
    while let Some(start) = rest.find("elements = {") {
        let open = start + "elements = {".len();
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let mut entries: Vec<String> = rest[open..open + close]
            .split(',')
            .map(|e| e.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|e| !e.is_empty())
            .collect();
        entries.sort();
        out.push(' ');
        out.push_str(&entries.join(", "));
        out.push_str(" }");
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}
