//! userspace mode behind the mode seam: the settings and the node's facts turned into one
//! userspace backend per IP family, its metrics, its leftovers (the portals), and taking the
//! portals away again on shutdown.
//!
//! The families are iptables mode's (the portals are iptables rules); the local-traffic
//! and NodePort settings are not read, as upstream's userspace proxy did not read them.
//! The listeners run on the proxy's own tokio runtime: the backend is built from it.

use std::sync::OnceLock;

use kpr_explain::Explainer;
use kpr_iptables::{
    IptablesCli, Variant, cleanup_footprint, nat_table_works, remove_everywhere, restore_tool,
};
use kpr_mode::{Deprecation, FamilyMode, Fatal, Gate, Leftovers, Mode, ModeContext, ProxyMode, Settings};
use kpr_model::IpFamily;
use kpr_state::{Backend, DesiredState};
use prometheus_client::registry::Registry;

use crate::metrics::UserspaceMetrics;
use crate::portals::{Portal, PortalFootprint, PortalTargets, render};
use crate::proxier::{UserspaceBackend, UserspaceOptions};
use kpr_relay::{Budget, Limits};

/// The one set of `kubeproxy_userspace_*` metrics, shared by both families' backends.
static METRICS: OnceLock<UserspaceMetrics> = OnceLock::new();

/// The limits' one budget, shared by both families' backends: they draw on the process's
/// one descriptor limit, which the limits were fitted to.
static BUDGET: OnceLock<Budget> = OnceLock::new();

/// userspace mode.
#[derive(Clone, Copy, Debug, Default)]
pub struct UserspaceMode;

impl Mode for UserspaceMode {
    fn name(&self) -> ProxyMode {
        ProxyMode::Userspace
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

    /// The portals are iptables rules: the family's iptables must work.
    fn supports(&self, family: IpFamily) -> bool {
        nat_table_works(family)
    }

    fn uses_service_cidrs(&self) -> bool {
        false
    }

    /// `kubeproxy_userspace_*` (once per process).
    fn register_metrics(&self, _settings: &Settings, registry: &mut Registry) {
        METRICS.get_or_init(|| UserspaceMetrics::register(registry));
    }

    fn family(&self, context: &ModeContext<'_>, family: IpFamily) -> Result<Box<dyn FamilyMode>, Fatal> {
        Ok(Box::new(UserspaceFamily {
            options: options(context, family)?,
        }))
    }

    /// The portals point at listeners that end with the process, so they go with it
    /// (traffic then meets no rule rather than a closed port). Best effort, logged.
    fn on_shutdown(&self, families: &[IpFamily]) {
        for &family in families {
            let report = cleanup_footprint(&IptablesCli::new(family, Variant::Auto), &PortalFootprint);
            for error in report.errors {
                tracing::warn!(ipFamily = family.label(), "portals not removed: {error}");
            }
        }
    }

    fn remove_leftovers(&self, _settings: &Settings) -> Leftovers {
        remove_everywhere(&PortalFootprint)
    }

    /// The portals only redirect; what the proxy does with a connection is in the process.
    fn adopts(&self) -> &'static [ProxyMode] {
        &[]
    }

    fn explainer(&self) -> Option<&dyn Explainer> {
        None
    }
}

/// One family of userspace mode.
struct UserspaceFamily {
    options: UserspaceOptions,
}

impl FamilyMode for UserspaceFamily {
    /// Upstream's userspace mode needs no host settings beyond conntrack's.
    fn prepare_host(&self) -> Result<(), Fatal> {
        Ok(())
    }

    /// The portals of a sync, with port 0 where the listeners' ports would be (they are
    /// chosen when the listeners open).
    fn dry_run(&self, state: &DesiredState) -> Result<String, Fatal> {
        let family = self.options.family;
        let mut out = kpr_mode::dry_run_header(
            family,
            &format!(
                "portals ({} input; port 0 stands for each listener's port)",
                restore_tool(family)
            ),
        );
        out.push_str(&dry_run(state, &self.options));
        Ok(out)
    }

    /// The backend, its listeners on the current tokio runtime.
    fn into_backend(self: Box<Self>) -> Result<Box<dyn Backend>, Fatal> {
        let options = self.options;
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
        Ok(Box::new(match METRICS.get() {
            Some(metrics) => backend.with_metrics(metrics.clone()),
            None => backend,
        }))
    }
}

/// The options of `family`'s backend.
fn options(context: &ModeContext<'_>, family: IpFamily) -> Result<UserspaceOptions, Fatal> {
    let settings = context.settings;
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
        listen_ip: context.host.bind_address.filter(|ip| IpFamily::of(ip) == family),
        host_ip: context.node.ips.of(family),
        port_range,
        udp_timeout,
        limits: Limits {
            max_connections: limit(settings.userspace_max_connections, defaults.max_connections),
            max_udp_sessions: limit(settings.userspace_max_udp_sessions, defaults.max_udp_sessions),
            max_listener_descriptors: defaults.max_listener_descriptors,
        },
        copy: kpr_relay::CopyMethod::default(),
        tcp_threads: kpr_relay::workers::default_count(),
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

/// What `--dry-run` prints for one family: the portals of a sync, with port 0 where the
/// listeners' ports would be (they are chosen when the listeners open).
fn dry_run(state: &DesiredState, options: &UserspaceOptions) -> String {
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
