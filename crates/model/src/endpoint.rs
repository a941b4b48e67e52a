//! EndpointSlices, seen as addresses with their conditions, plus the ports they serve.
//!
//! A slice is converted on its own ([`slice_view`]); joining several slices of one Service and
//! splitting them per service port is the endpoints tracker's job, because only it sees all
//! slices at once.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::ident::{IpFamily, NamespacedName, ObjectKind, Protocol};
use crate::rejection::{RejectReason, Rejecter, Rejection};
use crate::service::object_id;

/// The label that ties a slice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// When the change that produced this slice version happened (set by the endpoint-slice
/// controller); the start of upstream's network-programming-latency measurement.
pub const LAST_CHANGE_TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The slice's last-change trigger time, if it carries a valid one. A malformed value only
/// costs one latency sample, so it is ignored rather than rejecting the slice.
pub fn last_change_trigger_time(slice: &EndpointSlice) -> Option<std::time::SystemTime> {
    let text = slice
        .metadata
        .annotations
        .as_ref()?
        .get(LAST_CHANGE_TRIGGER_TIME_ANNOTATION)?;
    let timestamp: jiff::Timestamp = text.parse().ok()?;
    Some(timestamp.into())
}

/// One backend of one service port, as rule generation sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// Runs on this node (`nodeName` equals the proxy's node name).
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub zone_hints: Arc<[Arc<str>]>,
    pub node_hints: Arc<[Arc<str>]>,
}

impl Endpoint {
    pub fn new(address: &SliceAddress, port: u16, node_name: &str) -> Self {
        Self {
            addr: SocketAddr::new(address.ip, port),
            is_local: address.node_name.as_deref() == Some(node_name),
            ready: address.ready,
            serving: address.serving,
            terminating: address.terminating,
            zone_hints: address.zone_hints.clone(),
            node_hints: address.node_hints.clone(),
        }
    }

    /// `ip:port` (`[ip]:port` for IPv6): the form upstream hashes into KUBE-SEP names.
    pub fn addr_string(&self) -> String {
        self.addr.to_string()
    }
}

/// A port a slice serves, matched to the Service port of the same name and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: Arc<str>,
    pub protocol: Protocol,
    pub port: u16,
}

/// One address of a slice with its conditions, before it is paired with a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceAddress {
    pub ip: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<Arc<str>>,
    pub zone: Option<Arc<str>>,
    pub zone_hints: Arc<[Arc<str>]>,
    pub node_hints: Arc<[Arc<str>]>,
}

/// A converted EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceView {
    /// The slice's own `namespace/name`.
    pub id: NamespacedName,
    /// The Service it belongs to (from the `kubernetes.io/service-name` label).
    pub service: NamespacedName,
    pub ports: Vec<SlicePort>,
    pub addresses: Vec<SliceAddress>,
}

/// Converts a slice for `family`. `Ok(None)`: a valid slice this proxier does not use
/// (FQDN or the other address family).
pub fn slice_view(slice: &EndpointSlice, family: IpFamily) -> Result<Option<SliceView>, Rejection> {
    let id = object_id(&slice.metadata.namespace, &slice.metadata.name);
    let rejecter = Rejecter::new(ObjectKind::EndpointSlice, id.to_string());
    if id.name.is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    let service_name = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            rejecter.reject(
                format!("metadata.labels[{SERVICE_NAME_LABEL:?}]"),
                RejectReason::MissingField,
                "required: it names the Service this slice belongs to",
            )
        })?;
    let slice_family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        "FQDN" => return Ok(None),
        other => {
            return Err(rejecter.reject(
                "addressType",
                RejectReason::InvalidValue,
                format!("{other:?} is not one of IPv4, IPv6, FQDN"),
            ));
        }
    };
    let ports = slice_ports(slice, &rejecter)?;
    let addresses = slice_addresses(slice, slice_family, &rejecter)?;
    if slice_family != family {
        return Ok(None);
    }
    Ok(Some(SliceView {
        service: NamespacedName {
            namespace: id.namespace.clone(),
            name: service_name.as_str().into(),
        },
        id,
        ports,
        addresses,
    }))
}

fn slice_ports(slice: &EndpointSlice, rejecter: &Rejecter) -> Result<Vec<SlicePort>, Rejection> {
    let mut out = Vec::new();
    for (i, port) in slice.ports.as_deref().unwrap_or_default().iter().enumerate() {
        let field = format!("ports[{i}]");
        let protocol = Protocol::from_api(port.protocol.as_deref()).ok_or_else(|| {
            rejecter.reject(
                format!("{field}.protocol"),
                RejectReason::InvalidProtocol,
                format!(
                    "{:?} is not one of TCP, UDP, SCTP",
                    port.protocol.as_deref().unwrap_or("")
                ),
            )
        })?;
        let Some(number) = port.port else {
            return Err(rejecter.reject(
                format!("{field}.port"),
                RejectReason::MissingField,
                "required (a port-less slice only makes sense for headless Services)",
            ));
        };
        out.push(SlicePort {
            name: port.name.as_deref().unwrap_or("").into(),
            protocol,
            port: rejecter.port(&format!("{field}.port"), number)?,
        });
    }
    Ok(out)
}

