//! The address asked about: `<ip>:<port>[/tcp|udp|sctp]`, IPv6 as `[addr]:port`.
//!
//! The text comes from a command line, so it is parsed strictly and refused with the part
//! that is wrong; TCP is assumed when no protocol is given, as Services default it.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kpr_model::{IpFamily, Protocol};

/// One destination: address, port and protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("{0:?}: expected <ip>:<port>[/tcp|udp|sctp] (IPv6 as [addr]:port)")]
    Address(String),
    #[error("{0:?}: the protocol must be tcp, udp or sctp")]
    Protocol(String),
    #[error("{0:?}: port 0 is no Service port")]
    PortZero(String),
}

impl Query {
    pub fn parse(text: &str) -> Result<Self, QueryError> {
        let (address, protocol) = match text.rsplit_once('/') {
            Some((address, proto)) => (address, parse_protocol(proto)?),
            None => (text, Protocol::Tcp),
        };
        let socket: SocketAddr = address
            .parse()
            .map_err(|_| QueryError::Address(text.to_string()))?;
        if socket.port() == 0 {
            return Err(QueryError::PortZero(text.to_string()));
        }
        Ok(Self {
            ip: socket.ip(),
            port: socket.port(),
            protocol,
        })
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.ip)
    }
}

fn parse_protocol(text: &str) -> Result<Protocol, QueryError> {
    match text.to_ascii_lowercase().as_str() {
        "tcp" => Ok(Protocol::Tcp),
        "udp" => Ok(Protocol::Udp),
        "sctp" => Ok(Protocol::Sctp),
        _ => Err(QueryError::Protocol(text.to_string())),
    }
}

impl fmt::Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            SocketAddr::new(self.ip, self.port),
            self.protocol.lower()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_ports_and_protocols_parse() {
        let q = Query::parse("10.96.0.10:80").unwrap();
        assert_eq!(
            (q.ip.to_string(), q.port, q.protocol),
            ("10.96.0.10".into(), 80, Protocol::Tcp)
        );
        let q = Query::parse("[fd00::10]:53/UDP").unwrap();
        assert_eq!(
            (q.ip.to_string(), q.port, q.protocol),
            ("fd00::10".into(), 53, Protocol::Udp)
        );
        assert_eq!(q.to_string(), "[fd00::10]:53/udp");
        assert_eq!(Query::parse("1.2.3.4:9/sctp").unwrap().protocol, Protocol::Sctp);
    }

    #[test]
    fn bad_queries_say_what_is_wrong() {
        assert!(matches!(Query::parse("10.96.0.10"), Err(QueryError::Address(_))));
        assert!(matches!(Query::parse("fd00::1:80"), Err(QueryError::Address(_))));
        assert!(matches!(
            Query::parse("10.0.0.1:80/icmp"),
            Err(QueryError::Protocol(_))
        ));
        assert!(matches!(Query::parse("10.0.0.1:0"), Err(QueryError::PortZero(_))));
        assert!(matches!(
            Query::parse("10.0.0.1:70000"),
            Err(QueryError::Address(_))
        ));
    }
}
