//! The manifests in deploy/ must stay valid Kubernetes objects, agree with each other, and
//! carry a KubeProxyConfiguration this binary accepts strictly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kpr_config::{Strictness, decode_config};
use serde::Deserialize;
use serde_json::Value;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Every document of every deploy/*.yaml, as JSON values tagged with their file.
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = Value::deserialize(doc).unwrap();
            out.push((file.display().to_string(), value));
        }
    }
    out
}

fn one<T: serde::de::DeserializeOwned>(kind: &str) -> T {
    let mut found: Vec<T> = documents()
        .into_iter()
        .filter(|(_, v)| v["kind"] == kind)
        .map(|(file, v)| {
            serde_json::from_value(v).unwrap_or_else(|e| panic!("{file}: {kind} does not parse: {e}"))
        })
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind}");
    found.pop().unwrap()
}

#[test]
fn every_document_is_a_known_kind_that_parses_strictly() {
    for (file, value) in documents() {
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        // k8s-openapi ignores unknown fields, so compare round trips to catch typos too.
        let round_trip = match kind.as_str() {
            "DaemonSet" => serde_json::to_value(serde_json::from_value::<DaemonSet>(value.clone()).unwrap()),
            "ServiceAccount" => {
                serde_json::to_value(serde_json::from_value::<ServiceAccount>(value.clone()).unwrap())
            }
            "ClusterRole" => {
                serde_json::to_value(serde_json::from_value::<ClusterRole>(value.clone()).unwrap())
            }
            "ClusterRoleBinding" => {
                serde_json::to_value(serde_json::from_value::<ClusterRoleBinding>(value.clone()).unwrap())
            }
            "ConfigMap" => serde_json::to_value(serde_json::from_value::<ConfigMap>(value.clone()).unwrap()),
            other => panic!("{file}: unexpected kind {other:?}"),
        }
        .unwrap();
        assert_eq!(
            round_trip, value,
            "{file}: {kind} has fields Kubernetes does not know"
        );
    }
}

#[test]
fn the_config_map_holds_a_configuration_the_binary_accepts() {
    let map: ConfigMap = one("ConfigMap");
    let text = &map.data.unwrap()["config.conf"];
    let decoded = decode_config(text, "config.conf".as_ref(), Strictness::Strict).unwrap();
    assert_eq!(decoded.config.mode, "iptables");
    assert!(decoded.unknown_fields.is_empty(), "{:?}", decoded.unknown_fields);
}

#[test]
fn the_daemon_set_runs_on_the_host_network_with_only_the_privileges_it_needs() {
    let ds: DaemonSet = one("DaemonSet");
    let account: ServiceAccount = one("ServiceAccount");
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name, account.metadata.name);
    let main = &pod.containers[0];
    let security = main.security_context.as_ref().unwrap();
    assert_eq!(security.privileged, Some(false));
    let caps = security.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(
        caps.add.as_deref(),
        Some(
            &[
                "NET_ADMIN".to_string(),
                "NET_RAW".to_string(),
                "SYS_RESOURCE".to_string()
            ][..]
        )
    );
    let mounts: Vec<&str> = main
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains(&"/run/xtables.lock"), "{mounts:?}");
    assert!(mounts.contains(&"/lib/modules"), "{mounts:?}");
    let init = &pod.init_containers.unwrap()[0];
    assert!(init.command.iter().flatten().any(|a| a == "--init-only"));
    // The command lines, with the ConfigMap's file where the volume puts it, must load.
    let map: ConfigMap = one("ConfigMap");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(&config, &map.data.unwrap()["config.conf"]).unwrap();
    for container in [main, init] {
        let args = container.command.iter().flatten().map(|a| {
            a.replace("$(NODE_NAME)", "node-1")
                .replace("/var/lib/kube-proxy-rs/config.conf", config.to_str().unwrap())
        });
        let settings = kpr_config::load(args).unwrap_or_else(|e| panic!("{}: {e}", container.name));
        assert_eq!(settings.config.hostname_override, "node-1");
    }
}

#[test]
fn the_role_grants_what_the_sources_watch_and_the_binding_uses_it() {
    let role: ClusterRole = one("ClusterRole");
    let binding: ClusterRoleBinding = one("ClusterRoleBinding");
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let rules = role.rules.unwrap();
    let grants = |group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    for (group, resource) in [
        ("", "services"),
        ("", "nodes"),
        ("discovery.k8s.io", "endpointslices"),
        // nftables mode drops traffic to unallocated cluster IPs by them.
        ("networking.k8s.io", kpr_sources::api::Kind::ServiceCidr.plural()),
    ] {
        for verb in ["list", "watch"] {
            assert!(
                grants(group, resource, verb),
                "{verb} {group}/{resource} not granted"
            );
        }
        assert!(
            !grants(group, resource, "update"),
            "{group}/{resource} must stay read-only"
        );
    }
    // kpr-events' recorder creates Events and patches a repeat into a series on the first.
    for verb in ["create", "patch"] {
        assert!(
            grants("events.k8s.io", "events", verb),
            "{verb} events.k8s.io/events"
        );
    }
}
