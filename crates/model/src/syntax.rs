//! The API server's syntax rules for names, label values and addresses, in one place.
//!
//! Object names and port names end up inside kernel rule text (comments) and inside the
//! strings hashed into chain names, so the proxy cannot trust that "the API server already
//! checked them": manifest files never met an API server, and an API object is as untrusted as
//! any other input. These are the rules of Kubernetes' apimachinery validation (DNS-1123 and
//! DNS-1035 names, IANA service names, label values), written from their published
//! definitions, plus upstream kube-proxy's lenient address parsing ([`parse_ip_sloppy`]), which
//! still reads the legacy leading-zero IPv4 form that older API servers stored, and the API
//! server's rule for addresses traffic may be sent to ([`endpoint_ip`]).
//!
//! Each check returns `Err(why)` with a sentence an operator can act on; callers add the object
//! and the field.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Longest DNS-1123 / DNS-1035 label (namespaces, Service names).
pub const DNS1123_LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (EndpointSlice and Node names).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Longest IANA service name (named Service ports).
pub const IANA_SVC_NAME_MAX: usize = 15;
/// Longest label value.
pub const LABEL_VALUE_MAX: usize = 63;

fn is_lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn too_long(value: &str, max: usize) -> Option<String> {
    (value.len() > max).then(|| format!("must be no more than {max} characters (it has {})", value.len()))
}

/// A DNS-1123 label: lower-case alphanumerics and '-', starting and ending alphanumeric, at
/// most 63 characters (namespace names).
pub fn dns1123_label(value: &str) -> Result<(), String> {
    if let Some(why) = too_long(value, DNS1123_LABEL_MAX) {
        return Err(why);
    }
    label_body(value, is_lower_alnum).map_err(|()| {
        format!(
            "{value:?} is not a DNS-1123 label: lower-case letters, digits and '-', \
             starting and ending with a letter or digit"
        )
    })
}

/// A Service name: since Kubernetes 1.37 (KEP-5311, RelaxedServiceNameValidation locked on)
/// the API server takes any DNS-1123 label, so a name may start with a digit; before, it had
/// to be a DNS-1035 label (starting with a letter). A proxy reading a 1.37 API server must
/// take what it stores.
pub fn service_name(value: &str) -> Result<(), String> {
    dns1123_label(value)
}

/// A DNS-1035 label: like a DNS-1123 label, but starting with a letter (Service names before
/// 1.37).
pub fn dns1035_label(value: &str) -> Result<(), String> {
    if let Some(why) = too_long(value, DNS1123_LABEL_MAX) {
        return Err(why);
    }
    let starts_with_letter = value.starts_with(|c: char| c.is_ascii_lowercase());
    match label_body(value, is_lower_alnum) {
        Ok(()) if starts_with_letter => Ok(()),
        _ => Err(format!(
            "{value:?} is not a DNS-1035 label: lower-case letters, digits and '-', \
             starting with a letter and ending with a letter or digit"
        )),
    }
}

/// A DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters in all
/// (EndpointSlice and Node names).
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    if let Some(why) = too_long(value, DNS1123_SUBDOMAIN_MAX) {
        return Err(why);
    }
    let valid = value
        .split('.')
        .all(|part| label_body(part, is_lower_alnum).is_ok());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', \
             each dot-separated part starting and ending with a letter or digit"
        ))
    }
}

/// Non-empty; `edge` characters at both ends; only `edge` characters and '-' inside.
fn label_body(value: &str, edge: fn(char) -> bool) -> Result<(), ()> {
    let first = value.chars().next().ok_or(())?;
    let last = value.chars().next_back().ok_or(())?;
    let inner_ok = value.chars().all(|c| edge(c) || c == '-');
    if edge(first) && edge(last) && inner_ok {
        Ok(())
    } else {
        Err(())
    }
}

