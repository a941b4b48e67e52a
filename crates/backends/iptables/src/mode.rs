//! iptables mode behind the mode seam: the settings and the node's facts turned into one
//! backend per IP family (`iptables` for IPv4, `ip6tables` for IPv6), whether a family can
//! be programmed here at all, its metrics, `--dry-run`, `--init-only` and its leftovers.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kpr_conntrack::Reconciler;
use kpr_explain::Explainer;
use kpr_host::{InterfaceAddresses, ProcSysctl};
use kpr_mode::{Deprecation, FamilyMode, Fatal, Gate, Leftovers, Mode, ModeContext, ProxyMode, Settings};
use kpr_model::IpFamily;
use kpr_state::{Backend, DesiredState};
use prometheus_client::registry::Registry;

use crate::cleanup::IptablesFootprint;
use crate::everywhere::remove_everywhere;
use crate::exec::{Iptables, IptablesCli, Variant};
use crate::explain::IptablesExplainer;
use crate::host::prepare_host;
use crate::metrics::IptablesMetrics;
use crate::metrics::nfacct::{IptablesCounter, PacketCounters, register_nfacct_metrics};
use crate::nfacct::{
    Accounting, CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED, NetlinkAccounting, ensure_counters,
};
use crate::options::IptablesOptions;
use crate::proxier::IptablesBackend;
use crate::rules::render_dry_run;
use crate::ruleset::Table;

/// The mode's one set of metrics, shared by both families' backends.
static METRICS: OnceLock<IptablesMetrics> = OnceLock::new();

/// iptables mode.
#[derive(Clone, Copy, Debug, Default)]
pub struct IptablesMode;

impl Mode for IptablesMode {
    fn name(&self) -> ProxyMode {
        ProxyMode::Iptables
    }

    fn requirement(&self) -> &'static str {
        "its iptables can list the nat table"
    }

    fn gate(&self) -> Option<Gate> {
        None
    }

    fn deprecation(&self) -> Option<Deprecation> {
        None
    }

    fn check_host(&self, _settings: &Settings) -> Result<(), Fatal> {
        Ok(())
    }

    fn supports(&self, family: IpFamily) -> bool {
        nat_table_works(family)
    }

    /// Upstream starts the ServiceCIDR informer only for nftables mode.
    fn uses_service_cidrs(&self) -> bool {
        false
    }

    /// Upstream's rule counts and restore failures, and its two nfacct packet counters.
    fn register_metrics(&self, _settings: &Settings, registry: &mut Registry) {
        METRICS.get_or_init(|| IptablesMetrics::register(registry));
        register_nfacct_metrics(registry, Arc::new(NfacctReader));
    }

    fn family(&self, context: &ModeContext<'_>, family: IpFamily) -> Result<Box<dyn FamilyMode>, Fatal> {
        Ok(Box::new(IptablesFamily {
            options: options(context, family),
            sync_period: context.sync_period,
        }))
    }

    /// The rules keep serving without the process, as upstream's do.
    fn on_shutdown(&self, _families: &[IpFamily]) {}

    fn remove_leftovers(&self, _settings: &Settings) -> Leftovers {
        remove_everywhere(&IptablesFootprint)
    }

    fn adopts(&self) -> &'static [ProxyMode] {
        &[]
    }

    fn explainer(&self) -> Option<&dyn Explainer> {
        Some(&IptablesExplainer)
    }
}

/// Upstream's `Present()`: the family's iptables can list the nat table's POSTROUTING chain
/// (the tools are installed, the kernel has the family and its nat table). Modes that write
/// iptables rules of their own ask the same.
pub fn nat_table_works(family: IpFamily) -> bool {
    let cli = IptablesCli::new(family, Variant::Auto);
    match cli.chain_exists(Table::Nat, "POSTROUTING") {
        Ok(true) => true,
        Ok(false) => {
            tracing::info!(
                ipFamily = family.label(),
                "No iptables support for family: no nat POSTROUTING chain"
            );
            false
        }
        Err(error) => {
            tracing::info!(ipFamily = family.label(), %error, "No iptables support for family");
            false
        }
    }
}

/// The options of `family`'s backend, from the settings and the node's facts.
fn options(context: &ModeContext<'_>, family: IpFamily) -> IptablesOptions {
    let config = &context.settings.config;
    let host = context.host;
    IptablesOptions {
        family,
        // Validation keeps the bit within 0..=31.
        masquerade_bit: u8::try_from(config.masquerade_bit()).unwrap_or(crate::DEFAULT_MASQUERADE_BIT),
        masquerade_all: config.masquerade_all(),
        // Wanted; IptablesBackend::new keeps it only if the binary supports it.
        masquerade_random_fully: true,
        local_detector: host.local_detector.clone(),
        localhost_nodeports: config.localhost_node_ports(),
        nodeport_addresses: host.nodeport_addresses.clone(),
        bind_address: host.bind_address,
        conntrack_tcp_be_liberal: host.conntrack_tcp_be_liberal,
        ..IptablesOptions::default()
    }
}

