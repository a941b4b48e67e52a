//! "host:port" handling with Go's `net.SplitHostPort` rules.
//!
//! Upstream validates and completes the healthz and metrics addresses with Go's rules
//! (IPv6 in brackets, a bare IP gets the component's default port), so we do the same to
//! accept and reject exactly the addresses upstream does.

use std::net::{IpAddr, SocketAddr};

/// Splits "host:port" or "[v6]:port" like Go; `None` when the text has no port part.
pub fn split_host_port(text: &str) -> Option<(&str, &str)> {
    if let Some(bracketed) = text.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        let port = after.strip_prefix(':')?;
        return (!host.contains('[') && !port.contains(':')).then_some((host, port));
    }
    let (host, port) = text.rsplit_once(':')?;
    (!host.contains(':') && !host.contains('[') && !host.contains(']')).then_some((host, port))
}

/// Adds `port` to a bare IP ("10.0.0.1" -> "10.0.0.1:10256", "::" -> "[::]:10256"); anything
/// else is returned unchanged for validation to judge.
pub fn append_port_if_needed(address: &str, port: u16) -> String {
    if split_host_port(address).is_some() {
        return address.to_string();
    }
    match address.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) => address.to_string(),
    }
}

/// Whether Go would see `ip` as IPv4 (`To4() != nil`), which counts IPv4-mapped IPv6 too.
pub fn is_ipv4_like(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

/// Checks an "IP:port" bind address; the reason says what is wrong.
pub fn check_ip_port(text: &str) -> Result<SocketAddr, String> {
    let (host, port) = split_host_port(text).ok_or_else(|| "must be IP:port".to_string())?;
    let ip: IpAddr = host.parse().map_err(|_| format!("{host:?} must be a valid IP"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| format!("{port:?} must be a valid port (1-65535)"))?;
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_go() {
        assert_eq!(split_host_port("0.0.0.0:10256"), Some(("0.0.0.0", "10256")));
        assert_eq!(split_host_port("[::1]:10249"), Some(("::1", "10249")));
        assert_eq!(split_host_port("localhost:80"), Some(("localhost", "80")));
        assert_eq!(split_host_port("::1"), None);
        assert_eq!(split_host_port("10.0.0.1"), None);
        assert_eq!(split_host_port("[::1]"), None);
    }

    #[test]
    fn appends_default_port_to_bare_ips_only() {
        assert_eq!(append_port_if_needed("127.0.0.1", 10256), "127.0.0.1:10256");
        assert_eq!(append_port_if_needed("::", 10256), "[::]:10256");
        assert_eq!(append_port_if_needed("1.2.3.4:99", 10256), "1.2.3.4:99");
        assert_eq!(append_port_if_needed("bogus", 10256), "bogus");
    }

    #[test]
    fn checks_ip_and_port() {
        assert!(check_ip_port("0.0.0.0:10256").is_ok());
        assert!(check_ip_port("[::]:10256").is_ok());
        assert!(check_ip_port("localhost:10256").unwrap_err().contains("valid IP"));
        assert!(check_ip_port("1.2.3.4:0").unwrap_err().contains("valid port"));
        assert!(check_ip_port("1.2.3.4:70000").unwrap_err().contains("valid port"));
        assert_eq!(check_ip_port("1.2.3.4").unwrap_err(), "must be IP:port");
    }

    #[test]
    fn mapped_ipv4_counts_as_ipv4() {
        assert!(is_ipv4_like("::ffff:10.0.0.1".parse().unwrap()));
        assert!(!is_ipv4_like("fd00::1".parse().unwrap()));
    }
}
