//! EndpointSlices, seen as addresses with their conditions, plus the ports they serve.
//!
//! A slice is converted on its own ([`slice_view`]); joining several slices of one Service and
//! splitting them per service port is the endpoints tracker's job, because only it sees all
//! slices at once.
//!
//! As upstream's EndpointSlice cache does, an endpoint whose address cannot be used (none
//! given, malformed, or of the other family) is dropped and reported as an [`IgnoredValue`],
//! and the slice's other endpoints are used. So is a port entry that cannot be used (no port
//! number or 0, out of range, an unknown protocol, a name no Service port can have): upstream
//! skips such a port and keeps the slice's other ports, so one bad entry does not take every
//! endpoint of the Service away. Addresses are read as upstream reads them (`ParseIPSloppy`:
//! `10.180.00.001` is 10.180.0.1). An address the API server would refuse as an endpoint
//! (unspecified, loopback, link-local) is dropped too: no manifest may send Service traffic
//! to the node itself or its metadata service. What identifies the slice (its name, its
//! Service) must be right, or the whole slice is rejected.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::ident::{IpFamily, NamespacedName, ObjectKind, Protocol};
use crate::ignored::{Converted, IgnoredValue};
use crate::rejection::{RejectReason, Rejecter, Rejection, shown};
use crate::service::object_id;
use crate::syntax::{dns1123_label, dns1123_subdomain, endpoint_ip, parse_ip_sloppy, service_name};

/// The metric label of dropped endpoint addresses.
const ADDRESSES: &str = "endpoints.addresses";
/// The metric label of dropped slice ports.
const PORTS: &str = "ports";

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
    pub hints: Hints,
}

/// An endpoint's topology hints (`hints.forZones`, `hints.forNodes`): both lists behind one
/// pointer, and every endpoint without hints (most) shares one empty pair. Two `Arc<[_]>`
/// made every `Endpoint` 24 bytes larger, 11 MB at 50k Services x 10 endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hints(Arc<HintLists>);

#[derive(Debug, Default, PartialEq, Eq)]
struct HintLists {
    zones: Box<[Arc<str>]>,
    nodes: Box<[Arc<str>]>,
}

impl Hints {
    /// The hints of these zone and node names.
    pub fn new<'a>(
        zones: impl IntoIterator<Item = &'a str>,
        nodes: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let lists = HintLists {
            zones: zones.into_iter().map(Arc::from).collect(),
            nodes: nodes.into_iter().map(Arc::from).collect(),
        };
        if lists == HintLists::default() {
            return Self::default();
        }
        Self(Arc::new(lists))
    }

    /// The zones this endpoint should serve (`hints.forZones`).
    pub fn zones(&self) -> &[Arc<str>] {
        &self.0.zones
    }

    /// The nodes this endpoint should serve (`hints.forNodes`).
    pub fn nodes(&self) -> &[Arc<str>] {
        &self.0.nodes
    }

    /// Whether the hints are the one shared empty pair.
    pub fn is_shared_empty(&self) -> bool {
        Arc::ptr_eq(&self.0, &Self::default().0)
    }
}

/// No hints: one shared empty pair, so an endpoint without hints allocates nothing.
impl Default for Hints {
    fn default() -> Self {
        static NONE: OnceLock<Arc<HintLists>> = OnceLock::new();
        Self(NONE.get_or_init(Arc::default).clone())
    }
}

