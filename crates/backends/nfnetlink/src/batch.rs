//! A batch: nf_tables changes encoded into netlink messages, ready to be sent as one
//! transaction (or split into several). Building a batch touches no socket.
//!
//! Each change remembers an [`Operation`] describing it, so an error from the kernel,
//! which names a message by its sequence number, can say which change failed. Element
//! lists are cut into messages whose element list stays under the 64 KiB an attribute
//! can hold; a batch never has one huge message, only many bounded ones.

use crate::attr::Writer;
use crate::consts::*;
use crate::expr::{Expr, encode_list};
use crate::objects::{Chain, Counter, Element, ObjectType, Policy, Set, Table};
use crate::wire::{encode_element, finish, nft_type, start};

/// The most bytes one message's element list may take: an attribute's length is a u16.
const ELEMENT_LIST_LIMIT: usize = 60 * 1024;

/// The name an anonymous map is created under: the kernel replaces `%d` with a number
/// (`__map0`), and rules refer to it by the id given at creation.
pub(crate) const ANONYMOUS_MAP_NAME: &str = "__map%d";

/// What one message of a batch does, for error reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    AddTable(Table),
    DeleteTable(Table),
    DestroyTable(Table),
    AddChain {
        table: Table,
        chain: String,
    },
    DeleteChain {
        table: Table,
        chain: String,
    },
    FlushChain {
        table: Table,
        chain: String,
    },
    FlushRules(Table),
    AddSet {
        table: Table,
        set: String,
    },
    DeleteSet {
        table: Table,
        set: String,
    },
    DeleteChainByHandle {
        table: Table,
        handle: u64,
    },
    DeleteSetByHandle {
        table: Table,
        handle: u64,
    },
    FlushSet {
        table: Table,
        set: String,
    },
    AddElements {
        table: Table,
        set: String,
        count: usize,
    },
    DeleteElements {
        table: Table,
        set: String,
        count: usize,
    },
    DestroyElements {
        table: Table,
        set: String,
        count: usize,
    },
    AddRule {
        table: Table,
        chain: String,
    },
    ReplaceRule {
        table: Table,
        chain: String,
        handle: u64,
    },
    DeleteRule {
        table: Table,
        chain: String,
        handle: u64,
    },
    AddObject {
        table: Table,
        kind: ObjectType,
        name: String,
    },
    DeleteObject {
        table: Table,
        kind: ObjectType,
        name: String,
    },
    DeleteObjectByHandle {
        table: Table,
        kind: ObjectType,
        handle: u64,
    },
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AddTable(t) => write!(f, "add table {t}"),
            Self::DeleteTable(t) => write!(f, "delete table {t}"),
            Self::DestroyTable(t) => write!(f, "destroy table {t}"),
            Self::AddChain { table, chain } => write!(f, "add chain {table} {chain}"),
            Self::DeleteChain { table, chain } => write!(f, "delete chain {table} {chain}"),
            Self::FlushChain { table, chain } => write!(f, "flush chain {table} {chain}"),
            Self::FlushRules(t) => write!(f, "flush the rules of table {t}"),
            Self::AddSet { table, set } => write!(f, "add set {table} {set}"),
            Self::DeleteSet { table, set } => write!(f, "delete set {table} {set}"),
            Self::DeleteChainByHandle { table, handle } => {
                write!(f, "delete chain {table} handle {handle}")
            }
            Self::DeleteSetByHandle { table, handle } => write!(f, "delete set {table} handle {handle}"),
            Self::FlushSet { table, set } => write!(f, "flush set {table} {set}"),
            Self::AddElements { table, set, count } => {
                write!(f, "add {count} element(s) to set {table} {set}")
            }
            Self::DeleteElements { table, set, count } => {
                write!(f, "delete {count} element(s) from set {table} {set}")
            }
            Self::DestroyElements { table, set, count } => {
                write!(f, "destroy {count} element(s) of set {table} {set}")
            }
            Self::AddRule { table, chain } => write!(f, "add a rule to chain {table} {chain}"),
            Self::ReplaceRule { table, chain, handle } => {
                write!(f, "replace rule handle {handle} of chain {table} {chain}")
            }
            Self::DeleteRule { table, chain, handle } => {
                write!(f, "delete rule handle {handle} of chain {table} {chain}")
            }
            Self::AddObject { table, kind, name } => write!(f, "add {kind} {table} {name}"),
            Self::DeleteObject { table, kind, name } => write!(f, "delete {kind} {table} {name}"),
            Self::DeleteObjectByHandle { table, kind, handle } => {
                write!(f, "delete {kind} {table} handle {handle}")
            }
        }
    }
}

