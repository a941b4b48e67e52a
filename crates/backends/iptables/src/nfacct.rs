//! The nfacct counters upstream's iptables mode counts in (`-m nfacct --nfacct-name ...`)
//! and their netlink I/O (nfnetlink_acct, `NFNL_SUBSYS_ACCT`), as upstream's
//! `pkg/proxy/util/nfacct` does it.
//!
//! At start-up each counter is looked up and created if missing ([`ensure_counters`]);
//! only counters that exist are matched in rules (iptables refuses `-m nfacct` on a
//! counter the kernel does not know), so a kernel without nfacct gets upstream's rules
//! without the matches, and the metrics have no samples. Counters are never deleted: a
//! rule may still match them, and upstream leaves them too.
//!
//! The messages are built and read here byte by byte (tests pin the bytes): the
//! rust-netlink crates have no nfacct messages, and the format is four attributes.

use kpr_netlink::{Channel, ENOENT, NETLINK_NETFILTER, NetlinkError};
use netlink_packet_core::{DefaultNla, Emitable, NlasIterator};

/// Upstream's counter of packets the ctstate INVALID rule drops.
pub const CT_STATE_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// Upstream's counter of packets accepted for NodePorts on 127.0.0.0/8.
pub const LOCALHOST_NODEPORTS_ACCEPTED: &str = "localhost_nps_accepted_pkts";

/// `NFNL_SUBSYS_ACCT`.
const SUBSYS_ACCT: u16 = 7;
/// `NFNL_MSG_ACCT_NEW` (also the type of the kernel's answers) and `NFNL_MSG_ACCT_GET`.
const MSG_NEW: u16 = 0;
const MSG_GET: u16 = 1;
/// `NFACCT_NAME`, `NFACCT_PKTS`, `NFACCT_BYTES`.
const ATTR_NAME: u16 = 1;
const ATTR_PACKETS: u16 = 2;
const ATTR_BYTES: u16 = 3;
/// `NFACCT_NAME_MAX` (32) less the terminating NUL.
const NAME_MAX: usize = 31;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
/// `EBUSY`: NFNL_MSG_ACCT_NEW for a name that exists (someone created it meanwhile).
const EBUSY: i32 = 16;

/// Which of upstream's counters exist, so the rules may match them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfacctCounters {
    pub ct_state_invalid_dropped: bool,
    pub localhost_nodeports_accepted: bool,
}

impl NfacctCounters {
    /// Both counters (rendering and golden tests).
    pub const ALL: Self = Self {
        ct_state_invalid_dropped: true,
        localhost_nodeports_accepted: true,
    };
}

/// A counter as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    pub name: String,
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum NfacctError {
    #[error("nfacct counter {name:?}: {source}")]
    Netlink {
        name: String,
        #[source]
        source: NetlinkError,
    },
    #[error("nfacct counter {name:?}: unreadable answer: {reason}")]
    Unreadable { name: String, reason: String },
    #[error("nfacct counter {name:?}: names are 1 to {NAME_MAX} bytes without NUL")]
    BadName { name: String },
}

/// Reads and creates nfacct counters.
pub trait Accounting {
    /// The counter, or `None` when the kernel has none of that name.
    fn get(&self, name: &str) -> Result<Option<Counter>, NfacctError>;
    /// Creates the counter (at 0).
    fn create(&self, name: &str) -> Result<(), NfacctError>;
}

/// The kernel's counters in the calling thread's network namespace; every call opens its
/// own socket.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetlinkAccounting;

impl Accounting for NetlinkAccounting {
    fn get(&self, name: &str) -> Result<Option<Counter>, NfacctError> {
        check_name(name)?;
        let netlink = |source| NfacctError::Netlink {
            name: name.to_string(),
            source,
        };
        let mut channel = Channel::open(NETLINK_NETFILTER).map_err(netlink)?;
        let answers = match channel.request(|seq| get_request(name, seq)) {
            Err(NetlinkError::Kernel { errno: ENOENT }) => return Ok(None),
            other => other.map_err(netlink)?,
        };
        let Some(answer) = answers.first() else {
            return Err(NfacctError::Unreadable {
                name: name.to_string(),
                reason: "acknowledged without the counter".to_string(),
            });
        };
        parse_counter(answer.payload())
            .map(Some)
            .map_err(|reason| NfacctError::Unreadable {
                name: name.to_string(),
                reason,
            })
    }

    fn create(&self, name: &str) -> Result<(), NfacctError> {
        check_name(name)?;
        let netlink = |source| NfacctError::Netlink {
            name: name.to_string(),
            source,
        };
        let mut channel = Channel::open(NETLINK_NETFILTER).map_err(netlink)?;
        match channel.request(|seq| new_request(name, seq)) {
            Ok(_) | Err(NetlinkError::Kernel { errno: EBUSY }) => Ok(()),
            Err(source) => Err(netlink(source)),
        }
    }
}

