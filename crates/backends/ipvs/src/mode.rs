//! ipvs mode behind the mode seam: upstream's start-up checks and host settings, and the
//! settings and the node's facts turned into one IPVS backend per IP family.
//!
//! The families are iptables mode's (the mode writes iptables rules too); the kernel must
//! have IPVS, which [`check_ipvs`] loads and proves at start-up as upstream's
//! `CanUseIPVSProxier` does (a probe virtual server with the configured scheduler, added and
//! deleted), and the kernel's ipset must have the mode's set types (written over netlink,
//! so the `ipset` tool is not needed). Both families share one IPVS table and `kube-ipvs0`;
//! each family's backend touches only its own addresses and virtual servers.

use std::process::Command;
use std::time::Duration;

use ipnet::IpNet;
use kpr_explain::Explainer;
use kpr_host::{ProcSysctl, Sysctl};
use kpr_iptables::{Iptables, IptablesCli, Variant, nat_table_works, restore_tool};
use kpr_ipvs_netlink::{Ipvs, Protocol, Scheduler, Service, ServiceKey, Timeouts};
use kpr_mode::{Deprecation, FamilyMode, Fatal, Gate, Leftovers, Mode, ModeContext, ProxyMode, Settings};
use kpr_model::IpFamily;
use kpr_state::{Backend, DesiredState};
use prometheus_client::registry::Registry;

use crate::backend::{IpvsBackend, IpvsOptions};
use crate::explain::IpvsExplainer;
use crate::ipset::IpsetNetlink;
use crate::plan::{PlanInputs, plan};
use crate::rules::{RuleOptions, ruleset};

/// Upstream 1.37's words, in its log and in the `IPVSDeprecation` Event.
pub const IPVS_DEPRECATION: &str = "The ipvs proxier has been deprecated and will be disabled by default in Kubernetes 1.40 \
     and removed in Kubernetes 1.43. Migrate to the 'nftables' proxier instead.";

/// ipvs mode.
#[derive(Clone, Copy, Debug, Default)]
pub struct IpvsMode;

impl Mode for IpvsMode {
    fn name(&self) -> ProxyMode {
        ProxyMode::Ipvs
    }

    fn requirement(&self) -> &'static str {
        "its iptables can list the nat table (IPVS itself is checked next)"
    }

    /// Upstream's gate since 1.37 (default on; off in 1.40; the mode goes in 1.43, KEP-5495).
    fn gate(&self) -> Option<Gate> {
        Some(Gate::KubeProxyIPVS)
    }

    fn deprecation(&self) -> Option<Deprecation> {
        Some(Deprecation {
            reason: "IPVSDeprecation",
            message: IPVS_DEPRECATION,
        })
    }

    /// Upstream's `CanUseIPVSProxier`.
    fn check_host(&self, settings: &Settings) -> Result<(), Fatal> {
        check_ipvs(settings)
    }

    /// The rules are iptables rules: the family's iptables must work.
    fn supports(&self, family: IpFamily) -> bool {
        nat_table_works(family)
    }

    fn uses_service_cidrs(&self) -> bool {
        false
    }

    /// The shared metrics say all the mode has to say.
    fn register_metrics(&self, _settings: &Settings, _registry: &mut Registry) {}

    fn family(&self, context: &ModeContext<'_>, family: IpFamily) -> Result<Box<dyn FamilyMode>, Fatal> {
        Ok(Box::new(IpvsFamily {
            options: options(context, family, scheduler(context.settings)?)?,
            settings: context.settings.clone(),
            sync_period: context.sync_period,
        }))
    }

    /// The virtual servers keep serving without the process, as upstream's do.
    fn on_shutdown(&self, _families: &[IpFamily]) {}

    fn remove_leftovers(&self, _settings: &Settings) -> Leftovers {
        crate::leftovers::remove_all()
    }

    fn adopts(&self) -> &'static [ProxyMode] {
        &[]
    }

    fn explainer(&self) -> Option<&dyn Explainer> {
        Some(&IpvsExplainer)
    }
}

/// One family of ipvs mode.
struct IpvsFamily {
    options: IpvsOptions,
    settings: Settings,
    sync_period: Duration,
}

impl FamilyMode for IpvsFamily {
    /// The checks and host settings upstream's ipvs proxier makes at start-up.
    fn prepare_host(&self) -> Result<(), Fatal> {
        check_ipvs(&self.settings)?;
        prepare_host(&self.settings)
    }

