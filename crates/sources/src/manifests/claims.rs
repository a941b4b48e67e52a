//! The API server's allocators, replayed over manifests: a nodePort (healthCheckNodePorts
//! included) and a cluster IP belong to one Service at a time.
//!
//! In a cluster the second Service asking for a taken nodePort is refused at `kubectl apply`;
//! manifests have no such moment, so the catalog settles claims each time the files change:
//!
//! - A Service that holds a claim (it is published with it) keeps it: a newer Service, or an
//!   edit of another Service, asking for the same port or IP is refused.
//! - Among Services asking for a free claim in the same scan, the older
//!   `metadata.creationTimestamp` wins (one without a timestamp counts as newest), then the
//!   path that sorts first, then the earlier document.
//! - A refused version falls back to the Service's last good (published) version when that
//!   one conflicts with nothing; otherwise the Service is absent until the conflict is gone.
//!
//! Settling runs in rounds: in each, Services take their turn in the order above, and a
//! claim not yet re-taken this round stays reserved for whoever held it after the previous
//! round (the published state, for the first). Rounds repeat until nothing changes, so a
//! port released by one edit is free for another edit of the same scan, and a loser takes
//! over as soon as the winner goes away. Every round's outcome is free of conflicts.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kpr_model::syntax::parse_ip_sloppy;
use kpr_model::{RejectReason, Rejection};

use super::object::ObjectKey;

/// Rounds after which settling stops even without a fixed point (every round's outcome is
/// consistent; more rounds only let more edits through).
const MAX_ROUNDS: usize = 8;

/// Something only one Service may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Claim {
    NodePort(u16),
    ClusterIp(IpAddr),
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodePort(port) => write!(f, "node port {port}"),
            Self::ClusterIp(ip) => write!(f, "cluster IP {ip}"),
        }
    }
}

/// A claim and the field that makes it.
type FieldClaim = (Claim, String);

/// The order in which Services asking for the same free claim are served.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rank {
    /// `(false, time)` sorts before `(true, None)`: a recorded creation time is older than none.
    created: (bool, Option<Time>),
    path: PathBuf,
    ordinal: usize,
}

impl Rank {
    pub(crate) fn new(service: &ServiceClaims, path: PathBuf, ordinal: usize) -> Self {
        let created = service.created.clone();
        Self {
            created: (created.is_none(), created),
            path,
            ordinal,
        }
    }
}

/// What settling needs of one version of a Service, taken when its document is read so
/// that the catalog need not keep the Service itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceClaims {
    created: Option<Time>,
    claims: Vec<FieldClaim>,
}

impl ServiceClaims {
    pub(crate) fn of(service: &Service) -> Self {
        Self {
            created: service.metadata.creation_timestamp.clone(),
            claims: claims(service),
        }
    }
}

/// The version of a contender that consumers have now.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Published<'a> {
    Nothing,
    /// The candidate itself (same content).
    Candidate,
    Other(&'a ServiceClaims),
}

/// One Service in the running for its claims.
pub(crate) struct Contender<'a> {
    pub(crate) key: &'a ObjectKey,
    /// The newest valid version.
    pub(crate) candidate: &'a ServiceClaims,
    pub(crate) published: Published<'a>,
    pub(crate) rank: Rank,
}

/// Which version of a contender is programmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Candidate,
    /// The candidate conflicts; the published version stays.
    Published(Rejection),
    /// Both conflict (or nothing was published): the Service is absent.
    Absent(Rejection),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Candidate,
    Published,
    Absent,
}

/// The claims of each version of one contender.
struct Versions {
    candidate: Vec<FieldClaim>,
    /// `None` when nothing is published, or the published version is the candidate itself.
    published: Option<Vec<FieldClaim>>,
}

impl Versions {
    fn of(&self, choice: Choice) -> &[FieldClaim] {
        match choice {
            Choice::Candidate => &self.candidate,
            Choice::Published => self.published.as_deref().unwrap_or_default(),
            Choice::Absent => &[],
        }
    }
}

