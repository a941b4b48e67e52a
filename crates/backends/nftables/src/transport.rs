//! The one way the backend reaches the kernel: [`Transport`].
//!
//! `apply` sends one batch as one atomic nf_tables transaction; `read_back` lists our
//! table without set elements (chains, their rules, the names of sets), which a reconcile
//! compares with what it expects. The real implementation here, [`NftCli`], feeds nft text
//! to `nft -f -` (tests, tools and the oracle); [`crate::NetlinkTransport`] sends the same
//! batches over nf_tables netlink and is what the proxy runs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::process::{Command, Stdio};

use kpr_model::IpFamily;
use kpr_nfnetlink::ObjectType;

use crate::batch::{Batch, batch_text};
use crate::render::{TABLE, family_word};

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot run {program}: {source} (is nftables installed? the nft binary is needed)")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("nft refused the batch ({status}): {stderr}")]
    Refused { status: String, stderr: String },
    #[error("nft could not list table {table}: {stderr}")]
    List { table: String, stderr: String },
    #[error("reading nft's JSON listing: {0}")]
    Json(String),
    #[error("{0}")]
    Netlink(#[source] kpr_nfnetlink::Error),
}

/// Our table as the kernel holds it, without set elements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Chain name -> its rules, each as the transport's text of its expressions (nft's
    /// JSON, or kpr-nfnetlink's expression list), handles left out: compared only with a
    /// listing of the same transport.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Names of sets and maps.
    pub sets: BTreeSet<String>,
    /// The kernel's handle of each chain and set: foreign objects are deleted by handle, so
    /// their names (any text) never go into a command.
    pub chain_handles: BTreeMap<String, u64>,
    pub set_handles: BTreeMap<String, u64>,
    /// Stateful objects (our named counters, anyone's quotas, ...) by type and name, with
    /// the kernel's handle.
    pub objects: BTreeMap<(ObjectType, String), u64>,
}

pub trait Transport: Send {
    /// Applies `batch` as one atomic transaction.
    fn apply(&mut self, batch: &Batch) -> Result<(), TransportError>;

    /// Lists our table of `family`, or `None` when it does not exist.
    fn read_back(&mut self, family: IpFamily) -> Result<Option<Listing>, TransportError>;

    /// Has the kernel validate `batch` without committing it (start-up feature checks).
    fn check(&mut self, batch: &Batch) -> Result<(), TransportError>;

    /// Whether someone else committed nf_tables changes since this transport last asked
    /// (then our table may differ from what we wrote); `None` when the transport cannot
    /// tell cheaply, and the backend reads the table back on its reconcile period.
    fn foreign_changes(&mut self) -> Result<Option<bool>, TransportError> {
        Ok(None)
    }

    /// Whether [`Transport::read_back`] is cheap enough to run after every full sync (then
    /// the listing that rules are compared with is taken right after we wrote them).
    fn cheap_read_back(&self) -> bool {
        false
    }

    /// The netlink port id our batches carry, when this transport sends them from one
    /// socket of its own: the backend then watches nf_tables notifications and repairs
    /// someone else's change to its table at once ([`crate::repair`]). `None`: foreign
    /// changes are found by the periodic sync.
    fn own_port_id(&self) -> Option<u32> {
        None
    }
}

/// A transport without a kernel: every batch is accepted, there is no table to read back
/// and nobody else commits. The backend's own state does not depend on the kernel's
/// answers while every batch succeeds, so this measures and tests what the backend keeps
/// between syncs (the churn tests, kpr-sync's included) without a namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoKernel;

impl Transport for NoKernel {
    fn apply(&mut self, _batch: &Batch) -> Result<(), TransportError> {
        Ok(())
    }

    fn read_back(&mut self, _family: IpFamily) -> Result<Option<Listing>, TransportError> {
        Ok(None)
    }

    fn check(&mut self, _batch: &Batch) -> Result<(), TransportError> {
        Ok(())
    }

    fn foreign_changes(&mut self) -> Result<Option<bool>, TransportError> {
        Ok(Some(false))
    }
}

/// `nft` as a child process, optionally behind a prefix such as `ip netns exec NAME`.
#[derive(Clone, Debug)]
pub struct NftCli {
    command: Vec<String>,
    affinity_capacity: u32,
}

impl NftCli {
    pub fn new(affinity_capacity: u32) -> Self {
        Self {
            command: vec!["nft".to_string()],
            affinity_capacity,
        }
    }

