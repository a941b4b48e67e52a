//! Hostile manifest files cost a rejection, not the node's memory. The alias bomb is parsed
//! in a child process (this test binary, re-run on one test) whose address space is capped,
//! so a regression fails the test instead of exhausting the machine, and whose peak memory
//! is read back from the kernel.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use kpr_model::RejectReason;
use kpr_sources::manifests::{ParsedFile, parse_manifest};

const CHILD: &str = "KPR_ALIAS_BOMB_CHILD";
/// The child's address-space cap: far above what refusing the bomb needs, far below what
/// expanding it would take (hundreds of gigabytes).
const ADDRESS_SPACE_CAP: u64 = 4 << 30;
/// What refusing the bomb may cost at most: the file's events plus the budgeted values.
const PEAK_MEMORY_CEILING_KIB: u64 = 512 * 1024;

/// 200,000 aliases of a 200,000-item list: 1.2 MB of YAML, 40 billion values if expanded.
fn quadratic_bomb() -> String {
    let n = 200_000;
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nitems: &a [{}]\nmore: [{}]\n",
        vec!["1"; n].join(","),
        vec!["*a"; n].join(",")
    )
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// In the child: parse under the cap, print the outcome and the peak memory.
fn parse_bomb_and_report() {
    use nix::sys::resource::{Resource, setrlimit};
    setrlimit(Resource::RLIMIT_AS, ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP).unwrap();
    let text = quadratic_bomb();
    let outcome = match parse_manifest(Path::new("/m/bomb.yaml"), text.as_bytes(), None) {
        ParsedFile::Malformed(rejection) if rejection.reason == RejectReason::Malformed => {
            format!("refused: {}", rejection.detail)
        }
        other => format!("accepted: {other:?}"),
    };
    println!("outcome={outcome}");
    println!("peak_rss_kib={}", peak_rss_kib());
}

#[test]
fn a_quadratic_alias_bomb_is_refused_with_bounded_memory() {
    if std::env::var_os(CHILD).is_some() {
        parse_bomb_and_report();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_quadratic_alias_bomb_is_refused_with_bounded_memory",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let value = |key: &str| {
        stdout
            .lines()
            .find_map(|line| line.split_once(key).map(|(_, value)| value))
            .unwrap_or_else(|| panic!("no {key} in the child's output:\n{stdout}\n{stderr}"))
            .to_owned()
    };
    let outcome = value("outcome=");
    assert!(
        outcome.starts_with("refused: ") && outcome.contains("expands to far more than its file's size"),
        "{outcome}"
    );
    let peak: u64 = value("peak_rss_kib=").parse().unwrap();
    assert!(
        peak < PEAK_MEMORY_CEILING_KIB,
        "refusing a {} byte bomb peaked at {peak} KiB",
        quadratic_bomb().len()
    );
}
