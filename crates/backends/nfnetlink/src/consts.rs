//! The numbers of the nf_tables netlink ABI (linux/netfilter/nf_tables.h, nfnetlink.h,
//! nf_nat.h) that this crate speaks, in one place. They are kernel ABI: they never change.
#![allow(dead_code)]

// === nfnetlink ===
pub(crate) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(crate) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(crate) const NFNL_MSG_BATCH_END: u16 = 0x11;
pub(crate) const NFNETLINK_V0: u8 = 0;

// === netlink header flags and message types ===
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_MULTI: u16 = 0x2;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP_INTR: u16 = 0x10;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_REPLACE: u16 = 0x100;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
/// On an error message: the original request is cut to its header (`NETLINK_CAP_ACK`).
pub(crate) const NLM_F_CAPPED: u16 = 0x100;
/// On an error message: extended-ack attributes follow.
pub(crate) const NLM_F_ACK_TLVS: u16 = 0x200;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const NLMSGERR_ATTR_MSG: u16 = 1;
pub(crate) const NLMSGERR_ATTR_OFFS: u16 = 2;

// === nf_tables message types (low byte; the high byte is the subsystem) ===
pub(crate) const NFT_MSG_NEWTABLE: u16 = 0;
pub(crate) const NFT_MSG_GETTABLE: u16 = 1;
pub(crate) const NFT_MSG_DELTABLE: u16 = 2;
pub(crate) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(crate) const NFT_MSG_GETCHAIN: u16 = 4;
pub(crate) const NFT_MSG_DELCHAIN: u16 = 5;
pub(crate) const NFT_MSG_NEWRULE: u16 = 6;
pub(crate) const NFT_MSG_GETRULE: u16 = 7;
pub(crate) const NFT_MSG_DELRULE: u16 = 8;
pub(crate) const NFT_MSG_NEWSET: u16 = 9;
pub(crate) const NFT_MSG_GETSET: u16 = 10;
pub(crate) const NFT_MSG_DELSET: u16 = 11;
pub(crate) const NFT_MSG_NEWSETELEM: u16 = 12;
pub(crate) const NFT_MSG_GETSETELEM: u16 = 13;
pub(crate) const NFT_MSG_DELSETELEM: u16 = 14;
pub(crate) const NFT_MSG_NEWGEN: u16 = 15;
pub(crate) const NFT_MSG_GETGEN: u16 = 16;
pub(crate) const NFT_MSG_NEWOBJ: u16 = 18;
pub(crate) const NFT_MSG_GETOBJ: u16 = 19;
pub(crate) const NFT_MSG_DELOBJ: u16 = 20;
/// Like DEL*, without an error when the object is missing (Linux 6.3+).
pub(crate) const NFT_MSG_DESTROYTABLE: u16 = 26;
pub(crate) const NFT_MSG_DESTROYSETELEM: u16 = 30;

// === attributes ===
pub(crate) const NFTA_LIST_ELEM: u16 = 1;

pub(crate) const NFTA_TABLE_NAME: u16 = 1;
pub(crate) const NFTA_TABLE_FLAGS: u16 = 2;
pub(crate) const NFTA_TABLE_USE: u16 = 3;
pub(crate) const NFTA_TABLE_HANDLE: u16 = 4;
pub(crate) const NFTA_TABLE_USERDATA: u16 = 6;

pub(crate) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(crate) const NFTA_HOOK_PRIORITY: u16 = 2;

pub(crate) const NFTA_CHAIN_TABLE: u16 = 1;
pub(crate) const NFTA_CHAIN_HANDLE: u16 = 2;
pub(crate) const NFTA_CHAIN_NAME: u16 = 3;
pub(crate) const NFTA_CHAIN_HOOK: u16 = 4;
pub(crate) const NFTA_CHAIN_POLICY: u16 = 5;
pub(crate) const NFTA_CHAIN_USE: u16 = 6;
pub(crate) const NFTA_CHAIN_TYPE: u16 = 7;

