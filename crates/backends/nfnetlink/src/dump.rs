//! What the kernel reports about a table's objects, decoded from dump answers: the same
//! concepts as [`crate::objects`] plus what only the kernel knows (handles, use counts,
//! the raw key and data types).

use std::time::Duration;

use crate::attr::Malformed;
use crate::consts::*;
use crate::expr::{Expr, decode_list};
use crate::objects::{BaseChain, Chain, ChainType, Counter, Element, Hook, ObjectType, Policy, Set, Table};
use crate::wire::{body, decode_element};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    pub table: Table,
    pub flags: u32,
    pub handle: u64,
    /// How many chains, sets and objects it holds.
    pub use_count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInfo {
    pub table: Table,
    pub chain: Chain,
    pub handle: u64,
    /// How many rules jump or go to it.
    pub use_count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetInfo {
    pub table: Table,
    pub name: String,
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    /// Data type and length, for a map.
    pub data: Option<(u32, u32)>,
    pub timeout: Option<Duration>,
    /// Per-field lengths of a concatenated interval key.
    pub field_lengths: Vec<u32>,
    /// The size limit, when the set has one.
    pub size: Option<u32>,
    pub userdata: Vec<u8>,
    pub handle: u64,
}

impl SetInfo {
    /// Whether the kernel's set is the one `set` describes (name, key, data, flags,
    /// default timeout, user data, and the size limit when `set` has one).
    pub fn matches(&self, set: &Set) -> bool {
        self.name == set.name
            && self.key_type == set.key_type()
            && self.key_len == set.key_len()
            && self.data == set.data_type_len()
            && self.flags & !NFT_SET_CONSTANT == set.flags()
            && self.timeout == set.timeout
            && self.userdata == set.userdata
            && set.size.is_none_or(|size| self.size == Some(size))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    pub table: Table,
    pub chain: String,
    pub handle: u64,
    pub exprs: Vec<Expr>,
    pub userdata: Vec<u8>,
}

impl std::fmt::Display for RuleInfo {
    /// `chain [handle n]: expr; expr; ...`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [handle {}]:", self.chain, self.handle)?;
        for (index, expr) in self.exprs.iter().enumerate() {
            let sep = if index == 0 { " " } else { "; " };
            write!(f, "{sep}{expr}")?;
        }
        Ok(())
    }
}

/// A stateful object (`nft list counters`, ...) as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub table: Table,
    pub name: String,
    pub kind: ObjectType,
    pub handle: u64,
    /// How many rules (and set elements) refer to it.
    pub use_count: u32,
    /// A counter's numbers (`None` for other types).
    pub counter: Option<Counter>,
    pub userdata: Vec<u8>,
}

fn missing(what: &str) -> Malformed {
    Malformed(format!("a dump answer without {what}"))
}

pub(crate) fn table(payload: &[u8]) -> Result<TableInfo, Malformed> {
    let (family, attrs) = body(payload)?;
    let (mut name, mut flags, mut handle, mut use_count) = (None, 0, 0, 0);
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_TABLE_NAME => name = Some(attr.string()?),
            NFTA_TABLE_FLAGS => flags = attr.u32()?,
            NFTA_TABLE_HANDLE => handle = attr.u64()?,
            NFTA_TABLE_USE => use_count = attr.u32()?,
            _ => {}
        }
    }
    Ok(TableInfo {
        table: Table::new(family, name.ok_or_else(|| missing("a table name"))?),
        flags,
        handle,
        use_count,
    })
}

