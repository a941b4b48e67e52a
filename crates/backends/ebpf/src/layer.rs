//! The socket layer in the kernel: the programs loaded, attached to a cgroup v2 and pinned
//! with their maps under bpffs, so that a restarted process adopts them and connections
//! are translated throughout; and taken away again (`--cleanup`, another mode starting).
//!
//! ```text
//! <pin root>/maps/kpr_services, kpr_backends, kpr_affinity, kpr_revnat
//! <pin root>/links/kpr_connect4, ... (one link per program; the cgroup it is attached to)
//! ```
//!
//! Start-up is all or nothing: every program passes the verifier before any is attached,
//! and when an attach fails the links made so far are dropped (detached) and maps this
//! start created are unpinned, so the host is left as it was found.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use aya::maps::{HashMap, Map, MapData, MapError};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{CgroupAttachMode, CgroupSockAddr};
use aya::{Ebpf, EbpfLoader};

use crate::maps::{
    AFFINITY, ALL_MAPS, AddrPort, AffinityKey, AffinityValue, BACKENDS, BackendKey, REVNAT, RevnatKey,
    SERVICES, ServiceKey, ServiceValue,
};
use crate::table::Op;

/// The object clang built from bpf/socket_lb.c (build.rs).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/socket_lb.o"));

/// The programs, by their C names, each attached once.
pub const PROGRAMS: [&str; 8] = [
    "kpr_connect4",
    "kpr_sendmsg4",
    "kpr_recvmsg4",
    "kpr_getpeername4",
    "kpr_connect6",
    "kpr_sendmsg6",
    "kpr_recvmsg6",
    "kpr_getpeername6",
];

/// Where the mode pins its maps and links by default.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/kube-proxy-rs";

/// How many entries each map holds. The hash maps allocate per entry (no preallocation),
/// so a large capacity costs nothing until used; the two LRU maps are allocated whole.
/// The Service and endpoint maps are sized by `--ebpf-max-service-addresses` and
/// `--ebpf-max-endpoint-slots` ([`SERVICES_KNOB`], [`BACKENDS_KNOB`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    /// Service addresses (cluster IPs, NodePorts x node addresses, external and LB IPs).
    pub services: u32,
    /// Endpoint slots, twice what one sync may program: an adopting start writes its
    /// own beside the previous process's before deleting those.
    pub backends: u32,
    /// (client, Service) pairs with ClientIP affinity.
    pub affinity: u32,
    /// Translated sockets x endpoints they were given (least recently used evicted first).
    pub revnat: u32,
}

/// What sizes the Service map.
pub const SERVICES_KNOB: &str = "--ebpf-max-service-addresses (ebpf.maxServiceAddresses in the config file)";
/// What sizes the endpoint map.
pub const BACKENDS_KNOB: &str = "--ebpf-max-endpoint-slots (ebpf.maxEndpointSlots in the config file)";

impl Capacities {
    /// The capacities for the configured maxima (`None`: the default), the endpoint map
    /// twice the slots one sync may program.
    pub fn configured(max_service_addresses: Option<u32>, max_endpoint_slots: Option<u32>) -> Self {
        let default = Self::default();
        Self {
            services: max_service_addresses.unwrap_or(default.services),
            backends: max_endpoint_slots.map_or(default.backends, |n| n.saturating_mul(2)),
            ..default
        }
    }

    /// Whether `services` Service addresses and `slots` endpoint slots fit (half the
    /// endpoint map: an adopting restart writes its own beside the previous process's);
    /// if not, the error naming the map, its capacity, the need and the knob.
    pub fn check(&self, services: usize, slots: usize) -> Result<(), LayerError> {
        if services > self.services as usize {
            return Err(LayerError::Capacity {
                map: SERVICES,
                what: "Service addresses",
                needed: services,
                capacity: self.services,
                knob: SERVICES_KNOB,
            });
        }
        if slots > (self.backends / 2) as usize {
            return Err(LayerError::Capacity {
                map: BACKENDS,
                what: "endpoint slots (half its entries: an adopting restart needs the other half)",
                needed: slots,
                capacity: self.backends / 2,
                knob: BACKENDS_KNOB,
            });
        }
        Ok(())
    }
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            services: 1 << 19,
            backends: 1 << 21,
            affinity: 1 << 16,
            revnat: 1 << 17,
        }
    }
}

