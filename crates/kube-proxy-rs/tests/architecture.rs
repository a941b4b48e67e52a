//! The shape of the workspace, checked: which crates may depend on which, and which know
//! the proxy modes. Read from `cargo metadata` and the sources themselves, so a change that
//! breaks a rule fails here with the crate and the path that break it.
//!
//! The rules (ARCHITECTURE.md says why):
//! - the generic layers (model, sources, tracking, state, runner, sync) depend on no crate
//!   under `crates/backends/` and name no mode, by string or by `ProxyMode`;
//! - kpr-config, kpr-host, kpr-mode and kpr-explain depend on no backend crate either;
//! - nftables mode does not depend on kpr-iptables;
//! - kpr-relay, the data path of the modes that carry traffic themselves, depends on no
//!   other backend crate and names no mode;
//! - outside kpr-config, only the binary's `mode.rs` matches on `ProxyMode`, and each
//!   backend crate names only its own mode.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const GENERIC_LAYERS: [&str; 6] = [
    "kpr-model",
    "kpr-sources",
    "kpr-tracking",
    "kpr-state",
    "kpr-runner",
    "kpr-sync",
];
const MODE_FREE: [&str; 4] = ["kpr-config", "kpr-host", "kpr-mode", "kpr-explain"];
const MODE_NAMES: [&str; 5] = ["iptables", "nftables", "ipvs", "userspace", "ebpf"];
/// The in-process data path (listeners, balancer, TCP threads) more than one mode drives.
const RELAY: &str = "kpr-relay";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

/// Every workspace crate: its folder, and the workspace crates it depends on for building
/// (normal dependencies, not dev or build ones).
struct Workspace {
    folders: BTreeMap<String, PathBuf>,
    deps: BTreeMap<String, BTreeSet<String>>,
}

impl Workspace {
    fn read() -> Self {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let output = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
            .current_dir(workspace_root())
            .output()
            .expect("cargo metadata runs");
        assert!(
            output.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
        let packages = metadata["packages"].as_array().unwrap();
        let names: BTreeSet<String> = packages
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect();
        let mut folders = BTreeMap::new();
        let mut deps = BTreeMap::new();
        for package in packages {
            let name = package["name"].as_str().unwrap().to_string();
            let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap());
            folders.insert(name.clone(), manifest.parent().unwrap().to_path_buf());
            let normal: BTreeSet<String> = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().unwrap().to_string())
                .filter(|d| names.contains(d))
                .collect();
            deps.insert(name, normal);
        }
        Self { folders, deps }
    }

    fn is_backend(&self, name: &str) -> bool {
        self.folders[name].starts_with(workspace_root().join("crates/backends"))
    }

    /// Every workspace crate `name` builds on, with the chain of crates that leads there.
    fn closure(&self, name: &str) -> BTreeMap<String, Vec<String>> {
        let mut reached: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut queue = vec![(name.to_string(), vec![name.to_string()])];
        while let Some((current, path)) = queue.pop() {
            for dep in &self.deps[&current] {
                if reached.contains_key(dep) {
                    continue;
                }
                let mut via = path.clone();
                via.push(dep.clone());
                reached.insert(dep.clone(), via.clone());
                queue.push((dep.clone(), via));
            }
        }
        reached
    }

    /// The backend crates `name` builds on, each with the chain that leads there.
    fn backends_under(&self, name: &str) -> Vec<String> {
        self.closure(name)
            .into_iter()
            .filter(|(dep, _)| self.is_backend(dep))
            .map(|(_, path)| path.join(" -> "))
            .collect()
    }
}

#[test]
fn generic_layers_and_the_seam_build_on_no_backend() {
    let workspace = Workspace::read();
    for name in GENERIC_LAYERS.iter().chain(&MODE_FREE) {
        assert!(workspace.folders.contains_key(*name), "no crate {name}");
        let found = workspace.backends_under(name);
        assert!(found.is_empty(), "{name} builds on backend crates: {found:?}");
    }
}

#[test]
fn nftables_mode_does_not_build_on_iptables_mode() {
    let workspace = Workspace::read();
    let reached = workspace.closure("kpr-nftables");
    assert!(
        !reached.contains_key("kpr-iptables"),
        "kpr-nftables builds on kpr-iptables: {:?}",
        reached["kpr-iptables"]
    );
}

