//! A model of the kernel's iptables tables, so the `render` target can run the real
//! iptables backend through a sequence of syncs and look at what they leave behind.
//!
//! It keeps what matters for that: chains and their rules per table, `iptables-restore
//! --noflush` semantics (declaring a chain flushes it, chains not named keep their rules),
//! `iptables-save`, and the one-rule calls the backend makes on built-in chains. It refuses
//! what the kernel would refuse in a way the renderer could cause: a jump to a `KUBE-` chain
//! that does not exist, deleting a chain that still has rules or is still jumped to. Each
//! payload also passes kpr-iptables' `check_payload` first. Refusals panic: they are findings.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kpr_iptables::{ExecError, Iptables, IptablesVersion, Table};

use kpr_iptables::restore_syntax::{check_payload, split_args};

/// Chains and their rules (the text after `-A CHAIN `), per table.
pub type Tables = BTreeMap<&'static str, BTreeMap<String, Vec<String>>>;

const BUILTIN: [(&str, &[&str]); 2] = [
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
];

/// Shared by the backend (as its `Iptables`) and the caller, who reads the tables.
#[derive(Clone, Debug)]
pub struct ModelKernel(Arc<Mutex<Tables>>);

impl Default for ModelKernel {
    fn default() -> Self {
        let tables = BUILTIN
            .iter()
            .map(|(table, chains)| {
                let chains = chains.iter().map(|c| ((*c).to_owned(), Vec::new())).collect();
                (*table, chains)
            })
            .collect();
        Self(Arc::new(Mutex::new(tables)))
    }
}

impl ModelKernel {
    /// What the tables hold now.
    pub fn tables(&self) -> Tables {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding the lock is already the finding; read on regardless.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn chains(tables: &mut Tables, table: Table) -> &mut BTreeMap<String, Vec<String>> {
        tables.entry(table_name(table)).or_default()
    }
}

fn table_name(table: Table) -> &'static str {
    match table {
        Table::Filter => "filter",
        Table::Nat => "nat",
        Table::Mangle => "mangle",
    }
}

impl Iptables for ModelKernel {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        Ok(IptablesVersion {
            major: 1,
            minor: 8,
            patch: 9,
        })
    }

    fn restore(&self, payload: &[u8]) -> Result<(), ExecError> {
        let Ok(text) = std::str::from_utf8(payload) else {
            panic!("restore payload is not UTF-8");
        };
        if let Err(error) = check_payload(text) {
            panic!("{error}\n--- payload ---\n{text}");
        }
        let mut tables = self.lock();
        let mut current: Option<&'static str> = None;
        for line in text.lines() {
            if let Some(table) = line.strip_prefix('*') {
                current = BUILTIN
                    .iter()
                    .map(|(t, _)| *t)
                    .find(|t| *t == table)
                    .or(Some("mangle"));
                continue;
            }
            let Some(table) = current else { continue };
            let chains = tables.entry(table).or_default();
            if line == "COMMIT" {
                check_jumps(table, chains, text);
                current = None;
            } else if let Some(declared) = line.strip_prefix(':') {
                let name = declared.split(' ').next().unwrap_or_default();
                chains.insert(name.to_owned(), Vec::new());
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
                chains.entry(chain.to_owned()).or_default().push(rule.to_owned());
            } else if let Some(chain) = line.strip_prefix("-X ") {
                match chains.remove(chain) {
                    Some(rules) if rules.is_empty() => {}
                    _ => panic!("restore deletes {table} chain {chain}, which has rules\n{text}"),
                }
            }
        }
        Ok(())
    }

    fn save(&self, table: Table) -> Result<String, ExecError> {
        let mut tables = self.lock();
        let name = table_name(table);
        let chains = Self::chains(&mut tables, table);
        let mut out = format!("*{name}\n");
        for chain in chains.keys() {
            let policy = if is_builtin(name, chain) { "ACCEPT" } else { "-" };
            out.push_str(&format!(":{chain} {policy} [0:0]\n"));
        }
        for (chain, rules) in chains.iter() {
            for rule in rules {
                out.push_str(&format!("-A {chain} {rule}\n"));
            }
        }
        out.push_str("COMMIT\n");
        Ok(out)
    }

    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        Ok(Self::chains(&mut self.lock(), table).contains_key(chain))
    }

    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        let rule = args.join(" ");
        Ok(Self::chains(&mut self.lock(), table)
            .get(chain)
            .is_some_and(|rules| rules.contains(&rule)))
    }

    fn insert_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        let mut tables = self.lock();
        let chains = Self::chains(&mut tables, table);
        let Some(rules) = chains.get_mut(chain) else {
            panic!("insert into missing {} chain {chain}", table_name(table));
        };
        rules.insert(0, args.join(" "));
        Ok(())
    }

    fn create_chain(&self, table: Table, chain: &str) -> Result<(), ExecError> {
        let mut tables = self.lock();
        let chains = Self::chains(&mut tables, table);
        if chains.contains_key(chain) {
            return Err(ExecError::Failed {
                command: format!("iptables -t {} -N {chain}", table_name(table)),
                status: "exit status: 1".to_owned(),
                stderr: "iptables: Chain already exists.".to_owned(),
            });
        }
        chains.insert(chain.to_owned(), Vec::new());
        Ok(())
    }

    fn delete_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        let rule = args.join(" ");
        let mut tables = self.lock();
        if let Some(rules) = Self::chains(&mut tables, table).get_mut(chain)
            && let Some(at) = rules.iter().position(|r| *r == rule)
        {
            rules.remove(at);
        }
        Ok(())
    }
}

