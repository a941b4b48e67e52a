//! The one place that knows which proxy modes exist: [`implementation`] maps the configured
//! mode to its crate's value of kpr-mode's `Mode`. Adding a mode is its crate, its name in
//! kpr-config's `ProxyMode`, and one line in that `match`; everything below only ever sees
//! a `&dyn Mode`.

use std::sync::Arc;

use kpr_config::ProxyMode;
use kpr_events::Recorder;
use kpr_metrics::{Metrics, ProxyHealth};
use kpr_mode::{Fatal, Leftovers, Mode, ModeContext};
use kpr_model::IpFamily;
use kpr_state::DesiredState;
use kpr_sync::FamilyBackend;

use crate::families::log_missing_primary_detector;
use crate::health_check_servers;

/// The mode's implementation.
pub fn implementation(mode: ProxyMode) -> &'static dyn Mode {
    match mode {
        ProxyMode::Iptables => &kpr_iptables::IptablesMode,
        ProxyMode::Nftables => &kpr_nftables::NftablesMode,
        ProxyMode::Ipvs => &kpr_ipvs::IpvsMode,
        ProxyMode::Userspace => &kpr_userspace::UserspaceMode,
        ProxyMode::Ebpf => &kpr_ebpf::EbpfMode,
    }
}

/// Every mode, in `ProxyMode::ALL`'s order.
pub fn all() -> impl DoubleEndedIterator<Item = &'static dyn Mode> {
    ProxyMode::ALL.into_iter().map(implementation)
}

/// Every mode's `explain` reader; `ebpf_at`, when given, reads ebpf mode's maps where
/// `--ebpf-pin-root` put them instead of the default directory.
pub fn explainers(ebpf_at: Option<&kpr_ebpf::EbpfExplainer>) -> Vec<&dyn kpr_explain::Explainer> {
    all()
        .filter_map(|m| match (ebpf_at, m.name()) {
            (Some(at), ProxyMode::Ebpf) => Some(at as &dyn kpr_explain::Explainer),
            _ => m.explainer(),
        })
        .collect()
}

/// Upstream 1.37's warning when no mode was configured (k/k #139957, KEP-5343): the default
/// stays iptables until 1.40, then becomes nftables.
pub const DEFAULTED_MODE_WARNING: &str = "No proxy mode was configured, so the default, iptables, is used. \
     Kubernetes will make nftables the default in 1.40: set the mode explicitly (--proxy-mode or the config \
     file's mode) to keep iptables";
/// The reason of the Event saying so.
pub const DEFAULTED_MODE_REASON: &str = "ProxyModeDefaulted";

/// A mode whose feature gate is off is refused, as upstream's validation refuses it (status
/// 1, upstream's message, with the gate named).
pub fn refuse_gated(mode: &dyn Mode, settings: &kpr_config::Settings) -> Result<(), Fatal> {
    let Some(gate) = mode.gate() else {
        return Ok(());
    };
    if settings.gates.enabled(gate) {
        return Ok(());
    }
    Err(Fatal::runtime(format!(
        "failed validate: KubeProxyConfiguration.Mode.ProxyMode: Invalid value: {:?}: must be iptables, nftables, \
         userspace or blank (blank means the best-available proxy [currently iptables]) (feature gate {} is false)",
        mode.name().as_str(),
        gate.name()
    )))
}

/// The warnings said at start-up before anything is checked: the mode's deprecation, and a
/// mode left to its default. Their Events follow once the API client is up
/// ([`start_up_warnings`]).
pub fn warn_at_start_up(mode: &dyn Mode, settings: &kpr_config::Settings) {
    // Upstream logs its deprecation at error level.
    if let Some(deprecation) = mode.deprecation() {
        tracing::error!("{}", deprecation.message);
    }
    if settings.mode_defaulted {
        tracing::warn!("{DEFAULTED_MODE_WARNING}");
    }
}

/// (Event reason, message) of each start-up warning.
pub fn start_up_warnings(
    mode: &dyn Mode,
    settings: &kpr_config::Settings,
) -> Vec<(&'static str, &'static str)> {
    let mut warnings: Vec<(&'static str, &'static str)> = mode
        .deprecation()
        .map(|d| (d.reason, d.message))
        .into_iter()
        .collect();
    if settings.mode_defaulted {
        warnings.push((DEFAULTED_MODE_REASON, DEFAULTED_MODE_WARNING));
    }
    warnings
}

/// What each family's Service health-check servers report to.
pub struct ServiceHealthDeps {
    pub health: Arc<ProxyHealth>,
    pub metrics: Metrics,
    pub recorder: Recorder,
}

/// One backend per family, each ready to sync (host settings it needs already applied),
/// with that family's Service health-check servers following its syncs. The servers listen
/// where NodePorts are served (the node's `nodePortAddresses`), whatever the mode.
pub fn backends(
    mode: &dyn Mode,
    context: &ModeContext<'_>,
    families: &[IpFamily],
    service_health: &ServiceHealthDeps,
) -> Result<Vec<FamilyBackend>, Fatal> {
    log_missing_primary_detector(context.settings, context.node);
    let built: Result<Vec<FamilyBackend>, Fatal> = families
        .iter()
        .map(|&family| {
            let backend = mode.family(context, family)?.into_backend()?;
            let health_check_servers = health_check_servers::start(
                family,
                &context.host.nodeport_addresses,
                &context.node.name,
                service_health.health.clone(),
                service_health.metrics.clone(),
                service_health.recorder.clone(),
            );
            Ok(FamilyBackend::new(family, backend).observed_by(health_check_servers))
        })
        .collect();
    if built.is_err() {
        // Never half-started: what an earlier family's backend put in the kernel goes.
        mode.abandon_start(context.settings);
    }
    built
}

