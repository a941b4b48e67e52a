//! The only place that runs iptables binaries.
//!
//! Everything above talks to the small [`Iptables`] trait, so sync decisions are tested with
//! a recording fake and no kernel. [`IptablesCli`] is the real thing: it picks the legacy
//! or nf_tables flavour of the binaries (or detects which one already holds kube-proxy
//! rules, like upstream's iptables-wrapper) and can prefix every command, e.g. with
//! `ip netns exec NAME`, so tests program a namespace they created.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use kpr_model::IpFamily;

use crate::ruleset::Table;
use crate::saved::table_section;

/// Seconds to wait for the xtables lock before giving up (legacy backend only).
const WAIT_SECONDS: &str = "5";

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("could not run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("`{command}` printed no version we can read: {output:?}")]
    UnknownVersion { command: String, output: String },
    #[error("`{command}` rejected its input{}: {stderr}", describe_line(*.line, .input_line.as_deref()))]
    Restore {
        command: String,
        /// The 1-based input line iptables-restore reported, if it said.
        line: Option<usize>,
        /// That line of the input.
        input_line: Option<String>,
        stderr: String,
    },
}

fn describe_line(line: Option<usize>, text: Option<&str>) -> String {
    match (line, text) {
        (Some(n), Some(t)) => format!(" at line {n} ({t:?})"),
        (Some(n), None) => format!(" at line {n}"),
        _ => String::new(),
    }
}

/// An iptables version, as `iptables --version` prints it (`iptables v1.8.9 (nf_tables)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct IptablesVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl IptablesVersion {
    /// The first version whose MASQUERADE takes `--random-fully` (upstream's check).
    pub const RANDOM_FULLY: Self = Self {
        major: 1,
        minor: 6,
        patch: 2,
    };

    /// The first `v<major>.<minor>[.<patch>]` in `output`.
    pub fn parse(output: &str) -> Option<Self> {
        output.split_whitespace().find_map(|word| {
            let mut parts = word.strip_prefix('v')?.split('.');
            let number = |part: Option<&str>| part?.parse::<u32>().ok();
            let major = number(parts.next())?;
            let minor = number(parts.next())?;
            let patch = match parts.next() {
                Some(part) => part.parse().ok()?,
                None => 0,
            };
            Some(Self { major, minor, patch })
        })
    }

    pub fn supports_random_fully(self) -> bool {
        self >= Self::RANDOM_FULLY
    }
}

impl std::fmt::Display for IptablesVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What proxy code needs from iptables.
pub trait Iptables: Send {
    /// `iptables --version`.
    fn version(&self) -> Result<IptablesVersion, ExecError>;
    /// Whether these are the nf_tables flavour's binaries, whose `--noflush` restores cost
    /// more than linearly in the size of their input, so large writes are split
    /// ([`crate::RESTORE_CHUNK_CHAINS`]). The default: no (one restore per sync).
    fn is_nf_tables(&self) -> bool {
        false
    }
    /// `iptables-restore --noflush --counters` with `payload` on stdin (one or more tables).
    fn restore(&self, payload: &[u8]) -> Result<(), ExecError>;
    /// `iptables-save -t <table>`.
    fn save(&self, table: Table) -> Result<String, ExecError>;
    /// The table as [`Iptables::save`] gives it, if it exists, without creating it: legacy
    /// iptables instantiates a table in the namespace on the first `-t` that names it, and
    /// from then on the table's hooks see every packet. Looking for leftovers must not add
    /// that cost to a node whose kube-proxy uses the other flavour. `None`: no such table,
    /// so nothing of ours is in it.
    fn save_if_present(&self, table: Table) -> Result<Option<String>, ExecError> {
        self.save(table).map(Some)
    }
    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError>;
    /// `iptables -C`: whether this exact rule is in `chain`.
    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError>;
    /// `iptables -I`: inserts the rule at the top of `chain`.
    fn insert_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError>;
    /// `iptables -D`: deletes one copy of the rule.
    fn delete_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError>;
    /// `iptables -N`: creates an empty chain (an error if it exists).
    fn create_chain(&self, table: Table, chain: &str) -> Result<(), ExecError>;

    /// `iptables -S <chain> 1`: whether `chain` holds at least one rule (`false` when it
    /// is missing). The default answers whether the chain exists.
    fn chain_has_rules(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        self.chain_exists(table, chain)
    }