    /// The plan (virtual servers, addresses, set members) as comments, then the iptables
    /// ruleset (restore input). This host's addresses stand in for the node's.
    fn dry_run(&self, state: &DesiredState) -> Result<String, Fatal> {
        let family = self.options.rules.family;
        let mut out = kpr_mode::dry_run_header(
            family,
            &format!(
                "IPVS plan and rules (plan as comments, then {} input)",
                restore_tool(family)
            ),
        );
        out.push_str(&dry_run(state, &self.options)?);
        Ok(out)
    }

    /// The host settings (once per family, as upstream's; the same keys, so the second
    /// writes nothing), then the backend, reading the kernel back at least every sync
    /// period and reconciling the whole UDP conntrack table as often, as the other kernel
    /// modes do; `--random-fully` only when this iptables supports it.
    fn into_backend(self: Box<Self>) -> Result<Box<dyn Backend>, Fatal> {
        prepare_host(&self.settings)?;
        let mut options = self.options;
        let family = options.rules.family;
        let cli = IptablesCli::new(family, Variant::Auto);
        options.rules.random_fully = cli.version().is_ok_and(|v| v.supports_random_fully());
        let conntrack = kpr_conntrack::Reconciler::netlink(family).with_full_period(self.sync_period);
        Ok(Box::new(
            IpvsBackend::new(options, Box::new(cli), Box::new(IpsetNetlink::default()))
                .with_reconcile_period(self.sync_period)
                .with_conntrack(Box::new(conntrack)),
        ))
    }
}

/// Upstream's `CanUseIPVSProxier`: IPVS in the kernel (the module loaded if need be), the
/// scheduler usable (a probe virtual server added and deleted, unless one already uses
/// it), and the kernel's ipset with every set type the mode uses.
fn check_ipvs(settings: &Settings) -> Result<(), Fatal> {
    let scheduler = scheduler(settings)?;
    // The kernel loads ip_vs on demand for nothing IPVS-specific: load it as upstream does.
    let _ = Command::new("modprobe").arg("ip_vs").status();
    let unusable = |why: String| Fatal::runtime(format!("can't use the IPVS proxier: {why}"));
    let mut ipvs = Ipvs::open()
        .map_err(|e| unusable(e.to_string()))?
        .ok_or_else(|| unusable("this kernel has no IPVS (module ip_vs)".into()))?;
    let listed = ipvs.services().map_err(|e| unusable(e.to_string()))?;
    if !listed.objects.iter().any(|s| s.scheduler == scheduler) {
        probe_scheduler(&mut ipvs, &scheduler).map_err(unusable)?;
    }
    // Upstream runs `ipset version`; the sets are written over netlink here, so the
    // kernel's ipset and the mode's set types are what must be there.
    IpsetNetlink::default().check_kernel().map_err(unusable)
}

/// `--ipvs-scheduler` (round robin when unset), checked as a scheduler name.
fn scheduler(settings: &Settings) -> Result<Scheduler, Fatal> {
    Scheduler::new(settings.config.ipvs_scheduler())
        .map_err(|e| Fatal::usage(format!("--ipvs-scheduler: {e}")))
}

/// Adds and deletes a virtual server with `scheduler` at upstream's probe address.
fn probe_scheduler(ipvs: &mut Ipvs, scheduler: &Scheduler) -> Result<(), String> {
    let key = ServiceKey {
        protocol: Protocol::Tcp,
        address: "198.51.100.0".parse().map_err(|_| "probe address")?,
        port: 20000,
    };
    let probe = Service::new(key, scheduler.clone());
    ipvs.add_service(&probe)
        .map_err(|e| format!("IPVS scheduler {scheduler} is not usable: {e}"))?;
    ipvs.delete_service(&key).map_err(|e| e.to_string())
}

/// The host settings upstream's ipvs proxier makes at start-up (once per family there; the
/// same keys here, so once is enough). A failure is fatal, as upstream's.
fn prepare_host(settings: &Settings) -> Result<(), Fatal> {
    prepare_host_with(settings, &ProcSysctl::default())
}

