//! Repair at once: a thread checks, between syncs, that what we wrote is still there, and
//! asks for a full sync when it is not.
//!
//! iptables announces nothing, so the check polls: every [`CHECK_INTERVAL`], the nat
//! table's canary chain, the first rule of KUBE-SERVICES (when the last sync wrote one)
//! and the nat jumps into our chains (the Service path: PREROUTING and OUTPUT to
//! KUBE-SERVICES, POSTROUTING to KUBE-POSTROUTING); every [`THOROUGH_EVERY`]th check also
//! the filter table's canary and jumps. One `iptables` process per item, stopping at the
//! first missing one: a table flushed or replaced (`iptables -t nat -F`, an
//! `iptables-restore` without our chains, a deleted canary) or KUBE-SERVICES flushed.
//!
//! The check only runs between our own syncs: the backend disarms it when a sync starts
//! and re-arms it when one succeeds, and a check that overlapped a sync is thrown away, so
//! our own writes are never taken for damage. After it fires it stays disarmed until the
//! repair sync succeeded: one request per damage, never a loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use kpr_naming::chain;
use kpr_state::RepairRequest;

use crate::exec::{ExecError, Iptables};
use crate::jumps::jump_rules;
use crate::ruleset::Table;

/// How often the nat items are checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Every this many checks, the filter table's items too.
pub const THOROUGH_EVERY: u64 = 10;

/// The first thing found missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    CanaryMissing(Table),
    ServicesEmpty,
    JumpMissing {
        table: Table,
        chain: &'static str,
        target: &'static str,
    },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CanaryMissing(table) => {
                write!(f, "the canary chain {} is gone from table {table}", chain::CANARY)
            }
            Self::ServicesEmpty => write!(f, "chain {} in table nat was flushed or deleted", chain::SERVICES),
            Self::JumpMissing { table, chain, target } => {
                write!(f, "the jump from {table} {chain} to {target} is gone")
            }
        }
    }
}

/// The first missing item, in the order above: the nat table's (canary, KUBE-SERVICES'
/// first rule when `services_has_rules`, jumps), then, when `thorough`, the filter table's
/// (canary, jumps).
pub fn damage(
    exec: &dyn Iptables,
    services_has_rules: bool,
    thorough: bool,
) -> Result<Option<Damage>, ExecError> {
    let tables: &[Table] = if thorough {
        &[Table::Nat, Table::Filter]
    } else {
        &[Table::Nat]
    };
    for &table in tables {
        if !exec.chain_exists(table, chain::CANARY)? {
            return Ok(Some(Damage::CanaryMissing(table)));
        }
        if table == Table::Nat && services_has_rules && !exec.chain_has_rules(table, chain::SERVICES)? {
            return Ok(Some(Damage::ServicesEmpty));
        }
        for jump in jump_rules().into_iter().filter(|j| j.table == table) {
            if !exec.rule_exists(table, jump.chain, &jump.args)? {
                return Ok(Some(Damage::JumpMissing {
                    table,
                    chain: jump.chain,
                    target: jump.target,
                }));
            }
        }
    }
    Ok(None)
}

/// What the backend and the checking thread share.
#[derive(Debug, Default)]
struct Shared {
    /// Set when a sync succeeded, cleared when one starts or the check fired.
    armed: AtomicBool,
    /// Bumped when a sync starts and when it ends: a check that saw it change is stale.
    epoch: AtomicU64,
    /// Damage was found: the next sync must be full.
    pending: AtomicBool,
    /// Whether the last successful sync wrote rules into KUBE-SERVICES.
    services_has_rules: AtomicBool,
}

/// The running check of one family's rules; stops and joins its thread when dropped.
#[derive(Debug)]
pub struct RepairCheck {
    shared: Arc<Shared>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RepairCheck {
    /// Starts checking through `exec` every `interval`, disarmed until a sync succeeds.
    pub fn start(
        exec: Box<dyn Iptables>,
        interval: Duration,
        repair: RepairRequest,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = mpsc::channel();
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("iptables-repair".into())
            .spawn(move || check_loop(exec.as_ref(), interval, &stopped, &state, &repair))?;
        Ok(Self {
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// A sync starts: checks pause (and one running now is thrown away).
    pub fn sync_started(&self) {
        self.shared.armed.store(false, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// A sync ended; after a success the checks resume.
    pub fn sync_ended(&self, succeeded: bool, services_has_rules: bool) {
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        self.shared
            .services_has_rules
            .store(services_has_rules, Ordering::SeqCst);
        self.shared.armed.store(succeeded, Ordering::SeqCst);
    }

    /// Whether a check found damage since the last call (then this sync must be full);
    /// clears the mark.
    pub fn take_pending(&self) -> bool {
        self.shared.pending.swap(false, Ordering::SeqCst)
    }
}

impl Drop for RepairCheck {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn check_loop(
    exec: &dyn Iptables,
    interval: Duration,
    stopped: &mpsc::Receiver<()>,
    shared: &Shared,
    repair: &RepairRequest,
) {
    let mut checks: u64 = 0;
    loop {
        match stopped.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        if !shared.armed.load(Ordering::SeqCst) {
            continue;
        }
        checks += 1;
        let epoch = shared.epoch.load(Ordering::SeqCst);
        let services = shared.services_has_rules.load(Ordering::SeqCst);
        let found = damage(exec, services, checks.is_multiple_of(THOROUGH_EVERY));
        let current = shared.armed.load(Ordering::SeqCst) && shared.epoch.load(Ordering::SeqCst) == epoch;
        match found {
            Ok(Some(damage)) if current => {
                shared.armed.store(false, Ordering::SeqCst);
                shared.pending.store(true, Ordering::SeqCst);
                tracing::warn!("{damage}: someone else changed our rules; repairing them now");
                repair.request();
            }
            Ok(_) => {}
            Err(error) => tracing::debug!("checking our iptables rules: {error}"),
        }
    }
}

#[cfg(test)]
mod tests;