impl Endpoint {
    /// The endpoint of `address` on `port`, local if it names `node_name` (never when the
    /// proxy's node name is empty, as upstream's `isLocal`).
    pub fn new(address: &SliceAddress, port: u16, node_name: &str) -> Self {
        Self {
            addr: SocketAddr::new(address.ip, port),
            is_local: !node_name.is_empty() && address.node_name.as_deref() == Some(node_name),
            ready: address.ready,
            serving: address.serving,
            terminating: address.terminating,
            hints: address.hints.clone(),
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
    pub hints: Hints,
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

/// Converts a slice for `family`. `view` is `None` for a valid slice this proxier does not
/// use (FQDN or the other address family). Endpoints dropped on the way come back in
/// [`Converted::ignored`].
pub fn slice_view(
    slice: &EndpointSlice,
    family: IpFamily,
) -> Result<Converted<Option<SliceView>>, Rejection> {
    let id = object_id(&slice.metadata.namespace, &slice.metadata.name);
    let rejecter = Rejecter::new(ObjectKind::EndpointSlice, id.to_string());
    if id.name.is_empty() {
        return Err(rejecter.reject("metadata.name", RejectReason::MissingField, "required"));
    }
    rejecter.name("metadata.name", &id.name, dns1123_subdomain)?;
    rejecter.name("metadata.namespace", &id.namespace, dns1123_label)?;
    let label_field = format!("metadata.labels[{SERVICE_NAME_LABEL:?}]");
    let owner = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SERVICE_NAME_LABEL))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            rejecter.reject(
                &label_field,
                RejectReason::MissingField,
                "required: it names the Service this slice belongs to",
            )
        })?;
    // It names a Service, so it must be a Service name (which is also a valid label value).
    rejecter.name(&label_field, owner, service_name)?;
    let slice_family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        "FQDN" => return Ok(Converted::clean(None)),
        other => {
            return Err(rejecter.reject(
                "addressType",
                RejectReason::InvalidValue,
                format!("{} is not one of IPv4, IPv6, FQDN", shown(other)),
            ));
        }
    };
    if slice_family != family {
        return Ok(Converted::clean(None));
    }
    let mut ignored = Vec::new();
    let ports = slice_ports(slice, &rejecter, &mut ignored);
    let addresses = slice_addresses(slice, family, &rejecter, &mut ignored);
    Ok(Converted {
        view: Some(SliceView {
            service: NamespacedName {
                namespace: id.namespace.clone(),
                name: owner.as_str().into(),
            },
            id,
            ports,
            addresses,
        }),
        ignored,
    })
}

/// The slice's usable ports; each unusable entry is dropped and reported, as upstream's
/// EndpointSlice cache skips it ("Ignoring invalid endpoint port").
fn slice_ports(
    slice: &EndpointSlice,
    rejecter: &Rejecter,
    ignored: &mut Vec<IgnoredValue>,
) -> Vec<SlicePort> {
    let mut out = Vec::new();
    for (i, port) in slice.ports.as_deref().unwrap_or_default().iter().enumerate() {
        match slice_port(port, &format!("ports[{i}]"), rejecter) {
            Ok(port) => out.push(port),
            Err(skipped) => ignored.push(skipped),
        }
    }
    out
}

fn slice_port(
    port: &k8s_openapi::api::discovery::v1::EndpointPort,
    field: &str,
    rejecter: &Rejecter,
) -> Result<SlicePort, IgnoredValue> {
    let skip = |suffix: &str, reason, detail: String| {
        rejecter.ignore(PORTS, format!("{field}.{suffix}"), reason, detail)
    };
    // The API server defaults an absent name to "" (and an absent protocol to TCP).
    let name = port.name.as_deref().unwrap_or("");
    if !name.is_empty() {
        // A name no Service port can have matches nothing; upstream would carry it along
        // unused. Refusing it keeps odd text out of every later step.
        dns1123_label(name).map_err(|why| skip("name", RejectReason::InvalidValue, why))?;
    }
    let protocol = Protocol::from_api(port.protocol.as_deref()).ok_or_else(|| {
        let shown_protocol = shown(port.protocol.as_deref().unwrap_or(""));
        skip(
            "protocol",
            RejectReason::InvalidProtocol,
            format!("{shown_protocol} is not one of TCP, UDP, SCTP"),
        )
    })?;
    let number = match port.port {
        None | Some(0) => {
            return Err(skip(
                "port",
                RejectReason::MissingField,
                "no port number (upstream ignores such a port)".into(),
            ));
        }
        Some(n) => u16::try_from(n).map_err(|_| {
            skip(
                "port",
                RejectReason::InvalidPort,
                format!("{n} is outside 1-65535"),
            )
        })?,
    };
    Ok(SlicePort {
        name: name.into(),
        protocol,
        port: number,
    })
}

