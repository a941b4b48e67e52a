//! What the check between syncs calls damage, against a fake table.

use std::collections::HashSet;
use std::sync::Mutex;

use super::*;
use crate::exec::IptablesVersion;

/// Chains (with whether they hold rules) and jump rules.
#[derive(Default)]
struct Tables {
    chains: Mutex<HashSet<(Table, String, bool)>>,
    rules: Mutex<HashSet<(Table, String, Vec<String>)>>,
}

fn unused() -> ExecError {
    ExecError::Failed {
        command: "unused".into(),
        status: "exit status: 4".into(),
        stderr: String::new(),
    }
}

impl Iptables for Tables {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        Err(unused())
    }
    fn restore(&self, _: &[u8]) -> Result<(), ExecError> {
        Err(unused())
    }
    fn save(&self, _: Table) -> Result<String, ExecError> {
        Err(unused())
    }
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        Ok(self
            .chains
            .lock()
            .unwrap()
            .iter()
            .any(|(t, c, _)| *t == table && c == chain))
    }
    fn chain_has_rules(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        Ok(self
            .chains
            .lock()
            .unwrap()
            .contains(&(table, chain.to_string(), true)))
    }
    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        Ok(self
            .rules
            .lock()
            .unwrap()
            .contains(&(table, chain.to_string(), args.to_vec())))
    }
    fn insert_rule(&self, _: Table, _: &str, _: &[String]) -> Result<(), ExecError> {
        Err(unused())
    }
    fn delete_rule(&self, _: Table, _: &str, _: &[String]) -> Result<(), ExecError> {
        Err(unused())
    }
    fn create_chain(&self, _: Table, _: &str) -> Result<(), ExecError> {
        Err(unused())
    }
}

/// Everything a sync writes that the check looks at.
fn intact() -> Tables {
    let tables = Tables::default();
    for table in [Table::Nat, Table::Filter] {
        tables
            .chains
            .lock()
            .unwrap()
            .insert((table, chain::CANARY.into(), false));
    }
    tables
        .chains
        .lock()
        .unwrap()
        .insert((Table::Nat, chain::SERVICES.into(), true));
    for jump in jump_rules() {
        tables
            .rules
            .lock()
            .unwrap()
            .insert((jump.table, jump.chain.into(), jump.args));
    }
    tables
}

#[test]
fn intact_rules_are_no_damage() {
    assert_eq!(damage(&intact(), true, true).unwrap(), None);
}

#[test]
fn a_missing_canary_a_flushed_services_chain_or_a_missing_jump_is_damage() {
    let t = intact();
    t.chains
        .lock()
        .unwrap()
        .remove(&(Table::Nat, chain::CANARY.into(), false));
    assert_eq!(
        damage(&t, true, false).unwrap(),
        Some(Damage::CanaryMissing(Table::Nat))
    );

    let t = intact();
    t.chains
        .lock()
        .unwrap()
        .remove(&(Table::Nat, chain::SERVICES.into(), true));
    t.chains
        .lock()
        .unwrap()
        .insert((Table::Nat, chain::SERVICES.into(), false));
    assert_eq!(damage(&t, true, false).unwrap(), Some(Damage::ServicesEmpty));
    assert_eq!(
        damage(&t, false, true).unwrap(),
        None,
        "an empty KUBE-SERVICES we wrote empty"
    );

    let t = intact();
    t.rules
        .lock()
        .unwrap()
        .retain(|(table, c, _)| !(*table == Table::Nat && c == "OUTPUT"));
    assert_eq!(
        damage(&t, true, false).unwrap(),
        Some(Damage::JumpMissing {
            table: Table::Nat,
            chain: "OUTPUT",
            target: chain::SERVICES
        })
    );
}

#[test]
fn the_filter_table_is_checked_only_on_thorough_checks() {
    let t = intact();
    t.chains
        .lock()
        .unwrap()
        .remove(&(Table::Filter, chain::CANARY.into(), false));
    assert_eq!(damage(&t, true, false).unwrap(), None);
    assert_eq!(
        damage(&t, true, true).unwrap(),
        Some(Damage::CanaryMissing(Table::Filter))
    );
    let t = intact();
    t.rules
        .lock()
        .unwrap()
        .retain(|(table, c, _)| !(*table == Table::Filter && c == "FORWARD"));
    assert!(matches!(
        damage(&t, true, true).unwrap(),
        Some(Damage::JumpMissing {
            table: Table::Filter,
            chain: "FORWARD",
            ..
        })
    ));
}
