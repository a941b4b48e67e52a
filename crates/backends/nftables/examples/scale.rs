//! One quick measurement of the nftables mode at scale, through the netlink transport (or
//! `nft -f` with `SCALE_TRANSPORT=nft`), in a throw-away network namespace: cold full sync (generation + kernel), one endpoint
//! change and one new Service (partial syncs), batch sizes, peak RSS.
//!
//! `cargo run -p kpr-nftables --example scale -- <services> <endpoints per service> [changes]`
//! (needs root and nft). Not a test: it asserts nothing about speed.
//!
//! `SCALE_DISTINCT=<k>` gives service `i` `m - i % k` endpoints, so k distinct endpoint
//! counts: k entry sets, hence k dispatch rules a new connection may walk (default 1).
//! Last, two rarer changes are timed: a Service with an external IP added and deleted
//! again (its target `masq-...` and entry set come and go, the dispatch chain is
//! rewritten each time, the pick chain exists), new Services with endpoint counts no
//! other Service has (each also creates a pick chain, whose DNAT map binding makes the
//! kernel walk the endpoint map it binds), count changes of existing Services to a count
//! others have (their slots move if endpoint maps are per count), and new ClientIP
//! affinity Services with a timeout no other Service has (a sticky chain and one slot
//! chain per endpoint, each binding an endpoint map).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use kpr_netns::Netns;
use kpr_nftables::{NftCli, NftablesBackend, NftablesOptions, build, full_batches};
use kpr_state::Backend;
use kpr_world::{World, ep};
use serde_json::json;

fn service_ip(i: usize) -> String {
    format!("10.{}.{}.{}", 96 + i / 65536, (i / 256) % 256, i % 256)
}

/// The endpoints of service `i`; in `generation` g > 0 the first one is replaced by a new
/// address (one endpoint change).
fn endpoints(i: usize, m: usize, generation: usize) -> Vec<serde_json::Value> {
    (0..m)
        .map(|j| {
            let k = i * m + j;
            if j == 0 && generation > 0 {
                ep(&format!("10.200.{}.{}", generation / 256 % 256, generation % 256))
            } else {
                ep(&format!(
                    "10.{}.{}.{}",
                    128 + k / 65536 % 64,
                    k / 256 % 256,
                    k % 256
                ))
            }
        })
        .collect()
}

