//! `explain` for ebpf mode: reads the pinned socket maps (which endpoints a Service address
//! goes to, affinity). The nftables rules beside them are nftables mode's explainer's.

use std::net::IpAddr;
use std::path::PathBuf;

use kpr_explain::{Endpoint, EndpointGroup, Explainer, Finding, Outcome, Query, Section, Weight};
use kpr_model::IpFamily;

use crate::layer::{DEFAULT_PIN_ROOT, Pins, open_pinned};
use crate::maps::{AddrPort, BACKENDS, BackendKey, FLAG_EXTERNAL, SERVICES, ServiceKey, ServiceValue};

/// Reads the maps pinned at a pin root (`--ebpf-pin-root`), by default [`DEFAULT_PIN_ROOT`].
#[derive(Clone, Debug, Default)]
pub struct EbpfExplainer {
    /// `None`: [`DEFAULT_PIN_ROOT`].
    pin_root: Option<PathBuf>,
}

impl EbpfExplainer {
    /// The maps at [`DEFAULT_PIN_ROOT`].
    pub const DEFAULT: Self = Self { pin_root: None };

    /// The maps at `pin_root`.
    pub fn at(pin_root: impl Into<PathBuf>) -> Self {
        Self {
            pin_root: Some(pin_root.into()),
        }
    }

    fn pins(&self) -> Pins {
        Pins::new(
            self.pin_root
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_PIN_ROOT)),
        )
    }
}

impl Explainer for EbpfExplainer {
    fn looks_for(&self, _family: IpFamily) -> String {
        format!("BPF socket maps pinned at {}", self.pins().root().display())
    }

    fn explain(&self, query: &Query, _local_addresses: &[IpAddr]) -> Result<Option<Section>, String> {
        explain_at(&self.pins(), query)
    }

    /// Its section sits beside nftables mode's, whose tables this mode writes.
    fn builds_on_another_mode(&self) -> bool {
        true
    }
}

/// What the maps under `pins` do with `query`; `None` when nothing is pinned there.
pub fn explain_at(pins: &Pins, query: &Query) -> Result<Option<Section>, String> {
    if !pins.map(SERVICES).exists() {
        return Ok(None);
    }
    let services = open_pinned::<ServiceKey, ServiceValue>(pins, SERVICES).map_err(|e| e.to_string())?;
    let backends = open_pinned::<BackendKey, AddrPort>(pins, BACKENDS).map_err(|e| e.to_string())?;
    let mut section = Section {
        title: format!("socket programs (maps pinned at {})", pins.root().display()),
        family: query.family(),
        findings: Vec::new(),
    };
    let Some(key) = ServiceKey::new(query.ip, query.port, query.protocol) else {
        return Ok(Some(section));
    };
    let Ok(value) = services.get(&key, 0) else {
        return Ok(Some(section));
    };
    let count = u16::try_from(value.count).unwrap_or(u16::MAX);
    let mut endpoints = Vec::new();
    for slot in 0..value.count {
        let backend = backends
            .get(&BackendKey { id: value.id, slot }, 0)
            .map_err(|e| format!("endpoint set {} slot {slot}: {e}", value.id))?;
        endpoints.push(Endpoint {
            addr: backend.socket_addr(),
            weight: Weight::Slot {
                slot: u16::try_from(slot).unwrap_or(u16::MAX),
                count,
            },
            local: false,
        });
    }
    let mut decisions = vec![
        "a local socket's connect()/sendmsg() is given an endpoint's address: no NAT, no conntrack entry for it"
            .to_owned(),
    ];
    if value.affinity_seconds > 0 {
        decisions.push(format!(
            "ClientIP affinity per network namespace, {} s",
            value.affinity_seconds
        ));
    }
    if value.flags & FLAG_EXTERNAL != 0 {
        decisions.push(
            "external address: every usable endpoint in the cluster (pods and the node short-circuit)"
                .to_owned(),
        );
    }
    section.findings.push(Finding {
        destination: if value.flags & FLAG_EXTERNAL != 0 {
            "external address".to_owned()
        } else {
            "cluster IP".to_owned()
        },
        service: None,
        table_wide: false,
        outcome: Outcome::Forwarded,
        groups: vec![EndpointGroup {
            traffic: "local sockets".to_owned(),
            endpoints,
        }],
        decisions,
        objects: vec![
            format!("{SERVICES} -> endpoint set {}", value.id),
            BACKENDS.to_owned(),
        ],
    });
    Ok(Some(section))
}
