//! The typed object model: set declarations, rules as small closed enums of matches and
//! statements, and set elements with typed keys and values.
//!
//! Nothing here is free-form text. Each variant corresponds to a fixed sequence of nf_tables
//! expressions (payload/meta/ct/fib loads, lookups, numgen, nat, dynset, immediate
//! verdicts), so a netlink transport can lower it one-to-one, and the text renderer
//! ([`crate::render`]) spells the same thing for `nft -f`. The only text that is not a
//! literal is an interface name of the local-traffic detector, a kpr-naming
//! [`InterfaceName`] (checked: no quotes, control characters or wildcards).

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kpr_model::Protocol;
use kpr_naming::InterfaceName;
use kpr_naming::text::Comment;

use crate::names::{ChainId, Choice, EndpointMap, RejectCounter, SetName};

/// A packet field or combination of fields used as a lookup key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// `daddr . l4proto . th dport`.
    DestProtoPort,
    /// `l4proto . th dport`.
    ProtoPort,
    /// `daddr . l4proto . th dport . saddr`.
    DestProtoPortSource,
    /// `saddr . daddr`.
    SourceDest,
    /// `saddr . <endpoint key of map> . slot k` (a constant slot, written as
    /// `numgen random mod 1 offset k`, which the map's `typeof` accepts).
    AffinityEntry { map: EndpointMap, slot: u16 },
}

/// A condition; a rule's conditions all hold for its statement to run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Match {
    /// `ct state new`.
    CtStateNew,
    /// `ct state invalid`.
    CtStateInvalid,
    /// `ct status dnat`.
    CtStatusDnat,
    /// `saddr [!=] <net>`.
    SourceNet { net: IpNet, negate: bool },
    /// `daddr != <net>` (loopback exclusion for NodePorts).
    DestNotNet(IpNet),
    /// `daddr <net>` (loopback NodePorts).
    DestNet(IpNet),
    /// `meta l4proto <proto>`.
    L4Proto(Protocol),
    /// `iifname [!=] <name>` (a prefix matches `<name>*`).
    InputInterface {
        name: InterfaceName,
        prefix: bool,
        negate: bool,
    },
    /// `fib saddr type local`: sent by this host.
    SourceIsLocal,
    /// `fib daddr type local`: addressed to this host.
    DestIsLocal,
    /// `daddr @set`.
    DestIn(SetName),
    /// `<key> [!=] @set`.
    Lookup { key: Key, set: SetName, negate: bool },
    /// `mark and <mask> == 0`.
    MarkClear(u32),
}

/// What a rule does once its conditions hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stmt {
    Jump(ChainId),
    Goto(ChainId),
    Return,
    Drop,
    /// ICMP port unreachable (TCP too), as upstream's `reject`.
    Reject,
    /// `counter name "<counter>" reject`: counted in the table's named counter, then
    /// rejected as [`Stmt::Reject`].
    CountReject(RejectCounter),
    /// `numgen random mod <n> vmap { i : goto <targets[i]> }`: the random pick of a
    /// sticky chain (an anonymous map inside a shared chain, so one per distinct count).
    RandomGoto(Vec<ChainId>),
    /// `mark set mark or <bits>`.
    MarkOr(u32),
    /// `mark set mark xor <bits>`.
    MarkXor(u32),
    /// `masquerade fully-random`.
    Masquerade,
    /// `dnat to <key of map> . <slot> map @<endpoint map of choice>`.
    DnatMap {
        choice: Choice,
        slot: Slot,
    },
    /// `update @affinity { <AffinityEntry key> timeout <T>s }`.
    RememberSlot {
        map: EndpointMap,
        slot: u16,
        timeout: u32,
    },
}

/// Which slot of an endpoint map a DNAT takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    /// `numgen random mod <count>`: uniform among `count` slots.
    Random(u16),
    /// A fixed slot (a sticky client's).
    Fixed(u16),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub matches: Vec<Match>,
    pub stmt: Stmt,
}

impl Rule {
    pub fn new(matches: Vec<Match>, stmt: Stmt) -> Self {
        Self { matches, stmt }
    }

    pub fn always(stmt: Stmt) -> Self {
        Self::new(Vec::new(), stmt)
    }
}

/// The key of one set element.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemKey {
    Addr(IpAddr),
    Net(IpNet),
    AddrProtoPort(IpAddr, Protocol, u16),
    ProtoPort(Protocol, u16),
    AddrProtoPortNet(IpAddr, Protocol, u16, IpNet),
    AddrPair(IpAddr, IpAddr),
    /// Endpoint maps keyed by address: `addr . port . slot`.
    AddrPortSlot(IpAddr, u16, u16),
    /// Endpoint maps keyed by port: `port . slot`.
    PortSlot(u16, u16),
}

/// The value of a map element. Only endpoint maps have values: entries are elements of
/// plain sets (one per target chain), so no element ever holds a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemValue {
    Endpoint(SocketAddr),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub set: SetName,
    pub key: ElemKey,
    pub value: Option<ElemValue>,
    /// `ns/svc:port` on the entry elements (one per destination of a Service port, never
    /// per endpoint), as upstream's nftables mode writes it: for people and tools reading
    /// the table (`nft list`, `kube-proxy-rs explain`). Checked by kpr-naming's text gate
    /// and cut to nft's limit ([`ELEMENT_COMMENT_MAX_BYTES`]).
    pub comment: Option<Comment>,
}

/// nft refuses comments longer than 128 bytes (libnftnl's `NFTNL_UDATA_COMMENT_MAXLEN`);
/// one less, so the comment and its NUL fit the 128 bytes kpr-nfnetlink's
/// `comment_userdata` takes.
pub const ELEMENT_COMMENT_MAX_BYTES: usize = 127;

/// The comment of an entry element for `text` (a Service port's name), cut to
/// [`ELEMENT_COMMENT_MAX_BYTES`] on a character boundary; `None` when kpr-naming refuses
/// the text (the element is written without a comment: it names nothing, it does not
/// decide anything).
pub fn element_comment(text: &str) -> Option<Comment> {
    let mut end = text.len().min(ELEMENT_COMMENT_MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Comment::new(text.get(..end)?).ok()
}

impl Element {
    pub fn new(set: SetName, key: ElemKey) -> Self {
        Self {
            set,
            key,
            value: None,
            comment: None,
        }
    }

    pub fn map(set: SetName, key: ElemKey, value: ElemValue) -> Self {
        Self {
            set,
            key,
            value: Some(value),
            comment: None,
        }
    }

    /// The element with `comment` (see [`Element::comment`]).
    pub fn with_comment(self, comment: Option<Comment>) -> Self {
        Self { comment, ..self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_comments_pass_the_text_gate_and_fit_nft() {
        assert_eq!(
            element_comment("default/web:http").map(|c| c.as_str().to_string()),
            Some("default/web:http".to_string())
        );
        let long = format!("{}/{}:{}", "n".repeat(63), "s".repeat(63), "p".repeat(15));
        let cut = element_comment(&long).unwrap();
        assert_eq!(cut.as_str().len(), ELEMENT_COMMENT_MAX_BYTES);
        assert!(long.starts_with(cut.as_str()));
        // Cut on a character boundary, never inside one.
        let wide = "é".repeat(100);
        assert_eq!(element_comment(&wide).unwrap().as_str().len(), 126);
        assert_eq!(element_comment("a\"b"), None);
        assert_eq!(element_comment("a\nb"), None);
        assert_eq!(element_comment(""), None);
    }
}
