//! Fuzz target bodies, as plain functions of the input bytes.
//!
//! Two targets, each a panic-on-violation function so that both libFuzzer (`fuzz/`, on
//! nightly) and the corpus replay (`tests/corpus.rs`, on stable, in CI) run exactly the same
//! code:
//!
//! - [`manifest`]: bytes as a manifest file through parsing, validation and the catalog,
//!   then through the trackers and the iptables renderer;
//! - [`render`]: a structured cluster decoded with `arbitrary` through the model, the
//!   trackers and the renderer under varied options; with a next state, the real iptables
//!   backend syncs both into a [`ModelKernel`] and must end where a fresh sync ends.
//!
//! Both assert that every payload holds only the lines the renderer means to write
//! (kpr-iptables' `restore_syntax::check_payload`): whatever the input, it can never add a rule of its own.

mod kernel;
mod manifest;
mod pipeline;
mod render;
pub mod scenario;

pub use kernel::{ModelKernel, Tables};
pub use manifest::{PATHS as MANIFEST_PATHS, manifest, manifest_payloads};
pub use render::{assert_tables_eq, render, render_payload, render_scenario};

/// A target body: panics when the input breaks an invariant.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/` and `fuzz/corpus/` name them.
pub const TARGETS: [(&str, Target); 2] = [("manifest", manifest), ("render", render)];