fn prepare_host_with(settings: &Settings, sysctl: &dyn Sysctl) -> Result<(), Fatal> {
    let mut wanted = vec![
        ("net/ipv4/vs/conntrack", "1"),
        ("net/ipv4/vs/expire_nodest_conn", "1"),
        ("net/ipv4/vs/expire_quiescent_template", "1"),
        ("net/ipv4/ip_forward", "1"),
    ];
    if settings.config.ipvs.strict_arp {
        wanted.extend([
            ("net/ipv4/conf/all/arp_ignore", "1"),
            ("net/ipv4/conf/all/arp_announce", "2"),
        ]);
    }
    let release = sysctl
        .get("kernel/osrelease")
        .map_err(|e| Fatal::runtime(format!("ipvs mode: reading the kernel's version: {e}")))?;
    match ConnReuse::for_kernel(release.trim()) {
        Some(ConnReuse::Unsupported) => tracing::error!(
            kernel = release.trim(),
            "ipvs mode: cannot set net/ipv4/vs/conn_reuse_mode, the kernel is older than 4.1"
        ),
        Some(ConnReuse::Disable) => wanted.push(("net/ipv4/vs/conn_reuse_mode", "0")),
        Some(ConnReuse::LeaveAsIs) => {}
        None => {
            return Err(Fatal::runtime(format!(
                "ipvs mode: cannot read a kernel version from {:?}",
                release.trim()
            )));
        }
    }
    for (key, value) in wanted {
        if sysctl.get(key).is_ok_and(|current| current.trim() == value) {
            continue;
        }
        sysctl
            .set(key, value)
            .map_err(|e| Fatal::runtime(format!("ipvs mode: setting {key} to {value}: {e}")))?;
    }
    set_timeouts(settings)
}

/// What upstream's ipvs mode does with `net/ipv4/vs/conn_reuse_mode` on a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnReuse {
    /// Before 4.1 the setting does not exist (upstream logs an error and goes on).
    Unsupported,
    /// From 4.1 to before 5.9: 0, because reusing a closed connection's source port stalled
    /// new connections for a second when real servers changed (kubernetes#81775).
    Disable,
    /// From 5.9 the kernel handles it (kubernetes#93297): left as it is.
    LeaveAsIs,
}

impl ConnReuse {
    /// From `/proc/sys/kernel/osrelease` ("6.1.0-31-amd64"); `None` if it has no version.
    fn for_kernel(release: &str) -> Option<Self> {
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .map(str::parse::<u32>);
        let major = numbers.next()?.ok()?;
        let minor = numbers.next()?.ok()?;
        Some(match (major, minor) {
            version if version < (4, 1) => Self::Unsupported,
            version if version < (5, 9) => Self::Disable,
            _ => Self::LeaveAsIs,
        })
    }
}

/// `--ipvs-tcp-timeout` and friends (0 keeps the kernel's); a failure is logged, as upstream.
fn set_timeouts(settings: &Settings) -> Result<(), Fatal> {
    let ipvs = &settings.config.ipvs;
    let seconds = |d: &kpr_config::GoDuration| {
        d.to_std()
            .map_or(0, |d| d.as_secs().min(u64::from(u32::MAX)) as u32)
    };
    let timeouts = Timeouts {
        tcp: seconds(&ipvs.tcp_timeout),
        tcp_fin: seconds(&ipvs.tcp_fin_timeout),
        udp: seconds(&ipvs.udp_timeout),
    };
    if timeouts == Timeouts::default() {
        return Ok(());
    }
    match Ipvs::open() {
        Ok(Some(mut handle)) => {
            if let Err(error) = handle.set_timeouts(&timeouts) {
                tracing::error!(%error, "setting the IPVS timeouts failed");
            }
        }
        Ok(None) => {}
        Err(error) => tracing::error!(%error, "setting the IPVS timeouts failed"),
    }
    Ok(())
}

