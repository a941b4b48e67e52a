//! Test support: golden-file comparison and the iptables variants a machine may skip.
//! Desired states come from kpr-world (the real conversions and trackers).

#![allow(dead_code)]

use std::path::PathBuf;

use kpr_iptables::Variant;

pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with `tests/golden/<name>.txt` byte for byte, or rewrites the file
/// when `UPDATE_GOLDEN=1`.
pub fn check_golden(name: &str, actual: &str) {
    let path = golden_dir().join(format!("{name}.txt"));
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, actual).unwrap();
        // Not a pass: nothing was compared. Say so, so a stray UPDATE_GOLDEN is noticed.
        eprintln!("UPDATED (not compared): {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if let Some(diff) = golden_diff(&path.display().to_string(), &expected, actual) {
        panic!("golden mismatch for {name} (UPDATE_GOLDEN=1 to accept):\n{diff}");
    }
}

/// A unified diff from the golden file's content to `actual`, or `None` when they are
/// byte-identical.
pub fn golden_diff(golden: &str, expected: &str, actual: &str) -> Option<String> {
    if expected == actual {
        return None;
    }
    let diff = similar::TextDiff::from_lines(expected, actual)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{golden} (expected)"), "rendered (actual)")
        .to_string();
    Some(diff)
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
