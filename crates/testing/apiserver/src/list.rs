//! `GET` on a collection without `watch`: the list semantics of the real server.
//!
//! - `resourceVersion` unset: the newest state. `0`: any state (this server always has the
//!   newest). `X` with `resourceVersionMatch=NotOlderThan` (or with no match and no limit):
//!   at least `X`. `X` with `Exact` (or with no match but a `limit`, the legacy rule): exactly
//!   `X`, rebuilt from history; `410 Expired` once compacted away.
//! - A version newer than the server's is waited for (3 s, like the watch cache), then
//!   answered `504` with reason `Timeout` and cause `ResourceVersionTooLarge`.
//! - `limit`/`continue` paginate a consistent snapshot in etcd key order; the continue token
//!   is a base64url JSON `{v, rv, start}` like the real one, `remainingItemCount` is set when
//!   no selector filters, and a token whose version was compacted gets `410 Expired`.
//! - Items carry no `kind`/`apiVersion`, exactly as the real server sends them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::http::Query;
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{Object, ObjectKey, Store};

/// How long a request for a future resourceVersion waits before `504`, as the watch cache.
const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// The selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selectors {
    pub label: LabelSelector,
    pub field: FieldSelector,
}

impl Selectors {
    pub(crate) fn from_query(query: &Query, resource: &ResourceType) -> Result<Self, ApiError> {
        Ok(Selectors {
            label: LabelSelector::parse(query.get("labelSelector").unwrap_or_default())?,
            field: FieldSelector::parse(query.get("fieldSelector").unwrap_or_default(), resource)?,
        })
    }

    pub(crate) fn matches(&self, object: &Value) -> bool {
        self.label.matches(object) && self.field.matches(object)
    }

    fn is_empty(&self) -> bool {
        self.label.is_empty() && self.field.is_empty()
    }
}

/// Which state a list reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadAt {
    Latest,
    NotOlderThan(u64),
    Exact(u64),
}

/// Where a page starts: a snapshot version and the first etcd key to include.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

const CONTINUE_API_VERSION: &str = "meta.k8s.io/v1";

impl ContinueToken {
    fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        data_encoding::BASE64URL_NOPAD.encode(&json)
    }

    fn decode(text: &str) -> Result<Self, ApiError> {
        let invalid = |why: String| ApiError::BadRequest(format!("continue key is not valid: {why}"));
        let bytes = data_encoding::BASE64URL_NOPAD
            .decode(text.trim_end_matches('=').as_bytes())
            .map_err(|e| invalid(e.to_string()))?;
        let token: ContinueToken = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        if token.v != CONTINUE_API_VERSION {
            return Err(invalid(format!("unsupported version {:?}", token.v)));
        }
        if token.rv == 0 {
            return Err(invalid(
                "incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into(),
            ));
        }
        Ok(token)
    }
}

/// A list request, validated.
#[derive(Debug)]
struct ListRequest {
    selectors: Selectors,
    limit: Option<usize>,
    read_at: ReadAt,
    /// From a continue token: the first key of this page.
    start: Option<String>,
}

impl ListRequest {
    fn parse(query: &Query, resource: &ResourceType) -> Result<Self, ApiError> {
        let selectors = Selectors::from_query(query, resource)?;
        let limit = query
            .integer("limit")?
            .filter(|n| *n > 0)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let continue_token = query.get("continue").filter(|t| !t.is_empty());
        let resource_version = query.get("resourceVersion").unwrap_or_default();
        let version_match = query.get("resourceVersionMatch").filter(|m| !m.is_empty());
        validate_version_options(resource_version, version_match, continue_token.is_some())?;
        let (read_at, start) = match continue_token {
            Some(text) => {
                let token = ContinueToken::decode(text)?;
                (ReadAt::Exact(token.rv), Some(token.start))
            }
            None => (
                read_point(resource_version, version_match, limit.is_some())?,
                None,
            ),
        };
        Ok(ListRequest {
            selectors,
            limit,
            read_at,
            start,
        })
    }
}

/// The checks the real server applies to list options before reading anything.
fn validate_version_options(
    resource_version: &str,
    version_match: Option<&str>,
    has_continue: bool,
) -> Result<(), ApiError> {
    if let Some(version_match) = version_match {
        if resource_version.is_empty() {
            return Err(ApiError::Invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
                    .into(),
            ));
        }
        if has_continue {
            return Err(ApiError::Invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided".into(),
            ));
        }
        if !matches!(version_match, "Exact" | "NotOlderThan") {
            return Err(ApiError::Invalid(format!(
                "resourceVersionMatch: Unsupported value: {version_match:?}: supported values: \"Exact\", \"NotOlderThan\""
            )));
        }
        if version_match == "Exact" && resource_version == "0" {
            return Err(ApiError::Invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""
                    .into(),
            ));
        }
    }
    if has_continue && !resource_version.is_empty() && resource_version != "0" {
        return Err(ApiError::BadRequest(
            "specifying resource version is not allowed when using continue".into(),
        ));
    }
    Ok(())
}

fn read_point(
    resource_version: &str,
    version_match: Option<&str>,
    has_limit: bool,
) -> Result<ReadAt, ApiError> {
    if resource_version.is_empty() || resource_version == "0" {
        return Ok(ReadAt::Latest);
    }
    let version = parse_resource_version(resource_version)?;
    Ok(match version_match {
        Some("Exact") => ReadAt::Exact(version),
        Some(_) => ReadAt::NotOlderThan(version),
        None if has_limit => ReadAt::Exact(version),
        None => ReadAt::NotOlderThan(version),
    })
}