/// How many distinct endpoint counts the initial Services have (`SCALE_DISTINCT`).
fn distinct_counts(m: usize) -> usize {
    std::env::var("SCALE_DISTINCT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .clamp(1, m)
}

/// The endpoint count of initial service `i`.
fn count_of(i: usize, m: usize) -> usize {
    m - i % distinct_counts(m)
}

fn add_service(world: &mut World, i: usize, m: usize, generation: usize) {
    add_service_with(world, i, m, generation, json!({}));
}

/// Like [`add_service`], with `extra` merged into the Service's spec.
fn add_service_with(world: &mut World, i: usize, m: usize, generation: usize, extra: serde_json::Value) {
    let name = format!("svc{i}");
    let mut spec = json!({"type": "ClusterIP", "clusterIP": service_ip(i),
                          "ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    world.service(&name, spec).slice(
        &name,
        json!([{"name": "http", "port": 8080}]),
        endpoints(i, m, generation),
    );
}

fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

/// Builds, batches and renders the full table once without the kernel (timed, RSS shown).
fn dry_build(state: &kpr_state::DesiredState, opts: &NftablesOptions) -> (Duration, usize) {
    let started = Instant::now();
    let ruleset = build(state, opts, &[]);
    let batches = full_batches(&ruleset, opts, opts.max_batch_elements);
    let text: usize = batches
        .iter()
        .map(|b| kpr_nftables::batch_text(b, opts.affinity_capacity).len())
        .sum();
    let generation = started.elapsed();
    let generation_rss = rss_mib();
    // To time nft alone on the same input: SCALE_DUMP=<path> writes it as one script.
    if let Ok(path) = std::env::var("SCALE_DUMP") {
        std::fs::write(path, kpr_nftables::render_text(&ruleset, opts)).unwrap();
    }
    // T: how many dispatch rules (set lookups) a new connection may walk.
    let targets = ruleset
        .sets
        .iter()
        .filter(|set| matches!(set, kpr_nftables::names::SetName::Entries { .. }))
        .count();
    println!("entry sets, each one dispatch rule: {targets}");
    drop((ruleset, batches));
    println!(
        "RSS: {generation_rss:.0} MiB holding a full build, its batches and their text; {:.0} MiB after dropping them",
        rss_mib()
    );
    (generation, text)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let (n, m, changes) = (
        args.first().copied().unwrap_or(1000),
        args.get(1).copied().unwrap_or(10),
        args.get(2).copied().unwrap_or(20),
    );
    let netns = Netns::new("nftscale").unwrap();
    let opts = NftablesOptions {
        local_detector: kpr_host::LocalDetector::ClusterCidr(vec!["10.128.0.0/10".parse().unwrap()]),
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
        ..NftablesOptions::default()
    };
    let transport: Box<dyn kpr_nftables::Transport> = match std::env::var("SCALE_TRANSPORT").as_deref() {
        Ok("nft") => {
            Box::new(NftCli::new(opts.affinity_capacity).with_prefix(&["ip", "netns", "exec", netns.name()]))
        }
        _ => Box::new(netns.run(|| kpr_nftables::NetlinkTransport::open(opts.affinity_capacity).unwrap())),
    };
    let mut backend = NftablesBackend::new(opts.clone(), transport).unwrap();

    let mut world = World::new();
    for i in 0..n {
        add_service(&mut world, i, count_of(i, m), 0);
    }
    let pending = world.pending();
    let world_rss = rss_mib();
    // SCALE_SKIP_DRY=1 leaves the separate dry build out, so the RSS after the cold sync
    // holds no memory the allocator kept from it (the "state" column of the crate docs).
    let (generation, text) = if std::env::var("SCALE_SKIP_DRY").is_ok() {
        (Duration::ZERO, 0)
    } else {
        dry_build(&pending.state, &opts)
    };
    let started = Instant::now();
    let report = backend.sync(&pending.request(false)).unwrap();
    let cold = started.elapsed();
    let sizes: Vec<usize> = backend.last_batches().iter().map(|c| c.elements_added).collect();
    println!(
        "{n} services x {m} endpoints: generation+render {generation:?}, cold full sync {cold:?} ({} batches, elements per batch {:?}, {} bytes of nft text, {} objects)",
        sizes.len(),
        sizes,
        text,
        report.objects.total
    );
    drop(pending);
    println!(
        "RSS: {world_rss:.0} MiB with the test's World and state, {:.0} MiB after the cold sync",
        rss_mib()
    );

    let mut one_change = Vec::new();
    let mut sizes = Vec::new();
    for k in 0..changes {
        let i = (k * 7919) % n;
        world.slice(
            &format!("svc{i}"),
            json!([{"name": "http", "port": 8080}]),
            endpoints(i, count_of(i, m), k + 1),
        );
        let pending = world.pending();
        let started = Instant::now();
        let report = backend.sync(&pending.request(false)).unwrap();
        one_change.push(started.elapsed());
        assert!(!report.full);
        sizes.push(report.objects.written);
    }
    let mut new_service = Vec::new();
    for k in 0..changes {
        add_service(&mut world, n + k, count_of(k, m), 0);
        let pending = world.pending();
        let started = Instant::now();
        backend.sync(&pending.request(false)).unwrap();
        new_service.push(started.elapsed());
    }
    let mut rewrite = Vec::new();
    for k in 0..changes.min(20) {
        let name = format!("ext{k}");
        world
            .service(
                &name,
                json!({"type": "ClusterIP", "clusterIP": service_ip(n + changes + 100 + k),
                       "externalIPs": ["203.0.113.9"],
                       "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
            )
            .slice(&name, json!([{"name": "http", "port": 8080}]), endpoints(k, m, 0));
        for _ in 0..2 {
            let pending = world.pending();
            let started = Instant::now();
            backend.sync(&pending.request(false)).unwrap();
            rewrite.push(started.elapsed());
            world.delete_service(&name);
        }
    }
    let mut new_target = Vec::new();
    for k in 0..changes.min(20) {
        add_service(&mut world, n + changes + k, m + 1 + k, 0);
        let pending = world.pending();
        let started = Instant::now();
        backend.sync(&pending.request(false)).unwrap();
        new_target.push(started.elapsed());
    }
    // Count changes to a count other Services have: the first makes the count m - 1 exist
    // (untimed), then each timed one moves one more Service from m to m - 1 endpoints.
    let mut count_change = Vec::new();
    let mut count_written = Vec::new();
    for k in 0..=changes.min(20) {
        let i = (k * 7919 + 13) % n;
        // Its last endpoint goes (its first may also change back: the endpoint changes
        // above replaced some first endpoints).
        let mut fewer = endpoints(i, m, 0);
        fewer.truncate(m.max(2) - 1);
        world.slice(&format!("svc{i}"), json!([{"name": "http", "port": 8080}]), fewer);
        let pending = world.pending();
        let started = Instant::now();
        let report = backend.sync(&pending.request(false)).unwrap();
        if k > 0 {
            count_change.push(started.elapsed());
            count_written.push(report.objects.written);
        }
    }
    // New ClientIP affinity Services, each with a timeout no other Service has: a sticky
    // chain and m slot chains each.
    let mut new_sticky = Vec::new();
    for k in 0..changes.min(20) {
        let timeout = 1000 + k;
        add_service_with(
            &mut world,
            n + 2 * changes + 100 + k,
            m,
            0,
            json!({"sessionAffinity": "ClientIP",
                   "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}}}),
        );
        let pending = world.pending();
        let started = Instant::now();
        backend.sync(&pending.request(false)).unwrap();
        new_sticky.push(started.elapsed());
    }
    println!(
        "one endpoint change: p50 {:?} p99 {:?} (elements+rules written {:?}); one new service: p50 {:?} p99 {:?}; peak RSS {:.0} MiB",
        percentile(&mut one_change, 0.5),
        percentile(&mut one_change, 0.99),
        &sizes[..sizes.len().min(5)],
        percentile(&mut new_service, 0.5),
        percentile(&mut new_service, 0.99),
        peak_rss_mib()
    );
    println!(
        "an external IP's target added or removed (entry set, dispatch rewrite): p50 {:?} p99 {:?} ({} samples)",
        percentile(&mut rewrite, 0.5),
        percentile(&mut rewrite, 0.99),
        rewrite.len()
    );
    println!(
        "one new service with a new endpoint count (pick chain, entry set, dispatch rewrite): p50 {:?} p99 {:?} ({} samples)",
        percentile(&mut new_target, 0.5),
        percentile(&mut new_target, 0.99),
        new_target.len()
    );
    println!(
        "one count change to an existing count: p50 {:?} p99 {:?} (elements+rules written {:?}, {} samples)",
        percentile(&mut count_change, 0.5),
        percentile(&mut count_change, 0.99),
        &count_written[..count_written.len().min(5)],
        count_change.len()
    );
    println!(
        "one new ClientIP service with a new timeout (sticky chain, {m} slot chains): p50 {:?} p99 {:?} ({} samples)",
        percentile(&mut new_sticky, 0.5),
        percentile(&mut new_sticky, 0.99),
        new_sticky.len()
    );
}
