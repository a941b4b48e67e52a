//! The manifest-file source (`--manifests PATH`): Services, EndpointSlices and this node's
//! Node read from YAML/JSON files as `kubectl get -o yaml` writes them, followed live.
//!
//! Split into a pure half, tested on literal text (`parse`: file bytes to objects;
//! `catalog`: successive scans to events), and the I/O half (`scan` reads the paths,
//! `watch` wakes the loop, `source` ties them together).

mod catalog;
mod object;
mod parse;
mod scan;
mod source;
mod watch;

pub use catalog::{EMPTY_FILE_GRACE, FileRead, ManifestCatalog, Snapshot};
pub use object::{ManifestObject, ObjectKey};
pub use parse::{DEFAULT_NAMESPACE, FileObjects, ParsedFile, parse_manifest};
pub use source::{MANIFESTS_SOURCE, ManifestError, ManifestSource};