/// What went wrong, naming what is missing.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("BPF programs refused by the kernel (verifier or missing feature): {0}")]
    Load(String),
    #[error("cannot attach the socket programs to cgroup {path}: {detail}")]
    Attach { path: PathBuf, detail: String },
    #[error("pin directory {path}: {detail}")]
    Pin { path: PathBuf, detail: String },
    #[error("map {map}: {detail}")]
    Map { map: &'static str, detail: String },
    #[error(
        "map capacity exceeded: map {map} holds {capacity} {what}, the cluster needs {needed}; \
         {knob} sizes it"
    )]
    Capacity {
        map: &'static str,
        what: &'static str,
        needed: usize,
        capacity: u32,
        /// The flag (and config file field) that sizes the map.
        knob: &'static str,
    },
}

/// The pin directory's layout.
#[derive(Clone, Debug)]
pub struct Pins {
    root: PathBuf,
}

impl Pins {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn maps(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub fn links(&self) -> PathBuf {
        self.root.join("links")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps().join(name)
    }

    pub fn link(&self, program: &str) -> PathBuf {
        self.links().join(program)
    }

    /// Whether anything is pinned here.
    pub fn exists(&self) -> bool {
        self.root.exists()
    }
}

/// The Service keys and endpoint slots found in adopted maps.
pub type AdoptedEntries = (Vec<ServiceKey>, Vec<(BackendKey, AddrPort)>);

/// The loaded, attached and pinned socket layer, and its maps.
pub struct SocketLayer {
    pins: Pins,
    capacities: Capacities,
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, BackendKey, AddrPort>,
    /// Whether the maps were a previous process's (their entries are to be adopted).
    adopted: bool,
}

impl std::fmt::Debug for SocketLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketLayer")
            .field("pins", &self.pins)
            .field("adopted", &self.adopted)
            .finish_non_exhaustive()
    }
}

impl SocketLayer {
    /// Loads the programs (adopting pinned maps when a previous process left them), attaches
    /// them to `cgroup` and pins the links, replacing a previous process's links only once
    /// every new one is attached. The pin directory must be on a bpffs.
    pub fn start(pins: Pins, cgroup: &Path, capacities: Capacities) -> Result<Self, LayerError> {
        Self::start_from(pins, cgroup, capacities, OBJECT)
    }

