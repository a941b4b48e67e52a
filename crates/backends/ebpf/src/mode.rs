//! ebpf mode behind the mode seam: nftables mode's families, each with the socket layer
//! (one for the process, started by the first family's backend) on top.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use kpr_explain::Explainer;
use kpr_host::{InterfaceAddresses, LocalAddresses, NodePortAddresses};
use kpr_mode::{Deprecation, FamilyMode, Fatal, Gate, Leftovers, Mode, ModeContext, ProxyMode, Settings};
use kpr_model::IpFamily;
use kpr_nftables::NftablesMode;
use kpr_state::{Backend, DesiredState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::backend::{EbpfBackend, SharedLayer};
use crate::entries::service_entries;
use crate::explain::EbpfExplainer;
use crate::host::{cgroup2_root, check_cgroup2, ensure_bpffs};
use crate::layer::{Capacities, DEFAULT_PIN_ROOT, Pins, SocketLayer, remove};
use crate::table::Adopted;

/// ebpf mode.
#[derive(Clone, Copy, Debug, Default)]
pub struct EbpfMode;

/// `kubeproxy_ebpf_socket_map_sync_failures_total`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FailureLabels {
    pub ip_family: &'static str,
    /// `capacity` or `kernel`.
    pub reason: &'static str,
}

/// The mode's own metric, registered once.
pub(crate) static METRICS: OnceLock<Family<FailureLabels, Counter>> = OnceLock::new();

/// The process's socket layer, once started, and what each family adopts from it.
struct Started {
    shared: Arc<Mutex<SharedLayer>>,
    adopted: [Option<Adopted>; 2],
}

static STARTED: Mutex<Option<Started>> = Mutex::new(None);

/// `--ebpf-pin-root`, else [`DEFAULT_PIN_ROOT`].
fn pin_root(settings: &Settings) -> PathBuf {
    settings
        .ebpf_pin_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PIN_ROOT))
}

/// The maps' sizes: `--ebpf-max-service-addresses`, `--ebpf-max-endpoint-slots`.
fn capacities(settings: &Settings) -> Capacities {
    let ebpf = &settings.config.ebpf;
    Capacities::configured(ebpf.max_service_addresses, ebpf.max_endpoint_slots)
}

/// The cgroup to attach to: `--cgroup-root`, else the node's cgroup v2 root.
fn cgroup_root(settings: &Settings) -> Result<PathBuf, Fatal> {
    let path = match &settings.cgroup_root {
        Some(path) => path.clone(),
        None => cgroup2_root().map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))?,
    };
    check_cgroup2(&path).map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))?;
    Ok(path)
}

impl Mode for EbpfMode {
    fn name(&self) -> ProxyMode {
        ProxyMode::Ebpf
    }

    fn requirement(&self) -> &'static str {
        "nftables mode's nf_tables features, plus cgroup v2, BPF cgroup socket programs and bpffs"
    }

    fn gate(&self) -> Option<Gate> {
        None
    }

    fn deprecation(&self) -> Option<Deprecation> {
        None
    }

    /// A cgroup v2 directory to attach to and a bpffs to pin in (either mounted when the
    /// host has none); the programs themselves are checked by the verifier when the first
    /// backend starts, before anything is attached.
    fn check_host(&self, settings: &Settings) -> Result<(), Fatal> {
        cgroup_root(settings)?;
        ensure_bpffs(&pin_root(settings)).map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))
    }

    fn supports(&self, family: IpFamily) -> bool {
        NftablesMode.supports(family)
    }

    fn uses_service_cidrs(&self) -> bool {
        NftablesMode.uses_service_cidrs()
    }

    /// nftables mode's metrics (its rules are this mode's too), and the socket maps' failed
    /// writes.
    fn register_metrics(&self, settings: &Settings, registry: &mut Registry) {
        NftablesMode.register_metrics(settings, registry);
        METRICS.get_or_init(|| {
            let failures = Family::<FailureLabels, Counter>::default();
            registry.sub_registry_with_prefix("kubeproxy").register(
                "ebpf_socket_map_sync_failures",
                "Syncs whose socket map writes failed, by reason: capacity (a map too small for the \
                 cluster, nothing written) or kernel",
                failures.clone(),
            );
            failures
        });
    }

    fn family(&self, context: &ModeContext<'_>, family: IpFamily) -> Result<Box<dyn FamilyMode>, Fatal> {
        Ok(Box::new(EbpfFamily {
            family,
            nftables: NftablesMode.family(context, family)?,
            settings_cgroup: context.settings.cgroup_root.clone(),
            pins: Pins::new(pin_root(context.settings)),
            capacities: capacities(context.settings),
            nodeport_addresses: context.host.nodeport_addresses.clone(),
        }))
    }

    /// The programs stay attached and the maps pinned, serving without the process (as
    /// nftables mode's table does); the next start adopts them.
    fn on_shutdown(&self, _families: &[IpFamily]) {}

    /// The pinned links (detached by unpinning) and maps, at `--ebpf-pin-root` (else the
    /// default directory). nftables mode's tables are nftables mode's leftovers.
    fn remove_leftovers(&self, settings: &Settings) -> Leftovers {
        let mut leftovers = Leftovers::default();
        let pins = Pins::new(pin_root(settings));
        let object = format!("BPF socket programs and maps pinned at {}", pins.root().display());
        match remove(&pins) {
            Ok(true) => {
                tracing::info!(%object, "removed what another kube-proxy mode left");
                leftovers.removed.push(object);
            }
            Ok(false) => {}
            Err(error) => leftovers.failures.push(format!("{object}: {error}")),
        }
        leftovers
    }

    /// The socket layer this start attached (not one adopted from a previous process).
    fn abandon_start(&self, _settings: &Settings) {
        let started = STARTED.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(started) = started {
            let shared = started.shared.lock().unwrap_or_else(|p| p.into_inner());
            match shared.layer().abandon() {
                Ok(true) => tracing::info!("start-up failed: detached and unpinned the socket programs"),
                Ok(false) => {}
                Err(detail) => tracing::warn!("start-up failed; socket layer not fully removed: {detail}"),
            }
        }
    }

    /// Its rules are nftables mode's tables.
    fn adopts(&self) -> &'static [ProxyMode] {
        &[ProxyMode::Nftables]
    }

    fn explainer(&self) -> Option<&dyn Explainer> {
        Some(&EbpfExplainer::DEFAULT)
    }
}