pub(crate) const NFTA_RULE_TABLE: u16 = 1;
pub(crate) const NFTA_RULE_CHAIN: u16 = 2;
pub(crate) const NFTA_RULE_HANDLE: u16 = 3;
pub(crate) const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub(crate) const NFTA_RULE_USERDATA: u16 = 7;

pub(crate) const NFTA_SET_TABLE: u16 = 1;
pub(crate) const NFTA_SET_NAME: u16 = 2;
pub(crate) const NFTA_SET_FLAGS: u16 = 3;
pub(crate) const NFTA_SET_KEY_TYPE: u16 = 4;
pub(crate) const NFTA_SET_KEY_LEN: u16 = 5;
pub(crate) const NFTA_SET_DATA_TYPE: u16 = 6;
pub(crate) const NFTA_SET_DATA_LEN: u16 = 7;
pub(crate) const NFTA_SET_DESC: u16 = 9;
pub(crate) const NFTA_SET_ID: u16 = 10;
pub(crate) const NFTA_SET_TIMEOUT: u16 = 11;
pub(crate) const NFTA_SET_USERDATA: u16 = 13;
pub(crate) const NFTA_SET_HANDLE: u16 = 16;
pub(crate) const NFTA_SET_DESC_SIZE: u16 = 1;
pub(crate) const NFTA_SET_DESC_CONCAT: u16 = 2;
pub(crate) const NFTA_SET_FIELD_LEN: u16 = 1;

pub(crate) const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub(crate) const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub(crate) const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub(crate) const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub(crate) const NFTA_SET_ELEM_KEY: u16 = 1;
pub(crate) const NFTA_SET_ELEM_DATA: u16 = 2;
pub(crate) const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub(crate) const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
pub(crate) const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
pub(crate) const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub(crate) const NFTA_SET_ELEM_KEY_END: u16 = 10;

pub(crate) const NFTA_DATA_VALUE: u16 = 1;
pub(crate) const NFTA_DATA_VERDICT: u16 = 2;
pub(crate) const NFTA_VERDICT_CODE: u16 = 1;
pub(crate) const NFTA_VERDICT_CHAIN: u16 = 2;

pub(crate) const NFTA_GEN_ID: u16 = 1;

pub(crate) const NFTA_OBJ_TABLE: u16 = 1;
pub(crate) const NFTA_OBJ_NAME: u16 = 2;
pub(crate) const NFTA_OBJ_TYPE: u16 = 3;
pub(crate) const NFTA_OBJ_DATA: u16 = 4;
pub(crate) const NFTA_OBJ_USE: u16 = 5;
pub(crate) const NFTA_OBJ_HANDLE: u16 = 6;
pub(crate) const NFTA_OBJ_USERDATA: u16 = 8;
/// Inside `NFTA_OBJ_DATA` of a counter (`NFTA_COUNTER_*`, as the `counter` expression's).
pub(crate) const NFTA_COUNTER_BYTES: u16 = 1;
pub(crate) const NFTA_COUNTER_PACKETS: u16 = 2;

pub(crate) const NFTA_EXPR_NAME: u16 = 1;
pub(crate) const NFTA_EXPR_DATA: u16 = 2;

// === set flags and data types ===
pub(crate) const NFT_SET_ANONYMOUS: u32 = 0x1;
pub(crate) const NFT_SET_CONSTANT: u32 = 0x2;
pub(crate) const NFT_SET_INTERVAL: u32 = 0x4;
pub(crate) const NFT_SET_MAP: u32 = 0x8;
pub(crate) const NFT_SET_TIMEOUT: u32 = 0x10;
pub(crate) const NFT_SET_EVAL: u32 = 0x20;
pub(crate) const NFT_SET_CONCAT: u32 = 0x80;
pub(crate) const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
pub(crate) const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;

// === verdict codes ===
pub(crate) const NF_DROP: i32 = 0;
pub(crate) const NF_ACCEPT: i32 = 1;
pub(crate) const NFT_CONTINUE: i32 = -1;
pub(crate) const NFT_JUMP: i32 = -3;
pub(crate) const NFT_GOTO: i32 = -4;
pub(crate) const NFT_RETURN: i32 = -5;