fn slice_addresses(
    slice: &EndpointSlice,
    family: IpFamily,
    rejecter: &Rejecter,
    ignored: &mut Vec<IgnoredValue>,
) -> Vec<SliceAddress> {
    // Optional since the 1.37 API (an empty slice may leave the list out).
    let endpoints = slice.endpoints.as_deref().unwrap_or_default();
    let mut out = Vec::with_capacity(endpoints.len());
    for (i, endpoint) in endpoints.iter().enumerate() {
        // Like upstream, only the first address is used; the API guarantees they are the same pod.
        let Some(raw) = endpoint.addresses.first() else {
            ignored.push(rejecter.ignore(
                ADDRESSES,
                format!("endpoints[{i}].addresses"),
                RejectReason::MissingField,
                "the endpoint has no address",
            ));
            continue;
        };
        let field = format!("endpoints[{i}].addresses[0]");
        let Some(ip) = parse_ip_sloppy(raw) else {
            ignored.push(rejecter.ignore(
                ADDRESSES,
                field,
                RejectReason::InvalidIp,
                format!("{} is not an IP address", shown(raw)),
            ));
            continue;
        };
        if !family.matches(&ip) {
            ignored.push(rejecter.ignore(
                ADDRESSES,
                field,
                RejectReason::WrongIpFamily,
                format!("{} is not an {} address", shown(raw), family.label()),
            ));
            continue;
        }
        if let Err(why) = endpoint_ip(&ip) {
            ignored.push(rejecter.ignore(ADDRESSES, field, RejectReason::InvalidIp, why));
            continue;
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
            hints: Hints::new(
                hints
                    .and_then(|h| h.for_zones.as_deref())
                    .unwrap_or_default()
                    .iter()
                    .map(|z| z.name.as_str()),
                hints
                    .and_then(|h| h.for_nodes.as_deref())
                    .unwrap_or_default()
                    .iter()
                    .map(|n| n.name.as_str()),
            ),
        });
    }
    out
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

    fn view(value: serde_json::Value) -> Converted<Option<SliceView>> {
        slice_view(&slice(value), IpFamily::V4).expect("should convert")
    }

    #[test]
    fn addresses_without_hints_share_one_empty_list() {
        let converted = view(json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.10"]},
                {"addresses": ["10.244.1.11"], "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": ["10.244.1.12"], "hints": {"forZones": []}}
            ]
        }));
        let addresses = converted.view.unwrap().addresses;
        let [plain, hinted, empty] = &addresses[..] else {
            panic!("three addresses: {addresses:?}");
        };
        assert!(plain.hints.is_shared_empty() && empty.hints.is_shared_empty());
        assert!(!hinted.hints.is_shared_empty());
        assert_eq!(hinted.hints.zones(), &[Arc::<str>::from("z1")]);
        assert!(hinted.hints.nodes().is_empty());
    }

    #[test]
    fn converts_ports_addresses_and_conditions() {
        let converted = view(json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.10"], "nodeName": "node1", "zone": "z1",
                 "hints": {"forZones": [{"name": "z1"}]}},
                {"addresses": ["10.244.2.10"], "conditions": {"ready": false, "serving": true, "terminating": true}}
            ]
        }));
        assert!(converted.ignored.is_empty());
        let view = converted.view.unwrap();
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
        assert_eq!(&*first.hints.zones()[0], "z1");
        let second = Endpoint::new(&view.addresses[1], 8080, "node1");
        assert!(!second.is_local && !second.ready && second.serving && second.terminating);
        assert_eq!(second.addr_string(), "10.244.2.10:8080");
    }

    #[test]
    fn fqdn_and_other_family_slices_are_unused() {
        let base = json!({"metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "web"}},
                          "endpoints": [{"addresses": ["not-an-ip"]}]});
        let mut fqdn = base.clone();
        fqdn["addressType"] = json!("FQDN");
        assert_eq!(view(fqdn), Converted::clean(None));
        let mut v6 = base;
        v6["addressType"] = json!("IPv6");
        // Nothing of an unused slice is reported: its addresses are never read.
        assert_eq!(view(v6), Converted::clean(None));
    }

    /// Upstream's `isLocal`: an endpoint is local only if the proxy knows its node name.
    #[test]
    fn an_empty_node_name_matches_no_endpoint() {
        let converted = view(json!({
            "metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"port": 80}],
            "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": ""}, {"addresses": ["10.0.0.2"]}]
        }));
        let view = converted.view.unwrap();
        for address in &view.addresses {
            assert!(!Endpoint::new(address, 80, "").is_local, "{address:?}");
        }
    }

    /// Upstream's TestBadIPs endpoint: the legacy leading-zero form is read as decimal, so the
    /// endpoint is `10.180.0.1:80` (and so is the KUBE-SEP- hash input).
    #[test]
    fn legacy_leading_zero_endpoint_is_read_as_decimal() {
        let converted = view(json!({
            "metadata": {"name": "svc1-1", "namespace": "ns1", "labels": {"kubernetes.io/service-name": "svc1"}},
            "addressType": "IPv4",
            "ports": [{"name": "p80", "port": 80}],
            "endpoints": [{"addresses": ["10.180.00.001"]}]
        }));
        assert!(converted.ignored.is_empty());
        let view = converted.view.unwrap();
        assert_eq!(
            Endpoint::new(&view.addresses[0], 80, "n").addr_string(),
            "10.180.0.1:80"
        );
    }

    /// An endpoint whose address cannot be used is dropped and reported; the others stay.
    #[test]
    fn unusable_endpoints_are_dropped_and_reported() {
        let converted = view(json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.1.1"]},
                {"addresses": ["10.244.1.10"]},
                {"addresses": ["fd00::1"]},
                {"addresses": []},
                {"addresses": ["10.244.1.11\n-A KUBE-SERVICES -j ACCEPT"]},
                {"addresses": ["10.244.1.12"]}
            ]
        }));
        let found = converted.dropped();
        assert_eq!(
            found,
            [
                ("endpoints[0].addresses[0]", RejectReason::InvalidIp),
                ("endpoints[2].addresses[0]", RejectReason::WrongIpFamily),
                ("endpoints[3].addresses", RejectReason::MissingField),
                ("endpoints[4].addresses[0]", RejectReason::InvalidIp),
            ]
        );
        for w in &converted.ignored {
            assert_eq!(
                (w.kind, w.object.as_str(), w.list),
                (ObjectKind::EndpointSlice, "shop/web-abc", ADDRESSES)
            );
            assert!(!w.to_string().contains('\n'), "{w}");
        }
        let ips: Vec<_> = converted
            .view
            .unwrap()
            .addresses
            .iter()
            .map(|a| a.ip.to_string())
            .collect();
        assert_eq!(ips, ["10.244.1.10", "10.244.1.12"]);
    }

    /// The API server refuses these as endpoints; a manifest must not point a Service at
    /// the node's own loopback or at a link-local metadata service.
    #[test]
    fn addresses_the_api_server_refuses_as_endpoints_are_dropped() {
        let converted = view(json!({
            "metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"port": 80}],
            "endpoints": [
                {"addresses": ["127.0.0.1"]},
                {"addresses": ["169.254.169.254"]},
                {"addresses": ["0.0.0.0"]},
                {"addresses": ["224.0.0.1"]},
                {"addresses": ["10.0.0.1"]}
            ]
        }));
        let found = converted.dropped();
        assert_eq!(
            found,
            [
                ("endpoints[0].addresses[0]", RejectReason::InvalidIp),
                ("endpoints[1].addresses[0]", RejectReason::InvalidIp),
                ("endpoints[2].addresses[0]", RejectReason::InvalidIp),
                ("endpoints[3].addresses[0]", RejectReason::InvalidIp),
            ]
        );
        assert!(
            converted.ignored[0].detail.contains("loopback"),
            "{}",
            converted.ignored[0]
        );
        let ips: Vec<_> = converted
            .view
            .unwrap()
            .addresses
            .iter()
            .map(|a| a.ip.to_string())
            .collect();
        assert_eq!(ips, ["10.0.0.1"]);
    }

    #[test]
    fn malformed_slices_are_rejected_with_the_field_path() {
        let label = json!({"kubernetes.io/service-name": "web"});
        let label_field = "metadata.labels[\"kubernetes.io/service-name\"]";
        let cases = [
            (
                json!({"metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": []}),
                label_field,
                RejectReason::MissingField,
            ),
            (
                json!({"metadata": {"name": "s", "labels": label}, "addressType": "IPv5", "endpoints": []}),
                "addressType",
                RejectReason::InvalidValue,
            ),
        ];
        for (value, field, reason) in cases {
            let r = slice_view(&slice(value.clone()), IpFamily::V4).expect_err("should be rejected");
            assert_eq!((r.field.as_str(), r.reason), (field, reason), "for {value}");
            assert_eq!(r.object, "default/s");
        }
    }

    /// Upstream's EndpointSlice cache skips a port it cannot use and keeps the slice's other
    /// ports: one bad entry must not take every endpoint of the Service away.
    #[test]
    fn unusable_ports_are_dropped_and_reported_and_the_others_kept() {
        let converted = view(json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [
                {"name": "a", "port": 0},
                {"name": "b"},
                {"name": "c", "port": 70000},
                {"name": "d", "port": -1},
                {"name": "e", "port": 80, "protocol": "tcp"},
                {"name": "HTTP", "port": 81},
                {"name": "http\n-A X", "port": 82},
                {"name": "http", "port": 8080},
                {"port": 9090, "protocol": "UDP"}
            ],
            "endpoints": [{"addresses": ["10.244.1.10"]}]
        }));
        let found: Vec<_> = converted
            .ignored
            .iter()
            .map(|w| (w.field.as_str(), w.list, w.reason))
            .collect();
        assert_eq!(
            found,
            [
                ("ports[0].port", PORTS, RejectReason::MissingField),
                ("ports[1].port", PORTS, RejectReason::MissingField),
                ("ports[2].port", PORTS, RejectReason::InvalidPort),
                ("ports[3].port", PORTS, RejectReason::InvalidPort),
                ("ports[4].protocol", PORTS, RejectReason::InvalidProtocol),
                ("ports[5].name", PORTS, RejectReason::InvalidValue),
                ("ports[6].name", PORTS, RejectReason::InvalidValue),
            ]
        );
        for w in &converted.ignored {
            assert_eq!(
                (w.kind, w.object.as_str()),
                (ObjectKind::EndpointSlice, "shop/web-abc")
            );
            assert!(!w.to_string().contains('\n'), "{w}");
        }
        let view = converted.view.expect("the slice is used");
        assert_eq!(
            view.ports,
            [
                SlicePort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 8080
                },
                SlicePort {
                    name: "".into(),
                    protocol: Protocol::Udp,
                    port: 9090
                },
            ]
        );
        assert_eq!(view.addresses.len(), 1);
    }

    /// A slice of the other family is never read, so its ports are not reported either.
    #[test]
    fn ports_of_an_unused_slice_are_not_reported() {
        let converted = view(json!({
            "metadata": {"name": "s", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv6", "ports": [{"port": 70000}], "endpoints": []
        }));
        assert_eq!(converted, Converted::clean(None));
    }

    /// The slice's identity decides which Service (and so which chains) its endpoints feed:
    /// it follows the API server's name rules whatever the source.
    #[test]
    fn names_that_could_inject_or_collide_are_rejected() {
        let label_field = "metadata.labels[\"kubernetes.io/service-name\"]";
        let cases = [
            (json!({"name": "s\n-A X"}), "web", "metadata.name"),
            (json!({"name": "a/b"}), "web", "metadata.name"),
            (json!({"name": "S"}), "web", "metadata.name"),
            (
                json!({"name": "s", "namespace": "a/b"}),
                "web",
                "metadata.namespace",
            ),
            (json!({"name": "s"}), "b/c", label_field),
            (json!({"name": "s"}), "Web", label_field),
            (json!({"name": "s"}), "-web", label_field),
        ];
        for (mut metadata, service, field) in cases {
            metadata["labels"] = json!({"kubernetes.io/service-name": service});
            let value = json!({"metadata": metadata, "addressType": "IPv4",
                "ports": [{"port": 80}], "endpoints": []});
            let r = slice_view(&slice(value.clone()), IpFamily::V4).expect_err("should be rejected");
            assert_eq!(
                (r.field.as_str(), r.reason),
                (field, RejectReason::InvalidValue),
                "for {value}"
            );
            assert!(!r.to_string().contains('\n'), "{r}");
        }
        // Valid names of every kind still convert: a dotted slice name, a dashed port name.
        let ok = view(json!({
            "metadata": {"name": "web-abc.v1", "namespace": "kube-system", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "ports": [{"name": "dns-tcp", "port": 53}], "endpoints": []
        }));
        assert_eq!(ok.ignored, []);
        assert_eq!(ok.view.expect("used").ports.len(), 1);
    }
}
