//! Reading and writing the KubeProxyConfiguration file.
//!
//! Upstream first decodes strictly; when only unknown or duplicate fields make that fail, it
//! decodes v1alpha1 again leniently and logs a warning, so ConfigMaps carrying fields from
//! other releases (e.g. the long-removed `resourceContainer`) keep working. We do the same in
//! one pass: [`Strictness::Strict`] turns unknown fields into an error, [`Strictness::Lenient`]
//! returns them so the caller can warn. Either way a wrong `apiVersion`/`kind` or a value of
//! the wrong type is an error naming the file and the field.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ConfigError;
use crate::types::{API_VERSION, KIND, KubeProxyConfiguration};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strictness {
    /// Unknown fields are an error.
    Strict,
    /// Unknown fields are reported back (upstream's fallback for v1alpha1).
    Lenient,
}

/// A decoded file, not yet defaulted.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedFile {
    pub config: KubeProxyConfiguration,
    /// Dotted paths of fields that were ignored (only with [`Strictness::Lenient`]).
    pub unknown_fields: Vec<String>,
}

pub fn read_config_file(path: &Path, strictness: Strictness) -> Result<DecodedFile, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    decode_config(&text, path, strictness)
}

/// Decodes YAML or JSON text; `path` only names the source in errors.
pub fn decode_config(text: &str, path: &Path, strictness: Strictness) -> Result<DecodedFile, ConfigError> {
    let decode_error = |field: Option<&str>, detail: String| ConfigError::Decode {
        path: path.to_path_buf(),
        field: field.map(str::to_string),
        detail,
    };
    let mut document: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
        .map_err(|e| decode_error(None, format!("not valid YAML or JSON: {e}")))?;
    document
        .apply_merge()
        .map_err(|e| decode_error(None, format!("bad YAML merge key: {e}")))?;
    check_type_meta(&document).map_err(|(field, detail)| decode_error(Some(field), detail))?;

    let mut unknown_fields = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let tracked = serde_path_to_error::Deserializer::new(document, &mut track);
    let decoded = serde_ignored::deserialize(tracked, |ignored| unknown_fields.push(ignored.to_string()));
    let config: KubeProxyConfiguration = decoded.map_err(|e| {
        let field = track.path().to_string();
        let field = (field != ".").then_some(field);
        decode_error(field.as_deref(), e.to_string())
    })?;
    if strictness == Strictness::Strict && !unknown_fields.is_empty() {
        return Err(ConfigError::UnknownFields {
            path: path.to_path_buf(),
            fields: unknown_fields,
        });
    }
    Ok(DecodedFile {
        config,
        unknown_fields,
    })
}

/// Checks `apiVersion` and `kind` before anything else, as upstream's scheme does.
fn check_type_meta(document: &serde_yaml_ng::Value) -> Result<(), (&'static str, String)> {
    if !document.is_mapping() {
        let what = if document.is_null() {
            "empty"
        } else {
            "not a mapping"
        };
        return Err(("apiVersion", format!("missing: the document is {what}")));
    }
    expect_string(document, "apiVersion", API_VERSION)?;
    expect_string(document, "kind", KIND)
}

fn expect_string(
    document: &serde_yaml_ng::Value,
    field: &'static str,
    expected: &str,
) -> Result<(), (&'static str, String)> {
    match document.get(field).map(serde_yaml_ng::Value::as_str) {
        None => Err((field, format!("missing; must be {expected:?}"))),
        Some(Some(found)) if found == expected => Ok(()),
        Some(Some(found)) => Err((field, format!("{found:?} is not supported; must be {expected:?}"))),
        Some(None) => Err((field, format!("must be the string {expected:?}"))),
    }
}

/// The configuration as YAML, durations in Go notation, `apiVersion` and `kind` included.
pub fn to_yaml(config: &KubeProxyConfiguration) -> Result<String, ConfigError> {
    serde_yaml_ng::to_string(config).map_err(|e| ConfigError::Encode(e.to_string()))
}

/// What `--write-config-to` does: the effective configuration, readable by `--config`.
pub fn write_config_file(config: &KubeProxyConfiguration, path: &Path) -> Result<(), ConfigError> {
    let yaml = to_yaml(config)?;
    std::fs::write(path, yaml).map_err(|source| ConfigError::Write {
        path: PathBuf::from(path),
        source,
    })
}