fn check_name(name: &str) -> Result<(), NfacctError> {
    if name.is_empty() || name.len() > NAME_MAX || name.contains('\0') {
        return Err(NfacctError::BadName {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Looks up each of upstream's counters and creates the missing ones, as upstream's
/// proxier does at start-up. A counter that cannot be made is logged (its rule is then
/// written without the match, and its metric has no samples); the rest go on.
pub fn ensure_counters(accounting: &dyn Accounting) -> NfacctCounters {
    let ensure = |name: &str| match accounting.get(name) {
        Ok(Some(_)) => true,
        Ok(None) => match accounting.create(name) {
            Ok(()) => {
                tracing::info!(counter = name, "created nfacct counter");
                true
            }
            Err(error) => {
                tracing::error!(%error, "cannot create nfacct counter; its metric will not be updated");
                false
            }
        },
        Err(error) => {
            tracing::error!(%error, "nfacct is not usable; its metric will not be updated");
            false
        }
    };
    NfacctCounters {
        ct_state_invalid_dropped: ensure(CT_STATE_INVALID_DROPPED),
        localhost_nodeports_accepted: ensure(LOCALHOST_NODEPORTS_ACCEPTED),
    }
}

/// `struct nfgenmsg`: family AF_UNSPEC (as the nfacct tool sends it), version 0, res_id 0.
const NFGENMSG: [u8; 4] = [0, 0, 0, 0];

fn request(message: u16, flags: u16, name: &str, sequence: u32) -> Vec<u8> {
    let mut value = name.as_bytes().to_vec();
    value.push(0);
    let attribute = DefaultNla::new(ATTR_NAME, value);
    let mut payload = NFGENMSG.to_vec();
    let start = payload.len();
    payload.resize(start + attribute.buffer_len(), 0);
    attribute.emit(&mut payload[start..]);
    kpr_netlink::message((SUBSYS_ACCT << 8) | message, flags, sequence, &payload)
}

/// `NFNL_MSG_ACCT_GET` for one counter, acknowledged.
pub fn get_request(name: &str, sequence: u32) -> Vec<u8> {
    request(MSG_GET, NLM_F_REQUEST | NLM_F_ACK, name, sequence)
}

/// `NFNL_MSG_ACCT_NEW` creating one counter, acknowledged (upstream's flags).
pub fn new_request(name: &str, sequence: u32) -> Vec<u8> {
    request(MSG_NEW, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK, name, sequence)
}

/// The counter in an answer's payload (nfgenmsg, then attributes); packets and bytes are
/// big-endian. Every field must be present.
pub fn parse_counter(payload: &[u8]) -> Result<Counter, String> {
    let attributes = payload
        .get(NFGENMSG.len()..)
        .ok_or_else(|| format!("{} bytes, no nfgenmsg", payload.len()))?;
    let (mut name, mut packets, mut bytes) = (None, None, None);
    for attribute in NlasIterator::new(attributes) {
        let attribute = attribute.map_err(|e| e.to_string())?;
        let value = attribute.value();
        match attribute.kind() {
            ATTR_NAME => {
                let text = value.split(|b| *b == 0).next().unwrap_or_default();
                name = Some(String::from_utf8_lossy(text).into_owned());
            }
            ATTR_PACKETS => packets = Some(be_u64(value)?),
            ATTR_BYTES => bytes = Some(be_u64(value)?),
            _ => {}
        }
    }
    match (name, packets, bytes) {
        (Some(name), Some(packets), Some(bytes)) => Ok(Counter { name, packets, bytes }),
        _ => Err("name, packets or bytes missing".to_string()),
    }
}

fn be_u64(value: &[u8]) -> Result<u64, String> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| format!("a {}-byte counter", value.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    fn header(length: u32, message_type: u16, flags: u16, sequence: u32) -> Vec<u8> {
        let mut bytes = length.to_ne_bytes().to_vec();
        bytes.extend(message_type.to_ne_bytes());
        bytes.extend(flags.to_ne_bytes());
        bytes.extend(sequence.to_ne_bytes());
        bytes.extend([0; 4]);
        bytes
    }

    /// The bytes libnetfilter_acct and upstream send: nlmsghdr, nfgenmsg, NFACCT_NAME.
    #[test]
    fn get_request_is_byte_exact() {
        // "ct_state_invalid_dropped_pkts" + NUL = 30 bytes: attribute length 34, padded to
        // 36 in the message (as libmnl counts it).
        let mut expected = header(16 + 4 + 36, 0x0701, 0x0005, 7);
        expected.extend([0, 0, 0, 0]);
        expected.extend(34u16.to_ne_bytes());
        expected.extend(1u16.to_ne_bytes());
        expected.extend(b"ct_state_invalid_dropped_pkts\0");
        expected.extend([0, 0]);
        assert_eq!(get_request(CT_STATE_INVALID_DROPPED, 7), expected);
    }

    #[test]
    fn new_request_is_byte_exact() {
        // "localhost_nps_accepted_pkts" + NUL = 28 bytes; attribute 32.
        let mut expected = header(16 + 4 + 32, 0x0700, 0x0405, 9);
        expected.extend([0, 0, 0, 0]);
        expected.extend(32u16.to_ne_bytes());
        expected.extend(1u16.to_ne_bytes());
        expected.extend(b"localhost_nps_accepted_pkts\0");
        assert_eq!(new_request(LOCALHOST_NODEPORTS_ACCEPTED, 9), expected);
    }

    /// An answer as the kernel writes it (nfnl_acct_fill_info): name, packets, bytes,
    /// use count; unknown attributes are skipped.
    #[test]
    fn parses_the_kernels_answer() {
        let mut payload = vec![0, 0, 0, 0];
        payload.extend(17u16.to_ne_bytes());
        payload.extend(1u16.to_ne_bytes());
        payload.extend(b"dummy-metric\0");
        payload.extend([0, 0, 0]);
        for (kind, value) in [(2u16, 123u64), (3, 54321)] {
            payload.extend(12u16.to_ne_bytes());
            payload.extend(kind.to_ne_bytes());
            payload.extend(value.to_be_bytes());
        }
        payload.extend(8u16.to_ne_bytes());
        payload.extend(4u16.to_ne_bytes());
        payload.extend(1u32.to_be_bytes());
        assert_eq!(
            parse_counter(&payload).unwrap(),
            Counter {
                name: "dummy-metric".into(),
                packets: 123,
                bytes: 54321
            }
        );
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        assert!(parse_counter(&[0, 0]).is_err());
        assert!(parse_counter(&[0, 0, 0, 0]).is_err(), "fields missing");
        let mut short = vec![0, 0, 0, 0];
        short.extend(8u16.to_ne_bytes());
        short.extend(2u16.to_ne_bytes());
        short.extend(1u32.to_be_bytes());
        assert!(parse_counter(&short).is_err(), "a 4-byte packet count");
        let mut cut = vec![0, 0, 0, 0];
        cut.extend(40u16.to_ne_bytes());
        cut.extend(1u16.to_ne_bytes());
        assert!(
            parse_counter(&cut).is_err(),
            "an attribute longer than the message"
        );
    }

    #[test]
    fn names_are_checked_before_anything_is_sent() {
        for name in ["", "a\0b", &"x".repeat(32)] {
            assert!(matches!(
                NetlinkAccounting.get(name),
                Err(NfacctError::BadName { .. })
            ));
        }
    }

    /// Counters in memory; `broken` makes every call fail as on a kernel without nfacct.
    #[derive(Default)]
    struct Memory {
        counters: RefCell<BTreeMap<String, u64>>,
        broken: bool,
    }

    impl Accounting for Memory {
        fn get(&self, name: &str) -> Result<Option<Counter>, NfacctError> {
            if self.broken {
                return Err(NfacctError::Netlink {
                    name: name.into(),
                    source: NetlinkError::Kernel { errno: 95 },
                });
            }
            Ok(self.counters.borrow().get(name).map(|&packets| Counter {
                name: name.into(),
                packets,
                bytes: 0,
            }))
        }

        fn create(&self, name: &str) -> Result<(), NfacctError> {
            self.counters.borrow_mut().insert(name.into(), 0);
            Ok(())
        }
    }

    #[test]
    fn ensure_creates_what_is_missing_and_keeps_what_exists() {
        let memory = Memory::default();
        memory
            .counters
            .borrow_mut()
            .insert(CT_STATE_INVALID_DROPPED.into(), 5);
        assert_eq!(ensure_counters(&memory), NfacctCounters::ALL);
        let counters = memory.counters.borrow();
        assert_eq!(
            counters[CT_STATE_INVALID_DROPPED], 5,
            "an existing counter is not reset"
        );
        assert_eq!(counters[LOCALHOST_NODEPORTS_ACCEPTED], 0);
    }

    #[test]
    fn without_nfacct_no_rule_matches_a_counter() {
        let memory = Memory {
            broken: true,
            ..Memory::default()
        };
        assert_eq!(ensure_counters(&memory), NfacctCounters::default());
    }
}