    /// A copy for a thread that checks our rules between syncs ([`crate::repair`]);
    /// `None` (the default): no such checks, the periodic sync finds the damage.
    fn for_checks(&self) -> Option<Box<dyn Iptables>> {
        None
    }

    /// Creates the chain unless it exists, leaving an existing one's rules alone.
    fn ensure_chain(&self, table: Table, chain: &str) -> Result<(), ExecError> {
        if !self.chain_exists(table, chain)? {
            self.create_chain(table, chain)?;
        }
        Ok(())
    }

    /// Inserts the rule unless it is there; returns whether it was already there.
    fn ensure_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        if self.rule_exists(table, chain, args)? {
            return Ok(true);
        }
        self.insert_rule(table, chain, args)?;
        Ok(false)
    }
}

/// Which iptables binaries to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Variant {
    /// The flavour that already holds more kube rules (upstream's iptables-wrapper rule),
    /// or the plain names (whatever the host's alternatives say) if neither holds any.
    #[default]
    Auto,
    /// The plain `iptables` / `iptables-save` / `iptables-restore` names.
    Plain,
    Legacy,
    Nft,
}

impl Variant {
    fn infix(self) -> &'static str {
        match self {
            Self::Auto | Self::Plain => "",
            Self::Legacy => "-legacy",
            Self::Nft => "-nft",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    Main,
    Save,
    Restore,
}

/// Runs the real iptables binaries of one family and variant.
#[derive(Clone, Debug)]
pub struct IptablesCli {
    family: IpFamily,
    variant: Variant,
    prefix: Vec<String>,
}

impl IptablesCli {
    /// Binaries of `family`; `Variant::Auto` is resolved now (it runs both save binaries).
    pub fn new(family: IpFamily, variant: Variant) -> Self {
        Self::with_command_prefix(family, variant, Vec::new())
    }

    /// Like [`IptablesCli::new`], running every command as `prefix... <binary> <args>`.
    pub fn with_command_prefix(family: IpFamily, variant: Variant, prefix: Vec<String>) -> Self {
        let mut cli = Self {
            family,
            variant,
            prefix,
        };
        if variant == Variant::Auto {
            cli.variant = cli.detect_variant();
        }
        cli
    }

    /// Runs every command inside the network namespace `name` (`ip netns exec name ...`).
    pub fn in_netns(family: IpFamily, variant: Variant, name: &str) -> Self {
        let prefix = ["ip", "netns", "exec", name].map(String::from).to_vec();
        Self::with_command_prefix(family, variant, prefix)
    }

    /// The variant in use (never `Auto`).
    pub fn variant(&self) -> Variant {
        self.variant
    }

    fn binary(&self, variant: Variant, tool: Tool) -> String {
        let base = match self.family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        let suffix = match tool {
            Tool::Main => "",
            Tool::Save => "-save",
            Tool::Restore => "-restore",
        };
        format!("{base}{}{suffix}", variant.infix())
    }

    /// Upstream's iptables-wrapper rule: use the variant that holds more kube rules.
    fn detect_variant(&self) -> Variant {
        let count = |variant| {
            self.run(&self.binary(variant, Tool::Save), &[], None)
                .ok()
                .filter(|out| out.status.success())
                .map_or(0, |out| count_kube_lines(&String::from_utf8_lossy(&out.stdout)))
        };
        let legacy = count(Variant::Legacy);
        let nft = count(Variant::Nft);
        let chosen = match (legacy, nft) {
            (0, 0) => Variant::Plain,
            (l, n) if l > n => Variant::Legacy,
            _ => Variant::Nft,
        };
        tracing::info!(legacy, nft, ?chosen, "picked the iptables variant");
        chosen
    }

    fn command_line(&self, program: &str, args: &[String]) -> String {
        let mut parts: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        parts.push(program);
        parts.extend(args.iter().map(String::as_str));
        parts.join(" ")
    }

    fn run(&self, program: &str, args: &[String], stdin: Option<&[u8]>) -> Result<Output, ExecError> {
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .env("LC_ALL", "C")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawn_error = |source| ExecError::Spawn {
            command: self.command_line(program, args),
            source,
        };
        let started = std::time::Instant::now();
        let mut child = cmd.spawn().map_err(spawn_error)?;
        let input = child.stdin.take();
        // Feed stdin from another thread: a child blocked writing stderr while we block
        // writing its stdin would deadlock on large payloads.
        let output = std::thread::scope(|s| {
            if let (Some(mut pipe), Some(data)) = (input, stdin) {
                // A write error means the child exited early; its status tells why.
                s.spawn(move || pipe.write_all(data));
            }
            child.wait_with_output()
        })
        .map_err(spawn_error)?;
        // Where a slow sync spends its time (a lock waited on, a slow kernel) shows here.
        tracing::debug!(
            command = %self.command_line(program, args),
            status = %output.status,
            elapsed = ?started.elapsed(),
            "ran"
        );
        Ok(output)
    }

