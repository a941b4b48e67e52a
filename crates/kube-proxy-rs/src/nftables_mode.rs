//! nftables mode: the effective configuration and the node's facts turned into one nftables
//! backend per IP family (tables `ip kube-proxy` and `ip6 kube-proxy`), whether a family can
//! be programmed on this host, `--dry-run`, and what the other modes left behind.
//!
//! The options come from the same settings and node facts as iptables mode's (local-traffic
//! detection, `nodePortAddresses`, the primary node IP), through the same functions, so the
//! two modes cannot read the configuration differently.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kpr_config::Settings;
use kpr_conntrack::Reconciler;
use kpr_iptables::{InterfaceAddresses, LocalAddresses, ProcSysctl, conntrack_tcp_be_liberal};
use kpr_model::IpFamily;
use kpr_nftables::{
    GenerationLog, NetlinkTransport, NftablesBackend, NftablesOptions, check_support, render_dry_run,
};
use kpr_state::DesiredState;

use crate::fatal::Fatal;
use crate::iptables_mode;
use crate::node::NodeFacts;

/// Upstream's check for nftables mode, made stricter: the kernel validates (without
/// committing) every object kind and expression this mode writes, for `family`; the first one
/// missing is named in the log.
pub fn supports(family: IpFamily) -> bool {
    let options = NftablesOptions {
        family,
        ..NftablesOptions::default()
    };
    let mut transport = match NetlinkTransport::open(options.affinity_capacity) {
        Ok(transport) => transport,
        Err(error) => {
            tracing::warn!(
                ipFamily = family.label(),
                "No nftables support for family: {error}"
            );
            return false;
        }
    };
    match check_support(&mut transport, &options) {
        Ok(()) => true,
        Err(missing) => {
            tracing::warn!(
                ipFamily = family.label(),
                "No nftables support for family: {missing}"
            );
            false
        }
    }
}

/// The options of `family`'s backend, from the validated settings and the node's facts.
pub fn options(settings: &Settings, family: IpFamily, node: &NodeFacts) -> Result<NftablesOptions, Fatal> {
    let config = &settings.config;
    Ok(NftablesOptions {
        family,
        // Validation keeps the bit within 0..=31.
        masquerade_bit: u8::try_from(config.masquerade_bit()).unwrap_or(kpr_nftables::DEFAULT_MASQUERADE_BIT),
        masquerade_all: config.masquerade_all(),
        local_detector: iptables_mode::local_detector(settings, node)?,
        nodeport_addresses: iptables_mode::nodeport_addresses(
            config.node_port_addresses.as_deref().unwrap_or_default(),
            node,
        )?,
        bind_address: iptables_mode::specific_address(&config.bind_address),
        conntrack_tcp_be_liberal: config.conntrack.tcp_be_liberal
            || conntrack_tcp_be_liberal(&ProcSysctl::default()),
        ..NftablesOptions::default()
    })
}

/// The generations of this process's nf_tables commits, shared by both families' transports
/// so that one family's commits do not look like someone else's to the other.
fn generations() -> Arc<GenerationLog> {
    static LOG: OnceLock<Arc<GenerationLog>> = OnceLock::new();
    LOG.get_or_init(GenerationLog::new).clone()
}

/// The nftables backend over nf_tables netlink (no `nft` process), reconciling the whole UDP
/// conntrack table every `sync_period` as iptables mode does.
pub fn backend(options: NftablesOptions, sync_period: Duration) -> Result<NftablesBackend, Fatal> {
    let family = options.family;
    let transport = NetlinkTransport::open_shared(options.affinity_capacity, generations())
        .map_err(|e| Fatal::runtime(format!("nftables mode ({}): {e}", family.label())))?;
    let backend =
        NftablesBackend::new(options, Box::new(transport)).map_err(|e| Fatal::usage(e.to_string()))?;
    let reconciler = Reconciler::netlink(family).with_full_period(sync_period);
    Ok(backend
        .with_conntrack(Box::new(reconciler))
        .with_reconcile_period(sync_period))
}

/// What `--dry-run` prints for one family: the `nft -f` script of a full sync, with this
/// host's addresses.
pub fn dry_run(state: &DesiredState, options: &NftablesOptions) -> Result<String, Fatal> {
    let addresses = if options.nodeport_addresses.needs_local_addresses(options.family) {
        InterfaceAddresses
            .addresses(options.family)
            .map_err(|e| Fatal::runtime(e.to_string()))?
    } else {
        Vec::new()
    };
    Ok(render_dry_run(state, options, &addresses))
}

/// Start-up, as upstream's platform cleanup when it starts in nftables mode: the iptables
/// rules of iptables and IPVS modes (both families and flavours) and IPVS mode's kernel
/// objects. Our own tables stay: the first sync adopts them. Best effort, logged.
pub fn remove_other_modes_leftovers() {
    iptables_mode::remove_iptables_leftovers(kpr_iptables::Modes::ALL);
    crate::ipvs_mode::remove_node_port_servers();
    kpr_leftovers::remove_ipvs_leftovers();
}