    /// [`Self::start`] with the programs of `object` (an ELF built as bpf/socket_lb.c is)
    /// instead of the built-in ones: for a test of what the kernel refuses. A start that
    /// fails leaves what it found: nothing when the pin directory was new, else the
    /// previous process's maps and links.
    pub fn start_from(
        pins: Pins,
        cgroup: &Path,
        capacities: Capacities,
        object: &[u8],
    ) -> Result<Self, LayerError> {
        let fresh = !pins.exists();
        let undo = |pins: &Pins, created_maps: bool| {
            if fresh {
                if let Err(detail) = remove(pins) {
                    tracing::warn!("pin directory not fully removed: {detail}");
                }
            } else if created_maps {
                unpin_maps(pins);
            }
        };
        if !pinned_maps_fit(&pins, capacities) {
            // Another layout (an upgrade) or other capacities: new maps. The old programs
            // keep the old maps and translate until their links are replaced below; the
            // first full sync fills the new ones.
            tracing::warn!(
                pins = %pins.root().display(),
                "pinned socket maps have another layout or capacity: replaced by new ones"
            );
            unpin_maps(&pins);
        }
        let adopted = ALL_MAPS.iter().all(|name| pins.map(name).exists());
        let created_maps = !ALL_MAPS.iter().any(|name| pins.map(name).exists());
        let pin_error = |path: &Path, e: &dyn std::fmt::Display| LayerError::Pin {
            path: path.to_owned(),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(pins.maps()).map_err(|e| pin_error(&pins.maps(), &e))?;
        std::fs::create_dir_all(pins.links()).map_err(|e| pin_error(&pins.links(), &e))?;
        let loaded = load(&pins, capacities, object);
        let mut ebpf = match loaded {
            Ok(ebpf) => ebpf,
            Err(error) => {
                undo(&pins, created_maps);
                return Err(error);
            }
        };
        if let Err(error) = attach_all(&mut ebpf, &pins, cgroup) {
            drop(ebpf);
            undo(&pins, created_maps);
            return Err(error);
        }
        let services = take_hash(&mut ebpf, SERVICES)?;
        let backends = take_hash(&mut ebpf, BACKENDS)?;
        tracing::info!(
            cgroup = %cgroup.display(),
            pins = %pins.root().display(),
            adopted,
            "socket programs attached"
        );
        Ok(Self {
            pins,
            capacities,
            services,
            backends,
            adopted,
        })
    }

    pub fn capacities(&self) -> Capacities {
        self.capacities
    }

    /// The entries a previous process left (empty when the maps are new).
    pub fn adopted_entries(&self) -> Result<AdoptedEntries, LayerError> {
        if !self.adopted {
            return Ok((Vec::new(), Vec::new()));
        }
        let services = self
            .services
            .keys()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| map_error(SERVICES, &e))?;
        let backends = self
            .backends
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| map_error(BACKENDS, &e))?;
        Ok((services, backends))
    }

    /// Applies `ops` in order. Deleting an entry that is not there is not an error.
    pub fn apply(&mut self, ops: &[Op]) -> Result<(), LayerError> {
        for op in ops {
            match op {
                Op::PutBackend(key, value) => self.backends.insert(key, value, 0).map_err(|e| {
                    full_or(
                        BACKENDS,
                        "endpoint slots",
                        BACKENDS_KNOB,
                        self.capacities.backends,
                        &e,
                    )
                })?,
                Op::PutService(key, value) => self.services.insert(key, value, 0).map_err(|e| {
                    full_or(
                        SERVICES,
                        "Service addresses",
                        SERVICES_KNOB,
                        self.capacities.services,
                        &e,
                    )
                })?,
                Op::DeleteService(key) => {
                    absent_ok(self.services.remove(key)).map_err(|e| map_error(SERVICES, &e))?
                }
                Op::DeleteBackend(key) => {
                    absent_ok(self.backends.remove(key)).map_err(|e| map_error(BACKENDS, &e))?
                }
            }
        }
        Ok(())
    }

    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    /// Whether the maps were a previous process's (it left programs serving from them).
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// Start-up failed: detaches and unpins what this start attached and pinned, unless the
    /// maps were adopted (the programs attached beside them serve the previous process's
    /// entries until the next start). Whether it was removed.
    pub fn abandon(&self) -> Result<bool, String> {
        if self.adopted {
            tracing::warn!(
                pins = %self.pins.root().display(),
                "start-up failed; the adopted socket maps keep serving"
            );
            return Ok(false);
        }
        remove(&self.pins)
    }
}

