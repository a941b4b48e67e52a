//! The commentary of BENCHMARKS.md: this run's numbers next to reference figures, so a
//! reader can tell whether a number is good without knowing the field.
//!
//! Two kinds of references, quoted here because readers of the report do not have their
//! sources: measurements of upstream-shaped rulesets on the same kind of machine (the
//! kernel and iptables cost any kube-proxy with upstream's rule layout pays), and figures
//! upstream Kubernetes published for its own proxy.

use std::fmt::Write as _;
use std::time::Duration;

use crate::format::{bytes, duration, mebibytes};
use crate::load::{LoadResult, Outcome, Partial};
use crate::report::Row;

/// The sizes the reference figures were measured at.
const REFERENCE_ENDPOINTS: usize = 10;
const SMALL: usize = 1_000;
const LARGE: usize = 10_000;
/// Reference legacy load times at 1k and 10k services (seconds), for the growth ratio.
const LEGACY_SMALL_SECS: f64 = 0.17;
const LEGACY_LARGE_SECS: f64 = 4.9;
/// Reference nf_tables loads: `--noflush` at 1k, flushed tables at 1k and 10k (seconds).
const NFT_NOFLUSH_SMALL_SECS: f64 = 3.5;
const NFT_FLUSHED_SMALL_SECS: f64 = 0.36;
const NFT_FLUSHED_LARGE_SECS: f64 = 9.6;

const NOT_MEASURED: &str = "not measured in this run";

fn find(rows: &[Row], services: usize) -> Option<&Row> {
    rows.iter()
        .find(|r| r.shape.services == services && r.shape.endpoints == REFERENCE_ENDPOINTS)
}

fn full_cell(row: Option<&Row>, pick: fn(&Row) -> &LoadResult) -> String {
    row.map_or_else(
        || NOT_MEASURED.to_string(),
        |r| crate::format::outcome(&pick(r).full, |d| duration(*d)),
    )
}

fn partial_of(row: Option<&Row>, pick: fn(&Row) -> &LoadResult) -> Option<&Partial> {
    row.and_then(|r| pick(r).partial.done())
}

fn legacy(row: &Row) -> &LoadResult {
    &row.legacy
}

fn nft(row: &Row) -> &LoadResult {
    &row.nft
}

/// `b / a` as `12×`, when both loads finished.
fn growth(small: Option<&Row>, large: Option<&Row>, pick: fn(&Row) -> &LoadResult) -> Option<f64> {
    let secs = |row: Option<&Row>| match &pick(row?).full {
        Outcome::Done(d) => Some(d.as_secs_f64()),
        _ => None,
    };
    Some(secs(large)? / secs(small)?)
}

pub fn commentary(rows: &[Row]) -> String {
    let small = find(rows, SMALL);
    let large = find(rows, LARGE);
    let mut out = String::from("## Commentary\n\n");
    out.push_str(
        "Reference figures: *measured* ones come from loading rulesets shaped like upstream \
         kube-proxy's (KUBE-SERVICES -> KUBE-SVC-* with statistic rules -> KUBE-SEP-* with \
         masquerade and DNAT, 10 endpoints per service) into an empty namespace on the same \
         kind of machine (Linux 6.18, iptables 1.8.9, 2 cores, median of 5, noisy: compare \
         ratios); *published* ones are upstream Kubernetes' own figures.\n\n",
    );
    comparison_table(&mut out, small, large);
    bullets(&mut out, small, large);
    out
}

fn comparison_table(out: &mut String, small: Option<&Row>, large: Option<&Row>) {
    let payload = large.map_or_else(|| NOT_MEASURED.to_string(), |r| bytes(r.render.payload_bytes));
    let partial = partial_of(large, legacy)
        .or(partial_of(large, nft))
        .map_or_else(|| NOT_MEASURED.to_string(), |p| bytes(p.bytes));
    let _ = write!(
        out,
        "| what (services × 10 endpoints) | reference, measured | this run |\n\
         |---|---:|---:|\n\
         | `iptables-legacy-restore`, whole ruleset, 1k | 0.17 s | {} |\n\
         | `iptables-legacy-restore`, whole ruleset, 10k | 4.9 s | {} |\n\
         | `iptables-restore --noflush` (nf_tables), whole ruleset, 1k | 3.5 s | {} |\n\
         | `iptables-restore --noflush` (nf_tables), whole ruleset, 10k | more than 300 s | {} |\n\
         | `iptables-restore` (nf_tables) into flushed tables, 1k / 10k | 0.36 s / 9.6 s (517 MiB RSS) | {} / {} |\n\
         | restore payload, 10k | ~33 MB | {payload} |\n\
         | payload of a one-service change, 10k | ~3 KB (changed chains only); ~1.4 MB when KUBE-SERVICES is rewritten too | {partial} |\n\n",
        full_cell(small, legacy),
        full_cell(large, legacy),
        full_cell(small, nft),
        full_cell(large, nft),
        flushed_cell(small),
        flushed_cell(large),
    );
}

