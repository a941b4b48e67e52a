//! Kernel load time, measured through the product's own [`IptablesBackend`].
//!
//! Each measurement gets a fresh network namespace (so the full load starts from empty
//! tables) and a backend whose only difference from production is [`TimedRestore`]: it
//! runs the same `iptables-restore` flags, but times each call and kills it at a deadline.
//! The backend's first sync is full and writes exactly the payload the render benchmark
//! produced (checked by hash); then one endpoint changes and the backend makes the
//! partial sync production would make.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kpr_iptables::{
    ExecError, Iptables, IptablesBackend, IptablesCli, IptablesOptions, IptablesVersion, Table, Variant,
};
use kpr_model::IpFamily;
use kpr_netns::Netns;

use crate::cluster::Snapshot;
use crate::stats::median;
use crate::timed::{self, Ended};

/// The flags IptablesCli passes to every restore, so timings match production.
pub const RESTORE_ARGS: [&str; 4] = ["-w", "5", "--noflush", "--counters"];
/// A load slower than this is not repeated: one sample is precise enough, and repeats
/// would keep a shared machine busy for many minutes.
pub const REPEAT_BELOW: Duration = Duration::from_secs(60);

/// The restore binary of `variant` (IPv4).
pub fn restore_program(variant: Variant) -> &'static str {
    match variant {
        Variant::Legacy => "iptables-legacy-restore",
        Variant::Nft => "iptables-nft-restore",
        Variant::Auto | Variant::Plain => "iptables-restore",
    }
}

/// Whether `program` is an executable file in one of `$PATH`'s directories.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| is_executable(&dir.join(program))))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `ip netns exec NETNS PROGRAM FLAGS` with `payload` on stdin, killed after `timeout`.
pub fn restore_in(
    netns: &str,
    program: &str,
    flags: &[&str],
    payload: &[u8],
    timeout: Duration,
) -> std::io::Result<Ended> {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", netns, program])
        .args(flags)
        .env("LC_ALL", "C");
    timed::run(&mut command, payload, timeout)
}

/// The result of one measurement that may not have happened.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome<T> {
    Done(T),
    TimedOut(Duration),
    /// Not measured, and why (binary missing, an earlier step failed).
    NotAvailable(String),
    Failed(String),
}

impl<T> Outcome<T> {
    pub fn done(&self) -> Option<&T> {
        match self {
            Self::Done(value) => Some(value),
            _ => None,
        }
    }
}

/// The partial sync after one endpoint of one service changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    pub bytes: usize,
    /// `iptables-restore` alone.
    pub restore: Duration,
    /// The whole `sync_rules` call: canary checks, render of the whole ruleset, restore.
    pub sync: Duration,
}

/// Full load and partial sync of one variant, medians over the runs made.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadResult {
    pub runs: usize,
    pub full: Outcome<Duration>,
    pub partial: Outcome<Partial>,
}

/// What [`TimedRestore`] saw of one restore call.
#[derive(Clone, Debug)]
struct RestoreRecord {
    bytes: usize,
    hash: u64,
    end: RestoreEnd,
}

#[derive(Clone, Debug)]
enum RestoreEnd {
    Finished(Duration),
    TimedOut,
    Failed,
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// IptablesCli, except that restores are timed and killed at a deadline.
struct TimedRestore {
    cli: IptablesCli,
    netns: String,
    program: &'static str,
    timeout: Duration,
    records: Arc<Mutex<Vec<RestoreRecord>>>,
}

impl TimedRestore {
    fn command_line(&self) -> String {
        format!(
            "ip netns exec {} {} {}",
            self.netns,
            self.program,
            RESTORE_ARGS.join(" ")
        )
    }

    fn record(&self, payload: &[u8], end: RestoreEnd) {
        let record = RestoreRecord {
            bytes: payload.len(),
            hash: hash_bytes(payload),
            end,
        };
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(record);
    }
}

impl Iptables for TimedRestore {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        self.cli.version()
    }

    fn create_chain(&self, table: Table, chain: &str) -> Result<(), ExecError> {
        self.cli.create_chain(table, chain)
    }

    fn restore(&self, payload: &[u8]) -> Result<(), ExecError> {
        let ended = restore_in(&self.netns, self.program, &RESTORE_ARGS, payload, self.timeout).map_err(
            |source| ExecError::Spawn {
                command: self.command_line(),
                source,
            },
        )?;
        match ended {
            Ended::Exited { status, elapsed, .. } if status.success() => {
                self.record(payload, RestoreEnd::Finished(elapsed));
                Ok(())
            }
            Ended::Exited { status, stderr, .. } => {
                self.record(payload, RestoreEnd::Failed);
                Err(ExecError::Failed {
                    command: self.command_line(),
                    status: status.to_string(),
                    stderr,
                })
            }
            Ended::TimedOut => {
                self.record(payload, RestoreEnd::TimedOut);
                Err(ExecError::Failed {
                    command: self.command_line(),
                    status: format!("killed after {} s", self.timeout.as_secs()),
                    stderr: String::new(),
                })
            }
        }
    }

