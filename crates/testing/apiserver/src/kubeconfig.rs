//! A kubeconfig pointing at the test server, so programs under test take the same
//! `--kubeconfig` path they take against a real cluster: plain HTTP, no credentials.

use serde_json::json;

/// The cluster, user and context name used in the kubeconfig.
pub const CONTEXT: &str = "kpr-test-apiserver";

/// Kubeconfig YAML for a server at `url` (`http://127.0.0.1:PORT`).
pub fn render(url: &str) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": CONTEXT, "cluster": { "server": url } }],
        "users": [{ "name": CONTEXT, "user": {} }],
        "contexts": [{
            "name": CONTEXT,
            "context": { "cluster": CONTEXT, "user": CONTEXT, "namespace": "default" },
        }],
        "current-context": CONTEXT,
        "preferences": {},
    });
    // Serializing a JSON value to YAML cannot fail; fall back to JSON (valid YAML) anyway.
    serde_yaml_ng::to_string(&config).unwrap_or_else(|_| config.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_at_the_url_with_one_context() {
        let yaml = render("http://127.0.0.1:6443");
        let parsed: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(
            parsed["clusters"][0]["cluster"]["server"],
            "http://127.0.0.1:6443"
        );
        assert_eq!(parsed["current-context"], CONTEXT);
        assert_eq!(parsed["contexts"][0]["context"]["cluster"], CONTEXT);
    }
}
