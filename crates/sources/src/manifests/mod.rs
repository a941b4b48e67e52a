//! The manifest-file source (`--manifests PATH`): Services, EndpointSlices and this node's
//! Node read from YAML/JSON files as `kubectl get -o yaml` writes them, followed live.
//!
//! Split into a pure half, tested on literal text (`parse`: file bytes to objects;
//! `validate`: the API server's rules for each object; `claims`: nodePorts and cluster IPs
//! settled between Services; `catalog`: successive scans to events), and the I/O half
//! (`scan` reads the paths within the size cap, `watch` wakes the loop, `source` ties them
//! together).

mod catalog;
mod claims;
mod object;
mod parse;
mod scan;
mod source;
mod validate;
mod watch;

pub use catalog::{EMPTY_FILE_GRACE, FileRead, ManifestCatalog, Snapshot};
pub use object::{ManifestObject, ObjectKey};
pub use parse::{DEFAULT_NAMESPACE, FileObjects, ParsedFile, Placement, parse_manifest};
pub use scan::DEFAULT_MAX_FILE_BYTES;
pub use source::{MANIFESTS_SOURCE, ManifestError, ManifestSource};
pub use validate::{DEFAULT_NODE_PORT_RANGE, ValidationRules, validate_file, validate_object};