/// Whether every pinned map (if any) has this build's key and value sizes and the wanted
/// capacity: the loader reuses a pinned map by name without comparing them.
fn pinned_maps_fit(pins: &Pins, capacities: Capacities) -> bool {
    let expected = [
        (
            SERVICES,
            size_of::<ServiceKey>(),
            size_of::<ServiceValue>(),
            capacities.services,
        ),
        (
            BACKENDS,
            size_of::<BackendKey>(),
            size_of::<AddrPort>(),
            capacities.backends,
        ),
        (
            AFFINITY,
            size_of::<AffinityKey>(),
            size_of::<AffinityValue>(),
            capacities.affinity,
        ),
        (
            REVNAT,
            size_of::<RevnatKey>(),
            size_of::<AddrPort>(),
            capacities.revnat,
        ),
    ];
    expected.iter().all(|&(name, key, value, capacity)| {
        let path = pins.map(name);
        if !path.exists() {
            return true;
        }
        MapData::from_pin(&path)
            .and_then(|map| map.info())
            .is_ok_and(|info| {
                info.key_size() as usize == key
                    && info.value_size() as usize == value
                    && info.max_entries() == capacity
            })
    })
}

fn load(pins: &Pins, capacities: Capacities, object: &[u8]) -> Result<Ebpf, LayerError> {
    let mut loader = EbpfLoader::new();
    loader
        .default_map_pin_directory(pins.maps())
        // The programs read only the context's UAPI fields: no CO-RE relocation, so the
        // kernel's BTF need not be parsed.
        .btf(None)
        .map_max_entries(SERVICES, capacities.services)
        .map_max_entries(BACKENDS, capacities.backends)
        .map_max_entries(AFFINITY, capacities.affinity)
        .map_max_entries(REVNAT, capacities.revnat);
    let mut ebpf = loader
        .load(object)
        .map_err(|e| LayerError::Load(error_chain(&e)))?;
    for name in PROGRAMS {
        let program: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .ok_or_else(|| LayerError::Load(format!("program {name} missing from the object")))?
            .try_into()
            .map_err(|e| LayerError::Load(format!("{name}: {}", error_chain(&e))))?;
        program
            .load()
            .map_err(|e| LayerError::Load(format!("{name}: {}", error_chain(&e))))?;
    }
    Ok(ebpf)
}

/// Attaches every program and pins its new link beside the old one; then the old links
/// (a previous process's) are unpinned, which detaches them, and the new ones take their
/// names. Meanwhile both run; the second sees an endpoint address and leaves it alone.
fn attach_all(ebpf: &mut Ebpf, pins: &Pins, cgroup: &Path) -> Result<(), LayerError> {
    let attach_error = |detail: String| LayerError::Attach {
        path: cgroup.to_owned(),
        detail,
    };
    let cgroup_dir = File::open(cgroup).map_err(|e| attach_error(e.to_string()))?;
    let mut new_links: BTreeMap<&str, PinnedLink> = BTreeMap::new();
    let mut attached = || -> Result<(), LayerError> {
        for name in PROGRAMS {
            let program: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or_else(|| attach_error(format!("program {name} missing")))?
                .try_into()
                .map_err(|e| attach_error(format!("{name}: {}", error_chain(&e))))?;
            // The kernel makes every link-based cgroup attachment a multi one and refuses
            // attach flags there; aya 0.14 passes the mode as flags, so `Single` it is.
            let id = program
                .attach(&cgroup_dir, CgroupAttachMode::Single)
                .map_err(|e| attach_error(format!("{name}: {}", error_chain(&e))))?;
            let link: FdLink = program
                .take_link(id)
                .map_err(|e| attach_error(format!("{name}: {}", error_chain(&e))))?
                .try_into()
                .map_err(|e: aya::programs::links::LinkError| attach_error(format!("{name}: {e}")))?;
            // bpffs refuses dots in names.
            let staged = pins.links().join(format!("{name}_new"));
            let _ = std::fs::remove_file(&staged);
            let pinned = link
                .pin(&staged)
                .map_err(|e| attach_error(format!("{name}: pin {}: {e}", staged.display())))?;
            new_links.insert(name, pinned);
        }
        Ok(())
    };
    if let Err(error) = attached() {
        for (_, link) in new_links {
            // Unpinned and dropped: detached.
            let _ = link.unpin();
        }
        return Err(error);
    }
    for (name, link) in new_links {
        let old = pins.link(name);
        if old.exists() {
            match PinnedLink::from_pin(&old) {
                Ok(previous) => {
                    let _ = previous.unpin();
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&old);
                }
            }
        }
        let staged = pins.links().join(format!("{name}_new"));
        std::fs::rename(&staged, &old).map_err(|e| LayerError::Pin {
            path: old.clone(),
            detail: e.to_string(),
        })?;
        // The pin keeps the link; the process's descriptor closes here.
        drop(link);
    }
    Ok(())
}

