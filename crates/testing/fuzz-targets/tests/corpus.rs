//! The fuzz corpus, replayed on stable: every committed input of `fuzz/corpus/<target>/`,
//! `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` goes through the same target
//! function libFuzzer runs, so CI re-checks every invariant on every input the fuzzer
//! found interesting, and a crash once found and fixed stays fixed.
//!
//! The corpus must be there: a missing or empty corpus directory fails the test instead of
//! replaying nothing.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use kpr_fuzz_targets::{TARGETS, manifest_payloads, render_payload};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../fuzz")
}

/// The files of `dir`, sorted; `None` when the directory does not exist.
fn inputs(dir: &Path) -> Option<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("corpus directory entry").path())
        .filter(|path| path.is_file() && !is_marker(path))
        .collect();
    files.sort();
    Some(files)
}

/// `.gitkeep` and notes that keep empty directories in git are not inputs.
fn is_marker(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with('.') || name.ends_with(".md"))
}

/// Runs `target` on every file; returns the files that panicked, with the message.
fn replay(target: fn(&[u8]), files: &[PathBuf]) -> Vec<String> {
    let mut failures = Vec::new();
    for file in files {
        let data = std::fs::read(file).expect("readable corpus file");
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| target(&data))) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            failures.push(format!("{}: {message}", file.display()));
        }
    }
    failures
}

fn replay_dir(kind: &str, name: &str, target: fn(&[u8]), required: bool) -> usize {
    let dir = fuzz_dir().join(kind).join(name);
    let files = match inputs(&dir) {
        Some(files) => files,
        None if required => panic!("{} is missing", dir.display()),
        None => return 0,
    };
    if required {
        assert!(!files.is_empty(), "{} holds no inputs", dir.display());
    }
    let failures = replay(target, &files);
    assert!(
        failures.is_empty(),
        "{} of {} inputs in {} fail target {name}:\n{}",
        failures.len(),
        files.len(),
        dir.display(),
        failures.join("\n")
    );
    files.len()
}

fn target(name: &str) -> fn(&[u8]) {
    TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .expect("known target")
}

#[test]
fn manifest_corpus_replays() {
    let count = replay_dir("corpus", "manifest", target("manifest"), true);
    eprintln!("replayed {count} manifest corpus inputs");
}

#[test]
fn manifest_seeds_replay() {
    let count = replay_dir("seeds", "manifest", target("manifest"), true);
    eprintln!("replayed {count} manifest seeds");
}

#[test]
fn render_corpus_replays() {
    let count = replay_dir("corpus", "render", target("render"), true);
    eprintln!("replayed {count} render corpus inputs");
}

/// How many payloads of a corpus carry service rules, and how many endpoint chains.
fn reach(payloads: impl Iterator<Item = Vec<String>>) -> (usize, usize) {
    let (mut services, mut endpoints) = (0, 0);
    for payload in payloads {
        let service_rule = |p: &String| p.contains(" cluster IP\" ") || p.contains(" has no endpoints\" ");
        services += usize::from(payload.iter().any(service_rule));
        endpoints += usize::from(payload.iter().any(|p| p.contains(":KUBE-SEP-")));
    }
    (services, endpoints)
}

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let dir = fuzz_dir().join("corpus").join(name);
    let files = inputs(&dir).unwrap_or_else(|| panic!("{} is missing", dir.display()));
    files
        .iter()
        .map(|f| std::fs::read(f).expect("readable corpus file"))
        .collect()
}

/// A corpus that no longer reaches the rules (say, after the scenario's encoding changed)
/// would replay green while testing nothing: then it is time to grow and minimize it again.
#[test]
fn the_corpus_reaches_the_rules() {
    let manifests = corpus("manifest");
    let (services, endpoints) = reach(manifests.iter().map(|data| manifest_payloads(data)));
    eprintln!(
        "manifest corpus: {} inputs, {services} with service rules, {endpoints} with endpoint chains",
        manifests.len()
    );
    assert!(
        services > 0 && endpoints > 0,
        "the manifest corpus never reaches service and endpoint rules"
    );

    let scenarios = corpus("render");
    let (services, endpoints) = reach(
        scenarios
            .iter()
            .filter_map(|data| render_payload(data))
            .map(|p| vec![p]),
    );
    eprintln!(
        "render corpus: {} inputs, {services} with service rules, {endpoints} with endpoint chains",
        scenarios.len()
    );
    assert!(
        services * 4 >= scenarios.len() && endpoints > 0,
        "under a quarter of the render corpus reaches service rules, or none reaches endpoints"
    );
}

#[test]
fn crash_regressions_stay_fixed() {
    for (name, target) in TARGETS {
        replay_dir("regressions", name, target, false);
    }
}

/// Every target has its libFuzzer entry point and a corpus; a target added to the library
/// but not to `fuzz/` (or the other way round) would silently never be fuzzed.
#[test]
fn every_target_is_wired_into_cargo_fuzz() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut bins = Vec::new();
    for (name, _) in TARGETS {
        let entry = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let source = std::fs::read_to_string(&entry).unwrap_or_else(|e| panic!("{}: {e}", entry.display()));
        assert!(
            source.contains(&format!("kpr_fuzz_targets::{name}(data)")),
            "{} does not call kpr_fuzz_targets::{name}",
            entry.display()
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
        assert!(
            fuzz_dir().join("corpus").join(name).is_dir(),
            "no corpus for {name}"
        );
        bins.push(name);
    }
    let declared = manifest.matches("[[bin]]").count();
    assert_eq!(
        declared,
        bins.len(),
        "fuzz/Cargo.toml declares targets the library lacks"
    );
}