fn flushed_cell(row: Option<&Row>) -> String {
    row.map_or_else(
        || NOT_MEASURED.to_string(),
        |r| crate::format::outcome(&r.nft_flushed.load, |d| duration(*d)),
    )
}

fn bullets(out: &mut String, small: Option<&Row>, large: Option<&Row>) {
    if let Some(row) = large {
        let render = row.render.total;
        let (headline, share) = match &row.legacy.full {
            Outcome::Done(load) => {
                let percent = 100.0 * render.as_secs_f64() / load.as_secs_f64();
                let headline = if percent < 50.0 {
                    "Our code is the small part of a full sync."
                } else {
                    "Rendering is a large part of a full sync."
                };
                let share = format!(
                    ", {percent:.0}% of the {} the kernel needs to load the result with \
                     iptables-legacy",
                    duration(*load)
                );
                (headline, share)
            }
            _ => ("Rendering.", String::new()),
        };
        let _ = writeln!(
            out,
            "- **{headline}** Rendering 10k services × 10 endpoints takes {}{share}.",
            duration(render)
        );
    }
    let reference_growth = LEGACY_LARGE_SECS / LEGACY_SMALL_SECS;
    if let Some(g) = growth(small, large, legacy) {
        let nft_growth = growth(small, large, nft)
            .map(|n| format!(", iptables-nft {n:.0}×"))
            .unwrap_or_default();
        let headline = if g > 12.0 {
            "Kernel cost grows faster than the ruleset."
        } else {
            "Kernel cost grows about as fast as the ruleset."
        };
        let _ = writeln!(
            out,
            "- **{headline}** 10× the services made the full \
             load {g:.0}× slower with iptables-legacy{nft_growth} (reference: 4.9 s / 0.17 s ≈ \
             {reference_growth:.0}×). Upstream's layout has a chain per endpoint; fewer kernel \
             objects, not faster rendering, is where a faster proxy would come from."
        );
    }
    let too_slow = large.is_some_and(|r| match &r.nft.full {
        Outcome::TimedOut(_) => true,
        Outcome::Done(d) => *d >= Duration::from_secs(60),
        _ => false,
    });
    let consequence = if too_slow {
        " The product cannot flush whole tables (filter and nat hold other software's rules \
         too), so on nft-based hosts a full sync at this scale needs another way to write the \
         rules (smaller transactions, or nftables mode)."
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "- **`--noflush` on nf_tables.** The product writes with `iptables-restore --noflush` \
         (it must leave chains it does not own alone), which the reference finds pathological \
         on the nf_tables backend at scale. Here the whole ruleset took {} with iptables-nft \
         against {} with iptables-legacy at 1k services, and {} against {} at 10k; a \
         flushing iptables-nft restore of the same payload took {} at 10k.{consequence}",
        full_cell(small, nft),
        full_cell(small, legacy),
        full_cell(large, nft),
        full_cell(large, legacy),
        flushed_cell(large),
    );
    factor_bullet(out, small, large);
    partial_bullet(out, large);
    published_bullet(out, large);
    let _ = writeln!(
        out,
        "- **Not measured here: the data path at scale** (`--parts l4` measures it with one \
         Service). Upstream's blog (\"NFTables mode for kube-proxy\", 2025-02-28) gives \
         iptables first-packet RTT p50 of 0.047 ms at 5k services, 0.062 ms at 10k and 0.27 ms \
         at 30k, with nftables roughly flat."
    );
}

/// This run's load times over the reference's, where both are numbers.
fn reference_factors(small: Option<&Row>, large: Option<&Row>) -> Vec<f64> {
    let seconds = |outcome: &Outcome<Duration>| outcome.done().map(Duration::as_secs_f64);
    let pairs = [
        (small.and_then(|r| seconds(&r.legacy.full)), LEGACY_SMALL_SECS),
        (large.and_then(|r| seconds(&r.legacy.full)), LEGACY_LARGE_SECS),
        (small.and_then(|r| seconds(&r.nft.full)), NFT_NOFLUSH_SMALL_SECS),
        (
            small.and_then(|r| seconds(&r.nft_flushed.load)),
            NFT_FLUSHED_SMALL_SECS,
        ),
        (
            large.and_then(|r| seconds(&r.nft_flushed.load)),
            NFT_FLUSHED_LARGE_SECS,
        ),
    ];
    pairs
        .into_iter()
        .filter_map(|(ours, reference)| Some(ours? / reference))
        .collect()
}