/// One family of iptables mode.
struct IptablesFamily {
    options: IptablesOptions,
    sync_period: Duration,
}

impl FamilyMode for IptablesFamily {
    /// `route_localnet` for localhost NodePorts.
    fn prepare_host(&self) -> Result<(), Fatal> {
        prepare_host(&self.options, &ProcSysctl::default())
            .map_err(|e| Fatal::runtime(format!("--init-only: {e}")))
    }

    /// The full sync's restore input, with this host's addresses.
    fn dry_run(&self, state: &DesiredState) -> Result<String, Fatal> {
        let family = self.options.family;
        let addresses = self
            .options
            .nodeport_addresses
            .local_addresses(family, &InterfaceAddresses)
            .map_err(|e| Fatal::runtime(e.to_string()))?;
        let mut out = kpr_mode::dry_run_header(family, &format!("rules ({} input)", restore_tool(family)));
        out.push_str(&render_dry_run(state, &self.options, &addresses));
        Ok(out)
    }

    /// The backend on the host's binaries, with the variant chosen the way upstream's
    /// iptables-wrapper chooses it (the one already holding kube rules, else the default).
    /// Upstream's nfacct counters are created here (where the kernel has nfacct), so its
    /// rules can count in them. The whole UDP conntrack table is reconciled every sync
    /// period (upstream reconciles it after every sync; see kpr-conntrack for why ours looks
    /// only at changed services in between).
    fn into_backend(self: Box<Self>) -> Result<Box<dyn Backend>, Fatal> {
        let mut options = self.options;
        options.nfacct = ensure_counters(&NetlinkAccounting);
        let family = options.family;
        let cli = IptablesCli::new(family, Variant::Auto);
        let mut backend =
            IptablesBackend::new(options, Box::new(cli)).map_err(|e| Fatal::usage(e.to_string()))?;
        if let Err(error) = backend.init(&ProcSysctl::default()) {
            tracing::error!(%error, "host setting for localhost NodePorts failed; they may not answer");
        }
        if let Some(metrics) = METRICS.get() {
            backend = backend.with_metrics(metrics.clone());
        }
        let reconciler = Reconciler::netlink(family).with_full_period(self.sync_period);
        Ok(Box::new(backend.with_conntrack(Box::new(reconciler))))
    }
}

/// The iptables tool that reads `family`'s restore input, as `--dry-run` headers name it.
pub fn restore_tool(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "iptables-restore",
        IpFamily::V6 => "ip6tables-restore",
    }
}

/// The kernel's nfacct counters behind upstream's two packet metrics, read at every scrape.
struct NfacctReader;

impl PacketCounters for NfacctReader {
    fn packets(&self, counter: IptablesCounter) -> Result<Option<u64>, String> {
        let name = match counter {
            IptablesCounter::CtStateInvalidDropped => CT_STATE_INVALID_DROPPED,
            IptablesCounter::LocalhostNodeportsAccepted => LOCALHOST_NODEPORTS_ACCEPTED,
        };
        NetlinkAccounting
            .get(name)
            .map(|counter| counter.map(|c| c.packets))
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use kpr_host::{HostFacts, NodeFacts, NodeIps};

    use super::*;

    fn settings(args: &[&str]) -> Settings {
        let mut all = vec!["kube-proxy-rs", "--manifests=x"];
        all.extend_from_slice(args);
        kpr_config::load(all).unwrap()
    }

    #[test]
    fn options_follow_flags_and_the_nodes_facts() {
        let settings = settings(&[
            "--masquerade-all",
            "--iptables-masquerade-bit=12",
            "--cluster-cidr=10.244.0.0/16",
            "--bind-address=192.168.0.10",
        ]);
        let node = NodeFacts {
            name: "node1".into(),
            ips: NodeIps::detect(&[], "0.0.0.0"),
            pod_cidrs: Vec::new(),
        };
        let host = HostFacts::read(&settings, &node).unwrap();
        let context = ModeContext {
            settings: &settings,
            node: &node,
            host: &host,
            sync_period: Duration::from_secs(30),
        };
        let opts = options(&context, IpFamily::V4);
        assert!(opts.masquerade_all);
        assert_eq!(opts.masquerade_bit, 12);
        assert_eq!(opts.local_detector, host.local_detector);
        assert_eq!(opts.bind_address, Some("192.168.0.10".parse().unwrap()));
        assert_eq!(opts.conntrack_tcp_be_liberal, host.conntrack_tcp_be_liberal);
    }
}