fn slice_addresses(
    slice: &EndpointSlice,
    family: IpFamily,
    rejecter: &Rejecter,
) -> Result<Vec<SliceAddress>, Rejection> {
    let mut out = Vec::with_capacity(slice.endpoints.len());
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        // Like upstream, only the first address is used; the API guarantees they are the same pod.
        let Some(raw) = endpoint.addresses.first() else {
            return Err(rejecter.reject(
                format!("endpoints[{i}].addresses"),
                RejectReason::MissingField,
                "needs at least one address",
            ));
        };
        let field = format!("endpoints[{i}].addresses[0]");
        let ip = rejecter.parse_ip(&field, raw)?;
        if !family.matches(&ip) {
            return Err(rejecter.reject(
                field,
                RejectReason::WrongIpFamily,
                format!("{raw} is not an {} address", family.label()),
            ));
        }
        let conditions = endpoint.conditions.as_ref();
        // Upstream: absent ready/serving mean true, absent terminating means false.
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
        let hints = endpoint.hints.as_ref();
        out.push(SliceAddress {
            ip,
            ready,
            serving,
            terminating,
            node_name: endpoint.node_name.as_deref().map(Into::into),
            zone: endpoint.zone.as_deref().map(Into::into),
            zone_hints: hints
                .and_then(|h| h.for_zones.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|z| Arc::from(z.name.as_str()))
                .collect(),
            node_hints: hints
                .and_then(|h| h.for_nodes.as_deref())
                .unwrap_or_default()
                .iter()
                .map(|n| Arc::from(n.name.as_str()))
                .collect(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_time_is_read_from_the_annotation_and_bad_values_ignored() {
        let mut slice = EndpointSlice::default();
        assert_eq!(last_change_trigger_time(&slice), None);
        let annotations = slice.metadata.annotations.get_or_insert_default();
        annotations.insert(
            LAST_CHANGE_TRIGGER_TIME_ANNOTATION.into(),
            "2026-11-23T10:00:00Z".into(),
        );
        let t = last_change_trigger_time(&slice).unwrap();
        let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 1_795_428_000);
        let annotations = slice.metadata.annotations.get_or_insert_default();
        annotations.insert(LAST_CHANGE_TRIGGER_TIME_ANNOTATION.into(), "yesterday".into());
        assert_eq!(last_change_trigger_time(&slice), None);
    }
    use serde_json::json;

    fn slice(value: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(value).expect("test fixture is an EndpointSlice")
    }

    #[test]
    fn converts_ports_addresses_and_conditions() {
        let s = slice(json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.10"], "nodeName": "node1", "zone": "z1",
                 "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": ["10.244.2.10"], "conditions": {"ready": false, "serving": true, "terminating": true}}
            ]
        }));
        let view = slice_view(&s, IpFamily::V4).unwrap().unwrap();
        assert_eq!(view.service.to_string(), "shop/web");
        assert_eq!(
            view.ports,
            vec![SlicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080
            }]
        );
        let first = Endpoint::new(&view.addresses[0], 8080, "node1");
        assert!(first.is_local && first.ready && first.serving && !first.terminating);
        assert_eq!(&*first.zone_hints[0], "z1");
        let second = Endpoint::new(&view.addresses[1], 8080, "node1");
        assert!(!second.is_local && !second.ready && second.serving && second.terminating);
        assert_eq!(second.addr_string(), "10.244.2.10:8080");
    }

    #[test]
    fn fqdn_and_other_family_slices_are_unused() {
        let base = json!({"metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "web"}}, "endpoints": []});
        let mut fqdn = base.clone();
        fqdn["addressType"] = json!("FQDN");
        assert_eq!(slice_view(&slice(fqdn), IpFamily::V4), Ok(None));
        let mut v6 = base;
        v6["addressType"] = json!("IPv6");
        assert_eq!(slice_view(&slice(v6), IpFamily::V4), Ok(None));
    }

    #[test]
    fn malformed_slices_are_rejected_with_the_field_path() {
        let label = json!({"kubernetes.io/service-name": "web"});
        let cases = [
            (
                json!({"metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": []}),
                "metadata.labels[\"kubernetes.io/service-name\"]",
                RejectReason::MissingField,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv5", "endpoints": []}),
                "addressType",
                RejectReason::InvalidValue,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.1"]}]}),
                "endpoints[0].addresses[0]",
                RejectReason::InvalidIp,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv4", "endpoints": [{"addresses": ["fd00::1"]}]}),
                "endpoints[0].addresses[0]",
                RejectReason::WrongIpFamily,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv4", "endpoints": [{"addresses": []}]}),
                "endpoints[0].addresses",
                RejectReason::MissingField,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv4", "ports": [{"port": 0}], "endpoints": []}),
                "ports[0].port",
                RejectReason::InvalidPort,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv4", "ports": [{"name": "x"}], "endpoints": []}),
                "ports[0].port",
                RejectReason::MissingField,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv4", "ports": [{"port": 80, "protocol": "tcp"}], "endpoints": []}),
                "ports[0].protocol",
                RejectReason::InvalidProtocol,
            ),
        ];
        for (value, field, reason) in cases {
            let r = slice_view(&slice(value.clone()), IpFamily::V4).expect_err("should be rejected");
            assert_eq!((r.field.as_str(), r.reason), (field, reason), "for {value}");
            assert_eq!(r.object, "default/s");
        }
    }
}