fn take_hash<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, LayerError> {
    let map = ebpf.take_map(name).ok_or_else(|| LayerError::Map {
        map: name,
        detail: "missing from the object".to_owned(),
    })?;
    HashMap::try_from(map).map_err(|e| map_error(name, &e))
}

/// A pinned map of a running (or previous) process, for `explain` and tests.
pub fn open_pinned<K: aya::Pod, V: aya::Pod>(
    pins: &Pins,
    name: &'static str,
) -> Result<HashMap<MapData, K, V>, LayerError> {
    let data = MapData::from_pin(pins.map(name)).map_err(|e| map_error(name, &e))?;
    let map = Map::from_map_data(data).map_err(|e| map_error(name, &e))?;
    HashMap::try_from(map).map_err(|e| map_error(name, &e))
}

/// The affinity map, pinned (for `explain` and tests).
pub fn open_affinity(pins: &Pins) -> Result<HashMap<MapData, AffinityKey, AffinityValue>, LayerError> {
    open_pinned(pins, AFFINITY)
}

/// The reverse-translation map, pinned (for `explain` and tests).
pub fn open_revnat(pins: &Pins) -> Result<HashMap<MapData, RevnatKey, AddrPort>, LayerError> {
    open_pinned(pins, REVNAT)
}

/// Detaches and unpins everything under `pins` (links first, so no program runs on maps
/// being removed). Returns whether anything was there; what cannot be removed is named.
pub fn remove(pins: &Pins) -> Result<bool, String> {
    if !pins.exists() {
        return Ok(false);
    }
    let mut failures = Vec::new();
    if let Ok(entries) = std::fs::read_dir(pins.links()) {
        for entry in entries.flatten() {
            let path = entry.path();
            match PinnedLink::from_pin(&path) {
                Ok(link) => {
                    if let Err(e) = link.unpin() {
                        failures.push(format!("{}: {e}", path.display()));
                    }
                }
                Err(_) => {
                    if let Err(e) = std::fs::remove_file(&path) {
                        failures.push(format!("{}: {e}", path.display()));
                    }
                }
            }
        }
    }
    unpin_maps(pins);
    for dir in [pins.links(), pins.maps(), pins.root().to_owned()] {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => failures.push(format!("{}: {e}", dir.display())),
        }
    }
    if failures.is_empty() {
        Ok(true)
    } else {
        Err(failures.join("; "))
    }
}

fn unpin_maps(pins: &Pins) {
    for name in ALL_MAPS {
        let _ = std::fs::remove_file(pins.map(name));
    }
}

fn absent_ok(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::SyscallError(ref e)) if e.io_error.raw_os_error() == Some(nix::libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// A full map refuses an insert with E2BIG.
fn full_or(
    map: &'static str,
    what: &'static str,
    knob: &'static str,
    capacity: u32,
    error: &MapError,
) -> LayerError {
    match error {
        MapError::SyscallError(e) if e.io_error.raw_os_error() == Some(nix::libc::E2BIG) => {
            LayerError::Capacity {
                map,
                what,
                needed: capacity as usize + 1,
                capacity,
                knob,
            }
        }
        other => map_error(map, other),
    }
}

fn map_error(map: &'static str, error: &dyn std::error::Error) -> LayerError {
    LayerError::Map {
        map,
        detail: error_chain(error),
    }
}

/// An error and its causes, on one line (the verifier's log is in the causes).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