/// `--init-only`: the host settings every family's backend needs, nothing else.
pub fn init_only(mode: &dyn Mode, context: &ModeContext<'_>, families: &[IpFamily]) -> Result<(), Fatal> {
    for &family in families {
        mode.family(context, family)?.prepare_host()?;
    }
    Ok(())
}

/// `--dry-run`: each family's full sync, in the order given, under a comment line saying
/// which family it is and which tool would read it.
pub fn dry_run(
    mode: &dyn Mode,
    context: &ModeContext<'_>,
    states: &[(IpFamily, DesiredState)],
) -> Result<String, Fatal> {
    let mut out = String::new();
    for (family, state) in states {
        out.push_str(&mode.family(context, *family)?.dry_run(state)?);
    }
    Ok(out)
}

/// Start-up, before the first sync: removes what the other modes left behind (upstream's
/// platform cleanup), so their rules cannot answer or drop traffic next to ours. Upstream's
/// modes each remove a subset; we remove every other mode's, because any of them keeps
/// acting on traffic after a switch (ipvs mode's filter rules reject new connections to
/// addresses in its sets, userspace mode's portals redirect to listeners that are gone).
/// Best effort: logged, never fatal.
pub fn remove_other_modes_leftovers(running: &dyn Mode, settings: &kpr_config::Settings) {
    let others = all()
        .rev()
        .filter(|mode| mode.name() != running.name() && !running.adopts().contains(&mode.name()));
    for mode in others {
        mode.remove_leftovers(settings)
            .log_at_start_up(mode.name().as_str());
    }
}

/// `--cleanup`: what every mode (ours or upstream's, both families and iptables flavours)
/// left. We never claim success for what nobody looked at: a family that no flavour's tools
/// could check fails the cleanup (exit 1), where upstream skips it and exits 0.
pub fn cleanup(settings: &kpr_config::Settings) -> Result<(), Fatal> {
    let mut all_leftovers = Leftovers::default();
    for mode in all().rev() {
        all_leftovers.merge(mode.remove_leftovers(settings));
    }
    let failures = all_leftovers.cleanup_failures();
    if failures.is_empty() {
        tracing::info!("cleanup done");
        Ok(())
    } else {
        Err(Fatal::runtime(format!(
            "cleanup incomplete: {}",
            failures.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configured_mode_is_implemented_under_its_own_name() {
        for mode in ProxyMode::ALL {
            assert_eq!(implementation(mode).name(), mode);
        }
    }

    fn settings(args: &[&str]) -> kpr_config::Settings {
        let mut all = vec!["kube-proxy-rs", "--manifests=x"];
        all.extend_from_slice(args);
        kpr_config::load(all).unwrap()
    }

    #[test]
    fn ipvs_mode_is_refused_when_its_gate_is_off_with_status_1() {
        let ipvs = implementation(ProxyMode::Ipvs);
        assert!(refuse_gated(ipvs, &settings(&["--proxy-mode=ipvs"])).is_ok());
        let off = settings(&["--proxy-mode=ipvs", "--feature-gates=KubeProxyIPVS=false"]);
        let error = refuse_gated(ipvs, &off).unwrap_err();
        assert_eq!(error.code, 1);
        assert!(
            error.message.starts_with(
                "failed validate: KubeProxyConfiguration.Mode.ProxyMode: Invalid value: \"ipvs\""
            ),
            "{}",
            error.message
        );
        assert!(error.message.contains("KubeProxyIPVS"), "{}", error.message);
        let nftables = implementation(ProxyMode::Nftables);
        assert!(
            refuse_gated(nftables, &off).is_ok(),
            "only the gated mode is refused"
        );
    }

    #[test]
    fn start_up_warns_of_ipvs_deprecation_and_a_defaulted_mode() {
        let ipvs = implementation(ProxyMode::Ipvs);
        let warnings = start_up_warnings(ipvs, &settings(&["--proxy-mode=ipvs"]));
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].0, "IPVSDeprecation");
        assert!(warnings[0].1.contains("removed in Kubernetes 1.43"));
        let iptables = implementation(ProxyMode::Iptables);
        let defaulted = start_up_warnings(iptables, &settings(&[]));
        assert_eq!(defaulted, [(DEFAULTED_MODE_REASON, DEFAULTED_MODE_WARNING)]);
        assert!(start_up_warnings(iptables, &settings(&["--proxy-mode=iptables"])).is_empty());
    }

    #[test]
    fn only_nftables_rules_use_service_cidrs() {
        let users: Vec<ProxyMode> = all()
            .filter(|mode| mode.uses_service_cidrs())
            .map(|mode| mode.name())
            .collect();
        assert_eq!(users, [ProxyMode::Nftables, ProxyMode::Ebpf]);
    }
}