    /// Runs nft behind `prefix` (e.g. `["ip", "netns", "exec", "ns1"]`).
    pub fn with_prefix(mut self, prefix: &[&str]) -> Self {
        let mut command: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        command.append(&mut self.command);
        self.command = command;
        self
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.command[0]);
        cmd.args(&self.command[1..]);
        cmd
    }

    fn spawn_error(&self, source: std::io::Error) -> TransportError {
        TransportError::Spawn {
            program: self.command.join(" "),
            source,
        }
    }

    /// Runs `nft -f -` with `script` (also for tests and tools).
    pub fn run_script(&self, script: &str) -> Result<(), TransportError> {
        self.feed(&["-f", "-"], script)
    }

    fn feed(&self, args: &[&str], script: &str) -> Result<(), TransportError> {
        let mut child = self
            .command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.spawn_error(e))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A write error shows as nft's own failure below.
            let _ = stdin.write_all(script.as_bytes());
        }
        let output = child.wait_with_output().map_err(|e| self.spawn_error(e))?;
        if output.status.success() {
            return Ok(());
        }
        Err(TransportError::Refused {
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr)
                .chars()
                .take(4096)
                .collect(),
        })
    }

    /// `nft list table <family> kube-proxy` as text (for tests and debugging).
    pub fn list_text(&self, family: IpFamily) -> Result<String, TransportError> {
        let table = format!("{} {TABLE}", family_word(family));
        let output = self
            .command()
            .args(["list", "table", family_word(family), TABLE])
            .output()
            .map_err(|e| self.spawn_error(e))?;
        if !output.status.success() {
            return Err(TransportError::List {
                table,
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Transport for NftCli {
    fn apply(&mut self, batch: &Batch) -> Result<(), TransportError> {
        self.run_script(&batch_text(batch, self.affinity_capacity))
    }

    fn check(&mut self, batch: &Batch) -> Result<(), TransportError> {
        self.feed(
            &["--check", "-f", "-"],
            &batch_text(batch, self.affinity_capacity),
        )
    }

    fn read_back(&mut self, family: IpFamily) -> Result<Option<Listing>, TransportError> {
        let output = self
            .command()
            .args(["-j", "-t", "list", "table", family_word(family), TABLE])
            .output()
            .map_err(|e| self.spawn_error(e))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            if stderr.contains("No such file or directory") {
                return Ok(None);
            }
            return Err(TransportError::List {
                table: format!("{} {TABLE}", family_word(family)),
                stderr,
            });
        }
        parse_listing(&output.stdout).map(Some)
    }
}

/// Reads `nft -j -t list table` output.
pub fn parse_listing(json: &[u8]) -> Result<Listing, TransportError> {
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| TransportError::Json(e.to_string()))?;
    let items = value
        .get("nftables")
        .and_then(|v| v.as_array())
        .ok_or_else(|| TransportError::Json("no \"nftables\" array".to_string()))?;
    let mut listing = Listing::default();
    for item in items {
        let handle = |object: &serde_json::Value| object.get("handle").and_then(|h| h.as_u64());
        if let Some(chain) = item.get("chain") {
            if let Some(name) = chain.get("name").and_then(|n| n.as_str()) {
                listing.chains.entry(name.to_string()).or_default();
                if let Some(handle) = handle(chain) {
                    listing.chain_handles.insert(name.to_string(), handle);
                }
            }
        } else if let Some(set) = item.get("set").or_else(|| item.get("map")) {
            if let Some(name) = set.get("name").and_then(|n| n.as_str()) {
                listing.sets.insert(name.to_string());
                if let Some(handle) = handle(set) {
                    listing.set_handles.insert(name.to_string(), handle);
                }
            }
        } else if let Some((kind, object)) = item.as_object().and_then(|o| {
            o.iter()
                .find_map(|(key, value)| Some((ObjectType::from_keyword(key)?, value)))
        }) {
            if let (Some(name), Some(handle)) = (object.get("name").and_then(|n| n.as_str()), handle(object))
            {
                listing.objects.insert((kind, name.to_string()), handle);
            }
        } else if let Some(rule) = item.get("rule") {
            let chain = rule.get("chain").and_then(|c| c.as_str()).unwrap_or_default();
            let expr = rule.get("expr").map(|e| e.to_string()).unwrap_or_default();
            listing.chains.entry(chain.to_string()).or_default().push(expr);
        }
    }
    Ok(listing)
}
