//! From the bytes of one manifest file to the objects it defines.
//!
//! Pure: no filesystem, so every rule here is tested on literal text. The rules follow
//! what `kubectl apply -f` accepts: multi-document YAML, JSON (also a stream of objects),
//! `kind: List` and the typed lists (`ServiceList`, ...) that `kubectl get -o yaml` writes.
//! Kinds the proxy does not use are skipped; a document that cannot become the object it
//! claims to be is rejected on its own, so one typo never hides the rest of the file.
//!
//! The catalog parses with [`parse_and_store`]: each object is validated and turned into
//! its compact stored form as soon as it is decoded, so a file's decoded objects never all
//! exist at once (at 10k Services x 10 endpoints they were ~50 MB at the start-up peak).
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
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use tracing::{debug, warn};

use super::object::{ManifestObject, ObjectKey, Stored, shown_path};
use super::validate::{ValidationRules, validate_object, with_place};

mod bounded;
mod stream;

/// Where Services and EndpointSlices without `metadata.namespace` live, as with `kubectl apply`.
pub const DEFAULT_NAMESPACE: &str = "default";

/// What one version of one file contributes.
#[derive(Debug)]
pub enum ParsedFile<T = ManifestObject> {
    /// The file is not YAML/JSON at all. Nothing in it is trusted: whatever it produced
    /// before stays, as after a failed `kubectl apply`.
    Malformed(Rejection),
    /// The file was read document by document.
    Documents(FileObjects<T>),
}

/// The objects of a readable file, and the documents that could not become objects.
#[derive(Debug)]
pub struct FileObjects<T = ManifestObject> {
    /// Decoded objects; a later document with the same identity replaces an earlier one.
    pub objects: BTreeMap<ObjectKey, T>,
    /// Where in the file each of `objects` was defined.
    pub placements: BTreeMap<ObjectKey, Placement>,
    /// Identities whose document was rejected: their previous good version stays.
    pub failed: BTreeSet<ObjectKey>,
    pub rejections: Vec<Rejection>,
}

impl<T> Default for FileObjects<T> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            placements: BTreeMap::new(),
            failed: BTreeSet::new(),
            rejections: Vec::new(),
        }
    }
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
    parse_with(path, bytes, node_name, None, |kept| match kept {
        Kept::Typed(object) => Ok(object),
        Kept::Stored(_) | Kept::Invalid(_) => unreachable!("nothing is validated without rules"),
    })
}

/// [`parse_manifest`] then `validate_file`, with each object validated and stored as soon
/// as it is decoded: what the catalog keeps, without the file's decoded objects at once.
pub(crate) fn parse_and_store(
    path: &Path,
    bytes: &[u8],
    node_name: Option<&str>,
    rules: &ValidationRules,
) -> ParsedFile<Stored> {
    parse_with(path, bytes, node_name, Some(rules), |kept| match kept {
        Kept::Stored(object) => Ok(object),
        Kept::Invalid(rejection) => Err(*rejection),
        Kept::Typed(_) => unreachable!("every object is validated with rules"),
    })
}

