//! userspace mode: the settings and the node's facts turned into one userspace backend per
//! IP family (kpr-userspace), its metrics, the other modes' leftovers, and taking the
//! portals away again on shutdown.
//!
//! The families are iptables mode's (the portals are iptables rules); the local-traffic
//! and NodePort settings are not read, as upstream's userspace proxy did not read them.
//! The listeners run on the proxy's own tokio runtime: [`backend`] is called from it.

use std::sync::OnceLock;

use kpr_config::Settings;
use kpr_iptables::{IptablesCli, Modes, Variant, cleanup_modes};
use kpr_metrics::UserspaceMetrics;
use kpr_model::IpFamily;
use kpr_state::DesiredState;
use kpr_userspace::portals::{Portal, PortalTargets, render};
use kpr_userspace::{Budget, Limits, UserspaceBackend, UserspaceOptions};
use prometheus_client::registry::Registry;

use crate::fatal::Fatal;
use crate::iptables_mode;
use crate::node::NodeFacts;

/// The one set of `kubeproxy_userspace_*` metrics, shared by both families' backends.
static METRICS: OnceLock<UserspaceMetrics> = OnceLock::new();

/// The limits' one budget, shared by both families' backends: they draw on the process's
/// one descriptor limit, which the limits were fitted to.
static BUDGET: OnceLock<Budget> = OnceLock::new();

/// Registers `kubeproxy_userspace_*` in `registry` (once per process).
pub fn register_metrics(registry: &mut Registry) {
    METRICS.get_or_init(|| UserspaceMetrics::register(registry));
}

/// The portals are iptables rules: the family's iptables must work.
pub fn supports(family: IpFamily) -> bool {
    iptables_mode::supports(family)
}

/// The options of `family`'s backend.
pub fn options(settings: &Settings, family: IpFamily, node: &NodeFacts) -> Result<UserspaceOptions, Fatal> {
    let config = &settings.config;
    let port_range = kpr_config::proxy_port_range(&config.port_range)
        .map_err(|e| Fatal::usage(format!("portRange {:?}: {e}", config.port_range)))?;
    let udp_timeout = config
        .udp_idle_timeout
        .to_std()
        .ok_or_else(|| Fatal::usage("udpIdleTimeout must be greater than 0"))?;
    let defaults = Limits::within_descriptors(raise_descriptor_limit());
    let limit = |flag: Option<u32>, default: usize| flag.map_or(default, |n| n as usize);
    Ok(UserspaceOptions {
        family,
        // Upstream's listeners bound to --bind-address; one of another family binds nothing.
        listen_ip: iptables_mode::specific_address(&config.bind_address)
            .filter(|ip| IpFamily::of(ip) == family),
        host_ip: node.ips.of(family),
        port_range,
        udp_timeout,
        limits: Limits {
            max_connections: limit(settings.userspace_max_connections, defaults.max_connections),
            max_udp_sessions: limit(settings.userspace_max_udp_sessions, defaults.max_udp_sessions),
            max_listener_descriptors: defaults.max_listener_descriptors,
        },
        copy: kpr_userspace::CopyMethod::default(),
        tcp_threads: kpr_userspace::workers::default_count(),
    })
}

/// Upstream's userspace mode set its open-file limit to this.
const UPSTREAM_OPEN_FILES: u64 = 64_000;

/// Raises the open-file limit (a proxy carrying connections, with a listener or more per
/// service port, needs them): to upstream's 64,000 when the hard limit is lower and the
/// process may raise it (`CAP_SYS_RESOURCE`), else the soft limit to the hard one. Returns
/// the limit now in force.
fn raise_descriptor_limit() -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    let mut last_error = None;
    for wanted in [hard.max(UPSTREAM_OPEN_FILES), hard] {
        if soft >= wanted {
            break;
        }
        match setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted) {
            Ok(()) => return usize::try_from(wanted).unwrap_or(usize::MAX),
            Err(error) => last_error = Some(error),
        }
    }
    if let Some(error) = last_error {
        tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
    }
    usize::try_from(soft).unwrap_or(usize::MAX)
}

/// `family`'s backend, its listeners on the current tokio runtime.
pub fn backend(options: UserspaceOptions) -> Result<UserspaceBackend, Fatal> {
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| Fatal::runtime(format!("userspace mode needs the proxy's runtime: {e}")))?;
    let cli = IptablesCli::new(options.family, Variant::Auto);
    tracing::warn!(
        ipFamily = options.family.label(),
        "userspace mode does not support SCTP: SCTP Service ports are not proxied \
         (each is logged, and counted in kubeproxy_userspace_unsupported_service_ports)"
    );
    // Both families' options carry the same limits (from the same settings).
    let budget = BUDGET.get_or_init(|| Budget::new(options.limits));
    let backend = UserspaceBackend::new(options, Box::new(cli), runtime)
        .sharing(budget)
        .with_conntrack(Box::new(kpr_conntrack::NetlinkTable::new()));
    Ok(match METRICS.get() {
        Some(metrics) => backend.with_metrics(metrics.clone()),
        None => backend,
    })
}

/// What `--dry-run` prints for one family: the portals of a sync, with port 0 where the
/// listeners' ports would be (they are chosen when the listeners open).
pub fn dry_run(state: &DesiredState, options: &UserspaceOptions) -> String {
    let portals: Vec<Portal<'_>> = state
        .ports()
        .into_iter()
        .filter(|port| port.name.protocol != kpr_model::Protocol::Sctp)
        .map(|port| Portal { port, proxy_port: 0 })
        .collect();
    let targets = PortalTargets {
        listen_ip: options.listen_ip,
        host_ip: options.host_ip,
    };
    render(&portals, targets).render_full().text
}

/// Start-up: the iptables rules of iptables and IPVS modes, in both families and flavours,
/// and the kernel objects of nftables and IPVS modes, which would otherwise take the
/// Services' traffic before the portals do. Best effort, logged.
pub fn remove_other_modes_leftovers() {
    iptables_mode::remove_iptables_leftovers(Modes::USERSPACE.others());
    crate::ipvs_mode::remove_node_port_servers();
    kpr_leftovers::remove_kernel_leftovers();
}

/// Shutdown: the portals point at listeners that end with the process, so they go with it
/// (traffic then meets no rule rather than a closed port). Best effort, logged.
pub fn remove_portals(families: &[IpFamily]) {
    for &family in families {
        let report = cleanup_modes(&IptablesCli::new(family, Variant::Auto), Modes::USERSPACE);
        for error in report.errors {
            tracing::warn!(ipFamily = family.label(), "portals not removed: {error}");
        }
    }
}