    fn failed(&self, program: &str, args: &[String], out: &Output) -> ExecError {
        ExecError::Failed {
            command: self.command_line(program, args),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
    }

    fn table_args(table: Table, op: &str, chain: &str, rule: &[String]) -> Vec<String> {
        let mut args = vec![
            "-w".to_string(),
            WAIT_SECONDS.to_string(),
            "-t".to_string(),
            table.as_str().to_string(),
            op.to_string(),
            chain.to_string(),
        ];
        args.extend(rule.iter().cloned());
        args
    }

    /// Runs `iptables <args>`; exit status 1 ("no such rule/chain") is `Ok(false)`.
    fn check(&self, args: Vec<String>) -> Result<bool, ExecError> {
        let program = self.binary(self.variant, Tool::Main);
        let out = self.run(&program, &args, None)?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(self.failed(&program, &args, &out)),
        }
    }

    fn change(&self, args: Vec<String>) -> Result<(), ExecError> {
        let program = self.binary(self.variant, Tool::Main);
        let out = self.run(&program, &args, None)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(self.failed(&program, &args, &out))
        }
    }
}

impl Iptables for IptablesCli {
    fn version(&self) -> Result<IptablesVersion, ExecError> {
        let program = self.binary(self.variant, Tool::Main);
        let args = ["--version".to_string()];
        let out = self.run(&program, &args, None)?;
        if !out.status.success() {
            return Err(self.failed(&program, &args, &out));
        }
        let output = String::from_utf8_lossy(&out.stdout).into_owned();
        IptablesVersion::parse(&output).ok_or_else(|| ExecError::UnknownVersion {
            command: self.command_line(&program, &args),
            output,
        })
    }

    /// `Nft`, or plain names whose `--version` says `nf_tables`.
    fn is_nf_tables(&self) -> bool {
        match self.variant {
            Variant::Nft => true,
            Variant::Legacy => false,
            Variant::Auto | Variant::Plain => {
                let program = self.binary(self.variant, Tool::Main);
                self.run(&program, &["--version".to_string()], None)
                    .is_ok_and(|out| {
                        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("nf_tables")
                    })
            }
        }
    }

    fn restore(&self, payload: &[u8]) -> Result<(), ExecError> {
        let program = self.binary(self.variant, Tool::Restore);
        let args = ["-w", WAIT_SECONDS, "--noflush", "--counters"].map(String::from);
        let out = self.run(&program, &args, Some(payload))?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        let line = restore_error_line(&stderr);
        let input_line = line.and_then(|n| {
            String::from_utf8_lossy(payload)
                .lines()
                .nth(n.checked_sub(1)?)
                .map(str::to_string)
        });
        Err(ExecError::Restore {
            command: self.command_line(&program, &args),
            line,
            input_line,
            stderr,
        })
    }

