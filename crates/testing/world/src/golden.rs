//! Golden files: rendered text compared byte for byte with a file in the repository, or
//! rewritten with `UPDATE_GOLDEN=1` (which is then not a pass: nothing was compared, and the
//! test says so, so a stray variable is noticed). Every crate's golden tests use this one.

use std::path::Path;

/// Compares `actual` with the file at `path`; panics with a unified diff when they differ.
pub fn check(path: &Path, actual: &str) {
    if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        }
        std::fs::write(path, actual).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("UPDATED (not compared): {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if let Some(diff) = diff(&path.display().to_string(), &expected, actual) {
        panic!(
            "golden mismatch for {} (UPDATE_GOLDEN=1 to accept):\n{diff}",
            path.display()
        );
    }
}

/// A unified diff from the golden file's content to `actual`, or `None` when they are
/// byte-identical.
pub fn diff(golden: &str, expected: &str, actual: &str) -> Option<String> {
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
