//! Reads and writes of single objects over HTTP: `GET`, `POST`, `PUT`, `PATCH`, `DELETE`, and
//! `DELETE` on a collection, with the checks the real server makes before storing anything
//! (type, namespace and name consistency with the URL, name syntax, preconditions).
//!
//! The same preparation is used by the test controls, so an object a test stores looks
//! exactly like one a client created.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::http::Query;
use crate::list::{Selectors, etcd_key};
use crate::resources::{ResourceType, SERVICES};
use crate::store::{ObjectKey, Store};

const ACCEPTED_BODY_TYPES: &str = "application/json, application/yaml";
const ACCEPTED_PATCH_TYPES: &str = "application/json-patch+json, application/merge-patch+json";

/// A request body with its media type.
pub(crate) struct Payload<'a> {
    pub content_type: Option<&'a str>,
    pub bytes: &'a [u8],
}

impl Payload<'_> {
    /// The media type without parameters, lower-cased.
    fn media_type(&self) -> String {
        self.content_type
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    }

    /// The body as a JSON object (JSON or YAML bodies, as the real server accepts).
    fn object(&self) -> Result<Value, ApiError> {
        let value: Value = match self.media_type().as_str() {
            "application/json" => serde_json::from_slice(self.bytes).map_err(|e| {
                ApiError::BadRequest(format!("couldn't get version/kind; json parse error: {e}"))
            })?,
            "application/yaml" => serde_yaml_ng::from_slice(self.bytes).map_err(|e| {
                ApiError::BadRequest(format!("couldn't get version/kind; yaml parse error: {e}"))
            })?,
            _ => return Err(ApiError::UnsupportedMediaType(ACCEPTED_BODY_TYPES.into())),
        };
        if value.is_object() {
            Ok(value)
        } else {
            Err(ApiError::BadRequest(
                "the request body must be a JSON object".into(),
            ))
        }
    }
}

/// Checks an object against the type and namespace the URL names, then fills in what the
/// server fills in: `apiVersion`, `kind`, and the namespace of namespaced objects (cluster-
/// scoped ones lose any namespace they carry).
pub(crate) fn prepare(
    resource: &ResourceType,
    namespace: Option<&str>,
    mut object: Value,
) -> Result<Value, ApiError> {
    let expected_version = resource.api_version();
    let text = |field: &str| {
        object
            .get(field)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    if let Some(version) = text("apiVersion")
        && version != expected_version
    {
        return Err(ApiError::BadRequest(format!(
            "the API version in the data ({version}) does not match the expected API version ({expected_version})"
        )));
    }
    if let Some(kind) = text("kind")
        && kind != resource.kind
    {
        return Err(ApiError::BadRequest(format!(
            "{kind} in version \"{}\" cannot be handled as a {}",
            resource.version, resource.kind
        )));
    }
    object["apiVersion"] = json!(expected_version);
    object["kind"] = json!(resource.kind);
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = json!({});
    }
    let metadata = &mut object["metadata"];
    if resource.namespaced {
        let given = metadata
            .get("namespace")
            .and_then(Value::as_str)
            .filter(|ns| !ns.is_empty());
        match (given, namespace) {
            (Some(given), Some(path)) if given != path => {
                return Err(ApiError::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request"
                        .into(),
                ));
            }
            (None, Some(path)) => metadata["namespace"] = json!(path),
            (None, None) => metadata["namespace"] = json!("default"),
            _ => {}
        }
    } else if let Some(fields) = metadata.as_object_mut() {
        fields.remove("namespace");
    }
    Ok(object)
}

/// The object's key, after checking its name's syntax.
pub(crate) fn key_of(resource: &'static ResourceType, object: &Value) -> Result<ObjectKey, ApiError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name.is_empty() {
        return Err(ApiError::Invalid(format!(
            "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
            resource.kind
        )));
    }
    validate_name(resource, name)?;
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Ok(ObjectKey::new(resource, namespace, name))
}

/// Services need DNS-1035 labels; the other served types DNS-1123 subdomains.
fn validate_name(resource: &ResourceType, name: &str) -> Result<(), ApiError> {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let (valid, rule) = if std::ptr::eq(resource, &SERVICES) {
        let valid = name.len() <= 63
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.ends_with(alnum)
            && name.chars().all(|c| alnum(c) || c == '-');
        (
            valid,
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
        )
    } else {
        let valid = name.len() <= 253
            && name.split('.').all(|part| {
                !part.is_empty()
                    && part.starts_with(alnum)
                    && part.ends_with(alnum)
                    && part.chars().all(|c| alnum(c) || c == '-')
            });
        (
            valid,
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        )
    };
    if valid {
        Ok(())
    } else {
        Err(ApiError::Invalid(format!(
            "{} {name:?} is invalid: metadata.name: Invalid value: {name:?}: {rule}",
            resource.kind
        )))
    }
}