/// One message of a batch: where it starts in the buffer and what it does.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub(crate) start: usize,
    pub(crate) operation: Operation,
}

/// nf_tables changes, in order, to be applied atomically by [`crate::Socket::send`].
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub(crate) buf: Vec<u8>,
    pub(crate) messages: Vec<Message>,
    /// The first message with a name the kernel would misread or refuse, and why: such a
    /// batch is never sent.
    pub(crate) invalid: Option<(Operation, String)>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of messages (not counting the batch's begin and end markers).
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// Encoded size in bytes (not counting the begin and end markers).
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// What each message does, in order.
    pub fn operations(&self) -> impl Iterator<Item = &Operation> {
        self.messages.iter().map(|m| &m.operation)
    }

    /// The end of message `index` in the buffer.
    pub(crate) fn message_end(&self, index: usize) -> usize {
        self.messages
            .get(index + 1)
            .map_or(self.buf.len(), |next| next.start)
    }

    fn message(
        &mut self,
        message: u16,
        flags: u16,
        table: &Table,
        operation: Operation,
        attrs: impl FnOnce(&mut Writer<'_>),
    ) {
        let at = start(&mut self.buf, nft_type(message), flags, table.family.number(), 0);
        let mut w = Writer::new(&mut self.buf);
        attrs(&mut w);
        let invalid = w.invalid().map(str::to_owned);
        finish(&mut self.buf, at);
        self.note_invalid(&operation, invalid);
        self.messages.push(Message { start: at, operation });
    }

    fn note_invalid(&mut self, operation: &Operation, problem: Option<String>) {
        if self.invalid.is_none() {
            self.invalid = problem.map(|problem| (operation.clone(), problem));
        }
    }

    /// Creates `table` (no error if it exists).
    pub fn add_table(&mut self, table: &Table) {
        self.add_table_with_userdata(table, &[]);
    }

    /// Like [`Batch::add_table`], with opaque user data (nft keeps a table's comment there:
    /// [`crate::comment_userdata`]).
    pub fn add_table_with_userdata(&mut self, table: &Table, userdata: &[u8]) {
        self.message(
            NFT_MSG_NEWTABLE,
            NLM_F_CREATE,
            table,
            Operation::AddTable(table.clone()),
            |w| {
                w.string(NFTA_TABLE_NAME, &table.name);
                w.u32(NFTA_TABLE_FLAGS, 0);
                if !userdata.is_empty() {
                    w.bytes(NFTA_TABLE_USERDATA, userdata);
                }
            },
        );
    }

    /// Deletes `table` and everything in it; an error if it does not exist.
    pub fn delete_table(&mut self, table: &Table) {
        self.message(
            NFT_MSG_DELTABLE,
            0,
            table,
            Operation::DeleteTable(table.clone()),
            |w| w.string(NFTA_TABLE_NAME, &table.name),
        );
    }

    /// Deletes `table` and everything in it if it exists (Linux 6.3+).
    pub fn destroy_table(&mut self, table: &Table) {
        self.message(
            NFT_MSG_DESTROYTABLE,
            0,
            table,
            Operation::DestroyTable(table.clone()),
            |w| w.string(NFTA_TABLE_NAME, &table.name),
        );
    }

    /// Creates `chain` in `table` (no error if it exists with the same hook).
    pub fn add_chain(&mut self, table: &Table, chain: &Chain) {
        let operation = Operation::AddChain {
            table: table.clone(),
            chain: chain.name.clone(),
        };
        self.message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, table, operation, |w| {
            w.string(NFTA_CHAIN_TABLE, &table.name);
            w.string(NFTA_CHAIN_NAME, &chain.name);
            if let Some(base) = &chain.base {
                let hook = w.begin(NFTA_CHAIN_HOOK);
                w.u32(NFTA_HOOK_HOOKNUM, base.hook.number());
                w.u32(NFTA_HOOK_PRIORITY, base.priority as u32);
                w.end(hook);
                let policy = match base.policy {
                    Policy::Accept => NF_ACCEPT,
                    Policy::Drop => NF_DROP,
                };
                w.u32(NFTA_CHAIN_POLICY, policy as u32);
                w.string(NFTA_CHAIN_TYPE, base.chain_type.name());
            }
        });
    }

    /// Deletes chain `name` (it must be empty and unreferenced by the end of the batch).
    pub fn delete_chain(&mut self, table: &Table, name: &str) {
        let operation = Operation::DeleteChain {
            table: table.clone(),
            chain: name.to_owned(),
        };
        self.message(NFT_MSG_DELCHAIN, 0, table, operation, |w| {
            w.string(NFTA_CHAIN_TABLE, &table.name);
            w.string(NFTA_CHAIN_NAME, name);
        });
    }

    /// Deletes every rule of chain `name`.
    pub fn flush_chain(&mut self, table: &Table, name: &str) {
        let operation = Operation::FlushChain {
            table: table.clone(),
            chain: name.to_owned(),
        };
        self.message(NFT_MSG_DELRULE, 0, table, operation, |w| {
            w.string(NFTA_RULE_TABLE, &table.name);
            w.string(NFTA_RULE_CHAIN, name);
        });
    }

    /// Deletes every rule of every chain of `table` (sets keep their elements: see
    /// [`Batch::flush_set`]).
    pub fn flush_rules(&mut self, table: &Table) {
        self.message(
            NFT_MSG_DELRULE,
            0,
            table,
            Operation::FlushRules(table.clone()),
            |w| w.string(NFTA_RULE_TABLE, &table.name),
        );
    }

    /// Creates `set` (no error if it exists with the same definition).
    pub fn add_set(&mut self, table: &Table, set: &Set) {
        let operation = Operation::AddSet {
            table: table.clone(),
            set: set.name.clone(),
        };
        // The kernel wants an id unique within the transaction (nft's anonymous sets are
        // referred to by it); ours are referred to by name.
        let id = self.messages.len() as u32 + 1;
        self.message(NFT_MSG_NEWSET, NLM_F_CREATE, table, operation, |w| {
            w.string(NFTA_SET_TABLE, &table.name);
            w.string(NFTA_SET_NAME, &set.name);
            w.u32(NFTA_SET_ID, id);
            w.u32(NFTA_SET_FLAGS, set.flags());
            w.u32(NFTA_SET_KEY_TYPE, set.key_type());
            w.u32(NFTA_SET_KEY_LEN, set.key_len());
            if let Some((data_type, data_len)) = set.data_type_len() {
                w.u32(NFTA_SET_DATA_TYPE, data_type);
                w.u32(NFTA_SET_DATA_LEN, data_len);
            }
            if let Some(timeout) = set.timeout {
                w.u64(
                    NFTA_SET_TIMEOUT,
                    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                );
            }
            let concat = set.flags() & NFT_SET_CONCAT != 0;
            if concat || set.size.is_some() {
                let desc = w.begin(NFTA_SET_DESC);
                if let Some(size) = set.size {
                    w.u32(NFTA_SET_DESC_SIZE, size);
                }
                if concat {
                    // pipapo needs each field's own length.
                    let list = w.begin(NFTA_SET_DESC_CONCAT);
                    for field in &set.key {
                        let elem = w.begin(NFTA_LIST_ELEM);
                        w.u32(NFTA_SET_FIELD_LEN, field.byte_len());
                        w.end(elem);
                    }
                    w.end(list);
                }
                w.end(desc);
            }
            if !set.userdata.is_empty() {
                w.bytes(NFTA_SET_USERDATA, &set.userdata);
            }
        });
    }

    /// Deletes set `name` (no rule may use it by the end of the batch).
    pub fn delete_set(&mut self, table: &Table, name: &str) {
        let operation = Operation::DeleteSet {
            table: table.clone(),
            set: name.to_owned(),
        };
        self.message(NFT_MSG_DELSET, 0, table, operation, |w| {
            w.string(NFTA_SET_TABLE, &table.name);
            w.string(NFTA_SET_NAME, name);
        });
    }

    /// Deletes the chain with `handle` (from a dump) and its rules: for objects someone else
    /// put in our table, whose names are never written.
    pub fn delete_chain_by_handle(&mut self, table: &Table, handle: u64) {
        let operation = Operation::DeleteChainByHandle {
            table: table.clone(),
            handle,
        };
        self.message(NFT_MSG_DELCHAIN, 0, table, operation, |w| {
            w.string(NFTA_CHAIN_TABLE, &table.name);
            w.u64(NFTA_CHAIN_HANDLE, handle);
        });
    }

    /// Deletes the set or map with `handle` (from a dump).
    pub fn delete_set_by_handle(&mut self, table: &Table, handle: u64) {
        let operation = Operation::DeleteSetByHandle {
            table: table.clone(),
            handle,
        };
        self.message(NFT_MSG_DELSET, 0, table, operation, |w| {
            w.string(NFTA_SET_TABLE, &table.name);
            w.u64(NFTA_SET_HANDLE, handle);
        });
    }

    /// Creates a constant anonymous map (or set) holding `elements` and returns the id a
    /// rule added later in the same batch refers to it by ([`Expr::AnonymousLookup`]).
    /// The kernel deletes it with the rule; it must be bound by a rule of the same batch.
    pub fn add_anonymous_map(&mut self, table: &Table, set: &Set, elements: &[Element]) -> u32 {
        let id = self.messages.len() as u32 + 1;
        let operation = Operation::AddSet {
            table: table.clone(),
            set: ANONYMOUS_MAP_NAME.to_owned(),
        };
        let size = elements.len() as u32;
        self.message(NFT_MSG_NEWSET, NLM_F_CREATE, table, operation, |w| {
            w.string(NFTA_SET_TABLE, &table.name);
            w.string(NFTA_SET_NAME, ANONYMOUS_MAP_NAME);
            w.u32(NFTA_SET_ID, id);
            w.u32(NFTA_SET_FLAGS, set.flags() | NFT_SET_ANONYMOUS | NFT_SET_CONSTANT);
            w.u32(NFTA_SET_KEY_TYPE, set.key_type());
            w.u32(NFTA_SET_KEY_LEN, set.key_len());
            if let Some((data_type, data_len)) = set.data_type_len() {
                w.u32(NFTA_SET_DATA_TYPE, data_type);
                w.u32(NFTA_SET_DATA_LEN, data_len);
            }
            let desc = w.begin(NFTA_SET_DESC);
            w.u32(NFTA_SET_DESC_SIZE, size);
            w.end(desc);
            if !set.userdata.is_empty() {
                w.bytes(NFTA_SET_USERDATA, &set.userdata);
            }
        });
        let operation = Operation::AddElements {
            table: table.clone(),
            set: ANONYMOUS_MAP_NAME.to_owned(),
            count: elements.len(),
        };
        self.message(NFT_MSG_NEWSETELEM, NLM_F_CREATE, table, operation, |w| {
            w.string(NFTA_SET_ELEM_LIST_TABLE, &table.name);
            w.string(NFTA_SET_ELEM_LIST_SET, ANONYMOUS_MAP_NAME);
            w.u32(NFTA_SET_ELEM_LIST_SET_ID, id);
            let list = w.begin(NFTA_SET_ELEM_LIST_ELEMENTS);
            for element in elements {
                encode_element(w, element);
            }
            w.end(list);
        });
        id
    }

    /// Creates the named counter `name` at zero (nft's `add counter`); one that exists
    /// keeps its numbers (the kernel has nothing to update in a counter), so a sync may
    /// declare it every time.
    pub fn add_counter(&mut self, table: &Table, name: &str) {
        let operation = Operation::AddObject {
            table: table.clone(),
            kind: ObjectType::COUNTER,
            name: name.to_owned(),
        };
        self.message(NFT_MSG_NEWOBJ, NLM_F_CREATE, table, operation, |w| {
            w.string(NFTA_OBJ_TABLE, &table.name);
            w.string(NFTA_OBJ_NAME, name);
            w.u32(NFTA_OBJ_TYPE, ObjectType::COUNTER.0);
            let data = w.begin(NFTA_OBJ_DATA);
            let Counter { packets, bytes } = Counter::default();
            w.u64(NFTA_COUNTER_BYTES, bytes);
            w.u64(NFTA_COUNTER_PACKETS, packets);
            w.end(data);
        });
    }

    /// Deletes the object `name` of type `kind` (no rule may refer to it by the end of the
    /// batch).
    pub fn delete_object(&mut self, table: &Table, kind: ObjectType, name: &str) {
        let operation = Operation::DeleteObject {
            table: table.clone(),
            kind,
            name: name.to_owned(),
        };
        self.message(NFT_MSG_DELOBJ, 0, table, operation, |w| {
            w.string(NFTA_OBJ_TABLE, &table.name);
            w.string(NFTA_OBJ_NAME, name);
            w.u32(NFTA_OBJ_TYPE, kind.0);
            // Empty, as nft sends it.
            let data = w.begin(NFTA_OBJ_DATA);
            w.end(data);
        });
    }

    /// Deletes the object with `handle` (from a dump, which also says its type: the kernel
    /// wants both), for objects someone else put in our table.
    pub fn delete_object_by_handle(&mut self, table: &Table, kind: ObjectType, handle: u64) {
        let operation = Operation::DeleteObjectByHandle {
            table: table.clone(),
            kind,
            handle,
        };
        self.message(NFT_MSG_DELOBJ, 0, table, operation, |w| {
            w.string(NFTA_OBJ_TABLE, &table.name);
            w.u64(NFTA_OBJ_HANDLE, handle);
            w.u32(NFTA_OBJ_TYPE, kind.0);
            let data = w.begin(NFTA_OBJ_DATA);
            w.end(data);
        });
    }

    /// Deletes every element of set `name`.
    pub fn flush_set(&mut self, table: &Table, name: &str) {
        let operation = Operation::FlushSet {
            table: table.clone(),
            set: name.to_owned(),
        };
        self.message(NFT_MSG_DELSETELEM, 0, table, operation, |w| {
            w.string(NFTA_SET_ELEM_LIST_TABLE, &table.name);
            w.string(NFTA_SET_ELEM_LIST_SET, name);
        });
    }

    /// Adds `elements` to set `name`. An element that exists with the same data is no
    /// error; one that exists with other data is (`EEXIST`): to change a map element's
    /// data, delete it and add it again in the same batch.
    pub fn add_elements(&mut self, table: &Table, name: &str, elements: &[Element]) {
        self.elements(
            NFT_MSG_NEWSETELEM,
            NLM_F_CREATE,
            table,
            name,
            elements,
            |t, s, count| Operation::AddElements {
                table: t,
                set: s,
                count,
            },
        );
    }

    /// Deletes `elements` (only their keys count) from set `name`; a missing one is an
    /// error (`ENOENT`) that fails the batch.
    pub fn delete_elements(&mut self, table: &Table, name: &str, elements: &[Element]) {
        self.elements(NFT_MSG_DELSETELEM, 0, table, name, elements, |t, s, count| {
            Operation::DeleteElements {
                table: t,
                set: s,
                count,
            }
        });
    }

    /// Deletes `elements` from set `name`, ignoring missing ones (Linux 6.3+).
    pub fn destroy_elements(&mut self, table: &Table, name: &str, elements: &[Element]) {
        self.elements(NFT_MSG_DESTROYSETELEM, 0, table, name, elements, |t, s, count| {
            Operation::DestroyElements {
                table: t,
                set: s,
                count,
            }
        });
    }

    /// Element messages, each holding as many elements as fit its element list.
    fn elements(
        &mut self,
        message: u16,
        flags: u16,
        table: &Table,
        name: &str,
        elements: &[Element],
        operation: impl Fn(Table, String, usize) -> Operation,
    ) {
        let mut rest = elements;
        while !rest.is_empty() {
            let at = start(&mut self.buf, nft_type(message), flags, table.family.number(), 0);
            let mut w = Writer::new(&mut self.buf);
            w.string(NFTA_SET_ELEM_LIST_TABLE, &table.name);
            w.string(NFTA_SET_ELEM_LIST_SET, name);
            let list = w.begin(NFTA_SET_ELEM_LIST_ELEMENTS);
            let mut count = 0;
            for element in rest {
                encode_element(&mut w, element);
                count += 1;
                if w.size_since(&list) > ELEMENT_LIST_LIMIT {
                    break;
                }
            }
            w.end(list);
            let invalid = w.invalid().map(str::to_owned);
            finish(&mut self.buf, at);
            let operation = operation(table.clone(), name.to_owned(), count);
            self.note_invalid(&operation, invalid);
            self.messages.push(Message { start: at, operation });
            rest = &rest[count..];
        }
    }

    /// Appends a rule made of `exprs` at the end of chain `chain`.
    pub fn add_rule(&mut self, table: &Table, chain: &str, exprs: &[Expr]) {
        self.add_rule_with_userdata(table, chain, exprs, &[]);
    }

    /// Like [`Batch::add_rule`], with opaque user data kept with the rule (nft keeps a
    /// rule's comment there).
    pub fn add_rule_with_userdata(&mut self, table: &Table, chain: &str, exprs: &[Expr], userdata: &[u8]) {
        let operation = Operation::AddRule {
            table: table.clone(),
            chain: chain.to_owned(),
        };
        self.message(
            NFT_MSG_NEWRULE,
            NLM_F_CREATE | NLM_F_APPEND,
            table,
            operation,
            |w| {
                w.string(NFTA_RULE_TABLE, &table.name);
                w.string(NFTA_RULE_CHAIN, chain);
                let list = w.begin(NFTA_RULE_EXPRESSIONS);
                encode_list(w, exprs);
                w.end(list);
                if !userdata.is_empty() {
                    w.bytes(NFTA_RULE_USERDATA, userdata);
                }
            },
        );
    }

    /// Puts a rule made of `exprs` first in chain `chain`.
    pub fn insert_rule(&mut self, table: &Table, chain: &str, exprs: &[Expr]) {
        let operation = Operation::AddRule {
            table: table.clone(),
            chain: chain.to_owned(),
        };
        self.message(NFT_MSG_NEWRULE, NLM_F_CREATE, table, operation, |w| {
            w.string(NFTA_RULE_TABLE, &table.name);
            w.string(NFTA_RULE_CHAIN, chain);
            let list = w.begin(NFTA_RULE_EXPRESSIONS);
            encode_list(w, exprs);
            w.end(list);
        });
    }

    /// Replaces the rule with `handle` (from a dump) in chain `chain` by one made of
    /// `exprs`, in place: for repairing a rule someone edited.
    pub fn replace_rule(&mut self, table: &Table, chain: &str, handle: u64, exprs: &[Expr]) {
        let operation = Operation::ReplaceRule {
            table: table.clone(),
            chain: chain.to_owned(),
            handle,
        };
        self.message(NFT_MSG_NEWRULE, NLM_F_REPLACE, table, operation, |w| {
            w.string(NFTA_RULE_TABLE, &table.name);
            w.string(NFTA_RULE_CHAIN, chain);
            w.u64(NFTA_RULE_HANDLE, handle);
            let list = w.begin(NFTA_RULE_EXPRESSIONS);
            encode_list(w, exprs);
            w.end(list);
        });
    }

    /// Deletes the rule with `handle` (from a dump) from chain `chain`.
    pub fn delete_rule(&mut self, table: &Table, chain: &str, handle: u64) {
        let operation = Operation::DeleteRule {
            table: table.clone(),
            chain: chain.to_owned(),
            handle,
        };
        self.message(NFT_MSG_DELRULE, 0, table, operation, |w| {
            w.string(NFTA_RULE_TABLE, &table.name);
            w.string(NFTA_RULE_CHAIN, chain);
            w.u64(NFTA_RULE_HANDLE, handle);
        });
    }

    /// The batch's messages cut into consecutive runs of at most `max_bytes` each (a
    /// single message larger than that gets a run of its own).
    pub(crate) fn ranges(&self, max_bytes: usize) -> Vec<std::ops::Range<usize>> {
        let mut ranges = Vec::new();
        let mut start = 0;
        for index in 0..self.messages.len() {
            let run_start = self.messages[start].start;
            if index > start && self.message_end(index) - run_start > max_bytes {
                ranges.push(start..index);
                start = index;
            }
        }
        if start < self.messages.len() {
            ranges.push(start..self.messages.len());
        }
        ranges
    }

    /// Splits the batch at message boundaries into batches of at most `max_bytes` each
    /// (a single message larger than that gets a batch of its own).
    pub fn split(&self, max_bytes: usize) -> Vec<Batch> {
        let mut batches: Vec<Batch> = self
            .ranges(max_bytes)
            .into_iter()
            .map(|range| {
                let first = self.messages[range.start].start;
                let last = self.message_end(range.end - 1);
                Batch {
                    buf: self.buf[first..last].to_vec(),
                    messages: self.messages[range]
                        .iter()
                        .map(|m| Message {
                            start: m.start - first,
                            operation: m.operation.clone(),
                        })
                        .collect(),
                    invalid: None,
                }
            })
            .collect();
        if let Some(first) = batches.first_mut() {
            first.invalid = self.invalid.clone();
        }
        batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Family, Value};
    use std::net::Ipv4Addr;

    fn endpoints(count: u32) -> Vec<Element> {
        (0..count)
            .map(|i| {
                Element::mapping(
                    Value::new()
                        .ipv4(Ipv4Addr::from(0x0a60_0000 + i))
                        .port(80)
                        .host_u32(i % 10)
                        .build(),
                    Value::new()
                        .ipv4(Ipv4Addr::from(0x0af4_0000 + i))
                        .port(8080)
                        .build(),
                )
            })
            .collect()
    }

    #[test]
    fn many_elements_become_several_bounded_messages_that_hold_them_all() {
        let table = Table::new(Family::Ip, "kube-proxy");
        let mut batch = Batch::new();
        batch.add_elements(&table, "service-endpoints-tcp", &endpoints(10_000));
        assert!(batch.len() > 1, "10k elements do not fit one message");
        let mut total = 0;
        for (index, operation) in batch.operations().enumerate() {
            let Operation::AddElements { count, .. } = operation else {
                panic!("{operation}")
            };
            total += count;
            let size = batch.message_end(index) - batch.messages[index].start;
            assert!(size < 64 * 1024, "message {index} is {size} bytes");
        }
        assert_eq!(total, 10_000);
    }

    #[test]
    fn a_name_the_kernel_would_misread_marks_the_batch_invalid() {
        let table = Table::new(Family::Ip, "kube-proxy");
        let mut batch = Batch::new();
        batch.add_table(&table);
        assert!(batch.invalid.is_none());
        batch.add_chain(&table, &crate::Chain::regular("lb\0evil"));
        batch.add_elements(&table, &"x".repeat(300), &endpoints(1));
        let (operation, problem) = batch.invalid.clone().unwrap();
        assert_eq!(
            operation,
            Operation::AddChain {
                table: table.clone(),
                chain: "lb\0evil".into()
            }
        );
        assert!(problem.contains("NUL"), "{problem}");
        assert!(batch.split(1 << 20)[0].invalid.is_some());
    }

    #[test]
    fn split_keeps_every_message_once_in_order_under_the_limit() {
        let table = Table::new(Family::Ip, "kube-proxy");
        let mut batch = Batch::new();
        batch.add_table(&table);
        batch.add_elements(&table, "m", &endpoints(20_000));
        let parts = batch.split(200 * 1024);
        assert!(parts.len() > 1);
        assert!(parts.iter().all(|p| p.size() <= 200 * 1024));
        let ops: Vec<_> = parts.iter().flat_map(|p| p.operations().cloned()).collect();
        assert_eq!(ops, batch.operations().cloned().collect::<Vec<_>>());
        let bytes: Vec<u8> = parts.iter().flat_map(|p| p.buf.clone()).collect();
        assert_eq!(bytes, batch.buf);
    }
}