fn factor_bullet(out: &mut String, small: Option<&Row>, large: Option<&Row>) {
    let factors = reference_factors(small, large);
    let (Some(min), Some(max)) = (
        factors.iter().copied().reduce(f64::min),
        factors.iter().copied().reduce(f64::max),
    ) else {
        return;
    };
    if factors.len() < 2 {
        return;
    }
    let reading = if max / min < 2.0 {
        "a similar factor for every variant and size, with a payload of the same size, which \
         points at the machine (its speed, other work on it) rather than at the rules"
    } else {
        "factors that differ by variant and size; see the table above"
    };
    let _ = writeln!(
        out,
        "- **Against the reference.** This run's loads took {min:.1}–{max:.1}× the reference \
         times: {reading}."
    );
}

fn partial_bullet(out: &mut String, large: Option<&Row>) {
    let (Some(row), Some(p)) = (large, partial_of(large, legacy)) else {
        return;
    };
    let nft = match &row.nft.partial {
        Outcome::Done(p) => format!(
            ", and {} with iptables-nft (restore {})",
            duration(p.sync),
            duration(p.restore)
        ),
        _ => format!(
            "; iptables-nft made no partial sync, as its full load {}",
            crate::format::outcome(&row.nft.full, |_| "failed".to_string())
        ),
    };
    let _ = writeln!(
        out,
        "- **Partial syncs.** After one endpoint changed at 10k services the backend wrote {}: \
         the changed service's chains (the reference's ~3 KB) plus the fixed chains, \
         KUBE-SERVICES included, which every sync rewrites (the reference's ~1.4 MB case). \
         The whole sync step took {} with iptables-legacy (restore {}){}; on nf_tables after \
         a flushing load, the partial restore took {}. \
         iptables-legacy replaces a whole table in one kernel call, so even a \
         small restore pays for the size of the table{}.",
        bytes(p.bytes),
        duration(p.sync),
        duration(p.restore),
        nft,
        crate::format::outcome(&row.nft_flushed.partial, |d| duration(*d)),
        row.legacy.full.done().map_or_else(String::new, |full| format!(
            " ({} here, against {} for loading everything)",
            duration(p.restore),
            duration(*full)
        )),
    );
}

fn published_bullet(out: &mut String, large: Option<&Row>) {
    let ours = large
        .and_then(|r| partial_of(Some(r), legacy).map(|p| (r, p.sync)))
        .map(|(r, sync): (&Row, Duration)| {
            let memory = r
                .render
                .extra_memory_kib
                .map(|kib| format!("; rendering raised our peak RSS by {}", mebibytes(kib)))
                .unwrap_or_default();
            format!(
                " Ours at 10k services × 10 endpoints (iptables mode, so compare orders of \
                 magnitude only): a one-endpoint change syncs in {}{memory}.",
                duration(sync)
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "- **Upstream's published figures** (nftables mode). Kubernetes PR #126013 (kind, 10k \
         services × 2 endpoints): adding one service with 10k present took ~8 min before \
         partial syncs and ~141 ms after; peak memory went from 650 to 260 MiB. Issue #139513: \
         at 44,128 services an incremental sync takes 1.33 s after the fix (`nft list table` \
         40 s). Issue #135639: 5,006 services with ~250k endpoints need 2m12s for a full \
         nftables sync on kernel 6.12.{ours}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::row;

    #[test]
    fn compares_measured_sizes_with_the_reference() {
        let text = commentary(&[row(1_000, 0.2), row(10_000, 5.0)]);
        assert!(
            text.contains("| `iptables-legacy-restore`, whole ruleset, 1k | 0.17 s | 200 ms |"),
            "{text}"
        );
        assert!(
            text.contains("| `iptables-legacy-restore`, whole ruleset, 10k | 4.9 s | 5.00 s |"),
            "{text}"
        );
        assert!(
            text.contains("| 0.36 s / 9.6 s (517 MiB RSS) | 400 ms / 10.00 s |"),
            "{text}"
        );
        assert!(
            text.contains("after a flushing load, the partial restore took 700 ms"),
            "{text}"
        );
        assert!(text.contains("timed out after 600 s"), "{text}");
        assert!(text.contains("needs another way to write"), "{text}");
        assert!(text.contains("load 25× slower with iptables-legacy"), "{text}");
        assert!(text.contains("small part of a full sync.** Rendering 10k services × 10 endpoints takes 120 ms, 2% of the 5.00 s"), "{text}");
        assert!(
            text.contains("Kernel cost grows faster than the ruleset"),
            "{text}"
        );
        assert!(text.contains("the backend wrote 1.4 MB"), "{text}");
    }

    #[test]
    fn sizes_not_run_are_marked_not_measured() {
        let text = commentary(&[row(500, 0.1)]);
        assert!(text.contains(&format!("| 0.17 s | {NOT_MEASURED} |")), "{text}");
        assert!(!text.contains("Kernel cost grows"), "{text}");
        assert!(!text.contains("Partial syncs."), "{text}");
        assert!(!text.contains("Against the reference"), "{text}");
    }
}