pub(crate) fn chain(payload: &[u8]) -> Result<ChainInfo, Malformed> {
    let (family, attrs) = body(payload)?;
    let (mut table, mut name, mut handle, mut use_count) = (None, None, 0, 0);
    let (mut hook, mut priority, mut chain_type, mut policy) = (None, 0i32, None, Policy::Accept);
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_CHAIN_TABLE => table = Some(attr.string()?),
            NFTA_CHAIN_NAME => name = Some(attr.string()?),
            NFTA_CHAIN_HANDLE => handle = attr.u64()?,
            NFTA_CHAIN_USE => use_count = attr.u32()?,
            NFTA_CHAIN_TYPE => chain_type = ChainType::from_name(&attr.string()?),
            NFTA_CHAIN_POLICY => {
                policy = if attr.u32()? as i32 == NF_DROP {
                    Policy::Drop
                } else {
                    Policy::Accept
                }
            }
            NFTA_CHAIN_HOOK => {
                for inner in attr.nested() {
                    let inner = inner?;
                    match inner.kind {
                        NFTA_HOOK_HOOKNUM => hook = Hook::from_number(inner.u32()?),
                        NFTA_HOOK_PRIORITY => priority = inner.u32()? as i32,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let base = match (hook, chain_type) {
        (Some(hook), Some(chain_type)) => Some(BaseChain {
            chain_type,
            hook,
            priority,
            policy,
        }),
        _ => None,
    };
    Ok(ChainInfo {
        table: Table::new(family, table.ok_or_else(|| missing("a table name"))?),
        chain: Chain {
            name: name.ok_or_else(|| missing("a chain name"))?,
            base,
        },
        handle,
        use_count,
    })
}

pub(crate) fn set(payload: &[u8]) -> Result<SetInfo, Malformed> {
    let (family, attrs) = body(payload)?;
    let mut info = SetInfo {
        table: Table::new(family, ""),
        name: String::new(),
        flags: 0,
        key_type: 0,
        key_len: 0,
        data: None,
        timeout: None,
        field_lengths: Vec::new(),
        size: None,
        userdata: Vec::new(),
        handle: 0,
    };
    let (mut data_type, mut data_len) = (None, 0);
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_SET_TABLE => info.table.name = attr.string()?,
            NFTA_SET_NAME => info.name = attr.string()?,
            NFTA_SET_FLAGS => info.flags = attr.u32()?,
            NFTA_SET_KEY_TYPE => info.key_type = attr.u32()?,
            NFTA_SET_KEY_LEN => info.key_len = attr.u32()?,
            NFTA_SET_DATA_TYPE => data_type = Some(attr.u32()?),
            NFTA_SET_DATA_LEN => data_len = attr.u32()?,
            NFTA_SET_TIMEOUT => info.timeout = Some(Duration::from_millis(attr.u64()?)),
            NFTA_SET_USERDATA => info.userdata = attr.value.to_vec(),
            NFTA_SET_HANDLE => info.handle = attr.u64()?,
            NFTA_SET_DESC => {
                for desc in attr.nested() {
                    let desc = desc?;
                    if desc.kind == NFTA_SET_DESC_SIZE {
                        info.size = Some(desc.u32()?);
                    }
                    if desc.kind != NFTA_SET_DESC_CONCAT {
                        continue;
                    }
                    for field in desc.nested() {
                        for len in field?.nested() {
                            let len = len?;
                            if len.kind == NFTA_SET_FIELD_LEN {
                                info.field_lengths.push(len.u32()?);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    if info.name.is_empty() || info.table.name.is_empty() {
        return Err(missing("a set or table name"));
    }
    info.data = data_type.map(|t| (t, if t == NFT_DATA_VERDICT { 0 } else { data_len }));
    if info.timeout == Some(Duration::ZERO) {
        info.timeout = None;
    }
    Ok(info)
}

/// The elements of one `NEWSETELEM` dump answer.
pub(crate) fn elements(payload: &[u8], into: &mut Vec<Element>) -> Result<(), Malformed> {
    let (_, attrs) = body(payload)?;
    for attr in attrs {
        let attr = attr?;
        if attr.kind != NFTA_SET_ELEM_LIST_ELEMENTS {
            continue;
        }
        for elem in attr.nested() {
            into.push(decode_element(elem?.nested())?);
        }
    }
    Ok(())
}

pub(crate) fn rule(payload: &[u8]) -> Result<RuleInfo, Malformed> {
    let (family, attrs) = body(payload)?;
    let (mut table, mut chain, mut handle) = (None, None, 0);
    let (mut exprs, mut userdata) = (Vec::new(), Vec::new());
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_RULE_TABLE => table = Some(attr.string()?),
            NFTA_RULE_CHAIN => chain = Some(attr.string()?),
            NFTA_RULE_HANDLE => handle = attr.u64()?,
            NFTA_RULE_EXPRESSIONS => exprs = decode_list(attr.nested())?,
            NFTA_RULE_USERDATA => userdata = attr.value.to_vec(),
            _ => {}
        }
    }
    Ok(RuleInfo {
        table: Table::new(family, table.ok_or_else(|| missing("a table name"))?),
        chain: chain.ok_or_else(|| missing("a chain name"))?,
        handle,
        exprs,
        userdata,
    })
}

pub(crate) fn object(payload: &[u8]) -> Result<ObjectInfo, Malformed> {
    let (family, attrs) = body(payload)?;
    let (mut table, mut name, mut kind) = (None, None, None);
    let (mut handle, mut use_count, mut data, mut userdata) = (0, 0, None, Vec::new());
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_OBJ_TABLE => table = Some(attr.string()?),
            NFTA_OBJ_NAME => name = Some(attr.string()?),
            NFTA_OBJ_TYPE => kind = Some(ObjectType(attr.u32()?)),
            NFTA_OBJ_HANDLE => handle = attr.u64()?,
            NFTA_OBJ_USE => use_count = attr.u32()?,
            NFTA_OBJ_DATA => data = Some(attr),
            NFTA_OBJ_USERDATA => userdata = attr.value.to_vec(),
            _ => {}
        }
    }
    let kind = kind.ok_or_else(|| missing("an object type"))?;
    let counter = match data {
        Some(data) if kind == ObjectType::COUNTER => {
            let mut counter = Counter::default();
            for attr in data.nested() {
                let attr = attr?;
                match attr.kind {
                    NFTA_COUNTER_BYTES => counter.bytes = attr.u64()?,
                    NFTA_COUNTER_PACKETS => counter.packets = attr.u64()?,
                    _ => {}
                }
            }
            Some(counter)
        }
        _ => None,
    };
    Ok(ObjectInfo {
        table: Table::new(family, table.ok_or_else(|| missing("a table name"))?),
        name: name.ok_or_else(|| missing("an object name"))?,
        kind,
        handle,
        use_count,
        counter,
        userdata,
    })
}
