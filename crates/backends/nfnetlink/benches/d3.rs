//! The D3 design of shared/docs/KERNEL-COSTS.md at scale through kpr-nfnetlink: N
//! ClusterIP/TCP Services x 10 endpoints (one `service-ips` verdict map, one endpoint map,
//! a hairpin set, one shared `lb-tcp-<M>` chain per endpoint count), loaded into a fresh
//! namespace; then one endpoint change and one new Service, 100 times each. Only the
//! netlink layer's share of a sync: the object model's own work is not in it.
//!
//! `cargo bench -p kpr-nfnetlink --bench d3` (root; `SERVICES=1000,10000` to choose sizes,
//! `SIZE_HINT=1` to size the maps up front, `TWO_STAGE=1` for a data map of endpoint
//! counts plus a small verdict map instead of one big verdict map, `ENDPOINTS_ONLY=1` for
//! endpoint changes that keep the count, `PER_COUNT_SETS=1` for a set of Service ports
//! per endpoint count instead of a verdict map).

#![allow(clippy::unwrap_used)] // A benchmark binary: any failure should stop it loudly.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use kpr_netns::Netns;
use kpr_nfnetlink::*;

const ENDPOINTS: u32 = 10;
const MASQ_MARK: u32 = 0x4000;

fn vip(service: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0000 + service)
}

/// Endpoint `slot` of `service`, in 10.244.0.0/16 (wrapping: addresses repeat past 6.5k
/// Services, which the kernel does not mind).
fn endpoint(service: u32, slot: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0af4_0000 + ((service * ENDPOINTS + slot) & 0xffff))
}

fn r(i: u8) -> Register {
    Register::r32(i)
}

/// TWO_STAGE=1: `service-ips` maps a Service port to its endpoint count M (plain data),
/// and a small `lb-chains` verdict map (one element per distinct M) picks `lb-tcp-<M>`:
/// adding or changing a Service then adds no jump/goto element, which would make the
/// kernel re-validate every element of the verdict map at commit. nft 1.0.6 aborts when
/// listing the resulting `services` rule.
fn two_stage() -> bool {
    std::env::var("TWO_STAGE").is_ok_and(|v| v == "1")
}

/// PER_COUNT_SETS=1: one plain set of Service ports per endpoint count M
/// (`service-ips-<M>`), and in `services` one rule per M:
/// `ip daddr . meta l4proto . th dport @service-ips-<M> goto lb-tcp-<M>`. No verdict
/// elements at all; a packet's first look-up walks up to one rule per distinct M.
fn per_count_sets() -> bool {
    std::env::var("PER_COUNT_SETS").is_ok_and(|v| v == "1")
}

/// The set holding Service ports with `endpoints` endpoints.
fn services_set(endpoints: u32) -> String {
    if per_count_sets() {
        format!("service-ips-{endpoints}")
    } else {
        SETS[1].to_owned()
    }
}

fn service_elements(service: u32, endpoints: u32) -> [Vec<Element>; 4] {
    let cluster = vec![Element::key(Value::new().ipv4(vip(service)).build())];
    let key = Value::new().ipv4(vip(service)).proto(6).port(80).build();
    let services = if per_count_sets() {
        vec![Element::key(key)]
    } else if two_stage() {
        vec![Element::mapping(key, Value::new().host_u32(endpoints).build())]
    } else {
        vec![Element::verdict(
            key,
            Verdict::Goto(format!("lb-tcp-{endpoints}")),
        )]
    };
    let mut eps = Vec::new();
    let mut hairpin = Vec::new();
    for slot in 0..endpoints {
        let ep = endpoint(service, slot);
        eps.push(Element::mapping(
            Value::new().ipv4(vip(service)).port(80).host_u32(slot).build(),
            Value::new().ipv4(ep).port(8080).build(),
        ));
        hairpin.push(Element::key(Value::new().ipv4(ep).ipv4(ep).build()));
    }
    [cluster, services, eps, hairpin]
}

const SETS: [&str; 4] = ["cluster-ips", "service-ips", "service-endpoints-tcp", "hairpin"];

