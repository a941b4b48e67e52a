//! Element throughput: 500k `service-endpoints` map elements (50k Services x 10
//! endpoints, the D3 design's biggest map) loaded into a throw-away namespace through
//! kpr-nfnetlink, as one transaction and split, against `nft -f` loading the same
//! elements; then reading them back, and one-element changes to the full map.
//!
//! `cargo bench -p kpr-nfnetlink --bench elements` (root; `ELEMENTS=n` to change the count,
//! `SIZE=n` to give the map a size limit, `NFT=0` to leave out the `nft` comparison).

#![allow(clippy::unwrap_used)] // A benchmark binary: any failure should stop it loudly.

use std::io::Write;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use kpr_netns::Netns;
use kpr_nfnetlink::*;

const ENDPOINTS_PER_SERVICE: u32 = 10;

/// The endpoint map; `SIZE=n` gives it a size limit, which the kernel also takes as the
/// hash table's initial size hint.
fn map() -> Set {
    let mut set = Set::map(
        "service-endpoints-tcp",
        vec![Field::Ipv4Addr, Field::InetService, Field::Mark],
        SetData::Value(vec![Field::Ipv4Addr, Field::InetService]),
    );
    set.size = std::env::var("SIZE").ok().and_then(|v| v.parse().ok());
    set
}

fn vip(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0000 + i / ENDPOINTS_PER_SERVICE)
}

fn endpoint(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0af4_0000 + i)
}

fn element(i: u32) -> Element {
    Element::mapping(
        Value::new()
            .ipv4(vip(i))
            .port(80)
            .host_u32(i % ENDPOINTS_PER_SERVICE)
            .build(),
        Value::new().ipv4(endpoint(i)).port(8080).build(),
    )
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn fresh(table: &Table) -> Batch {
    let mut batch = Batch::new();
    batch.add_table(table);
    batch.add_set(table, &map());
    batch
}

fn main() {
    let count: u32 = std::env::var("ELEMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500_000);
    let table = Table::new(Family::Ip, "kube-proxy");
    let elements: Vec<Element> = (0..count).map(element).collect();
    println!(
        "{count} map elements (key ipv4 . port . slot, value ipv4 . port), size limit {:?}",
        map().size
    );

    let started = Instant::now();
    let mut batch = fresh(&table);
    batch.add_elements(&table, "service-endpoints-tcp", &elements);
    let encode = started.elapsed();
    println!(
        "encode: {} ({} messages, {:.1} MiB)",
        ms(encode),
        batch.len(),
        batch.size() as f64 / (1 << 20) as f64
    );

    // One atomic transaction.
    let netns = Netns::new("nfbench").expect("a throw-away namespace");
    let one = netns.run(|| {
        let mut socket = Socket::open().unwrap();
        let started = Instant::now();
        socket.send(&batch).unwrap();
        started.elapsed()
    });
    println!("send as one transaction: {}", ms(one));

    // Read back, then one-element changes against the full map.
    netns.run(|| {
        let mut socket = Socket::open().unwrap();
        let started = Instant::now();
        let back = socket.elements(&table, "service-endpoints-tcp").unwrap();
        println!("dump {} elements: {}", back.len(), ms(started.elapsed()));
        assert_eq!(back.len(), elements.len());

        let mut times = Vec::new();
        for round in 0..100u32 {
            let i = round * 997 % count;
            let mut change = Batch::new();
            change.delete_elements(&table, "service-endpoints-tcp", &[element(i)]);
            let moved = Element::mapping(
                element(i).key,
                Value::new().ipv4(endpoint(i)).port(9000 + round as u16).build(),
            );
            change.add_elements(&table, "service-endpoints-tcp", &[moved]);
            let started = Instant::now();
            socket.send(&change).unwrap();
            times.push(started.elapsed());
        }
        times.sort();
        println!(
            "one endpoint change (delete + add element) at {count}: p50 {} p99 {} (100 changes)",
            ms(times[49]),
            ms(times[98])
        );
    });
    drop(netns);

    // Split into transactions.
    for limit in [1usize << 20, 4 << 20] {
        let netns = Netns::new("nfbench").expect("a throw-away namespace");
        let parts = batch.split(limit);
        let (total, longest) = netns.run(|| {
            let mut socket = Socket::open().unwrap();
            let started = Instant::now();
            let mut longest = Duration::ZERO;
            for part in &parts {
                let one = Instant::now();
                socket.send(part).unwrap();
                longest = longest.max(one.elapsed());
            }
            (started.elapsed(), longest)
        });
        println!(
            "send split at {} MiB: {} transactions, {} in all, longest transaction {}",
            limit >> 20,
            parts.len(),
            ms(total),
            ms(longest)
        );
    }

    if std::env::var("NFT").is_ok_and(|v| v == "0") {
        return;
    }
    // The same elements through nft -f.
    let netns = Netns::new("nfbench").expect("a throw-away namespace");
    let path = std::env::temp_dir().join(format!("kpr-nfnetlink-bench-{}.nft", std::process::id()));
    {
        let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        writeln!(file, "table ip kube-proxy {{").unwrap();
        writeln!(
            file,
            "map service-endpoints-tcp {{ typeof ip daddr . tcp dport . numgen random mod 1 : ip daddr . tcp dport; }}\n}}"
        )
        .unwrap();
        for chunk in (0..count).collect::<Vec<_>>().chunks(10_000) {
            write!(file, "add element ip kube-proxy service-endpoints-tcp {{ ").unwrap();
            for (n, i) in chunk.iter().enumerate() {
                let sep = if n == 0 { "" } else { ", " };
                write!(
                    file,
                    "{sep}{} . 80 . {} : {} . 8080",
                    vip(*i),
                    i % ENDPOINTS_PER_SERVICE,
                    endpoint(*i)
                )
                .unwrap();
            }
            writeln!(file, " }}").unwrap();
        }
    }
    let started = Instant::now();
    let status = netns.command("nft").arg("-f").arg(&path).status().expect("nft");
    let nft = started.elapsed();
    std::fs::remove_file(&path).ok();
    assert!(status.success(), "nft -f failed");
    println!("nft -f, one transaction: {}", ms(nft));
    let started = Instant::now();
    let listed = netns
        .sh("nft list map ip kube-proxy service-endpoints-tcp | grep -c ' : '")
        .unwrap_or_default();
    println!(
        "nft list map: {} ({} element lines)",
        ms(started.elapsed()),
        listed.trim()
    );
}
