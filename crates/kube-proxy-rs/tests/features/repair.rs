//! Repair at once (issue 24): when someone else flushes or deletes what the proxy wrote,
//! the Service answers again long before the next periodic sync (30 s here, the default).
//!
//! Each scenario serves one ClusterIP Service, damages the proxy's rules from the node's
//! shell as an admin or another tool would, then probes the Service from a pod every 20 ms,
//! each probe a fresh connection on its own thread with a short connect timeout (shorter
//! than TCP's first SYN retransmission, so a probe connects only if the rules were back
//! when it started; only pod0 listens behind the Service's address). It prints the time
//! from the start and from the end of the damaging command to the first connected probe
//! (docs/operations.md records them) and fails if none connects within [`DEADLINE`], a
//! ceiling for CI noise, far below the sync period. The proxy's log must say the repair
//! sync was full for reason `Repair`, so a periodic sync cannot pass it, and the Service
//! must then answer as before.
//!
//! nftables mode hears the change from nf_tables notifications; iptables mode's check
//! between syncs polls (crates/backends/iptables/src/repair.rs, every second). Userspace
//! and ipvs modes have no such watch yet.

use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::Mode;
use crate::manifests::Manifests;
use crate::objects::{ready_here, service, slice, slice_port, tcp_port};
use crate::stage::{POD_PORT, Stage};
use crate::traffic::at;

in_mode!(nftables, crate::Mode::Nftables;
    a_flushed_table_is_repaired_at_once,
    a_deleted_chain_is_repaired_at_once
);
// ebpf mode's rules are nftables mode's; a pod's connection is translated at connect()
// either way, so the scenario's probe says little there, but the one repair sync it
// demands does.
in_mode!(ebpf, crate::Mode::Ebpf;
    a_flushed_table_is_repaired_at_once,
    a_deleted_chain_is_repaired_at_once
);
in_mode!(iptables, crate::Mode::Iptables;
    a_flushed_services_chain_is_repaired_at_once,
    a_flushed_nat_table_is_repaired_at_once,
    a_deleted_canary_is_put_back_at_once
);

/// How long a repair may take before the scenario fails: a ceiling for a loaded CI machine
/// (an iptables full sync, ~30 iptables processes, once took 4 s on 2 busy cores), well
/// below the 30 s sync period; the log's `reason=Repair` rules out a periodic sync.
const DEADLINE: Duration = Duration::from_secs(10);
/// One probe's connect timeout: below TCP's 1 s initial retransmission timeout.
const PROBE_TIMEOUT: Duration = Duration::from_millis(150);
/// Long enough for the iptables check to run twice after a repair.
const QUIET: Duration = Duration::from_millis(2500);
/// Between probes.
const PROBE_GAP: Duration = Duration::from_millis(20);

const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 30, 10);

/// A Service on `VIP`:80 served by pod0, reached from pod1.
fn served(mode: Mode) -> Stage {
    let manifests = Manifests::new(
        "repair.yaml",
        vec![
            service("repaired", VIP, json!({"ports": [tcp_port("http", 80)]})),
            slice(
                "repaired",
                json!([slice_port("http", "TCP", POD_PORT)]),
                vec![ready_here(0)],
            ),
        ],
    );
    let stage = Stage::start(mode, 2, &manifests);
    stage.pod(1).wait_answered_by(at(VIP, 80), 5, &["pod0"]);
    stage
}

/// Runs `damage` in the node, then probes until the Service answers. Returns the times
/// from the start and from the end of `damage` to the start of the first connected probe.
/// A probe starts every [`PROBE_GAP`], each on its own thread, so a dropped probe's timeout
/// does not hide the moment the rules came back.
fn repair_time(stage: &Stage, damage: &str) -> (Duration, Duration) {
    let node = stage.lab().node();
    let started = Instant::now();
    node.sh(damage).unwrap_or_else(|e| panic!("{damage}: {e}"));
    let damaged = Instant::now();
    let pod = stage.lab().pod(1);
    let answered: Mutex<Option<Instant>> = Mutex::new(None);
    std::thread::scope(|scope| {
        let mut probes = 0;
        while answered.lock().unwrap().is_none() {
            assert!(
                damaged.elapsed() < DEADLINE,
                "not repaired {DEADLINE:?} after `{damage}` ({probes} probes)\n{}\n{}",
                stage.ruleset(),
                stage.proxy_logs()
            );
            probes += 1;
            let answered = &answered;
            scope.spawn(move || {
                let probe = Instant::now();
                // Only pod0 listens behind the VIP: a connection is the rules' doing, and
                // proves them back without waiting for a reply on a loaded machine.
                let connected =
                    pod.run(|| std::net::TcpStream::connect_timeout(&at(VIP, 80), PROBE_TIMEOUT).is_ok());
                if connected {
                    let mut first = answered.lock().unwrap();
                    if first.is_none_or(|t| probe < t) {
                        *first = Some(probe);
                    }
                }
            });
            std::thread::sleep(PROBE_GAP);
        }
    });
    let first = answered.into_inner().unwrap().expect("a connected probe");
    (
        first.saturating_duration_since(started),
        first.saturating_duration_since(damaged),
    )
}