fn sets(services: u32, hint: bool) -> Vec<Set> {
    let size = |n: u32| hint.then(|| (2 * n).next_power_of_two());
    let mut all = vec![
        Set::new(SETS[0], vec![Field::Ipv4Addr]),
        Set::map(
            SETS[1],
            vec![Field::Ipv4Addr, Field::InetProto, Field::InetService],
            if two_stage() {
                SetData::Value(vec![Field::Mark])
            } else {
                SetData::Verdict
            },
        ),
        Set::map(
            SETS[2],
            vec![Field::Ipv4Addr, Field::InetService, Field::Mark],
            SetData::Value(vec![Field::Ipv4Addr, Field::InetService]),
        ),
        Set::new(SETS[3], vec![Field::Ipv4Addr, Field::Ipv4Addr]),
    ];
    for (set, n) in all
        .iter_mut()
        .zip([services, services, services * ENDPOINTS, services * ENDPOINTS])
    {
        set.size = size(n);
    }
    if per_count_sets() {
        let mut template = all.remove(1);
        template.data = None;
        for m in 1..=ENDPOINTS {
            template.name = services_set(m);
            all.push(template.clone());
        }
    }
    all
}

fn payload(base: PayloadBase, offset: u32, len: u32, dreg: Register) -> Expr {
    Expr::Payload {
        base,
        offset,
        len,
        dreg,
    }
}

fn rules() -> Vec<(String, Vec<Expr>)> {
    let jump = |c: &str| Expr::verdict(Verdict::Jump(c.into()));
    let mark = Expr::Meta {
        key: MetaKey::Mark,
        dreg: r(0),
    };
    let set_mark = Expr::MetaSet {
        key: MetaKey::Mark,
        sreg: r(0),
    };
    let bitwise = |mask: u32, xor: u32| Expr::Bitwise {
        sreg: r(0),
        dreg: r(0),
        mask: mask.to_ne_bytes().to_vec(),
        xor: xor.to_ne_bytes().to_vec(),
    };
    let cmp = |op, data: Vec<u8>| Expr::Cmp { op, sreg: r(0), data };
    let masq = Expr::Masquerade {
        flags: nat_flags::PROTO_RANDOM_FULLY,
    };
    let net = PayloadBase::Network;
    let mut rules = vec![
        ("nat-prerouting".into(), vec![jump("services")]),
        ("nat-output".into(), vec![jump("services")]),
        ("nat-postrouting".into(), vec![jump("masquerading")]),
        (
            "nat-postrouting".into(),
            vec![
                Expr::Ct {
                    key: CtKey::Status,
                    dreg: r(0),
                    direction: None,
                },
                bitwise(ct_status::DNAT, 0),
                cmp(CmpOp::Neq, vec![0; 4]),
                payload(net, 12, 4, r(0)),
                payload(net, 16, 4, r(1)),
                Expr::Lookup {
                    set: "hairpin".into(),
                    sreg: r(0),
                    dreg: None,
                    invert: false,
                },
                masq.clone(),
            ],
        ),
        (
            "mark-for-masquerade".into(),
            vec![mark.clone(), bitwise(!MASQ_MARK, MASQ_MARK), set_mark.clone()],
        ),
        (
            "masquerading".into(),
            vec![
                mark.clone(),
                bitwise(MASQ_MARK, 0),
                cmp(CmpOp::Eq, vec![0; 4]),
                Expr::verdict(Verdict::Return),
            ],
        ),
        (
            "masquerading".into(),
            vec![mark, bitwise(u32::MAX, MASQ_MARK), set_mark],
        ),
        ("masquerading".into(), vec![masq]),
    ];
    let service_key = vec![
        payload(net, 16, 4, r(0)),
        Expr::Meta {
            key: MetaKey::L4Proto,
            dreg: r(1),
        },
        payload(PayloadBase::Transport, 2, 2, r(2)),
    ];
    if per_count_sets() {
        for m in 1..=ENDPOINTS {
            let mut exprs = service_key.clone();
            exprs.push(Expr::Lookup {
                set: services_set(m),
                sreg: r(0),
                dreg: None,
                invert: false,
            });
            exprs.push(Expr::verdict(Verdict::Goto(format!("lb-tcp-{m}"))));
            rules.push(("services".into(), exprs));
        }
    } else {
        let mut exprs = service_key;
        exprs.push(Expr::Lookup {
            set: "service-ips".into(),
            sreg: r(0),
            dreg: Some(if two_stage() { r(0) } else { Register::Verdict }),
            invert: false,
        });
        if two_stage() {
            exprs.push(Expr::Lookup {
                set: "lb-chains".into(),
                sreg: r(0),
                dreg: Some(Register::Verdict),
                invert: false,
            });
        }
        rules.push(("services".into(), exprs));
    }
    for m in 1..=ENDPOINTS {
        let chain = format!("lb-tcp-{m}");
        rules.push((
            chain.clone(),
            vec![
                payload(net, 12, 4, r(0)),
                Expr::Bitwise {
                    sreg: r(0),
                    dreg: r(0),
                    mask: vec![255, 255, 0, 0],
                    xor: vec![0; 4],
                },
                cmp(CmpOp::Neq, vec![10, 244, 0, 0]),
                jump("mark-for-masquerade"),
            ],
        ));
        rules.push((
            chain,
            vec![
                payload(net, 16, 4, r(0)),
                payload(PayloadBase::Transport, 2, 2, r(1)),
                Expr::Numgen {
                    kind: NumgenKind::Random,
                    modulus: m,
                    offset: 0,
                    dreg: r(2),
                },
                Expr::Lookup {
                    set: "service-endpoints-tcp".into(),
                    sreg: r(0),
                    dreg: Some(r(0)),
                    invert: false,
                },
                Expr::Nat {
                    kind: NatKind::Dnat,
                    family: Family::Ip,
                    addr_min: Some(r(0)),
                    addr_max: None,
                    proto_min: Some(r(1)),
                    proto_max: None,
                    flags: 0,
                },
            ],
        ));
    }
    rules
}

