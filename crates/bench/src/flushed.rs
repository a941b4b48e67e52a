//! iptables-nft loaded the fast way: a flushing restore, then the partial sync.
//!
//! `iptables-nft-restore --noflush` of a big ruleset (what the product's full sync runs)
//! can take longer than any sensible timeout, so the partial sync that would follow it is
//! out of reach that way. Here a fresh namespace is seeded with the same full payload by a
//! restore *without* `--noflush` (in an empty namespace the resulting ruleset is the same,
//! minus the few jump rules from built-in chains), then the backend's partial payload is
//! restored with the product's own `--noflush` flags: what a partial sync costs on a node
//! that already holds the ruleset. The seeding time is also the reference's "tables
//! flushed" figure.

use std::time::Duration;

use kpr_iptables::Variant;
use kpr_netns::Netns;

use crate::load::{Outcome, REPEAT_BELOW, RESTORE_ARGS, restore_in, restore_program};
use crate::stats::median;
use crate::timed::Ended;

/// A restore without `--noflush`: the tables it names are flushed first.
const FLUSHING_ARGS: [&str; 3] = ["-w", "5", "--counters"];

#[derive(Clone, Debug, PartialEq)]
pub struct FlushedResult {
    pub runs: usize,
    /// The full payload, flushing restore.
    pub load: Outcome<Duration>,
    /// The partial payload afterwards, `--noflush` as the product runs it.
    pub partial: Outcome<Duration>,
}

impl FlushedResult {
    pub fn not_measured(why: &str) -> Self {
        Self {
            runs: 0,
            load: Outcome::NotAvailable(why.to_string()),
            partial: Outcome::NotAvailable(why.to_string()),
        }
    }
}

pub struct FlushedPlan<'a> {
    pub variant: Variant,
    pub full_payload: &'a str,
    pub partial_payload: &'a str,
    pub timeout: Duration,
    pub runs: usize,
}

/// Up to `plan.runs` measurements, each in a fresh namespace.
pub fn measure(plan: &FlushedPlan<'_>) -> FlushedResult {
    let program = restore_program(plan.variant);
    if !crate::load::on_path(program) {
        return FlushedResult::not_measured(&format!("{program} not installed"));
    }
    let mut loads = Vec::new();
    let mut partials = Vec::new();
    for run in 0..plan.runs.max(1) {
        let (load, partial) = measure_once(plan, program);
        let (Outcome::Done(load_time), Outcome::Done(partial_time)) = (&load, &partial) else {
            return FlushedResult {
                runs: run + 1,
                load,
                partial,
            };
        };
        loads.push(*load_time);
        partials.push(*partial_time);
        if *load_time >= REPEAT_BELOW {
            break;
        }
    }
    FlushedResult {
        runs: loads.len(),
        load: Outcome::Done(median(&loads).unwrap_or_default()),
        partial: Outcome::Done(median(&partials).unwrap_or_default()),
    }
}

fn measure_once(plan: &FlushedPlan<'_>, program: &str) -> (Outcome<Duration>, Outcome<Duration>) {
    let skipped = || Outcome::NotAvailable("the flushing load did not finish".to_string());
    let netns = match Netns::new("benchflush") {
        Ok(netns) => netns,
        Err(err) => return (Outcome::Failed(format!("namespace: {err}")), skipped()),
    };
    let restore = |flags: &[&str], payload: &str| {
        outcome(
            restore_in(netns.name(), program, flags, payload.as_bytes(), plan.timeout),
            plan.timeout,
        )
    };
    let load = restore(&FLUSHING_ARGS, plan.full_payload);
    if load.done().is_none() {
        return (load, skipped());
    }
    let partial = restore(&RESTORE_ARGS, plan.partial_payload);
    (load, partial)
}

fn outcome(ended: std::io::Result<Ended>, timeout: Duration) -> Outcome<Duration> {
    match ended {
        Ok(Ended::Exited { status, elapsed, .. }) if status.success() => Outcome::Done(elapsed),
        Ok(Ended::Exited { status, stderr, .. }) => Outcome::Failed(format!("{status}: {stderr}")),
        Ok(Ended::TimedOut) => Outcome::TimedOut(timeout),
        Err(err) => Outcome::Failed(format!("cannot run the restore: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Shape, SyntheticCluster};
    use crate::options::bench_options;
    use crate::payloads::partial_payload;

    /// Needs root and iptables-nft; runs in namespaces of its own.
    #[test]
    fn seeds_with_a_flushing_restore_then_applies_the_partial_payload() {
        if !crate::load::on_path(restore_program(Variant::Nft)) {
            eprintln!("iptables-nft-restore missing; nothing to check");
            return;
        }
        let mut cluster = SyntheticCluster::new(Shape {
            services: 10,
            endpoints: 2,
        })
        .expect("valid");
        let base = cluster.take();
        cluster.replace_one_endpoint().expect("valid");
        let changed = cluster.take();
        let options = bench_options();
        let full = kpr_iptables::render_dry_run(&base.state, &options, &[]);
        let partial = partial_payload(&options, &base, &changed).expect("two syncs");
        let result = measure(&FlushedPlan {
            variant: Variant::Nft,
            full_payload: &full,
            partial_payload: &partial,
            timeout: Duration::from_secs(60),
            runs: 1,
        });
        assert!(result.load.done().is_some(), "{result:?}");
        assert!(result.partial.done().is_some(), "{result:?}");
    }

    #[test]
    fn a_rejected_partial_payload_is_a_failure() {
        if !crate::load::on_path(restore_program(Variant::Nft)) {
            return;
        }
        let result = measure(&FlushedPlan {
            variant: Variant::Nft,
            full_payload: "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n",
            partial_payload: "*nat\n-A KUBE-NO-SUCH-CHAIN -j ACCEPT\nCOMMIT\n",
            timeout: Duration::from_secs(60),
            runs: 3,
        });
        assert_eq!(result.runs, 1, "{result:?}");
        assert!(result.load.done().is_some(), "{result:?}");
        assert!(matches!(result.partial, Outcome::Failed(_)), "{result:?}");
    }
}