    fn save(&self, table: Table) -> Result<String, ExecError> {
        let program = self.binary(self.variant, Tool::Save);
        let args = ["-t".to_string(), table.as_str().to_string()];
        let out = self.run(&program, &args, None)?;
        if !out.status.success() {
            return Err(self.failed(&program, &args, &out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `iptables-save` naming no table prints only the tables that exist.
    fn save_if_present(&self, table: Table) -> Result<Option<String>, ExecError> {
        let program = self.binary(self.variant, Tool::Save);
        let out = self.run(&program, &[], None)?;
        if !out.status.success() {
            return Err(self.failed(&program, &[], &out));
        }
        let dump = String::from_utf8_lossy(&out.stdout);
        Ok(table_section(&dump, table).map(str::to_owned))
    }

    fn chain_exists(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        self.check(Self::table_args(table, "-S", chain, &[]))
    }

    fn chain_has_rules(&self, table: Table, chain: &str) -> Result<bool, ExecError> {
        // `-S <chain> 1` prints the chain's first rule, nothing for an empty chain, and
        // fails (status 1) for a missing one.
        let program = self.binary(self.variant, Tool::Main);
        let args = Self::table_args(table, "-S", chain, &["1".to_string()]);
        let out = self.run(&program, &args, None)?;
        match out.status.code() {
            Some(0) => Ok(out.stdout.iter().any(|b| !b.is_ascii_whitespace())),
            Some(1) => Ok(false),
            _ => Err(self.failed(&program, &args, &out)),
        }
    }

    fn for_checks(&self) -> Option<Box<dyn Iptables>> {
        Some(Box::new(self.clone()))
    }

    fn rule_exists(&self, table: Table, chain: &str, args: &[String]) -> Result<bool, ExecError> {
        self.check(Self::table_args(table, "-C", chain, args))
    }

    fn insert_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        self.change(Self::table_args(table, "-I", chain, args))
    }

    fn delete_rule(&self, table: Table, chain: &str, args: &[String]) -> Result<(), ExecError> {
        self.change(Self::table_args(table, "-D", chain, args))
    }

    fn create_chain(&self, table: Table, chain: &str) -> Result<(), ExecError> {
        self.change(Self::table_args(table, "-N", chain, &[]))
    }
}

/// Lines of `iptables-save` output that mention a kube chain.
fn count_kube_lines(saved: &str) -> usize {
    saved
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("KUBE-"))
        .count()
}

/// The input line an `iptables-restore` error names. Both flavours say `line N` somewhere:
/// "iptables-restore: line 3 failed", "line 3: CHAIN_DEL failed", "Error occurred at line: 5".
pub fn restore_error_line(stderr: &str) -> Option<usize> {
    let mut rest = stderr;
    while let Some(at) = rest.find("line") {
        let after = rest[at + 4..].trim_start_matches([':', ' ']);
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(n) = digits.parse() {
            return Some(n);
        }
        rest = &rest[at + 4..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_failed_line_in_both_flavours_messages() {
        assert_eq!(restore_error_line("iptables-restore: line 3 failed"), Some(3));
        assert_eq!(
            restore_error_line(
                "iptables-nft-restore v1.8.9 (nf_tables): \nline 12: CHAIN_DEL failed (Device or resource busy): chain KUBE-A"
            ),
            Some(12)
        );
        assert_eq!(
            restore_error_line(
                "iptables-restore v1.8.9 (legacy): Couldn't load target `NOPE'\n\nError occurred at line: 5\nTry"
            ),
            Some(5)
        );
        assert_eq!(
            restore_error_line("Another app is currently holding the xtables lock"),
            None
        );
    }

    #[test]
    fn versions_are_read_like_upstream() {
        let v = |s: &str| IptablesVersion::parse(s);
        assert_eq!(
            v("iptables v1.8.9 (nf_tables)"),
            Some(IptablesVersion {
                major: 1,
                minor: 8,
                patch: 9
            })
        );
        assert!(v("iptables v1.8.9 (legacy)").unwrap().supports_random_fully());
        assert!(v("iptables v1.6.2").unwrap().supports_random_fully());
        assert!(!v("iptables v1.6.1").unwrap().supports_random_fully());
        assert!(!v("iptables v1.4.21").unwrap().supports_random_fully());
        assert_eq!(v("iptables v1.6").map(|v| v.patch), Some(0));
        assert_eq!(v("iptables version unknown"), None);
        assert_eq!(v(""), None);
    }

    #[test]
    fn binary_names_follow_family_and_variant() {
        let cli = IptablesCli::with_command_prefix(IpFamily::V6, Variant::Legacy, vec![]);
        assert_eq!(
            cli.binary(Variant::Legacy, Tool::Restore),
            "ip6tables-legacy-restore"
        );
        let cli = IptablesCli::with_command_prefix(IpFamily::V4, Variant::Plain, vec![]);
        assert_eq!(cli.binary(Variant::Plain, Tool::Main), "iptables");
        assert_eq!(cli.binary(Variant::Nft, Tool::Save), "iptables-nft-save");
    }

    #[test]
    fn spawn_errors_name_the_command() {
        let cli = IptablesCli::with_command_prefix(
            IpFamily::V4,
            Variant::Plain,
            vec!["/nonexistent/wrapper".to_string()],
        );
        let err = cli.save(Table::Nat).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("could not run `/nonexistent/wrapper iptables-save -t nat`"),
            "{err}"
        );
    }

    #[test]
    fn counts_only_kube_lines() {
        let saved = "# Generated by iptables-save\n*nat\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A PREROUTING -j OTHER\n# KUBE- comment\nCOMMIT\n";
        assert_eq!(count_kube_lines(saved), 2);
    }
}
