//! nftables mode behind the mode seam: the settings and the node's facts turned into one
//! backend per IP family (tables `ip kube-proxy` and `ip6 kube-proxy`), whether a family
//! can be programmed here, its metrics, `--dry-run` and its leftovers (its tables); with
//! the gate `KubeProxyNFTablesLocalhostNodePorts`, a family's localhost NodePort proxy.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kpr_conntrack::Reconciler;
use kpr_explain::Explainer;
use kpr_host::InterfaceAddresses;
use kpr_mode::{Deprecation, FamilyMode, Fatal, Gate, Leftovers, Mode, ModeContext, ProxyMode, Settings};
use kpr_model::IpFamily;
use kpr_state::{Backend, DesiredState};
use prometheus_client::registry::Registry;

use crate::backend::{NftablesBackend, cleanup};
use crate::explain::NftablesExplainer;
use crate::localhost::LocalhostProxy;
use crate::metrics::{NetlinkRejectedPackets, NftablesMetrics};
use crate::netlink::{GenerationLog, NetlinkTransport};
use crate::options::{DEFAULT_MASQUERADE_BIT, LocalhostNodePorts, NftablesOptions};
use crate::render::TABLE;
use crate::support::check_support;

/// The mode's one set of metrics, shared by both families' backends.
static METRICS: OnceLock<NftablesMetrics> = OnceLock::new();

/// nftables mode.
#[derive(Clone, Copy, Debug, Default)]
pub struct NftablesMode;

impl Mode for NftablesMode {
    fn name(&self) -> ProxyMode {
        ProxyMode::Nftables
    }

    fn requirement(&self) -> &'static str {
        "nf_tables with every feature nftables mode uses (the log names the missing one)"
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

    /// Upstream's check, made stricter: the kernel validates (without committing) every
    /// object kind and expression this mode writes, for `family`; the first one missing is
    /// named in the log.
    fn supports(&self, family: IpFamily) -> bool {
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

    /// Traffic to an unallocated address of a Service CIDR is dropped, as upstream's.
    fn uses_service_cidrs(&self) -> bool {
        true
    }

    /// Upstream's, and with the gate `KubeProxyNFTablesLocalhostNodePorts` on, the
    /// localhost NodePort metrics (whichever family ends up running the proxy).
    fn register_metrics(&self, settings: &Settings, registry: &mut Registry) {
        METRICS.get_or_init(|| {
            let metrics = NftablesMetrics::register(registry);
            if settings.gates.enabled(Gate::KubeProxyNFTablesLocalhostNodePorts) {
                metrics.register_localhost(registry, Arc::new(NetlinkRejectedPackets))
            } else {
                metrics
            }
        });
    }

    fn family(&self, context: &ModeContext<'_>, family: IpFamily) -> Result<Box<dyn FamilyMode>, Fatal> {
        let options = options(context, family);
        let addresses = &context.host.nodeport_addresses;
        if options.localhost_nodeports == LocalhostNodePorts::Off
            && addresses.contains_explicit_loopback(family)
        {
            tracing::warn!(
                ipFamily = family.label(),
                gate = Gate::KubeProxyNFTablesLocalhostNodePorts.name(),
                "--nodeport-addresses includes localhost but localhost NodePorts are not supported"
            );
        }
        Ok(Box::new(NftablesFamily {
            options,
            sync_period: context.sync_period,
        }))
    }

    /// The table keeps serving without the process, as upstream's does.
    fn on_shutdown(&self, _families: &[IpFamily]) {}

    /// Both families' tables.
    fn remove_leftovers(&self, _settings: &Settings) -> Leftovers {
        let mut leftovers = Leftovers::default();
        for family in [IpFamily::V4, IpFamily::V6] {
            let object = format!("nftables table {} {TABLE}", family_name(family));
            let removed = NetlinkTransport::open(0)
                .map_err(|e| e.to_string())
                .and_then(|mut transport| cleanup(&mut transport, family).map_err(|e| e.to_string()));
            match removed {
                Ok(true) => {
                    tracing::info!(%object, "removed what another kube-proxy mode left");
                    leftovers.removed.push(object);
                }
                Ok(false) => {}
                Err(error) => leftovers.failures.push(format!("{object}: {error}")),
            }
        }
        leftovers
    }

    fn adopts(&self) -> &'static [ProxyMode] {
        &[]
    }

    fn explainer(&self) -> Option<&dyn Explainer> {
        Some(&NftablesExplainer)
    }
}

