//! From the bytes of one manifest file to the objects it defines.
//!
//! Pure: no filesystem, so every rule here is tested on literal text. The rules follow
//! what `kubectl apply -f` accepts: multi-document YAML, JSON (also a stream of objects),
//! `kind: List` and the typed lists (`ServiceList`, ...) that `kubectl get -o yaml` writes.
//! Kinds the proxy does not use are skipped; a document that cannot become the object it
//! claims to be is rejected on its own, so one typo never hides the rest of the file.
//!
//! A file that is not UTF-8 text, or whose YAML aliases would expand it far beyond its size
//! (`bounded`), is refused whole before any object is built from it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::Resource;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kpr_model::{ObjectKind, RejectReason, Rejection};
use serde::de::{DeserializeOwned, DeserializeSeed};
use serde_json::{Map, Value};
use tracing::{debug, warn};

use super::object::{ManifestObject, ObjectKey, shown_path};

mod bounded;

/// Where Services and EndpointSlices without `metadata.namespace` live, as with `kubectl apply`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// What one version of one file contributes.
#[derive(Debug)]
pub enum ParsedFile {
    /// The file is not YAML/JSON at all. Nothing in it is trusted: whatever it produced
    /// before stays, as after a failed `kubectl apply`.
    Malformed(Rejection),
    /// The file was read document by document.
    Documents(FileObjects),
}

/// The objects of a readable file, and the documents that could not become objects.
#[derive(Debug, Default)]
pub struct FileObjects {
    /// Decoded objects; a later document with the same identity replaces an earlier one.
    pub objects: BTreeMap<ObjectKey, ManifestObject>,
    /// Where in the file each of `objects` was defined.
    pub placements: BTreeMap<ObjectKey, Placement>,
    /// Identities whose document was rejected: their previous good version stays.
    pub failed: BTreeSet<ObjectKey>,
    pub rejections: Vec<Rejection>,
}

/// Where in its file an object was defined: named in rejections, and the last tie-breaker
/// between Services that claim the same nodePort or cluster IP in one scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Counts objects in file order, list items included.
    pub ordinal: usize,
    /// `document 2` or `document 1, items[3]`.
    pub label: String,
}

/// Parses one file. `node_name` selects the only Node that is kept (none when `None`).
pub fn parse_manifest(path: &Path, bytes: &[u8], node_name: Option<&str>) -> ParsedFile {
    let documents = match read_documents(path, bytes) {
        Ok(documents) => documents,
        Err(rejection) => return ParsedFile::Malformed(rejection),
    };
    let mut decoder = FileDecoder {
        path,
        node_name,
        out: FileObjects::default(),
        next_ordinal: 0,
    };
    for (index, document) in documents.into_iter().enumerate() {
        decoder.decode(&format!("document {}", index + 1), document, None);
    }
    ParsedFile::Documents(decoder.out)
}

// === Documents ===

fn read_documents(path: &Path, bytes: &[u8]) -> Result<Vec<Value>, Rejection> {
    if let Err(error) = std::str::from_utf8(bytes) {
        return Err(Rejection::new(
            ObjectKind::Manifest,
            shown_path(path),
            "file",
            RejectReason::Malformed,
            format!(
                "not UTF-8 text (invalid byte at offset {}), keeping what this file defined before",
                error.valid_up_to()
            ),
        ));
    }
    if path.extension().is_some_and(|ext| ext == "json") {
        json_documents(path, bytes)
    } else {
        yaml_documents(path, bytes)
    }
}

/// YAML documents, each converted to JSON values the way the API server sees them.
/// A syntax error anywhere makes the whole file malformed, and so does a file whose aliases
/// expand it beyond its budget.
fn yaml_documents(path: &Path, bytes: &[u8]) -> Result<Vec<Value>, Rejection> {
    let mut documents = Vec::new();
    let budget = bounded::budget_for(bytes.len());
    for document in serde_yaml_ng::Deserializer::from_slice(bytes) {
        match (bounded::BoundedValue { budget: &budget }).deserialize(document) {
            Ok(value) => documents.push(value),
            Err(error) => {
                let position = error.location().map(|at| (at.line(), at.column()));
                return Err(malformed_file(path, documents.len() + 1, position, &error));
            }
        }
    }
    Ok(documents)
}