fn is_builtin(table: &str, chain: &str) -> bool {
    BUILTIN
        .iter()
        .any(|(t, chains)| *t == table && chains.contains(&chain))
}

/// After a table's COMMIT: every jump to a `KUBE-` chain lands on a chain that exists, as
/// iptables-restore refuses the whole transaction otherwise.
fn check_jumps(table: &str, chains: &BTreeMap<String, Vec<String>>, payload: &str) {
    for (chain, rules) in chains {
        for rule in rules {
            let Some(target) = jump_target(rule) else {
                continue;
            };
            assert!(
                !target.starts_with("KUBE-") || chains.contains_key(&target),
                "{table} chain {chain} jumps to {target}, which does not exist after the restore:\n\
                 -A {chain} {rule}\n--- payload ---\n{payload}"
            );
        }
    }
}

fn jump_target(rule: &str) -> Option<String> {
    let words = split_args(rule).ok()?;
    let at = words.iter().rposition(|w| w == "-j" || w == "-g")?;
    words.get(at + 1).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_flushes_declared_chains_and_keeps_the_rest() {
        let kernel = ModelKernel::default();
        let first =
            "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-B\n-A KUBE-B -j ACCEPT\nCOMMIT\n";
        kernel.restore(first.as_bytes()).unwrap();
        kernel
            .restore(b"*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j DROP\nCOMMIT\n")
            .unwrap();
        let nat = &kernel.tables()["nat"];
        assert_eq!(nat["KUBE-A"], ["-j DROP"]);
        assert_eq!(nat["KUBE-B"], ["-j ACCEPT"]);
        let saved = kernel.save(Table::Nat).unwrap();
        for line in [
            ":PREROUTING ACCEPT [0:0]",
            ":KUBE-A - [0:0]",
            "-A KUBE-B -j ACCEPT",
        ] {
            assert!(saved.lines().any(|l| l == line), "{line} in {saved}");
        }
    }

    #[test]
    #[should_panic(expected = "jumps to KUBE-GONE")]
    fn a_jump_to_a_missing_chain_fails_the_restore() {
        let kernel = ModelKernel::default();
        let _ = kernel
            .restore(b"*nat\n:KUBE-A - [0:0]\n-A KUBE-A -m comment --comment \"x\" -j KUBE-GONE\nCOMMIT\n");
    }

    #[test]
    #[should_panic(expected = "jumps to KUBE-B")]
    fn deleting_a_chain_still_jumped_to_fails_the_restore() {
        let kernel = ModelKernel::default();
        let setup = "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-B\nCOMMIT\n";
        kernel.restore(setup.as_bytes()).unwrap();
        let _ = kernel.restore(b"*nat\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n");
    }

    #[test]
    fn builtin_chain_rules_are_checked_inserted_and_deleted() {
        let kernel = ModelKernel::default();
        let args: Vec<String> = ["-m", "comment", "--comment", "x y", "-j", "KUBE-SERVICES"]
            .map(String::from)
            .to_vec();
        assert!(!kernel.ensure_rule(Table::Nat, "OUTPUT", &args).unwrap());
        assert!(kernel.ensure_rule(Table::Nat, "OUTPUT", &args).unwrap());
        kernel.delete_rule(Table::Nat, "OUTPUT", &args).unwrap();
        assert!(!kernel.rule_exists(Table::Nat, "OUTPUT", &args).unwrap());
        assert!(kernel.chain_exists(Table::Filter, "FORWARD").unwrap());
        assert!(!kernel.chain_exists(Table::Nat, "KUBE-SERVICES").unwrap());
    }
}