pub(crate) fn parse_resource_version(text: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| {
        ApiError::BadRequest(format!(
            "invalid resource version {text:?}: not an unsigned integer"
        ))
    })
}

/// Waits (briefly) for the store to reach `wanted`, as the real server does for a version
/// newer than its own; `504 ResourceVersionTooLarge` if it never does.
pub(crate) async fn wait_until_fresh(store: &Store, wanted: u64) -> Result<(), ApiError> {
    let mut head = store.subscribe();
    let reached = matches!(
        tokio::time::timeout(FRESHNESS_WAIT, head.wait_for(|rv| *rv >= wanted)).await,
        Ok(Ok(_))
    );
    if reached {
        Ok(())
    } else {
        Err(ApiError::TooLargeResourceVersion {
            requested: wanted,
            current: store.resource_version(),
        })
    }
}

/// The etcd key suffix an object sorts by: `namespace/name`, or `name` when cluster-scoped.
pub(crate) fn etcd_key(key: &ObjectKey) -> String {
    if key.resource.namespaced {
        format!("{}/{}", key.namespace, key.name)
    } else {
        key.name.clone()
    }
}

/// An object as a list item: the real server leaves `kind` and `apiVersion` out.
fn as_item(object: &Object) -> Value {
    let mut item = (**object).clone();
    if let Some(fields) = item.as_object_mut() {
        fields.remove("kind");
        fields.remove("apiVersion");
    }
    item
}

/// Answers a list request with the `{kind}List` document.
pub(crate) async fn list(
    store: &Store,
    resource: &'static ResourceType,
    namespace: Option<&str>,
    query: &Query,
) -> Result<Value, ApiError> {
    let request = ListRequest::parse(query, resource)?;
    let at = match request.read_at {
        ReadAt::Latest => None,
        ReadAt::NotOlderThan(version) => {
            wait_until_fresh(store, version).await?;
            None
        }
        ReadAt::Exact(version) => {
            wait_until_fresh(store, version).await?;
            Some(version)
        }
    };
    let snapshot =
        store
            .sorted_snapshot(resource, namespace, at)
            .map_err(|error| match (error, &request.start) {
                (ApiError::Expired(_), Some(_)) => ApiError::Expired(
                    "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter."
                        .into(),
                ),
                (error, _) => error,
            })?;
    let first = request.start.as_ref().map_or(0, |start| {
        snapshot.objects.partition_point(|(key, _)| key < start)
    });
    let limit = request.limit.unwrap_or(usize::MAX);
    let mut matching = snapshot.objects[first..]
        .iter()
        .filter(|(_, object)| request.selectors.matches(object));
    let page: Vec<&(String, Object)> = matching.by_ref().take(limit).collect();
    let mut metadata = json!({ "resourceVersion": snapshot.resource_version.to_string() });
    if let Some((last_key, _)) = page.last()
        && matching.next().is_some()
    {
        let token = ContinueToken {
            v: CONTINUE_API_VERSION.into(),
            rv: snapshot.resource_version,
            start: format!("{last_key}\0"),
        };
        metadata["continue"] = json!(token.encode());
        if request.selectors.is_empty() {
            metadata["remainingItemCount"] = json!(snapshot.objects.len() - first - page.len());
        }
    }
    let items: Vec<Value> = page.iter().map(|(_, object)| as_item(object)).collect();
    Ok(json!({
        "kind": resource.list_kind(),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
        "items": items,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::SERVICES;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let token = ContinueToken {
            v: CONTINUE_API_VERSION.into(),
            rv: 1234,
            start: "ns/b\0".into(),
        };
        assert_eq!(ContinueToken::decode(&token.encode()).unwrap(), token);
        assert_eq!(ContinueToken::decode("not base64!").unwrap_err().code(), 400);
        let foreign = ContinueToken {
            v: "other/v9".into(),
            ..token
        };
        assert_eq!(ContinueToken::decode(&foreign.encode()).unwrap_err().code(), 400);
    }

    #[test]
    fn version_options_are_validated_like_the_real_server() {
        let invalid =
            |rv: &str, m: Option<&str>, c: bool| validate_version_options(rv, m, c).unwrap_err().code();
        assert_eq!(invalid("", Some("NotOlderThan"), false), 422);
        assert_eq!(invalid("5", Some("Exact"), true), 422);
        assert_eq!(invalid("0", Some("Exact"), false), 422);
        assert_eq!(invalid("5", Some("Newest"), false), 422);
        assert_eq!(invalid("5", None, true), 400);
        assert!(validate_version_options("0", Some("NotOlderThan"), false).is_ok());
        assert!(validate_version_options("0", None, true).is_ok());
    }

    #[test]
    fn legacy_rule_a_limit_makes_a_version_exact() {
        assert_eq!(read_point("", None, true).unwrap(), ReadAt::Latest);
        assert_eq!(
            read_point("0", Some("NotOlderThan"), false).unwrap(),
            ReadAt::Latest
        );
        assert_eq!(read_point("7", None, true).unwrap(), ReadAt::Exact(7));
        assert_eq!(read_point("7", None, false).unwrap(), ReadAt::NotOlderThan(7));
        assert_eq!(read_point("7", Some("Exact"), false).unwrap(), ReadAt::Exact(7));
        assert_eq!(read_point("x", None, false).unwrap_err().code(), 400);
    }

    #[test]
    fn etcd_keys_order_namespaces_as_strings() {
        let key = ObjectKey::new(&SERVICES, "a-b", "y");
        assert!(etcd_key(&key) < etcd_key(&ObjectKey::new(&SERVICES, "a", "x")));
    }
}