/// Damages, measures, prints, and checks the log names the repair.
fn measure(mode: Mode, damage: &str) {
    let stage = served(mode);
    let (from_start, from_end) = repair_time(&stage, damage);
    println!(
        "repair time, {} mode, `{damage}`: {} ms from the command's start, {} ms from its end",
        mode.name(),
        from_start.as_millis(),
        from_end.as_millis()
    );
    stage.pod(1).wait_answered_by(at(VIP, 80), 5, &["pod0"]);
    assert_one_repair(&stage);
}

/// Exactly one repair sync: the one the damage asked for. Our own repair's writes (and
/// the checks after it, over more than one check interval) must not ask for another.
fn assert_one_repair(stage: &Stage) {
    std::thread::sleep(QUIET);
    let logs = stage.proxy_logs();
    let repairs = logs.lines().filter(|l| l.contains("reason=Repair")).count();
    assert_eq!(repairs, 1, "one repair sync, saying why\n{logs}");
}

fn a_flushed_table_is_repaired_at_once(mode: Mode) {
    measure(mode, "nft flush table ip kube-proxy");
}

/// nat-prerouting is the base chain a pod's packet enters; a chain is deleted empty.
fn a_deleted_chain_is_repaired_at_once(mode: Mode) {
    measure(
        mode,
        "nft 'flush chain ip kube-proxy nat-prerouting; delete chain ip kube-proxy nat-prerouting'",
    );
}

fn a_flushed_services_chain_is_repaired_at_once(mode: Mode) {
    measure(mode, "iptables -t nat -F KUBE-SERVICES");
}

/// Every nat chain flushed, the jumps from PREROUTING and OUTPUT included.
fn a_flushed_nat_table_is_repaired_at_once(mode: Mode) {
    measure(mode, "iptables -t nat -F");
}

/// The canary carries no traffic: the scenario waits for it to be back, and for the
/// Service still answering after the full sync that recreated it.
fn a_deleted_canary_is_put_back_at_once(mode: Mode) {
    let stage = served(mode);
    let node = stage.lab().node();
    node.sh("iptables -t nat -X KUBE-PROXY-CANARY").unwrap();
    let deleted = Instant::now();
    while node.sh("iptables -t nat -S KUBE-PROXY-CANARY").is_err() {
        assert!(deleted.elapsed() < DEADLINE, "no canary\n{}", stage.proxy_logs());
        std::thread::sleep(PROBE_GAP);
    }
    println!(
        "repair time, iptables mode, after `iptables -t nat -X KUBE-PROXY-CANARY`: {} ms",
        deleted.elapsed().as_millis()
    );
    stage.pod(1).wait_answered_by(at(VIP, 80), 5, &["pod0"]);
    assert_one_repair(&stage);
    check_cost(&stage);
}

/// The check between syncs, as the proxy runs it (its own code, the real binaries, in the
/// node): intact rules are no damage (else it would repair every second); and what one
/// check costs, printed (docs/operations.md records it).
fn check_cost(stage: &Stage) {
    use kpr_iptables::repair::damage;
    use kpr_iptables::{IptablesCli, Variant};
    const ROUNDS: u32 = 20;
    let node = stage.lab().node();
    let (quick, thorough) = node.run(|| {
        let cli = IptablesCli::new(kpr_model::IpFamily::V4, Variant::Auto);
        assert_eq!(
            damage(&cli, true, true).unwrap(),
            None,
            "the rules a sync wrote are intact"
        );
        let timed = |thorough| {
            let started = Instant::now();
            for _ in 0..ROUNDS {
                assert_eq!(damage(&cli, true, thorough).unwrap(), None);
            }
            started.elapsed() / ROUNDS
        };
        (timed(false), timed(true))
    });
    println!(
        "iptables check between syncs: {:.1} ms per check, {:.1} ms with the filter table",
        quick.as_secs_f64() * 1e3,
        thorough.as_secs_f64() * 1e3,
    );
}