    fn save(&self, table: Table) -> Result<String, ExecError> {
        self.cli.save(table)
    }

    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        self.cli.chain_exists(table, chain)
    }

    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        self.cli.rule_exists(table, chain, args)
    }

    fn insert_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        self.cli.insert_rule(table, chain, args)
    }

    fn delete_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        self.cli.delete_rule(table, chain, args)
    }
}

/// What to load and how.
pub struct LoadPlan<'a> {
    pub variant: Variant,
    pub options: &'a IptablesOptions,
    /// The state the full sync writes; its payload must be `expected_payload`.
    pub base: &'a Snapshot,
    pub expected_payload: &'a str,
    /// The state after one endpoint changed, for the partial sync.
    pub changed: &'a Snapshot,
    pub timeout: Duration,
    pub runs: usize,
}

/// Up to `plan.runs` measurements, each in a fresh namespace; stops repeating after a
/// failure, a timeout or a slow load.
pub fn measure(plan: &LoadPlan<'_>) -> LoadResult {
    let program = restore_program(plan.variant);
    if !on_path(program) {
        let reason = format!("{program} not installed");
        return LoadResult {
            runs: 0,
            full: Outcome::NotAvailable(reason.clone()),
            partial: Outcome::NotAvailable(reason),
        };
    }
    let mut fulls = Vec::new();
    let mut partials = Vec::new();
    for run in 0..plan.runs.max(1) {
        let (full, partial) = measure_once(plan);
        let (Outcome::Done(full_time), Outcome::Done(partial)) = (&full, &partial) else {
            // Report the first problem as it is, whatever earlier runs measured.
            return LoadResult {
                runs: run + 1,
                full,
                partial,
            };
        };
        fulls.push(*full_time);
        partials.push(partial.clone());
        if *full_time >= REPEAT_BELOW {
            break;
        }
    }
    summarize(fulls, partials)
}

fn summarize(fulls: Vec<Duration>, partials: Vec<Partial>) -> LoadResult {
    let restores: Vec<Duration> = partials.iter().map(|p| p.restore).collect();
    let syncs: Vec<Duration> = partials.iter().map(|p| p.sync).collect();
    LoadResult {
        runs: fulls.len(),
        full: Outcome::Done(median(&fulls).unwrap_or_default()),
        partial: Outcome::Done(Partial {
            bytes: partials.first().map_or(0, |p| p.bytes),
            restore: median(&restores).unwrap_or_default(),
            sync: median(&syncs).unwrap_or_default(),
        }),
    }
}

/// One full load and one partial sync in a namespace of their own.
fn measure_once(plan: &LoadPlan<'_>) -> (Outcome<Duration>, Outcome<Partial>) {
    let skipped = |why: &str| Outcome::NotAvailable(format!("full load {why}"));
    let netns = match Netns::new("bench") {
        Ok(netns) => netns,
        Err(err) => return (Outcome::Failed(format!("namespace: {err}")), skipped("failed")),
    };
    let records = Arc::new(Mutex::new(Vec::new()));
    let exec = TimedRestore {
        cli: IptablesCli::in_netns(IpFamily::V4, plan.variant, netns.name()),
        netns: netns.name().to_string(),
        program: restore_program(plan.variant),
        timeout: plan.timeout,
        records: Arc::clone(&records),
    };
    let mut backend = match IptablesBackend::new(plan.options.clone(), Box::new(exec)) {
        Ok(backend) => backend,
        Err(err) => return (Outcome::Failed(err.to_string()), skipped("failed")),
    };
    let nth_record = |n: usize| {
        records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(n)
            .cloned()
    };

    let synced = backend.sync_rules(&plan.base.request(false));
    let full = full_outcome(synced.map(|r| r.full), nth_record(0), plan);
    if full.done().is_none() {
        return (full, skipped("did not finish"));
    }

    let started = Instant::now();
    let synced = backend.sync_rules(&plan.changed.request(false));
    let sync = started.elapsed();
    let partial = partial_outcome(synced.map(|r| r.full), nth_record(1), sync, plan.timeout);
    (full, partial)
    // The namespace, and every rule loaded into it, is deleted here.
}