fn parse_with<T>(
    path: &Path,
    bytes: &[u8],
    node_name: Option<&str>,
    rules: Option<&ValidationRules>,
    winner: impl Fn(Kept) -> Result<T, Rejection>,
) -> ParsedFile<T> {
    if let Err(error) = std::str::from_utf8(bytes) {
        return ParsedFile::Malformed(Rejection::new(
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
    let decoder = Decoder {
        path,
        node_name,
        rules,
    };
    let mut outcomes = Vec::new();
    let each =
        |number, document| decoder.finish_document(&stream::document_label(number), document, &mut outcomes);
    let read = if path.extension().is_some_and(|ext| ext == "json") {
        stream::json_documents(bytes, &decoder, each)
    } else {
        stream::yaml_documents(bytes, &decoder, each)
    };
    match read {
        // A syntax error anywhere makes the whole file malformed, also for YAML whose aliases
        // expand it beyond its budget.
        Err(error) => ParsedFile::Malformed(malformed_file(path, &error)),
        Ok(()) => ParsedFile::Documents(replay(path, outcomes, winner)),
    }
}

fn malformed_file(path: &Path, error: &stream::SyntaxError) -> Rejection {
    let document = error.document;
    let field = match error.position {
        Some((line, column)) => format!("document {document} (line {line}, column {column})"),
        None => format!("document {document}"),
    };
    Rejection::new(
        ObjectKind::Manifest,
        shown_path(path),
        field,
        RejectReason::Malformed,
        format!(
            "not valid YAML/JSON, keeping what this file defined before: {}",
            error.message
        ),
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

/// What decoding one document or list item produced, in file order. Kept as a record and
/// replayed once the file is read, because a list item is decoded before its list is known
/// to be one (see `stream`): only the documents that count are replayed.
#[derive(Debug)]
pub(super) enum Outcome {
    Object {
        label: String,
        key: ObjectKey,
        object: Kept,
    },
    /// A document that never became a nameable object.
    RejectedDocument(Rejection),
    /// A nameable object whose document is refused: its previous good version stays.
    RejectedObject { key: ObjectKey, rejection: Rejection },
}

/// How a decoded object is kept until the file is replayed.
#[derive(Debug)]
pub(super) enum Kept {
    /// As decoded (no rules given).
    Typed(ManifestObject),
    /// Valid, in its stored form.
    Stored(Stored),
    /// Breaks a rule; reported only if this document is the one that counts for its object.
    Invalid(Box<Rejection>),
}

/// Turns documents into [`Outcome`]s; knows the file only to name it.
pub(super) struct Decoder<'a> {
    path: &'a Path,
    node_name: Option<&'a str>,
    /// When given, objects are validated and stored as they are decoded.
    rules: Option<&'a ValidationRules>,
}

impl Decoder<'_> {
    /// A document as `stream` read it: a plain value, or a mapping whose items were read
    /// (and mostly decoded) one by one.
    fn finish_document(&self, label: &str, document: stream::Document, out: &mut Vec<Outcome>) {
        let (fields, items) = match document {
            stream::Document::Plain(value) => return self.decode(label, value, None, out),
            stream::Document::Listed { fields, items } => (fields, items),
        };
        let list = match (string_field(&fields, "kind"), string_field(&fields, "apiVersion")) {
            (Some(kind), Some(api_version)) => list_item_kind(kind).map(|item_kind| (item_kind, api_version)),
            _ => None,
        };
        let Some((item_kind, api_version)) = list else {
            // Not a list after all (or not even typed): decoded as a whole, where the API types
            // ignore `items` and a missing kind is rejected as usual.
            return self.decode(label, Value::Object(fields), None, out);
        };
        let inherited = item_kind.map(|kind| Inherited { kind, api_version });
        for (index, item) in items.into_iter().enumerate() {
            match item {
                stream::Item::Decoded(outcomes) => out.extend(outcomes),
                stream::Item::Deferred(value) => {
                    self.decode(&stream::item_label(label, index), value, inherited, out);
                }
            }
        }
    }

    fn decode(&self, label: &str, document: Value, inherited: Option<Inherited<'_>>, out: &mut Vec<Outcome>) {
        let map = match &document {
            // An empty document (e.g. a trailing `---`) defines nothing.
            Value::Null => return,
            Value::Object(map) => map,
            other => {
                let found = json_type(other);
                let detail = format!("expected an object, found {found}");
                out.push(self.rejected_document(label, "", RejectReason::Malformed, detail));
                return;
            }
        };
        let Some(kind) = string_field(map, "kind").or(inherited.map(|i| i.kind)) else {
            out.push(self.rejected_document(label, "kind", RejectReason::MissingField, "no kind".into()));
            return;
        };
        let Some(api_version) = string_field(map, "apiVersion").or(inherited.map(|i| i.api_version)) else {
            let detail = format!("{kind} without apiVersion");
            out.push(self.rejected_document(label, "apiVersion", RejectReason::MissingField, detail));
            return;
        };
        let (kind, api_version) = (kind.to_owned(), api_version.to_owned());
        if let Some(item_kind) = list_item_kind(&kind) {
            let inherited = item_kind.map(|kind| Inherited {
                kind,
                api_version: &api_version,
            });
            self.decode_list(label, document, inherited, out);
            return;
        }
        let Some((object_kind, supported_version)) = supported_kind(&kind) else {
            debug!(file = %shown_path(self.path), document = label, kind, "ignoring a kind the proxy does not use");
            return;
        };
        let key = match self.identity(label, object_kind, map) {
            Ok(key) => key,
            Err(rejection) => return out.push(rejection),
        };
        if object_kind == ObjectKind::Node && self.node_name != Some(&*key.id.name) {
            debug!(file = %shown_path(self.path), node = %key, "ignoring a Node that is not this node");
            return;
        }
        if api_version != supported_version {
            let detail =
                format!("{kind} in apiVersion {api_version:?} is not supported, use {supported_version:?}");
            out.push(self.rejected_object(label, key, "apiVersion", RejectReason::InvalidValue, detail));
            return;
        }
        out.push(match typed(object_kind, document, &key) {
            Ok(object) => Outcome::Object {
                label: label.to_owned(),
                object: self.keep(&key, object),
                key,
            },
            Err((field, detail)) => self.rejected_object(label, key, &field, RejectReason::Malformed, detail),
        });
    }

    /// The decoded object, or with rules its stored form (the decoded one is dropped here).
    fn keep(&self, key: &ObjectKey, object: ManifestObject) -> Kept {
        let Some(rules) = self.rules else {
            return Kept::Typed(object);
        };
        if let Err(rejection) = validate_object(key, &object, rules) {
            return Kept::Invalid(Box::new(rejection));
        }
        match Stored::of(&object) {
            Ok(stored) => Kept::Stored(stored),
            Err(error) => Kept::Invalid(Box::new(Rejection::new(
                key.kind,
                key.display_name(),
                "object",
                RejectReason::Malformed,
                format!("cannot be stored ({error})"),
            ))),
        }
    }

    fn decode_list(
        &self,
        label: &str,
        mut document: Value,
        inherited: Option<Inherited<'_>>,
        out: &mut Vec<Outcome>,
    ) {
        let items = match document.get_mut("items").map(Value::take) {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(other) => {
                let found = json_type(&other);
                let detail = format!("expected a list, found {found}");
                out.push(self.rejected_document(label, "items", RejectReason::Malformed, detail));
                return;
            }
        };
        for (index, item) in items.into_iter().enumerate() {
            self.decode(&stream::item_label(label, index), item, inherited, out);
        }
    }

    /// (kind, namespace, name) read from the raw document, so an object whose body does not
    /// decode can still be named, and its last good version kept.
    fn identity(
        &self,
        label: &str,
        kind: ObjectKind,
        map: &Map<String, Value>,
    ) -> Result<ObjectKey, Outcome> {
        let metadata = map.get("metadata");
        let name = metadata
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let Some(name) = name else {
            let detail = format!("{kind} without a name");
            return Err(self.rejected_document(label, "metadata.name", RejectReason::MissingField, detail));
        };
        let namespace = match kind {
            ObjectKind::Node | ObjectKind::ServiceCidr => "",
            _ => metadata
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
                .unwrap_or(DEFAULT_NAMESPACE),
        };
        Ok(ObjectKey::new(kind, namespace, name))
    }

    fn rejected_document(&self, label: &str, field: &str, reason: RejectReason, detail: String) -> Outcome {
        let field = if field.is_empty() {
            label.to_owned()
        } else {
            format!("{label}: {field}")
        };
        let rejection = Rejection::new(ObjectKind::Manifest, shown_path(self.path), field, reason, detail);
        Outcome::RejectedDocument(rejection)
    }

    fn rejected_object(
        &self,
        label: &str,
        key: ObjectKey,
        field: &str,
        reason: RejectReason,
        detail: String,
    ) -> Outcome {
        let detail = format!("{detail} (in {}, {label})", shown_path(self.path));
        let rejection = Rejection::new(key.kind, key.display_name(), field, reason, detail);
        Outcome::RejectedObject { key, rejection }
    }
}

/// The file's objects from its outcomes in file order: a later document for the same
/// object wins, and settles an earlier failure; ordinals count objects in file order.
/// `winner` unwraps what was kept of each object; a winner that broke a rule is then
/// rejected as `validate_file` would (only the document that counts is reported).
fn replay<T>(
    path: &Path,
    outcomes: Vec<Outcome>,
    winner: impl Fn(Kept) -> Result<T, Rejection>,
) -> FileObjects<T> {
    let mut out = FileObjects::default();
    let mut invalid: BTreeMap<ObjectKey, Rejection> = BTreeMap::new();
    let mut next_ordinal = 0;
    for outcome in outcomes {
        match outcome {
            Outcome::Object { label, key, object } => {
                if out.placements.contains_key(&key) {
                    warn!(file = %shown_path(path), document = label, object = %key, "object defined twice in one file; the later document wins");
                }
                match winner(object) {
                    Ok(object) => {
                        out.objects.insert(key.clone(), object);
                        invalid.remove(&key);
                    }
                    Err(rejection) => {
                        out.objects.remove(&key);
                        invalid.insert(key.clone(), rejection);
                    }
                }
                let placement = Placement {
                    ordinal: next_ordinal,
                    label,
                };
                next_ordinal += 1;
                out.placements.insert(key.clone(), placement);
                out.failed.remove(&key);
            }
            Outcome::RejectedDocument(rejection) => out.rejections.push(rejection),
            Outcome::RejectedObject { key, rejection } => {
                out.rejections.push(rejection);
                out.failed.insert(key);
            }
        }
    }
    for (key, rejection) in invalid {
        let placement = out.placements.remove(&key);
        out.rejections
            .push(with_place(rejection, path, placement.as_ref()));
        out.failed.insert(key);
    }
    out
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