/// The options of `family`'s backend.
fn options(context: &ModeContext<'_>, family: IpFamily, scheduler: Scheduler) -> Result<IpvsOptions, Fatal> {
    let config = &context.settings.config;
    let exclude_cidrs = config
        .ipvs
        .exclude_cidrs
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|cidr| {
            cidr.trim()
                .parse::<IpNet>()
                .map_err(|e| Fatal::usage(format!("ipvs.excludeCIDRs {cidr:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(IpvsOptions {
        scheduler,
        rules: RuleOptions {
            family,
            // Validation keeps the bit within 0..=31; ipvs mode uses the iptables section's.
            masquerade_bit: u8::try_from(config.masquerade_bit())
                .unwrap_or(kpr_iptables::DEFAULT_MASQUERADE_BIT),
            masquerade_all: config.masquerade_all(),
            local_detector: context.host.local_detector.clone(),
            random_fully: true,
        },
        node_port_addresses: context.host.nodeport_addresses.clone(),
        exclude_cidrs,
        node_ip: Some(context.node.ips.of(family)),
    })
}

/// The plan (virtual servers, addresses, set members) as comments, then the iptables
/// ruleset (restore input). This host's addresses stand in for the node's.
fn dry_run(state: &DesiredState, options: &IpvsOptions) -> Result<String, Fatal> {
    let all = crate::addresses::read_interface_addresses()
        .map_err(|e| Fatal::runtime(format!("reading this host's addresses: {e}")))?;
    let host = crate::addresses::HostAddresses::new(&all, options.rules.family, &options.node_port_addresses);
    let inputs = PlanInputs {
        family: options.rules.family,
        scheduler: &options.scheduler,
        node_port_addresses: &host.node_ports,
        other_interface_addresses: &host.others,
        node_ip: options.node_ip,
    };
    let plan = plan(state, &inputs);
    let mut out = String::new();
    for line in plan.to_string().lines() {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&ruleset(&plan, &options.rules).render_full().text);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Settings {
        let mut all = vec!["kube-proxy-rs", "--manifests=x", "--proxy-mode=ipvs"];
        all.extend_from_slice(args);
        kpr_config::load(all).unwrap()
    }

    #[test]
    fn the_scheduler_defaults_to_round_robin_and_a_bad_name_is_a_usage_error() {
        assert_eq!(scheduler(&settings(&[])).unwrap().as_str(), "rr");
        assert_eq!(
            scheduler(&settings(&["--ipvs-scheduler=sh"])).unwrap().as_str(),
            "sh"
        );
        for bad in ["RR", "rr;reboot", "a-very-long-scheduler-name"] {
            let error = scheduler(&settings(&[&format!("--ipvs-scheduler={bad}")])).unwrap_err();
            assert_eq!(error.code, 2, "{bad}");
            assert!(
                error.message.starts_with("--ipvs-scheduler: IPVS scheduler"),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn connection_reuse_is_turned_off_only_on_kernels_from_4_1_to_5_8() {
        for (release, expected) in [
            ("3.10.0-1160.el7.x86_64", Some(ConnReuse::Unsupported)),
            ("4.0.9", Some(ConnReuse::Unsupported)),
            ("4.1.0", Some(ConnReuse::Disable)),
            ("4.19.0-27-amd64", Some(ConnReuse::Disable)),
            ("5.8.18", Some(ConnReuse::Disable)),
            ("5.9.0", Some(ConnReuse::LeaveAsIs)),
            ("6.1.0-31-amd64", Some(ConnReuse::LeaveAsIs)),
            ("6.18.44-fc-v657", Some(ConnReuse::LeaveAsIs)),
            ("", None),
            ("linux", None),
            ("6", None),
        ] {
            assert_eq!(ConnReuse::for_kernel(release), expected, "{release:?}");
        }
    }

    /// Upstream's host settings, each written once and only when it differs.
    #[test]
    fn host_settings_are_upstreams_and_strict_arp_only_when_asked() {
        let root = tempfile::tempdir().unwrap();
        for key in [
            "net/ipv4/vs/conntrack",
            "net/ipv4/vs/expire_nodest_conn",
            "net/ipv4/vs/expire_quiescent_template",
            "net/ipv4/ip_forward",
            "net/ipv4/conf/all/arp_ignore",
            "net/ipv4/conf/all/arp_announce",
        ] {
            let path = root.path().join(key);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "0\n").unwrap();
        }
        // The kernel's default.
        std::fs::write(root.path().join("net/ipv4/vs/conn_reuse_mode"), "1\n").unwrap();
        let write_release = |release: &str| {
            std::fs::create_dir_all(root.path().join("kernel")).unwrap();
            std::fs::write(root.path().join("kernel/osrelease"), format!("{release}\n")).unwrap();
        };
        write_release("6.1.0-31-amd64");
        let sysctl = ProcSysctl::at(root.path());
        prepare_host_with(&settings(&[]), &sysctl).unwrap();
        let read = |key: &str| sysctl.get(key).unwrap().trim().to_string();
        assert_eq!(read("net/ipv4/vs/conntrack"), "1");
        assert_eq!(read("net/ipv4/ip_forward"), "1");
        assert_eq!(
            read("net/ipv4/conf/all/arp_ignore"),
            "0",
            "strict ARP only when asked"
        );
        assert_eq!(read("net/ipv4/vs/conn_reuse_mode"), "1", "left as is from 5.9");
        prepare_host_with(&settings(&["--ipvs-strict-arp"]), &sysctl).unwrap();
        assert_eq!(read("net/ipv4/conf/all/arp_ignore"), "1");
        assert_eq!(read("net/ipv4/conf/all/arp_announce"), "2");
        write_release("5.4.0-150-generic");
        prepare_host_with(&settings(&[]), &sysctl).unwrap();
        assert_eq!(read("net/ipv4/vs/conn_reuse_mode"), "0", "turned off before 5.9");
        write_release("not a version");
        let error = prepare_host_with(&settings(&[]), &sysctl).unwrap_err();
        assert!(error.message.contains("kernel version"), "{}", error.message);
    }
}