/// The whole table as one batch, and how long building the element values took (the
/// rest of the time is this crate's encoding).
fn cold_batch(table: &Table, services: u32, hint: bool) -> (Batch, Duration) {
    let nat = |hook, priority| BaseChain {
        chain_type: ChainType::Nat,
        hook,
        priority,
        policy: Policy::Accept,
    };
    let mut batch = Batch::new();
    batch.add_table(table);
    batch.add_chain(table, &Chain::base("nat-prerouting", nat(Hook::Prerouting, -100)));
    batch.add_chain(table, &Chain::base("nat-output", nat(Hook::Output, -100)));
    batch.add_chain(
        table,
        &Chain::base("nat-postrouting", nat(Hook::Postrouting, 100)),
    );
    for name in ["services", "mark-for-masquerade", "masquerading"] {
        batch.add_chain(table, &Chain::regular(name));
    }
    for m in 1..=ENDPOINTS {
        batch.add_chain(table, &Chain::regular(format!("lb-tcp-{m}")));
    }
    for set in sets(services, hint) {
        batch.add_set(table, &set);
    }
    if two_stage() {
        batch.add_set(table, &Set::map("lb-chains", vec![Field::Mark], SetData::Verdict));
        let chains: Vec<Element> = (1..=ENDPOINTS)
            .map(|m| {
                Element::verdict(
                    Value::new().host_u32(m).build(),
                    Verdict::Goto(format!("lb-tcp-{m}")),
                )
            })
            .collect();
        batch.add_elements(table, "lb-chains", &chains);
    }
    let building = Instant::now();
    let mut per_set: [Vec<Element>; 4] = Default::default();
    for service in 0..services {
        for (all, some) in per_set.iter_mut().zip(service_elements(service, ENDPOINTS)) {
            all.extend(some);
        }
    }
    let built = building.elapsed();
    for (index, (name, elements)) in SETS.iter().zip(&per_set).enumerate() {
        let name = if index == 1 {
            services_set(ENDPOINTS)
        } else {
            (*name).to_owned()
        };
        batch.add_elements(table, &name, elements);
    }
    for (chain, exprs) in rules() {
        batch.add_rule(table, &chain, &exprs);
    }
    (batch, built)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn percentiles(mut times: Vec<Duration>) -> String {
    times.sort();
    let at = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
    format!("p50 {} p99 {}", ms(at(50)), ms(at(99)))
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let sizes: Vec<u32> = std::env::var("SERVICES")
        .unwrap_or_else(|_| "1000,10000,50000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let hint = std::env::var("SIZE_HINT").is_ok_and(|v| v == "1");
    // ENDPOINTS_ONLY=1: the endpoint change leaves the Service's verdict element alone
    // (as when a count stays the same), to show what verdict elements cost.
    let endpoints_only = std::env::var("ENDPOINTS_ONLY").is_ok_and(|v| v == "1");
    let table = Table::new(Family::Ip, "kube-proxy");
    println!(
        "D3, {ENDPOINTS} endpoints per Service, map size hints: {hint}, two-stage service map: {}, per-count sets: {}",
        two_stage(),
        per_count_sets()
    );
    for services in sizes {
        let started = Instant::now();
        let (batch, built) = cold_batch(&table, services, hint);
        let encode = started.elapsed() - built;
        let netns = Netns::new("nfbench").expect("a throw-away namespace");
        netns.run(|| {
            let mut socket = Socket::open().unwrap();
            let started = Instant::now();
            socket.send_split(&batch, SPLIT_TRANSACTION_BYTES).unwrap();
            let load = started.elapsed();
            println!(
                "{services} services: cold load: element values {} + encode {} + kernel {} ({} messages, {:.1} MiB, {} transactions)",
                ms(built),
                ms(encode),
                ms(load),
                batch.len(),
                batch.size() as f64 / (1 << 20) as f64,
                batch.split(SPLIT_TRANSACTION_BYTES).len()
            );

            // One endpoint change: service s loses slot 3; slot 9 moves into it; its
            // service-ips element goes to lb-tcp-9.
            let mut change_times = Vec::new();
            for round in 0..100u32 {
                let s = round * 7 % services;
                let [_, svc, eps, hairpin] = service_elements(s, ENDPOINTS);
                let [_, new_svc, new_eps, _] = service_elements(s, ENDPOINTS - 1);
                let mut change = Batch::new();
                change.delete_elements(&table, SETS[2], &[eps[3].clone(), eps[9].clone()]);
                let mut moved = eps[9].clone();
                moved.key = eps[3].key.clone();
                change.add_elements(&table, SETS[2], &[moved]);
                if !endpoints_only {
                    change.delete_elements(&table, &services_set(ENDPOINTS), &svc);
                    change.add_elements(&table, &services_set(ENDPOINTS - 1), &new_svc);
                }
                change.delete_elements(&table, SETS[3], &[hairpin[3].clone()]);
                let started = Instant::now();
                socket.send(&change).unwrap();
                change_times.push(started.elapsed());
                // Undo, untimed, so every round changes a full Service.
                let mut undo = Batch::new();
                let mut moved_back = eps[9].clone();
                moved_back.key = eps[3].key.clone();
                undo.delete_elements(&table, SETS[2], &[moved_back]);
                undo.add_elements(&table, SETS[2], &[eps[3].clone(), eps[9].clone()]);
                if !endpoints_only {
                    undo.delete_elements(&table, &services_set(ENDPOINTS - 1), &new_svc);
                    undo.add_elements(&table, &services_set(ENDPOINTS), &svc);
                }
                undo.add_elements(&table, SETS[3], &[hairpin[3].clone()]);
                let _ = new_eps;
                socket.send(&undo).unwrap();
            }
            println!("  one endpoint change: {}", percentiles(change_times));

            let mut new_times = Vec::new();
            for round in 0..100u32 {
                let mut add = Batch::new();
                let elements = service_elements(services + round, ENDPOINTS);
                for (index, (name, elements)) in SETS.iter().zip(elements).enumerate() {
                    let name = if index == 1 { services_set(ENDPOINTS) } else { (*name).to_owned() };
                    add.add_elements(&table, &name, &elements);
                }
                let started = Instant::now();
                socket.send(&add).unwrap();
                new_times.push(started.elapsed());
            }
            println!("  one new Service (22 elements): {}", percentiles(new_times));
        });
    }
    println!("peak RSS of this process: {:.0} MiB", peak_rss_mib());
}
