//! The seam between kube-proxy-rs and its proxy modes: a mode is one value of the [`Mode`]
//! trait, implemented in the mode's own crate, and the binary picks it in one exhaustive
//! `match` on the configured [`ProxyMode`]. Everything the binary does differently per mode
//! goes through this trait, so adding a mode is its crate, its name in `ProxyMode` and one
//! line in that `match`; the compiler names whatever else must be handled.
//!
//! # What a mode answers
//!
//! | when | method |
//! |---|---|
//! | before anything is changed | [`Mode::gate`] (a feature gate it needs), [`Mode::deprecation`] (said first), [`Mode::check_host`] (the mode cannot run here at all), [`Mode::supports`] per IP family, with [`Mode::requirement`] for the error |
//! | building the process | [`Mode::uses_service_cidrs`] (the API source watches them), [`Mode::register_metrics`] (the metrics only it has) |
//! | per IP family, options built once | [`Mode::family`] -> [`FamilyMode`]: [`FamilyMode::prepare_host`] (`--init-only`), [`FamilyMode::dry_run`] (`--dry-run`), [`FamilyMode::into_backend`] (the kpr-state `Backend` the sync loop drives) |
//! | another mode starts, or `--cleanup` | [`Mode::remove_leftovers`]: what this mode leaves, removed ([`Leftovers`]); [`Mode::adopts`]: the modes whose objects it programs too |
//! | a clean shutdown | [`Mode::on_shutdown`] |
//! | `kube-proxy-rs explain` | [`Mode::explainer`]: the reader of the mode's own objects |
//!
//! What belongs to the node rather than to a mode (local-traffic detection, NodePort
//! addresses, the node IPs, sysctls) arrives ready in [`ModeContext`] (kpr-host), so no two
//! modes read the configuration differently.
//!
//! # A new mode
//!
//! Everything a mode implements, in a mode that programs nothing:
//!
//! ```
//! use kpr_config::ProxyMode;
//! use kpr_explain::Explainer;
//! use kpr_mode::{Deprecation, Fatal, FamilyMode, Gate, Leftovers, Mode, ModeContext};
//! use kpr_model::IpFamily;
//! use kpr_state::{Backend, BackendError, DesiredState, SyncReport, SyncRequest};
//! use prometheus_client::registry::Registry;
//!
//! struct NullMode;
//!
//! impl Mode for NullMode {
//!     fn name(&self) -> ProxyMode {
//!         ProxyMode::Iptables // a new mode adds its own name to ProxyMode
//!     }
//!     fn requirement(&self) -> &'static str {
//!         "nothing"
//!     }
//!     fn gate(&self) -> Option<Gate> {
//!         None
//!     }
//!     fn deprecation(&self) -> Option<Deprecation> {
//!         None
//!     }
//!     fn check_host(&self, _settings: &kpr_config::Settings) -> Result<(), Fatal> {
//!         Ok(())
//!     }
//!     fn supports(&self, _family: IpFamily) -> bool {
//!         true
//!     }
//!     fn uses_service_cidrs(&self) -> bool {
//!         false
//!     }
//!     fn register_metrics(&self, _settings: &kpr_config::Settings, _registry: &mut Registry) {}
//!     fn family(&self, _context: &ModeContext<'_>, family: IpFamily) -> Result<Box<dyn FamilyMode>, Fatal> {
//!         Ok(Box::new(NullFamily(family)))
//!     }
//!     fn on_shutdown(&self, _families: &[IpFamily]) {}
//!     fn remove_leftovers(&self, _settings: &kpr_config::Settings) -> Leftovers {
//!         Leftovers::default()
//!     }
//!     fn adopts(&self) -> &'static [ProxyMode] {
//!         &[]
//!     }
//!     fn explainer(&self) -> Option<&dyn Explainer> {
//!         None
//!     }
//! }
//!
//! struct NullFamily(IpFamily);
//!
//! impl FamilyMode for NullFamily {
//!     fn prepare_host(&self) -> Result<(), Fatal> {
//!         Ok(())
//!     }
//!     fn dry_run(&self, _state: &DesiredState) -> Result<String, Fatal> {
//!         Ok(format!("# {} rules (none)\n", self.0.label()))
//!     }
//!     fn into_backend(self: Box<Self>) -> Result<Box<dyn Backend>, Fatal> {
//!         Ok(Box::new(NullBackend))
//!     }
//! }
//!
//! struct NullBackend;
//!
//! impl Backend for NullBackend {
//!     fn sync(&mut self, _request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
//!         Ok(SyncReport::default())
//!     }
//! }
//!
//! assert_eq!(NullMode.requirement(), "nothing");
//! ```

mod fatal;
mod leftovers;

use std::time::Duration;