fn refuse_dry_run(query: &Query) -> Result<(), ApiError> {
    match query.get("dryRun") {
        Some(_) => Err(ApiError::BadRequest(
            "dryRun is not supported by this test API server".into(),
        )),
        None => Ok(()),
    }
}

/// `POST` on a namespaced collection: `201` with the stored object.
pub(crate) fn create(
    store: &Store,
    resource: &'static ResourceType,
    namespace: Option<&str>,
    query: &Query,
    payload: &Payload<'_>,
) -> Result<(u16, Value), ApiError> {
    refuse_dry_run(query)?;
    let object = prepare(resource, namespace, payload.object()?)?;
    if object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(ApiError::BadRequest(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    let created = create_prepared(store, resource, object)?;
    Ok((201, created))
}

/// Stores a prepared object, naming it from `generateName` when it has no name.
pub(crate) fn create_prepared(
    store: &Store,
    resource: &'static ResourceType,
    mut object: Value,
) -> Result<Value, ApiError> {
    let has_name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let prefix = object
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(prefix) = prefix.filter(|p| !has_name && !p.is_empty()) else {
        let key = key_of(resource, &object)?;
        return Ok((*store.create(key, object)?).clone());
    };
    // Like the real server: a few attempts at a random suffix, then AlreadyExists.
    let mut last_error = None;
    for attempt in 0..8u32 {
        object["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix(&prefix, attempt)));
        let key = key_of(resource, &object)?;
        match store.create(key, object.clone()) {
            Ok(created) => return Ok((*created).clone()),
            Err(error @ ApiError::AlreadyExists { .. }) => last_error = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or(ApiError::BadRequest("could not generate a name".into())))
}

/// Five characters from the alphabet the real server uses for generated names.
fn random_suffix(prefix: &str, attempt: u32) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let digest = Sha256::digest(format!("{prefix}/{attempt}/{nanos}"));
    digest
        .iter()
        .take(5)
        .map(|byte| ALPHABET[usize::from(*byte) % ALPHABET.len()] as char)
        .collect()
}

pub(crate) fn get(store: &Store, key: &ObjectKey) -> Result<(u16, Value), ApiError> {
    let object = store
        .get(key)
        .ok_or_else(|| ApiError::not_found(key.resource, &key.name))?;
    Ok((200, (*object).clone()))
}

/// `PUT`: a replacement, with `metadata.resourceVersion` as a precondition when given.
/// Events may be created this way (their storage allows create-on-update).
pub(crate) fn replace(
    store: &Store,
    key: &ObjectKey,
    query: &Query,
    payload: &Payload<'_>,
) -> Result<(u16, Value), ApiError> {
    refuse_dry_run(query)?;
    let object = prepare(key.resource, namespace_of(key), payload.object()?)?;
    check_name_matches_url(&object, key)?;
    key_of(key.resource, &object)?; // the name's syntax
    if store.get(key).is_none() && key.resource.allow_create_on_update {
        let created = store.create(key.clone(), object)?;
        return Ok((201, (*created).clone()));
    }
    let outcome = store.update(key.clone(), object)?;
    Ok((200, (*outcome.object).clone()))
}

/// `PATCH` with a JSON merge patch (RFC 7386) or a JSON patch (RFC 6902).
pub(crate) fn patch(
    store: &Store,
    key: &ObjectKey,
    query: &Query,
    payload: &Payload<'_>,
) -> Result<(u16, Value), ApiError> {
    refuse_dry_run(query)?;
    let patch = PatchBody::decode(payload)?;
    let outcome = store.modify(key.clone(), |existing| {
        let mut patched = existing.clone();
        patch.apply(&mut patched)?;
        let patched = prepare(key.resource, namespace_of(key), patched)?;
        check_name_matches_url(&patched, key)?;
        let wanted = patched
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let current = existing
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !wanted.is_empty() && wanted != current {
            return Err(ApiError::conflict(
                key.resource,
                &key.name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        Ok(patched)
    })?;
    Ok((200, (*outcome.object).clone()))
}

/// A decoded `PATCH` body.
enum PatchBody {
    /// RFC 7386 JSON merge patch.
    Merge(Value),
    /// RFC 6902 JSON patch.
    Json(json_patch::Patch),
}

impl PatchBody {
    fn decode(payload: &Payload<'_>) -> Result<Self, ApiError> {
        let undecodable = |e: serde_json::Error| ApiError::BadRequest(format!("error decoding patch: {e}"));
        match payload.media_type().as_str() {
            "application/merge-patch+json" => Ok(PatchBody::Merge(
                serde_json::from_slice(payload.bytes).map_err(undecodable)?,
            )),
            "application/json-patch+json" => Ok(PatchBody::Json(
                serde_json::from_slice(payload.bytes).map_err(undecodable)?,
            )),
            _ => Err(ApiError::UnsupportedMediaType(ACCEPTED_PATCH_TYPES.into())),
        }
    }

    fn apply(&self, object: &mut Value) -> Result<(), ApiError> {
        match self {
            PatchBody::Merge(patch) => {
                json_patch::merge(object, patch);
                Ok(())
            }
            PatchBody::Json(patch) => json_patch::patch(object, &patch.0)
                .map_err(|e| ApiError::Invalid(format!("the patch could not be applied: {e}"))),
        }
    }
}

/// `DELETE` of one object: `200` with its last state. Honours DeleteOptions' preconditions.
pub(crate) fn delete(
    store: &Store,
    key: &ObjectKey,
    query: &Query,
    payload: &Payload<'_>,
) -> Result<(u16, Value), ApiError> {
    refuse_dry_run(query)?;
    let options: Value = if payload.bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(payload.bytes)
            .map_err(|e| ApiError::BadRequest(format!("invalid DeleteOptions: {e}")))?
    };
    let deleted = store.delete_if(key, |current| check_delete_preconditions(key, &options, current))?;
    Ok((200, (*deleted).clone()))
}

fn check_delete_preconditions(key: &ObjectKey, options: &Value, current: &Value) -> Result<(), ApiError> {
    for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let Some(wanted) = options
            .pointer(&format!("/preconditions/{field}"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let actual = current
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if wanted != actual {
            return Err(ApiError::conflict(
                key.resource,
                &key.name,
                format!(
                    "Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {actual}"
                ),
            ));
        }
    }
    Ok(())
}

/// `DELETE` on a namespaced collection: deletes what the selectors match, returns the list
/// of deleted objects.
pub(crate) fn delete_collection(
    store: &Store,
    resource: &'static ResourceType,
    namespace: Option<&str>,
    query: &Query,
) -> Result<(u16, Value), ApiError> {
    refuse_dry_run(query)?;
    let selectors = Selectors::from_query(query, resource)?;
    let mut targets = store.snapshot(resource, namespace, None)?.objects;
    targets.retain(|(_, object)| selectors.matches(object));
    targets.sort_by_key(|(key, _)| etcd_key(key));
    let mut deleted = Vec::new();
    for (key, _) in targets {
        match store.delete(&key) {
            Ok(last) => deleted.push((*last).clone()),
            // Deleted meanwhile by someone else: not ours to report.
            Err(ApiError::NotFound { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok((
        200,
        json!({
            "kind": resource.list_kind(),
            "apiVersion": resource.api_version(),
            "metadata": { "resourceVersion": store.resource_version().to_string() },
            "items": deleted,
        }),
    ))
}

fn namespace_of(key: &ObjectKey) -> Option<&str> {
    key.resource.namespaced.then_some(key.namespace.as_str())
}

fn check_name_matches_url(object: &Value, key: &ObjectKey) -> Result<(), ApiError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if name == key.name {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            key.name
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{EVENTS, NODES};

    fn json_payload(value: &Value) -> Vec<u8> {
        serde_json::to_vec(value).unwrap()
    }

    #[test]
    fn prepare_fills_type_and_namespace_and_rejects_mismatches() {
        let object = prepare(&SERVICES, Some("prod"), json!({"metadata": {"name": "web"}})).unwrap();
        assert_eq!(object["kind"], "Service");
        assert_eq!(object["apiVersion"], "v1");
        assert_eq!(object["metadata"]["namespace"], "prod");
        let other_ns = json!({"metadata": {"name": "web", "namespace": "dev"}});
        assert_eq!(
            prepare(&SERVICES, Some("prod"), other_ns).unwrap_err().code(),
            400
        );
        assert_eq!(
            prepare(&SERVICES, None, json!({"kind": "Node"}))
                .unwrap_err()
                .code(),
            400
        );
        assert_eq!(
            prepare(&SERVICES, None, json!({"apiVersion": "v2"}))
                .unwrap_err()
                .code(),
            400
        );
        let node = prepare(&NODES, None, json!({"metadata": {"name": "n", "namespace": "x"}})).unwrap();
        assert!(node["metadata"].get("namespace").is_none());
    }

    #[test]
    fn names_follow_each_types_rule() {
        assert!(validate_name(&SERVICES, "web-1").is_ok());
        assert_eq!(validate_name(&SERVICES, "1web").unwrap_err().code(), 422);
        assert_eq!(validate_name(&SERVICES, "a.b").unwrap_err().code(), 422);
        assert!(validate_name(&NODES, "node-1.example.com").is_ok());
        assert_eq!(validate_name(&NODES, "Node").unwrap_err().code(), 422);
    }

    #[test]
    fn generate_name_appends_a_suffix() {
        let store = Store::new(10);
        let object = prepare(
            &SERVICES,
            Some("d"),
            json!({"metadata": {"generateName": "web-"}}),
        )
        .unwrap();
        let created = create_prepared(&store, &SERVICES, object).unwrap();
        let name = created["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
    }

    #[test]
    fn merge_patch_changes_fields_and_checks_versions() {
        let store = Store::new(10);
        let svc = prepare(
            &SERVICES,
            Some("d"),
            json!({"metadata": {"name": "web"}, "spec": {"type": "ClusterIP"}}),
        )
        .unwrap();
        create_prepared(&store, &SERVICES, svc).unwrap();
        let key = ObjectKey::new(&SERVICES, "d", "web");
        let body = json_payload(&json!({"spec": {"type": "NodePort"}}));
        let payload = Payload {
            content_type: Some("application/merge-patch+json"),
            bytes: &body,
        };
        let (code, patched) = patch(&store, &key, &Query::default(), &payload).unwrap();
        assert_eq!((code, patched["spec"]["type"].as_str()), (200, Some("NodePort")));
        let stale = json_payload(&json!({"metadata": {"resourceVersion": "1"}}));
        let payload = Payload {
            content_type: Some("application/merge-patch+json"),
            bytes: &stale,
        };
        assert_eq!(
            patch(&store, &key, &Query::default(), &payload)
                .unwrap_err()
                .code(),
            409
        );
        let strategic = Payload {
            content_type: Some("application/strategic-merge-patch+json"),
            bytes: &body,
        };
        assert_eq!(
            patch(&store, &key, &Query::default(), &strategic)
                .unwrap_err()
                .code(),
            415
        );
    }

    #[test]
    fn events_may_be_created_by_put() {
        let store = Store::new(10);
        let key = ObjectKey::new(&EVENTS, "d", "e1");
        let body = json_payload(&json!({"metadata": {"name": "e1"}, "reason": "Test"}));
        let payload = Payload {
            content_type: Some("application/json"),
            bytes: &body,
        };
        assert_eq!(replace(&store, &key, &Query::default(), &payload).unwrap().0, 201);
        let svc_key = ObjectKey::new(&SERVICES, "d", "e1");
        assert_eq!(
            replace(&store, &svc_key, &Query::default(), &payload)
                .unwrap_err()
                .code(),
            404
        );
    }

    #[test]
    fn delete_preconditions() {
        let store = Store::new(10);
        let svc = prepare(&SERVICES, Some("d"), json!({"metadata": {"name": "web"}})).unwrap();
        create_prepared(&store, &SERVICES, svc).unwrap();
        let key = ObjectKey::new(&SERVICES, "d", "web");
        let wrong = json_payload(&json!({"preconditions": {"uid": "nope"}}));
        let payload = Payload {
            content_type: Some("application/json"),
            bytes: &wrong,
        };
        assert_eq!(
            delete(&store, &key, &Query::default(), &payload)
                .unwrap_err()
                .code(),
            409
        );
        let empty = Payload {
            content_type: None,
            bytes: b"",
        };
        assert_eq!(delete(&store, &key, &Query::default(), &empty).unwrap().0, 200);
        assert_eq!(
            delete(&store, &key, &Query::default(), &empty)
                .unwrap_err()
                .code(),
            404
        );
    }
}