/// A JSON file may hold one object or a stream of them, as kubectl accepts.
fn json_documents(path: &Path, bytes: &[u8]) -> Result<Vec<Value>, Rejection> {
    let mut documents = Vec::new();
    for document in serde_json::Deserializer::from_slice(bytes).into_iter::<Value>() {
        match document {
            Ok(value) => documents.push(value),
            Err(error) => {
                let position = Some((error.line(), error.column()));
                return Err(malformed_file(path, documents.len() + 1, position, &error));
            }
        }
    }
    Ok(documents)
}

fn malformed_file(
    path: &Path,
    document: usize,
    position: Option<(usize, usize)>,
    error: &dyn std::fmt::Display,
) -> Rejection {
    let field = match position {
        Some((line, column)) => format!("document {document} (line {line}, column {column})"),
        None => format!("document {document}"),
    };
    Rejection::new(
        ObjectKind::Manifest,
        shown_path(path),
        field,
        RejectReason::Malformed,
        format!("not valid YAML/JSON, keeping what this file defined before: {error}"),
    )
}

// === Objects ===

/// The API version each kind is accepted in; older versions are refused, not guessed at.
fn supported_kind(kind: &str) -> Option<(ObjectKind, &'static str)> {
    match kind {
        "Service" => Some((ObjectKind::Service, Service::API_VERSION)),
        "EndpointSlice" => Some((ObjectKind::EndpointSlice, EndpointSlice::API_VERSION)),
        "Node" => Some((ObjectKind::Node, Node::API_VERSION)),
        "ServiceCIDR" => Some((ObjectKind::ServiceCidr, ServiceCIDR::API_VERSION)),
        _ => None,
    }
}

/// For typed lists, the kind their items have when the items do not say.
fn list_item_kind(kind: &str) -> Option<Option<&'static str>> {
    match kind {
        "List" => Some(None),
        "ServiceList" => Some(Some("Service")),
        "EndpointSliceList" => Some(Some("EndpointSlice")),
        "NodeList" => Some(Some("Node")),
        "ServiceCIDRList" => Some(Some("ServiceCIDR")),
        _ => None,
    }
}

/// `kind` and `apiVersion` a list lends to items that omit them.
#[derive(Clone, Copy)]
struct Inherited<'a> {
    kind: &'a str,
    api_version: &'a str,
}

struct FileDecoder<'a> {
    path: &'a Path,
    node_name: Option<&'a str>,
    out: FileObjects,
    /// The next object's [`Placement::ordinal`].
    next_ordinal: usize,
}