pub use fatal::Fatal;
pub use kpr_config::{Gate, ProxyMode, Settings};
use kpr_explain::Explainer;
use kpr_host::{HostFacts, NodeFacts};
use kpr_model::IpFamily;
use kpr_state::{Backend, DesiredState};
pub use leftovers::Leftovers;
use prometheus_client::registry::Registry;

/// One proxy mode: what the binary needs to know about it, in one value.
pub trait Mode: Sync {
    /// The mode's name in the configuration (`--proxy-mode`, `/proxyMode`).
    fn name(&self) -> ProxyMode;

    /// What the host must offer the mode for one IP family, said when it does not.
    fn requirement(&self) -> &'static str;

    /// The feature gate that must be on for the mode to run (ipvs mode: `KubeProxyIPVS`);
    /// with it off the mode is refused at start-up, as upstream's validation refuses it.
    fn gate(&self) -> Option<Gate>;

    /// Said at start-up when the mode is deprecated, before anything else is checked: an
    /// error-level log line and a Warning Event on the Node.
    fn deprecation(&self) -> Option<Deprecation>;

    /// Fails, before anything is changed, when this host cannot run the mode at all (ipvs
    /// mode needs IPVS: upstream's `CanUseIPVSProxier`). Not called for `--dry-run`, which
    /// changes nothing and needs nothing. Per-family needs are [`Mode::supports`].
    fn check_host(&self, settings: &Settings) -> Result<(), Fatal>;

    /// Upstream's `platformCheckSupported`: whether this host can program `family`.
    fn supports(&self, family: IpFamily) -> bool;

    /// Whether the mode uses ServiceCIDR objects (to drop traffic to unallocated cluster
    /// IPs), so the API source must watch them.
    fn uses_service_cidrs(&self) -> bool;

    /// Registers the metrics only this mode has (upstream's per-mode `RegisterMetrics`,
    /// which also asks the feature gates: nftables mode's localhost NodePort metrics exist
    /// only with theirs on); called once, before any backend is built.
    fn register_metrics(&self, settings: &Settings, registry: &mut Registry);

    /// The mode's options for `family`, built once from the settings and the node's facts.
    fn family(&self, context: &ModeContext<'_>, family: IpFamily) -> Result<Box<dyn FamilyMode>, Fatal>;

    /// A clean shutdown (SIGTERM): what the mode must not leave behind. Most modes leave
    /// their rules serving without the process, as upstream's do.
    fn on_shutdown(&self, families: &[IpFamily]);

    /// Removes what this mode leaves in the kernel (both IP families, every flavour of its
    /// tools): when another mode starts (upstream's platform cleanup), and for `--cleanup`.
    /// Best effort: what fails is reported, and the rest is still removed.
    fn remove_leftovers(&self, settings: &Settings) -> Leftovers;

    /// Start-up failed after this mode began programming the kernel (a later family's
    /// backend could not be built, or a first sync only the operator can fix): take away
    /// what this start put there that would act without the process, except what it adopted
    /// from a previous process, which keeps serving. Most modes leave their rules, as after
    /// any exit.
    fn abandon_start(&self, _settings: &Settings) {}

    /// The other modes whose kernel objects this mode programs too (a mode built on
    /// another's rules): their leftovers are this mode's to adopt, not to remove, when it
    /// starts.
    fn adopts(&self) -> &'static [ProxyMode];

    /// The reader of this mode's own objects for `kube-proxy-rs explain`, if it has one.
    fn explainer(&self) -> Option<&dyn Explainer>;
}

/// What a deprecated mode says at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deprecation {
    /// The Event's reason (upstream's `IPVSDeprecation`).
    pub reason: &'static str,
    /// The log line and the Event's note.
    pub message: &'static str,
}

/// One IP family of a mode, its options built.
pub trait FamilyMode: Send {
    /// `--init-only`: the host settings this family's backend needs (a failure is fatal).
    fn prepare_host(&self) -> Result<(), Fatal>;

    /// `--dry-run`: what a full sync of `state` would write, under a comment line naming
    /// the family and the tool that would read it.
    fn dry_run(&self, state: &DesiredState) -> Result<String, Fatal>;

    /// The family's backend, ready to sync (the host settings it needs applied).
    fn into_backend(self: Box<Self>) -> Result<Box<dyn Backend>, Fatal>;
}

/// What a mode's options are built from.
#[derive(Clone, Copy, Debug)]
pub struct ModeContext<'a> {
    pub settings: &'a Settings,
    pub node: &'a NodeFacts,
    /// The node-local facts every mode shares (kpr-host), read once.
    pub host: &'a HostFacts,
    /// `syncPeriod`: modes read the kernel back (and reconcile conntrack) at this rhythm.
    pub sync_period: Duration,
}

/// The comment line above a family's `--dry-run` output: which family, and the tool that
/// would read what follows.
pub fn dry_run_header(family: IpFamily, what: &str) -> String {
    format!("# {} {what}\n", family.label())
}
