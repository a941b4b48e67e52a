//! Userspace mode's own metrics (`kubeproxy_userspace_*`): in that mode the proxy carries
//! the traffic itself, so what the kernel would count in the other modes (connections,
//! bytes, failed connects) is counted here.
//!
//! Series are per service port (`service_port="ns/name:port"`, `protocol`, `ip_family`);
//! the mode removes a port's series when it closes the port's listener
//! ([`UserspaceMetrics::forget`]), so the label sets follow the Services and never grow with
//! churn.
//!
//! kpr-relay carries the traffic and counts into handles ([`PortStats`]) and a
//! [`LimitObserver`]; the names and labels they are counted under are this mode's, here.

use kpr_relay::{Kind, LimitObserver, PortStats};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One service port of one family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PortLabels {
    pub ip_family: &'static str,
    /// `namespace/name:port`.
    pub service_port: String,
    pub protocol: &'static str,
}

/// One direction of one service port's bytes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    pub ip_family: &'static str,
    pub service_port: String,
    pub protocol: &'static str,
    /// `to_endpoint` (client -> endpoint) or `from_endpoint`.
    pub direction: &'static str,
}

/// A limit the proxy hit (`connections` or `udp_sessions`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub ip_family: &'static str,
    pub limit: &'static str,
}

/// Service ports the mode cannot serve, by protocol (SCTP).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub ip_family: &'static str,
    pub protocol: &'static str,
}

/// `to_endpoint` then `from_endpoint`.
pub const DIRECTIONS: [&str; 2] = ["to_endpoint", "from_endpoint"];

#[derive(Clone, Debug, Default)]
pub struct UserspaceMetrics {
    pub active_connections: Family<PortLabels, Gauge>,
    pub connections_total: Family<PortLabels, Counter>,
    pub bytes_total: Family<BytesLabels, Counter>,
    pub connect_failures_total: Family<PortLabels, Counter>,
    pub endpoint_retries_total: Family<PortLabels, Counter>,
    pub active_udp_sessions: Family<PortLabels, Gauge>,
    pub udp_sessions_total: Family<PortLabels, Counter>,
    pub limit_reached_total: Family<LimitLabels, Counter>,
    pub unsupported_service_ports: Family<ProtocolLabels, Gauge>,
}

impl UserspaceMetrics {
    /// Creates the metrics and registers them in `registry` under the `kubeproxy` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("kubeproxy");
        r.register(
            "userspace_active_connections",
            "TCP connections the userspace proxy is carrying now",
            m.active_connections.clone(),
        );
        r.register(
            "userspace_connections",
            "TCP connections the userspace proxy accepted",
            m.connections_total.clone(),
        );
        r.register(
            "userspace_bytes",
            "Bytes the userspace proxy carried, counted when a connection or UDP session ends",
            m.bytes_total.clone(),
        );
        r.register(
            "userspace_connect_failures",
            "Connections to endpoints that failed or timed out",
            m.connect_failures_total.clone(),
        );
        r.register(
            "userspace_endpoint_retries",
            "Connections retried on another endpoint after a failed connect",
            m.endpoint_retries_total.clone(),
        );
        r.register(
            "userspace_active_udp_sessions",
            "UDP client sessions the userspace proxy holds now",
            m.active_udp_sessions.clone(),
        );
        r.register(
            "userspace_udp_sessions",
            "UDP client sessions the userspace proxy opened",
            m.udp_sessions_total.clone(),
        );
        r.register(
            "userspace_limit_reached",
            "Connections, UDP sessions or service port listeners refused because a limit was reached (limit: connections, udp_sessions, listener_descriptors, proxy_port_range, ephemeral_ports)",
            m.limit_reached_total.clone(),
        );
        r.register(
            "userspace_unsupported_service_ports",
            "Service ports the userspace proxy does not serve (SCTP is not supported in this mode)",
            m.unsupported_service_ports.clone(),
        );
        m
    }

    /// The handles one service port's relay counts into, created (so its series exist)
    /// when the port opens.
    pub fn port_stats(&self, labels: &PortLabels) -> PortStats {
        let bytes = |direction| {
            self.bytes_total
                .get_or_create(&BytesLabels {
                    ip_family: labels.ip_family,
                    service_port: labels.service_port.clone(),
                    protocol: labels.protocol,
                    direction,
                })
                .clone()
        };
        PortStats {
            active_connections: self.active_connections.get_or_create(labels).clone(),
            connections: self.connections_total.get_or_create(labels).clone(),
            to_endpoint_bytes: bytes("to_endpoint"),
            from_endpoint_bytes: bytes("from_endpoint"),
            connect_failures: self.connect_failures_total.get_or_create(labels).clone(),
            endpoint_retries: self.endpoint_retries_total.get_or_create(labels).clone(),
            active_udp_sessions: self.active_udp_sessions.get_or_create(labels).clone(),
            udp_sessions: self.udp_sessions_total.get_or_create(labels).clone(),
        }
    }

    /// Removes every series of one service port (its listener closed).
    pub fn forget(&self, port: &PortLabels) {
        self.active_connections.remove(port);
        self.connections_total.remove(port);
        self.connect_failures_total.remove(port);
        self.endpoint_retries_total.remove(port);
        self.active_udp_sessions.remove(port);
        self.udp_sessions_total.remove(port);
        for direction in DIRECTIONS {
            self.bytes_total.remove(&BytesLabels {
                ip_family: port.ip_family,
                service_port: port.service_port.clone(),
                protocol: port.protocol,
                direction,
            });
        }
    }
}

