//! Facts about the node this proxy runs on that no Kubernetes object tells us.

/// `--hostname-override`, else the host name, lower-cased as upstream does (Node names are
/// DNS labels, host names need not be).
pub fn node_name(hostname_override: &str) -> Result<String, String> {
    let name = if hostname_override.trim().is_empty() {
        nix::unistd::gethostname()
            .map_err(|e| format!("cannot read the host name: {e}"))?
            .to_string_lossy()
            .into_owned()
    } else {
        hostname_override.trim().to_string()
    };
    if name.is_empty() {
        return Err("the host name is empty; set --hostname-override".to_string());
    }
    Ok(name.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_wins_and_is_lower_cased() {
        assert_eq!(node_name(" Node-1 ").unwrap(), "node-1");
        assert!(!node_name("").unwrap().is_empty());
    }
}