impl FileDecoder<'_> {
    fn decode(&mut self, label: &str, document: Value, inherited: Option<Inherited<'_>>) {
        let map = match &document {
            // An empty document (e.g. a trailing `---`) defines nothing.
            Value::Null => return,
            Value::Object(map) => map,
            other => {
                let found = json_type(other);
                self.reject_document(
                    label,
                    "",
                    RejectReason::Malformed,
                    format!("expected an object, found {found}"),
                );
                return;
            }
        };
        let Some(kind) = string_field(map, "kind").or(inherited.map(|i| i.kind)) else {
            self.reject_document(label, "kind", RejectReason::MissingField, "no kind".into());
            return;
        };
        let Some(api_version) = string_field(map, "apiVersion").or(inherited.map(|i| i.api_version)) else {
            self.reject_document(
                label,
                "apiVersion",
                RejectReason::MissingField,
                format!("{kind} without apiVersion"),
            );
            return;
        };
        let (kind, api_version) = (kind.to_owned(), api_version.to_owned());
        if let Some(item_kind) = list_item_kind(&kind) {
            let inherited = item_kind.map(|kind| Inherited {
                kind,
                api_version: &api_version,
            });
            self.decode_list(label, document, inherited);
            return;
        }
        let Some((object_kind, supported_version)) = supported_kind(&kind) else {
            debug!(file = %shown_path(self.path), document = label, kind, "ignoring a kind the proxy does not use");
            return;
        };
        let Some(key) = self.identity(label, object_kind, map) else {
            return;
        };
        if object_kind == ObjectKind::Node && self.node_name != Some(&*key.id.name) {
            debug!(file = %shown_path(self.path), node = %key, "ignoring a Node that is not this node");
            return;
        }
        if api_version != supported_version {
            let detail =
                format!("{kind} in apiVersion {api_version:?} is not supported, use {supported_version:?}");
            self.reject_object(label, key, "apiVersion", RejectReason::InvalidValue, detail);
            return;
        }
        match typed(object_kind, document, &key) {
            Ok(object) => self.insert(label, key, object),
            Err((field, detail)) => self.reject_object(label, key, &field, RejectReason::Malformed, detail),
        }
    }

    fn decode_list(&mut self, label: &str, mut document: Value, inherited: Option<Inherited<'_>>) {
        let items = match document.get_mut("items").map(Value::take) {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(other) => {
                let found = json_type(&other);
                self.reject_document(
                    label,
                    "items",
                    RejectReason::Malformed,
                    format!("expected a list, found {found}"),
                );
                return;
            }
        };
        for (index, item) in items.into_iter().enumerate() {
            self.decode(&format!("{label}, items[{index}]"), item, inherited);
        }
    }

    /// (kind, namespace, name) read from the raw document, so an object whose body does not
    /// decode can still be named, and its last good version kept.
    fn identity(&mut self, label: &str, kind: ObjectKind, map: &Map<String, Value>) -> Option<ObjectKey> {
        let metadata = map.get("metadata");
        let name = metadata
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let Some(name) = name else {
            self.reject_document(
                label,
                "metadata.name",
                RejectReason::MissingField,
                format!("{kind} without a name"),
            );
            return None;
        };
        let namespace = match kind {
            ObjectKind::Node | ObjectKind::ServiceCidr => "",
            _ => metadata
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
                .unwrap_or(DEFAULT_NAMESPACE),
        };
        Some(ObjectKey::new(kind, namespace, name))
    }

    fn insert(&mut self, label: &str, key: ObjectKey, object: ManifestObject) {
        if self.out.objects.insert(key.clone(), object).is_some() {
            warn!(file = %shown_path(self.path), document = label, object = %key, "object defined twice in one file; the later document wins");
        }
        let placement = Placement {
            ordinal: self.next_ordinal,
            label: label.to_owned(),
        };
        self.next_ordinal += 1;
        self.out.placements.insert(key.clone(), placement);
        // A good document after a bad one for the same object settles it.
        self.out.failed.remove(&key);
    }

    /// A document that never became a nameable object.
    fn reject_document(&mut self, label: &str, field: &str, reason: RejectReason, detail: String) {
        let field = if field.is_empty() {
            label.to_owned()
        } else {
            format!("{label}: {field}")
        };
        let rejection = Rejection::new(ObjectKind::Manifest, shown_path(self.path), field, reason, detail);
        self.out.rejections.push(rejection);
    }

    /// A nameable object whose document is refused: its previous good version stays.
    fn reject_object(
        &mut self,
        label: &str,
        key: ObjectKey,
        field: &str,
        reason: RejectReason,
        detail: String,
    ) {
        let detail = format!("{detail} (in {}, {label})", shown_path(self.path));
        let rejection = Rejection::new(key.kind, key.display_name(), field, reason, detail);
        self.out.rejections.push(rejection);
        self.out.failed.insert(key);
    }
}

/// Decodes into the API type; on failure, the field path and why.
fn typed(kind: ObjectKind, document: Value, key: &ObjectKey) -> Result<ManifestObject, (String, String)> {
    let namespace = || Some(key.id.namespace.to_string());
    Ok(match kind {
        ObjectKind::Service => {
            let mut service: Service = decode_as(document)?;
            service.metadata.namespace = namespace();
            ManifestObject::Service(service.into())
        }
        ObjectKind::EndpointSlice => {
            let mut slice: EndpointSlice = decode_as(document)?;
            slice.metadata.namespace = namespace();
            ManifestObject::EndpointSlice(slice.into())
        }
        ObjectKind::ServiceCidr => ManifestObject::ServiceCidr(decode_as::<ServiceCIDR>(document)?.into()),
        ObjectKind::Node | ObjectKind::Manifest => ManifestObject::Node(decode_as::<Node>(document)?.into()),
    })
}

fn decode_as<T: DeserializeOwned>(document: Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(document).map_err(|error| {
        let field = error.path().to_string();
        (field, error.into_inner().to_string())
    })
}

fn string_field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    map.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests;