/// Decodes a config the caller already holds as a JSON value (tests, `/configz` checks).
pub fn from_json_value(value: serde_json::Value) -> Result<KubeProxyConfiguration, serde_json::Error> {
    KubeProxyConfiguration::deserialize(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(text: &str) -> Result<DecodedFile, ConfigError> {
        decode_config(text, Path::new("/etc/kube-proxy/config.yaml"), Strictness::Strict)
    }

    const HEADER: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

    #[test]
    fn decodes_yaml_fields_by_upstream_names() {
        let text = format!(
            "{HEADER}mode: nftables\nclusterCIDR: 10.0.0.0/8\niptables:\n  masqueradeBit: 12\n  syncPeriod: 1m0s\n\
             ipvs:\n  excludeCIDRs: [10.1.0.0/16]\n  strictARP: true\nconntrack:\n  maxPerCore: 0\n  tcpCloseWaitTimeout: 30s\n\
             detectLocal:\n  bridgeInterface: cbr0\nnodePortAddresses: null\noomScoreAdj: -500\n"
        );
        let c = strict(&text).unwrap().config;
        assert_eq!(c.mode, "nftables");
        assert_eq!(c.cluster_cidr, "10.0.0.0/8");
        assert_eq!(c.iptables.masquerade_bit, Some(12));
        assert_eq!(c.iptables.sync_period.to_string(), "1m0s");
        assert_eq!(c.ipvs.exclude_cidrs, Some(vec!["10.1.0.0/16".to_string()]));
        assert!(c.ipvs.strict_arp);
        assert_eq!(c.conntrack.max_per_core, Some(0));
        assert_eq!(c.conntrack.tcp_close_wait_timeout.unwrap().to_string(), "30s");
        assert_eq!(c.detect_local.bridge_interface, "cbr0");
        assert_eq!(c.node_port_addresses, None);
        assert_eq!(c.oom_score_adj, Some(-500));
        assert_eq!(
            c.conntrack.min, None,
            "absent pointer fields stay unset until defaulting"
        );
    }

    #[test]
    fn decodes_json_too() {
        let text = r#"{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
                       "metricsBindAddress": "0.0.0.0:10249", "clientConnection": {"qps": 20}}"#;
        let c = strict(text).unwrap().config;
        assert_eq!(c.metrics_bind_address, "0.0.0.0:10249");
        assert_eq!(c.client_connection.qps, 20.0);
    }

    #[test]
    fn wrong_api_version_names_the_field_and_file() {
        let err = strict("apiVersion: kubeproxy.config.k8s.io/v1alpha2\nkind: KubeProxyConfiguration\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/etc/kube-proxy/config.yaml"), "{err}");
        assert!(err.contains("field apiVersion"), "{err}");
        assert!(err.contains("v1alpha2"), "{err}");
    }

    #[test]
    fn wrong_or_missing_kind_is_an_error() {
        let err = strict("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("field kind"), "{err}");
        let err = strict("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("field kind: missing"), "{err}");
        assert!(strict("").unwrap_err().to_string().contains("apiVersion"));
    }

    #[test]
    fn unknown_fields_are_errors_when_strict() {
        let err = strict(&format!(
            "{HEADER}resourceContainer: /kube-proxy\niptables:\n  masqueradeBits: 3\n"
        ))
        .unwrap_err();
        match &err {
            ConfigError::UnknownFields { fields, .. } => {
                assert_eq!(fields, &["resourceContainer", "iptables.masqueradeBits"]);
            }
            other => panic!("unexpected {other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains("/etc/kube-proxy/config.yaml") && text.contains("iptables.masqueradeBits"));
    }

    #[test]
    fn unknown_fields_are_reported_when_lenient() {
        let text = format!("{HEADER}resourceContainer: /kube-proxy\nmode: ipvs\n");
        let decoded = decode_config(&text, Path::new("c.yaml"), Strictness::Lenient).unwrap();
        assert_eq!(decoded.unknown_fields, ["resourceContainer"]);
        assert_eq!(decoded.config.mode, "ipvs");
    }

    #[test]
    fn wrong_type_names_the_field() {
        let err = strict(&format!("{HEADER}iptables:\n  masqueradeBit: fourteen\n")).unwrap_err();
        match &err {
            ConfigError::Decode { field, .. } => assert_eq!(field.as_deref(), Some("iptables.masqueradeBit")),
            other => panic!("unexpected {other:?}"),
        }
        let err = strict(&format!("{HEADER}configSyncPeriod: 15 minutes\n")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("field configSyncPeriod") && text.contains("15 minutes"),
            "{text}"
        );
    }

    #[test]
    fn not_yaml_is_an_error() {
        assert!(matches!(
            strict("{ this is : not : yaml"),
            Err(ConfigError::Decode { field: None, .. })
        ));
    }

    #[test]
    fn upstream_written_defaults_decode_strictly() {
        let text = include_str!("../testdata/upstream-style-defaults.yaml");
        let decoded = strict(text).unwrap();
        assert!(decoded.unknown_fields.is_empty());
        assert_eq!(decoded.config.conntrack.max_per_core, Some(32768));
        assert_eq!(decoded.config.nftables.sync_period.to_string(), "30s");
        assert_eq!(decoded.config.logging["verbosity"], 0);
    }
}
