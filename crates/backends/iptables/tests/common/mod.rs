//! Test support: golden-file comparison and the iptables variants a machine may skip.
//! Desired states come from kpr-world (the real conversions and trackers).

#![allow(dead_code)]

use std::path::PathBuf;

use kpr_iptables::Variant;

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with `tests/golden/<name>.txt` (see [`kpr_world::golden`]).
pub fn check_golden(name: &str, actual: &str) {
    kpr_world::golden::check(&golden_dir().join(format!("{name}.txt")), actual);
}

/// Names the iptables variants this machine may skip (comma-separated: `legacy`, `nft`).
/// CI never sets it: there, a variant that does not work fails its tests.
pub const SKIP_VARIANTS_ENV: &str = "KPR_SKIP_IPTABLES_VARIANTS";

pub fn variant_name(variant: Variant) -> &'static str {
    match variant {
        Variant::Legacy => "legacy",
        Variant::Nft => "nft",
        other => panic!("tests pick a variant explicitly, not {other:?}"),
    }
}

/// Whether `KPR_SKIP_IPTABLES_VARIANTS` names `variant`; prints the skip when it does.
pub fn skip_requested(variant: Variant) -> bool {
    let listed = std::env::var(SKIP_VARIANTS_ENV).unwrap_or_default();
    let skip = listed.split(',').any(|name| name.trim() == variant_name(variant));
    if skip {
        eprintln!(
            "SKIPPED: iptables variant {} ({SKIP_VARIANTS_ENV} names it)",
            variant_name(variant)
        );
    }
    skip
}