fn family_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// The options of `family`'s backend, from the settings and the node's facts.
fn options(context: &ModeContext<'_>, family: IpFamily) -> NftablesOptions {
    let config = &context.settings.config;
    let host = context.host;
    NftablesOptions {
        family,
        // Validation keeps the bit within 0..=31.
        masquerade_bit: u8::try_from(config.masquerade_bit()).unwrap_or(DEFAULT_MASQUERADE_BIT),
        masquerade_all: config.masquerade_all(),
        local_detector: host.local_detector.clone(),
        nodeport_addresses: host.nodeport_addresses.clone(),
        bind_address: host.bind_address,
        conntrack_tcp_be_liberal: host.conntrack_tcp_be_liberal,
        localhost_nodeports: LocalhostNodePorts::decide(
            context
                .settings
                .gates
                .enabled(Gate::KubeProxyNFTablesLocalhostNodePorts),
            &host.nodeport_addresses,
            family,
        ),
        ..NftablesOptions::default()
    }
}

/// The localhost NodePort proxies' one budget, shared by both families' relays: they draw
/// on the process's one descriptor limit, which the limits are fitted to.
fn localhost_budget() -> &'static kpr_relay::Budget {
    static BUDGET: OnceLock<kpr_relay::Budget> = OnceLock::new();
    BUDGET.get_or_init(|| {
        let limits = kpr_relay::Limits::within_descriptors(soft_descriptor_limit_raised());
        tracing::info!(
            maxConnections = limits.max_connections,
            maxListenerDescriptors = limits.max_listener_descriptors,
            "localhost NodePort proxy limits"
        );
        kpr_relay::Budget::new(limits)
    })
}

/// Raises the soft open-file limit to the hard one, as Go's runtime does for upstream's
/// proxy at start-up (any process may), and returns the limit now in force. Without it a
/// soft limit of 1024, the usual one outside containers, leaves the relay's limits nothing
/// past the descriptors they reserve for the rest of the process: one connection at a time.
fn soft_descriptor_limit_raised() -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    let limit = if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
                soft
            }
        }
    } else {
        soft
    };
    usize::try_from(limit).unwrap_or(usize::MAX)
}

/// The generations of this process's nf_tables commits, shared by both families' transports
/// so that one family's commits do not look like someone else's to the other.
fn generations() -> Arc<GenerationLog> {
    static LOG: OnceLock<Arc<GenerationLog>> = OnceLock::new();
    LOG.get_or_init(GenerationLog::new).clone()
}

/// One family of nftables mode.
struct NftablesFamily {
    options: NftablesOptions,
    sync_period: Duration,
}

impl FamilyMode for NftablesFamily {
    /// Upstream's nftables mode needs no host settings beyond conntrack's (the node's, applied
    /// by the caller): localhost NodePorts are a proxy's listeners, not DNATed loopback
    /// traffic, so no route_localnet.
    fn prepare_host(&self) -> Result<(), Fatal> {
        Ok(())
    }

    /// The `nft -f` script of a full sync, with this host's addresses.
    fn dry_run(&self, state: &DesiredState) -> Result<String, Fatal> {
        let family = self.options.family;
        let addresses = self
            .options
            .nodeport_addresses
            .local_addresses(family, &InterfaceAddresses)
            .map_err(|e| Fatal::runtime(e.to_string()))?;
        let mut out = kpr_mode::dry_run_header(family, "rules (nft -f input)");
        out.push_str(&crate::render_dry_run(state, &self.options, &addresses));
        Ok(out)
    }

    /// The backend over nf_tables netlink (no `nft` process), reading the table back and
    /// reconciling the whole UDP conntrack table every sync period, as iptables mode does.
    fn into_backend(self: Box<Self>) -> Result<Box<dyn Backend>, Fatal> {
        let family = self.options.family;
        let transport = NetlinkTransport::open_shared(self.options.affinity_capacity, generations())
            .map_err(|e| Fatal::runtime(format!("nftables mode ({}): {e}", family.label())))?;
        let mut backend = NftablesBackend::new(self.options, Box::new(transport))
            .map_err(|e| Fatal::usage(e.to_string()))?;
        if let Some(metrics) = METRICS.get() {
            backend = backend.with_metrics(metrics.clone());
        }
        if backend.options().localhost_nodeports == LocalhostNodePorts::Proxied {
            let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
                Fatal::runtime(format!(
                    "nftables mode's localhost NodePort proxy needs the proxy's runtime: {e}"
                ))
            })?;
            let mut proxy = LocalhostProxy::new(family, localhost_budget(), runtime);
            if let Some(localhost) = METRICS.get().and_then(NftablesMetrics::localhost) {
                proxy = proxy.with_metrics(localhost.clone());
            }
            tracing::info!(
                ipFamily = family.label(),
                "serving TCP NodePorts on the loopback address (KubeProxyNFTablesLocalhostNodePorts)"
            );
            backend = backend.with_localhost_proxy(proxy);
        }
        let reconciler = Reconciler::netlink(family).with_full_period(self.sync_period);
        Ok(Box::new(
            backend
                .with_conntrack(Box::new(reconciler))
                .with_reconcile_period(self.sync_period),
        ))
    }
}