/// Counts one family's relay's refusals in `kubeproxy_userspace_limit_reached_total`; the
/// series appears with the first one.
#[derive(Debug)]
pub struct LimitsReached {
    pub metrics: UserspaceMetrics,
    pub ip_family: &'static str,
}

impl LimitObserver for LimitsReached {
    fn limit_reached(&self, kind: Kind) {
        let limit = match kind {
            Kind::Connections => "connections",
            Kind::UdpSessions => "udp_sessions",
        };
        let labels = LimitLabels {
            ip_family: self.ip_family,
            limit,
        };
        self.metrics.limit_reached_total.get_or_create(&labels).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_port_leaves_no_series() {
        let mut registry = Registry::default();
        let m = UserspaceMetrics::register(&mut registry);
        let port = PortLabels {
            ip_family: "IPv4",
            service_port: "default/web:http".into(),
            protocol: "TCP",
        };
        m.connections_total.get_or_create(&port).inc();
        m.bytes_total
            .get_or_create(&BytesLabels {
                ip_family: "IPv4",
                service_port: "default/web:http".into(),
                protocol: "TCP",
                direction: "to_endpoint",
            })
            .inc_by(10);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        assert!(text.contains("kubeproxy_userspace_connections_total{ip_family=\"IPv4\",service_port=\"default/web:http\",protocol=\"TCP\"} 1"), "{text}");
        m.forget(&port);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        assert!(!text.contains("default/web"), "{text}");
    }

    #[test]
    fn a_refusal_makes_its_series_and_counts_under_family_and_limit() {
        let mut registry = Registry::default();
        let m = UserspaceMetrics::register(&mut registry);
        let text = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
            text
        };
        assert!(!text().contains("limit_reached_total{"), "{}", text());
        let observer = LimitsReached {
            metrics: m.clone(),
            ip_family: "IPv6",
        };
        observer.limit_reached(Kind::UdpSessions);
        observer.limit_reached(Kind::UdpSessions);
        observer.limit_reached(Kind::Connections);
        let text = text();
        assert!(
            text.contains(
                "kubeproxy_userspace_limit_reached_total{ip_family=\"IPv6\",limit=\"udp_sessions\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "kubeproxy_userspace_limit_reached_total{ip_family=\"IPv6\",limit=\"connections\"} 1"
            ),
            "{text}"
        );
    }
}