fn full_outcome<E: std::fmt::Display>(
    synced: Result<bool, E>,
    record: Option<RestoreRecord>,
    plan: &LoadPlan<'_>,
) -> Outcome<Duration> {
    let expected_hash = hash_bytes(plan.expected_payload.as_bytes());
    match (synced, record) {
        (
            _,
            Some(RestoreRecord {
                end: RestoreEnd::TimedOut,
                ..
            }),
        ) => Outcome::TimedOut(plan.timeout),
        (Err(err), _) => Outcome::Failed(err.to_string()),
        (Ok(false), _) => Outcome::Failed("the first sync was not a full one".to_string()),
        (Ok(true), None) => Outcome::Failed("the full sync ran no restore".to_string()),
        (Ok(true), Some(record)) => match record.end {
            RestoreEnd::Finished(_) if record.hash != expected_hash => Outcome::Failed(format!(
                "the backend wrote {} bytes, not the {} rendered",
                record.bytes,
                plan.expected_payload.len()
            )),
            RestoreEnd::Finished(elapsed) => Outcome::Done(elapsed),
            RestoreEnd::TimedOut | RestoreEnd::Failed => {
                Outcome::Failed("restore failed but the sync succeeded".to_string())
            }
        },
    }
}

fn partial_outcome<E: std::fmt::Display>(
    synced: Result<bool, E>,
    record: Option<RestoreRecord>,
    sync: Duration,
    timeout: Duration,
) -> Outcome<Partial> {
    match (synced, record) {
        (
            _,
            Some(RestoreRecord {
                end: RestoreEnd::TimedOut,
                ..
            }),
        ) => Outcome::TimedOut(timeout),
        (Err(err), _) => Outcome::Failed(err.to_string()),
        (Ok(true), _) => Outcome::Failed("the backend made a full sync, not a partial one".to_string()),
        (
            Ok(false),
            Some(RestoreRecord {
                bytes,
                end: RestoreEnd::Finished(restore),
                ..
            }),
        ) => Outcome::Done(Partial { bytes, restore, sync }),
        (Ok(false), _) => Outcome::Failed("the partial sync ran no successful restore".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Shape, SyntheticCluster};
    use crate::options::bench_options;
    use crate::render;

    #[test]
    fn finds_programs_on_the_path() {
        assert!(on_path("sh"));
        assert!(!on_path("kpr-bench-no-such-program"));
    }

    /// Needs root and iptables-legacy; runs in a namespace of its own.
    #[test]
    fn loads_the_rendered_payload_then_syncs_one_change_partially() {
        if !on_path(restore_program(Variant::Legacy)) {
            eprintln!("iptables-legacy-restore missing; nothing to check");
            return;
        }
        let mut cluster = SyntheticCluster::new(Shape {
            services: 20,
            endpoints: 3,
        })
        .expect("valid");
        let base = cluster.take();
        cluster.replace_one_endpoint().expect("valid");
        let changed = cluster.take();
        let options = bench_options();
        let (rendered, payload) = render::measure(&base.state, &options, 1);
        let result = measure(&LoadPlan {
            variant: Variant::Legacy,
            options: &options,
            base: &base,
            expected_payload: &payload,
            changed: &changed,
            timeout: Duration::from_secs(60),
            runs: 2,
        });
        assert_eq!(result.runs, 2, "{result:?}");
        assert!(result.full.done().is_some(), "{result:?}");
        let partial = result.partial.done().unwrap_or_else(|| panic!("{result:?}"));
        assert!(
            partial.bytes > 0 && partial.bytes < rendered.payload_bytes,
            "{partial:?}"
        );
        assert!(partial.sync >= partial.restore);
    }

    #[test]
    fn a_payload_other_than_the_rendered_one_is_a_failure() {
        let cluster = SyntheticCluster::new(Shape {
            services: 1,
            endpoints: 1,
        })
        .expect("valid")
        .take();
        let plan = LoadPlan {
            variant: Variant::Legacy,
            options: &bench_options(),
            base: &cluster,
            expected_payload: "*nat\nCOMMIT\n",
            changed: &cluster,
            timeout: Duration::from_secs(1),
            runs: 1,
        };
        let record = |payload: &str, end| RestoreRecord {
            bytes: payload.len(),
            hash: hash_bytes(payload.as_bytes()),
            end,
        };
        let second = Duration::from_secs(1);
        let ok: Result<bool, String> = Ok(true);
        assert_eq!(
            full_outcome(
                ok.clone(),
                Some(record("*nat\nCOMMIT\n", RestoreEnd::Finished(second))),
                &plan
            ),
            Outcome::Done(second)
        );
        assert!(matches!(
            full_outcome(
                ok,
                Some(record("*filter\nCOMMIT\n", RestoreEnd::Finished(second))),
                &plan
            ),
            Outcome::Failed(_)
        ));
        let timed_out: Result<bool, String> = Err("killed".into());
        assert_eq!(
            full_outcome(timed_out, Some(record("x", RestoreEnd::TimedOut)), &plan),
            Outcome::TimedOut(second)
        );
    }
}