/// Every mode that carries traffic itself builds on the relay, so whatever it builds on,
/// they all would: one backend crate under it (kpr-iptables, say) would put iptables mode's
/// machinery under nftables mode. It needs none: rule and object names (kpr-naming) belong
/// to the rules that lead to it, and conntrack cleanups (kpr-conntrack) to the mode whose
/// rules leave flows behind.
#[test]
fn the_relay_builds_on_no_other_backend_and_names_no_mode() {
    let workspace = Workspace::read();
    assert!(
        workspace.is_backend(RELAY),
        "{RELAY} moved out of crates/backends"
    );
    let found = workspace.backends_under(RELAY);
    assert!(found.is_empty(), "{RELAY} builds on backend crates: {found:?}");
    let mut offenders = Vec::new();
    for file in production_sources(&workspace.folders[RELAY]) {
        let found = mode_names_in(&production_text(&file));
        if !found.is_empty() {
            offenders.push(format!("{}: {found:?}", file.display()));
        }
    }
    assert!(offenders.is_empty(), "{RELAY} naming a mode: {offenders:#?}");
}

/// Production sources of `folder`: `src/**/*.rs` without the files that hold only tests.
fn production_sources(folder: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![folder.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The part of a source file before its `#[cfg(test)]` module.
fn production_text(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    match text.find("\n#[cfg(test)]") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// How many modes a mode's `fn adopts` names (the body up to its closing brace).
fn adopted_in(text: &str) -> usize {
    let Some(start) = text.find("fn adopts(") else {
        return 0;
    };
    let body = &text[start..];
    let end = body.find("\n    }").unwrap_or(body.len());
    body[..end].matches("ProxyMode::").count()
}

/// `"iptables"` and the like as string literals, and the mode enum.
fn mode_names_in(text: &str) -> Vec<String> {
    let mut found: Vec<String> = MODE_NAMES
        .iter()
        .map(|mode| format!("\"{mode}\""))
        .filter(|quoted| text.contains(quoted.as_str()))
        .collect();
    if text.contains("ProxyMode") {
        found.push("ProxyMode".to_string());
    }
    found
}

#[test]
fn generic_layers_name_no_mode() {
    let workspace = Workspace::read();
    let mut offenders = Vec::new();
    for name in GENERIC_LAYERS {
        for file in production_sources(&workspace.folders[name]) {
            let found = mode_names_in(&production_text(&file));
            if !found.is_empty() {
                offenders.push(format!("{}: {found:?}", file.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "generic layers naming a mode: {offenders:#?}"
    );
}

/// The checker finds what it looks for (a rule whose check cannot fail proves nothing).
#[test]
fn the_mode_name_check_sees_literals_and_the_enum() {
    assert_eq!(
        mode_names_in(r#"match backend.mode() { "iptables" => 1, _ => 2 }"#),
        ["\"iptables\""]
    );
    assert_eq!(mode_names_in("fn f(m: ProxyMode) {}"), ["ProxyMode"]);
    assert!(mode_names_in("// an iptables-restore payload").is_empty());
}

#[test]
fn only_the_binarys_mode_seam_matches_on_the_mode() {
    let workspace = Workspace::read();
    let seam = workspace.folders["kube-proxy-rs"].join("src/mode.rs");
    let mut offenders = Vec::new();
    for (name, folder) in &workspace.folders {
        if name == "kpr-config" || name == "kpr-mode" {
            continue;
        }
        for file in production_sources(folder) {
            let text = production_text(&file);
            let variants: BTreeSet<&str> = ["Iptables", "Nftables", "Ipvs", "Userspace", "Ebpf"]
                .into_iter()
                .filter(|v| text.contains(&format!("ProxyMode::{v}")))
                .collect();
            let allowed = if file == seam {
                usize::MAX
            } else if workspace.is_backend(name) {
                // Its own name, in Mode::name, and the modes whose objects it programs
                // too, in Mode::adopts.
                1 + adopted_in(&text)
            } else {
                0
            };
            if variants.len() > allowed {
                offenders.push(format!("{}: {variants:?}", file.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "mode variants outside the seam: {offenders:#?}"
    );
}