/// Which version each contender gets (in `contenders`' order).
pub(crate) fn settle(contenders: &[Contender<'_>]) -> Vec<Outcome> {
    let versions: Vec<Versions> = contenders.iter().map(versions).collect();
    let mut order: Vec<usize> = (0..contenders.len()).collect();
    order.sort_by(|a, b| contenders[*a].rank.cmp(&contenders[*b].rank));
    // Before the first round, claims are held as published.
    let mut choices: Vec<Choice> = contenders
        .iter()
        .zip(&versions)
        .map(
            |(contender, versions)| match (contender.published, &versions.published) {
                (Published::Nothing, _) => Choice::Absent,
                (_, None) => Choice::Candidate,
                (_, Some(_)) => Choice::Published,
            },
        )
        .collect();
    let mut conflicts = vec![None; contenders.len()];
    for _ in 0..MAX_ROUNDS {
        let (next, found) = round(&order, &versions, &choices);
        let settled = next == choices;
        choices = next;
        conflicts = found;
        if settled {
            break;
        }
    }
    contenders
        .iter()
        .enumerate()
        .map(|(i, contender)| outcome(contender, choices[i], conflicts[i].as_ref(), contenders))
        .collect()
}

/// The first conflict of a contender's candidate: its field, the claim, who holds it.
type Conflict = (String, Claim, usize);

/// One round: each contender in turn takes its candidate, else its published version, else
/// nothing, given what earlier turns took and what later ones still hold from `previous`.
fn round(
    order: &[usize],
    versions: &[Versions],
    previous: &[Choice],
) -> (Vec<Choice>, Vec<Option<Conflict>>) {
    let mut holders: HashMap<Claim, usize> = HashMap::new();
    for (i, choice) in previous.iter().enumerate() {
        for (claim, _) in versions[i].of(*choice) {
            holders.insert(*claim, i);
        }
    }
    let mut choices = vec![Choice::Absent; previous.len()];
    let mut conflicts = vec![None; previous.len()];
    for &i in order {
        // This turn replaces what `i` held from the previous round.
        for (claim, _) in versions[i].of(previous[i]) {
            if holders.get(claim) == Some(&i) {
                holders.remove(claim);
            }
        }
        let blocked = |claims: &[FieldClaim]| {
            claims.iter().find_map(|(claim, field)| {
                let holder = *holders.get(claim)?;
                (holder != i).then(|| (field.clone(), *claim, holder))
            })
        };
        conflicts[i] = blocked(&versions[i].candidate);
        choices[i] = match (&conflicts[i], &versions[i].published) {
            (None, _) => Choice::Candidate,
            (Some(_), Some(published)) if blocked(published).is_none() => Choice::Published,
            (Some(_), _) => Choice::Absent,
        };
        for (claim, _) in versions[i].of(choices[i]) {
            holders.insert(*claim, i);
        }
    }
    (choices, conflicts)
}

fn versions(contender: &Contender<'_>) -> Versions {
    let published = match contender.published {
        Published::Other(published) => Some(published.claims.clone()),
        Published::Nothing | Published::Candidate => None,
    };
    Versions {
        candidate: contender.candidate.claims.clone(),
        published,
    }
}

fn outcome(
    contender: &Contender<'_>,
    choice: Choice,
    conflict: Option<&Conflict>,
    contenders: &[Contender<'_>],
) -> Outcome {
    let Some((field, claim, holder)) = conflict else {
        return Outcome::Candidate;
    };
    let rejection = |consequence: &str| {
        Rejection::new(
            contender.key.kind,
            contender.key.display_name(),
            field.as_str(),
            RejectReason::Conflict,
            format!(
                "{claim} is already used by Service {}; {consequence}",
                contenders[*holder].key.display_name()
            ),
        )
    };
    match choice {
        Choice::Published => Outcome::Published(rejection("keeping this Service's last good version")),
        Choice::Candidate | Choice::Absent => Outcome::Absent(rejection("this Service is not programmed")),
    }
}

/// What a (valid) Service claims: its nodePorts and healthCheckNodePort, and its cluster IPs
/// unless headless. Unparseable values were rejected by validation; they claim nothing.
fn claims(service: &Service) -> Vec<FieldClaim> {
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let has_node_ports = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    for (i, port) in spec.ports.iter().flatten().enumerate() {
        let node_port = port
            .node_port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0);
        if let Some(node_port) = node_port.filter(|_| has_node_ports) {
            out.push((Claim::NodePort(node_port), format!("spec.ports[{i}].nodePort")));
        }
    }
    let health = spec
        .health_check_node_port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0);
    if let Some(port) = health {
        out.push((Claim::NodePort(port), "spec.healthCheckNodePort".to_owned()));
    }
    let listed: Vec<(String, &str)> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str()))
            .collect(),
        (_, Some(ip)) => vec![("spec.clusterIP".to_owned(), ip.as_str())],
        _ => Vec::new(),
    };
    for (field, raw) in listed {
        if let Some(ip) = parse_ip_sloppy(raw) {
            out.push((Claim::ClusterIp(ip), field));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(
        name: &str,
        created: Option<&str>,
        node_ports: &[u16],
        cluster_ip: &str,
    ) -> (ObjectKey, ServiceClaims) {
        let ports: Vec<serde_json::Value> = node_ports
            .iter()
            .enumerate()
            .map(|(i, p)| serde_json::json!({"name": format!("p{i}"), "port": 80 + i, "nodePort": p}))
            .collect();
        let mut metadata = serde_json::json!({"name": name, "namespace": "default"});
        if let Some(created) = created {
            metadata["creationTimestamp"] = created.into();
        }
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": metadata,
            "spec": {"type": "NodePort", "clusterIP": cluster_ip, "ports": ports}
        }))
        .unwrap();
        (
            ObjectKey::new(kpr_model::ObjectKind::Service, "default", name),
            ServiceClaims::of(&service),
        )
    }

    /// `published` is the candidate itself when it is the very same version.
    fn contender<'a>(
        entry: &'a (ObjectKey, ServiceClaims),
        published: Option<&'a ServiceClaims>,
        ordinal: usize,
    ) -> Contender<'a> {
        let published = match published {
            None => Published::Nothing,
            Some(published) if std::ptr::eq(published, &entry.1) => Published::Candidate,
            Some(published) => Published::Other(published),
        };
        Contender {
            key: &entry.0,
            candidate: &entry.1,
            published,
            rank: Rank::new(&entry.1, "/m/a.yaml".into(), ordinal),
        }
    }

    fn summary(outcomes: &[Outcome]) -> Vec<String> {
        outcomes
            .iter()
            .map(|o| match o {
                Outcome::Candidate => "candidate".to_owned(),
                Outcome::Published(r) => format!("published: {} {}", r.field, r.detail),
                Outcome::Absent(r) => format!("absent: {} {}", r.field, r.detail),
            })
            .collect()
    }

    #[test]
    fn the_older_creation_timestamp_wins_then_document_order() {
        let a = service("a", Some("2025-01-02T00:00:00Z"), &[30080], "10.0.0.1");
        let b = service("b", Some("2025-01-01T00:00:00Z"), &[30080], "10.0.0.2");
        let c = service("c", None, &[30080], "10.0.0.3");
        let outcomes = settle(&[
            contender(&a, None, 0),
            contender(&b, None, 1),
            contender(&c, None, 2),
        ]);
        assert_eq!(
            summary(&outcomes),
            [
                "absent: spec.ports[0].nodePort node port 30080 is already used by Service default/b; this Service is not programmed",
                "candidate",
                "absent: spec.ports[0].nodePort node port 30080 is already used by Service default/b; this Service is not programmed",
            ]
        );
        let d = service("d", None, &[], "10.0.0.3");
        let outcomes = settle(&[contender(&c, None, 5), contender(&d, None, 4)]);
        assert_eq!(
            summary(&outcomes)[0],
            "absent: spec.clusterIP cluster IP 10.0.0.3 is already used by Service default/d; this Service is not programmed"
        );
    }

    #[test]
    fn a_published_holder_keeps_its_claim_against_an_older_edit() {
        let a_old = service("a", Some("2020-01-01T00:00:00Z"), &[30080], "10.0.0.1");
        let a_new = service("a", Some("2020-01-01T00:00:00Z"), &[30081], "10.0.0.1");
        let b = service("b", Some("2025-01-01T00:00:00Z"), &[30081], "10.0.0.2");
        let outcomes = settle(&[contender(&a_new, Some(&a_old.1), 0), contender(&b, Some(&b.1), 1)]);
        assert_eq!(
            summary(&outcomes),
            [
                "published: spec.ports[0].nodePort node port 30081 is already used by Service default/b; keeping this Service's last good version",
                "candidate",
            ]
        );
    }

    #[test]
    fn a_port_released_in_the_same_scan_goes_to_whoever_asks() {
        let a_old = service("a", None, &[30080], "10.0.0.1");
        let a_new = service("a", None, &[30081], "10.0.0.1");
        let b_old = service("b", None, &[30081], "10.0.0.2");
        let b_new = service("b", None, &[30082], "10.0.0.2");
        let outcomes = settle(&[
            contender(&a_new, Some(&a_old.1), 0),
            contender(&b_new, Some(&b_old.1), 1),
        ]);
        assert_eq!(summary(&outcomes), ["candidate", "candidate"]);
    }

    #[test]
    fn when_the_winner_goes_away_the_loser_takes_over() {
        let a = service("a", None, &[30080], "10.0.0.1");
        let b = service("b", None, &[30080], "10.0.0.2");
        let both = settle(&[contender(&a, Some(&a.1), 0), contender(&b, None, 1)]);
        assert!(matches!(both[1], Outcome::Absent(_)), "{both:?}");
        assert_eq!(settle(&[contender(&b, None, 1)]), [Outcome::Candidate]);
    }

    #[test]
    fn an_unchanged_published_service_is_not_displaced_by_an_older_newcomer() {
        let holder = service("holder", Some("2025-06-01T00:00:00Z"), &[30080], "10.0.0.1");
        let older = service("older", Some("2020-01-01T00:00:00Z"), &[30080], "10.0.0.2");
        let outcomes = settle(&[contender(&holder, Some(&holder.1), 1), contender(&older, None, 0)]);
        assert_eq!(outcomes[0], Outcome::Candidate);
        assert!(
            matches!(&outcomes[1], Outcome::Absent(r) if r.detail.contains("default/holder")),
            "{outcomes:?}"
        );
    }

    #[test]
    fn a_service_may_reuse_its_own_claims_and_unrelated_ones_never_conflict() {
        let a = service("a", None, &[30080, 30081], "10.0.0.1");
        let b = service("b", None, &[30082], "10.0.0.2");
        let outcomes = settle(&[contender(&a, Some(&a.1), 0), contender(&b, None, 1)]);
        assert_eq!(summary(&outcomes), ["candidate", "candidate"]);
    }

    #[test]
    fn leading_zero_cluster_ips_claim_the_same_address() {
        let a = service("a", None, &[], "10.0.0.1");
        let b = service("b", None, &[], "10.0.0.001");
        let outcomes = settle(&[contender(&a, None, 0), contender(&b, None, 1)]);
        assert!(matches!(outcomes[1], Outcome::Absent(_)), "{outcomes:?}");
    }
}