/// An IANA service name (RFC 6335), the rule for named Service ports: 1-15 characters of
/// lower-case letters, digits and '-', at least one letter, no '-' at either end, no "--".
pub fn iana_svc_name(value: &str) -> Result<(), String> {
    if let Some(why) = too_long(value, IANA_SVC_NAME_MAX) {
        return Err(why);
    }
    let bad = |rule: &str| Err(format!("{value:?} is not an IANA service name: {rule}"));
    if value.is_empty() {
        return bad("must not be empty");
    }
    if !value.chars().all(|c| is_lower_alnum(c) || c == '-') {
        return bad("only lower-case letters, digits and '-' are allowed");
    }
    if !value.chars().any(|c| c.is_ascii_lowercase()) {
        return bad("must contain at least one letter");
    }
    if value.starts_with('-') || value.ends_with('-') {
        return bad("must not begin or end with '-'");
    }
    if value.contains("--") {
        return bad("must not contain \"--\"");
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of letters, digits, '-', '_' and '.',
/// starting and ending with a letter or digit.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if let Some(why) = too_long(value, LABEL_VALUE_MAX) {
        return Err(why);
    }
    let edge = |c: char| c.is_ascii_alphanumeric();
    let inner = |c: char| edge(c) || matches!(c, '-' | '_' | '.');
    let first_ok = value.chars().next().is_some_and(edge);
    let last_ok = value.chars().next_back().is_some_and(edge);
    if first_ok && last_ok && value.chars().all(inner) {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a valid label value: letters, digits, '-', '_' and '.', \
             starting and ending with a letter or digit"
        ))
    }
}

/// The API server's `ValidateEndpointIP`, for EndpointSlice addresses and external IPs:
/// unspecified, loopback and link-local addresses are refused there, because traffic for a
/// Service must not be sent to the node itself or to node-centric services such as a cloud
/// metadata endpoint (169.254.169.254). `ip` is already in canonical form (an IPv4-mapped
/// address is IPv4), as [`parse_ip_sloppy`] returns it.
pub fn endpoint_ip(ip: &IpAddr) -> Result<(), String> {
    let refused = if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("in the loopback range (127.0.0.0/8, ::1/128)")
    } else if is_link_local_unicast(ip) {
        Some("in the link-local range (169.254.0.0/16, fe80::/10)")
    } else if is_link_local_multicast(ip) {
        Some("in the link-local multicast range (224.0.0.0/24, ff02::/16)")
    } else {
        None
    };
    match refused {
        Some(range) => Err(format!("{ip} may not be {range}")),
        None => Ok(()),
    }
}

fn is_link_local_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    }
}

/// 224.0.0.0/24, or an IPv6 multicast address of link-local scope (ffX2::/16).
fn is_link_local_multicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => v6.segments()[0] & 0xff0f == 0xff02,
    }
}

/// Parses an IP address as upstream kube-proxy does (`ParseIPSloppy`): also the legacy IPv4
/// form with leading zeros, read as decimal (`172.30.0.041` is 172.30.0.41, not octal), which
/// API servers accepted before they validated strictly and which may still be stored. An
/// IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is the IPv4 address, as Go's `To4` sees it.
/// Surrounding whitespace is not accepted, as upstream does not accept it.
pub fn parse_ip_sloppy(value: &str) -> Option<IpAddr> {
    let ip = match value.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => IpAddr::V4(parse_ipv4_leading_zeros(value)?),
    };
    Some(ip.to_canonical())
}