/// One family of ebpf mode.
struct EbpfFamily {
    family: IpFamily,
    nftables: Box<dyn FamilyMode>,
    /// `--cgroup-root`; resolved (and checked) when the backend starts, so `--dry-run`
    /// mounts nothing.
    settings_cgroup: Option<PathBuf>,
    pins: Pins,
    capacities: Capacities,
    nodeport_addresses: NodePortAddresses,
}

/// The process's socket layer, started by the first family's backend (programs verified,
/// attached, pinned), and what `family` adopts from it.
fn start_layer(
    family: IpFamily,
    settings_cgroup: Option<&std::path::Path>,
    pins: &Pins,
    capacities: Capacities,
) -> Result<(Arc<Mutex<SharedLayer>>, Adopted), Fatal> {
    let mut started = STARTED.lock().unwrap_or_else(|p| p.into_inner());
    if started.is_none() {
        let cgroup = match settings_cgroup {
            Some(path) => path.to_owned(),
            None => cgroup2_root().map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))?,
        };
        check_cgroup2(&cgroup).map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))?;
        ensure_bpffs(pins.root()).map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))?;
        let layer = SocketLayer::start(pins.clone(), &cgroup, capacities)
            .map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))?;
        let (shared, v4, v6) =
            SharedLayer::new(layer).map_err(|e| Fatal::runtime(format!("ebpf mode: {e}")))?;
        *started = Some(Started {
            shared,
            adopted: [Some(v4), Some(v6)],
        });
    }
    let Some(started) = started.as_mut() else {
        return Err(Fatal::runtime("ebpf mode: the socket layer did not start"));
    };
    let index = usize::from(family == IpFamily::V6);
    let adopted = started.adopted[index].take().unwrap_or_default();
    Ok((started.shared.clone(), adopted))
}

impl FamilyMode for EbpfFamily {
    fn prepare_host(&self) -> Result<(), Fatal> {
        self.nftables.prepare_host()
    }

    /// nftables mode's script, then the socket map entries, one line per Service address.
    fn dry_run(&self, state: &DesiredState) -> Result<String, Fatal> {
        let mut out = self.nftables.dry_run(state)?;
        let all = InterfaceAddresses
            .addresses(self.family)
            .map_err(|e| Fatal::runtime(e.to_string()))?;
        let mut nodes = match self.nodeport_addresses.targets(self.family, &all) {
            kpr_host::NodePortTargets::AllLocal => all,
            kpr_host::NodePortTargets::Ips(ips) => ips,
        };
        nodes.retain(|ip| !ip.is_loopback());
        out.push_str(&kpr_mode::dry_run_header(
            self.family,
            "socket map entries (address -> endpoints)",
        ));
        out.push_str(&render_entries(state, &nodes, self.family));
        Ok(out)
    }

    /// nftables' backend first: the socket layer is the last thing that can fail.
    fn into_backend(self: Box<Self>) -> Result<Box<dyn Backend>, Fatal> {
        let EbpfFamily {
            family,
            nftables,
            settings_cgroup,
            pins,
            capacities,
            nodeport_addresses,
        } = *self;
        let nftables = nftables.into_backend()?;
        let (shared, adopted) = start_layer(family, settings_cgroup.as_deref(), &pins, capacities)?;
        let table = crate::table::Table::new(family, adopted);
        Ok(Box::new(EbpfBackend::new(
            family,
            nftables,
            shared,
            table,
            nodeport_addresses,
        )))
    }
}

/// The socket entries of `state`, as text: `proto address:port -> endpoints [affinity]`.
pub fn render_entries(state: &DesiredState, node_addresses: &[std::net::IpAddr], family: IpFamily) -> String {
    use std::fmt::Write as _;
    let mut lines = Vec::new();
    for ports in state.services.values() {
        for (set_name, set) in service_entries(state, ports.iter(), node_addresses, family) {
            for (key, _) in &set.addresses {
                let endpoints: Vec<String> = set.endpoints.iter().map(ToString::to_string).collect();
                let mut line = format!(
                    "{} {} -> {} ({})",
                    set_name.port.protocol.api(),
                    std::net::SocketAddr::new(key.ip(), key.port()),
                    endpoints.join(" "),
                    set_name.port
                );
                if set.affinity_seconds > 0 {
                    let _ = write!(line, " affinity {}s", set.affinity_seconds);
                }
                lines.push(line);
            }
        }
    }
    lines.sort();
    let mut out = String::new();
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
    out
}
