//! nf_tables messages: the 16-byte netlink header and 4-byte `nfgenmsg` that start each
//! one, and the attribute encodings shared by batches and dumps (data, verdicts, elements).

use std::time::Duration;

use crate::attr::{Attrs, Malformed, Writer};
use crate::consts::*;
use crate::objects::{Data, Element, Family, Verdict};

/// Length of `struct nlmsghdr`.
pub(crate) const HEADER_LEN: usize = 16;
/// Length of `struct nfgenmsg`.
pub(crate) const NFGENMSG_LEN: usize = 4;

/// Starts a message at the end of `buf`: header (length patched by [`finish`], sequence
/// number patched when sent) and `nfgenmsg`. Returns where it starts.
pub(crate) fn start(buf: &mut Vec<u8>, message_type: u16, flags: u16, family: u8, res_id: u16) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&message_type.to_ne_bytes());
    buf.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(family);
    buf.push(NFNETLINK_V0);
    buf.extend_from_slice(&res_id.to_be_bytes());
    start
}

/// Writes the message length of the message starting at `start`.
pub(crate) fn finish(buf: &mut [u8], start: usize) {
    let length = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&length.to_ne_bytes());
}

/// Sets the sequence number of the message starting at `start`.
pub(crate) fn set_sequence(buf: &mut [u8], start: usize, sequence: u32) {
    buf[start + 8..start + 12].copy_from_slice(&sequence.to_ne_bytes());
}

/// An nf_tables message type: subsystem in the high byte.
pub(crate) fn nft_type(message: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | message
}

/// One whole nf_tables request (for dumps and the generation): header, nfgenmsg,
/// attributes; or why one of its names cannot be sent.
pub(crate) fn request(
    message: u16,
    flags: u16,
    family: u8,
    attrs: impl FnOnce(&mut Writer<'_>),
) -> Result<Vec<u8>, String> {
    let mut buf = Vec::with_capacity(64);
    let start = start(&mut buf, nft_type(message), flags, family, 0);
    let mut w = Writer::new(&mut buf);
    attrs(&mut w);
    if let Some(problem) = w.invalid() {
        return Err(problem.to_owned());
    }
    finish(&mut buf, start);
    Ok(buf)
}

/// `NFTA_DATA_*` nested in attribute `kind`.
pub(crate) fn encode_data(w: &mut Writer<'_>, kind: u16, data: &Data) {
    let nest = w.begin(kind);
    match data {
        Data::Value(bytes) => w.bytes(NFTA_DATA_VALUE, bytes),
        Data::Verdict(verdict) => {
            let inner = w.begin(NFTA_DATA_VERDICT);
            w.u32(NFTA_VERDICT_CODE, verdict.code() as u32);
            if let Some(chain) = verdict.chain() {
                w.string(NFTA_VERDICT_CHAIN, chain);
            }
            w.end(inner);
        }
    }
    w.end(nest);
}

/// `NFTA_DATA_VALUE` nested in attribute `kind` (no copy of `bytes`).
fn encode_value(w: &mut Writer<'_>, kind: u16, bytes: &[u8]) {
    let nest = w.begin(kind);
    w.bytes(NFTA_DATA_VALUE, bytes);
    w.end(nest);
}

/// Reads the attributes inside an `NFTA_DATA_*` nest.
pub(crate) fn decode_data(attrs: Attrs<'_>) -> Result<Data, Malformed> {
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_DATA_VALUE => return Ok(Data::Value(attr.value.to_vec())),
            NFTA_DATA_VERDICT => return decode_verdict(attr.nested()).map(Data::Verdict),
            _ => {}
        }
    }
    Err(Malformed("data without a value or verdict".into()))
}

fn decode_verdict(attrs: Attrs<'_>) -> Result<Verdict, Malformed> {
    let mut code = None;
    let mut chain = None;
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_VERDICT_CODE => code = Some(attr.u32()? as i32),
            NFTA_VERDICT_CHAIN => chain = Some(attr.string()?),
            _ => {}
        }
    }
    let missing_chain = || Malformed("a jump or goto without a chain".into());
    Ok(
        match code.ok_or_else(|| Malformed("a verdict without a code".into()))? {
            NF_ACCEPT => Verdict::Accept,
            NF_DROP => Verdict::Drop,
            NFT_CONTINUE => Verdict::Continue,
            NFT_RETURN => Verdict::Return,
            NFT_JUMP => Verdict::Jump(chain.ok_or_else(missing_chain)?),
            NFT_GOTO => Verdict::Goto(chain.ok_or_else(missing_chain)?),
            other => return Err(Malformed(format!("verdict code {other}"))),
        },
    )
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One `NFTA_LIST_ELEM` of an element list.
pub(crate) fn encode_element(w: &mut Writer<'_>, element: &Element) {
    let nest = w.begin(NFTA_LIST_ELEM);
    encode_value(w, NFTA_SET_ELEM_KEY, &element.key);
    if let Some(key_end) = &element.key_end {
        encode_value(w, NFTA_SET_ELEM_KEY_END, key_end);
    }
    if let Some(data) = &element.data {
        encode_data(w, NFTA_SET_ELEM_DATA, data);
    }
    if let Some(timeout) = element.timeout {
        w.u64(NFTA_SET_ELEM_TIMEOUT, duration_ms(timeout));
    }
    if element.interval_end {
        w.u32(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
    }
    if !element.userdata.is_empty() {
        w.bytes(NFTA_SET_ELEM_USERDATA, &element.userdata);
    }
    w.end(nest);
}

/// Reads one `NFTA_LIST_ELEM` of an element list.
pub(crate) fn decode_element(attrs: Attrs<'_>) -> Result<Element, Malformed> {
    let mut element = Element::key(Vec::new());
    let value = |attr: crate::attr::Attr<'_>| match decode_data(attr.nested())? {
        Data::Value(bytes) => Ok(bytes),
        Data::Verdict(_) => Err(Malformed("a verdict as an element key".into())),
    };
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_SET_ELEM_KEY => element.key = value(attr)?,
            NFTA_SET_ELEM_KEY_END => element.key_end = Some(value(attr)?),
            NFTA_SET_ELEM_DATA => element.data = Some(decode_data(attr.nested())?),
            NFTA_SET_ELEM_TIMEOUT => element.timeout = Some(Duration::from_millis(attr.u64()?)),
            NFTA_SET_ELEM_EXPIRATION => element.expiration = Some(Duration::from_millis(attr.u64()?)),
            NFTA_SET_ELEM_FLAGS => element.interval_end = attr.u32()? & NFT_SET_ELEM_INTERVAL_END != 0,
            NFTA_SET_ELEM_USERDATA => element.userdata = attr.value.to_vec(),
            _ => {}
        }
    }
    Ok(element)
}

/// The family of a message from its `nfgenmsg`, and its attributes.
pub(crate) fn body(payload: &[u8]) -> Result<(Family, Attrs<'_>), Malformed> {
    let family = payload
        .first()
        .and_then(|n| Family::from_number(*n))
        .ok_or_else(|| Malformed("a message of an unknown family".into()))?;
    let attrs = payload
        .get(NFGENMSG_LEN..)
        .ok_or_else(|| Malformed("a message shorter than nfgenmsg".into()))?;
    Ok((family, Attrs::new(attrs)))
}