/// Four decimal octets, each 0-255 with any number of leading zeros.
fn parse_ipv4_leading_zeros(value: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = value.split('.');
    for octet in &mut octets {
        *octet = parse_decimal_u8(parts.next()?)?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

fn parse_decimal_u8(digits: &str) -> Option<u8> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    if significant.len() > 3 {
        return None;
    }
    // All zeros trims to "", which is 0.
    if significant.is_empty() {
        return Some(0);
    }
    significant.parse().ok()
}

/// Parses a CIDR as upstream does (`ParseCIDRSloppy`): the address part as
/// [`parse_ip_sloppy`], the prefix length in decimal; host bits are cleared
/// (`10.0.0.1/8` is 10.0.0.0/8), as Go's `ParseCIDR` returns the network.
pub fn parse_cidr_sloppy(value: &str) -> Option<IpNet> {
    let (addr, prefix) = value.split_once('/')?;
    let prefix_digits = prefix.trim_start_matches('0');
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix_digits.len() > 3 {
        return None;
    }
    let prefix: u8 = if prefix_digits.is_empty() {
        0
    } else {
        prefix_digits.parse().ok()?
    };
    // Mapping to canonical form would change the prefix's meaning, so parse the address
    // without it: an IPv4-mapped network stays IPv6.
    let ip = match addr.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => IpAddr::V4(parse_ipv4_leading_zeros(addr)?),
    };
    IpNet::new(ip, prefix).ok().map(|net| net.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "default", "kube-system", "a1", "1a", &"a".repeat(63)] {
            assert_eq!(dns1123_label(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "a/b",
            "a b",
            "a\nb",
            &"a".repeat(64),
        ] {
            assert!(dns1123_label(bad).is_err(), "{bad:?}");
        }
        assert!(dns1035_label("web").is_ok());
        assert!(dns1035_label("1web").is_err(), "must start with a letter");
        assert!(service_name("1web").is_ok(), "1.37 takes DNS-1123 labels");
        assert!(service_name("Web").is_err() && service_name("-web").is_err());
        assert!(dns1035_label("we/b").is_err());
    }

    #[test]
    fn dns_subdomains() {
        for ok in ["web-abc12", "a.b.c", "node-1.example.com", "1"] {
            assert_eq!(dns1123_subdomain(ok), Ok(()), "{ok}");
        }
        let long = format!("{}.{}", "a".repeat(63), "b".repeat(190));
        assert_eq!(long.len(), 254);
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "A.b",
            "a_b",
            "a/b",
            "a\u{0}",
            long.as_str(),
        ] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn iana_service_names() {
        for ok in ["http", "dns-tcp", "h2c", "a", "web-8080"] {
            assert_eq!(iana_svc_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "80",
            "-http",
            "http-",
            "dns--tcp",
            "HTTP",
            "http_alt",
            "a-very-long-name1",
            "a:b",
        ] {
            assert!(iana_svc_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn label_values() {
        for ok in ["", "web", "Web_1.2-x", &"a".repeat(63)] {
            assert_eq!(label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["-web", "web.", "a/b", "a b", "a\nb", &"a".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sloppy_ips_read_leading_zeros_as_decimal() {
        let ip = |s: &str| parse_ip_sloppy(s).map(|ip| ip.to_string());
        assert_eq!(ip("172.30.0.041").as_deref(), Some("172.30.0.41"));
        assert_eq!(ip("10.180.00.001").as_deref(), Some("10.180.0.1"));
        assert_eq!(ip("010.000.000.255").as_deref(), Some("10.0.0.255"));
        assert_eq!(ip("10.0.0.1").as_deref(), Some("10.0.0.1"));
        assert_eq!(ip("fd00::1").as_deref(), Some("fd00::1"));
        assert_eq!(ip("::ffff:10.0.0.1").as_deref(), Some("10.0.0.1"));
        for bad in [
            "",
            "10.0.0",
            "10.0.0.256",
            "10.0.0.0256",
            "10.0.0.1.2",
            "1e.0.0.1",
            " 10.0.0.1",
            "10.0.0.+1",
            "x",
        ] {
            assert_eq!(parse_ip_sloppy(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn endpoint_ips_follow_the_api_servers_rule() {
        let check = |s: &str| endpoint_ip(&parse_ip_sloppy(s).unwrap());
        for ok in [
            "10.0.0.1",
            "192.0.2.1",
            "fd00::1",
            "2001:db8::1",
            "224.0.1.1",
            "ff05::1",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "0.0.0.0",
            "::",
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "::ffff:127.0.0.1",
            "169.254.169.254",
            "fe80::1",
            "224.0.0.251",
            "ff02::1",
            "ff12::1",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
        assert_eq!(
            check("169.254.169.254"),
            Err("169.254.169.254 may not be in the link-local range (169.254.0.0/16, fe80::/10)".into())
        );
    }

    #[test]
    fn sloppy_cidrs() {
        let net = |s: &str| parse_cidr_sloppy(s).map(|n| n.to_string());
        assert_eq!(net("10.0.0.0/8").as_deref(), Some("10.0.0.0/8"));
        assert_eq!(net("10.0.0.1/8").as_deref(), Some("10.0.0.0/8"));
        assert_eq!(net("010.001.0.0/016").as_deref(), Some("10.1.0.0/16"));
        assert_eq!(net("fd00::1/64").as_deref(), Some("fd00::/64"));
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/",
            "/8",
            "10.0.0.0/-1",
            "fd00::/129",
            "x/8",
        ] {
            assert_eq!(parse_cidr_sloppy(bad), None, "{bad:?}");
        }
    }
}
