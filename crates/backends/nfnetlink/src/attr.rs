//! Netlink attributes (TLVs): a writer that appends them, nested or not, to one growing
//! message buffer, and a reader that walks them without trusting their lengths.
//!
//! Why not a packet crate's `Nla` trait: a cold load encodes hundreds of thousands of set
//! elements; appending into one `Vec` (nests closed by patching their length in place)
//! costs no allocation per attribute. nf_tables wants every integer big-endian.

/// `NLA_F_NESTED`: set on nested attributes, as libmnl does.
const NLA_F_NESTED: u16 = 0x8000;
/// The flag bits of an attribute type (nested, network byte order).
const NLA_TYPE_MASK: u16 = 0x3fff;
/// An attribute's header: length (u16) and type (u16).
pub(crate) const NLA_HEADER: usize = 4;

/// The longest name the kernel takes (`NFT_NAME_MAXLEN` less the NUL).
pub(crate) const NAME_MAX: usize = 255;

/// Why `name` cannot be sent as an nf_tables name, if it cannot: the kernel would read a
/// name with a NUL in it only up to the NUL (another object), and refuses long ones.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    if name.contains('\0') {
        Some(format!("{name:?} contains a NUL byte"))
    } else if name.len() > NAME_MAX {
        Some(format!(
            "a {}-byte name is longer than {NAME_MAX} bytes",
            name.len()
        ))
    } else {
        None
    }
}

/// Appends attributes to a message buffer.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    buf: &'a mut Vec<u8>,
    /// The first string that cannot be a name (see [`name_problem`]).
    invalid: Option<String>,
}

/// An open nested attribute: where its header starts, closed by [`Writer::end`].
#[must_use]
#[derive(Debug)]
pub(crate) struct Nest(usize);

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut Vec<u8>) -> Self {
        Self { buf, invalid: None }
    }

    /// The first string written that cannot be an nf_tables name.
    pub(crate) fn invalid(&self) -> Option<&str> {
        self.invalid.as_deref()
    }

    pub(crate) fn bytes(&mut self, kind: u16, value: &[u8]) {
        let length = NLA_HEADER + value.len();
        // Callers keep attributes small (elements are split into messages of bounded size),
        // so a value never exceeds the u16 length field.
        self.buf.extend_from_slice(&(length as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.pad();
    }

    /// A NUL-terminated string, as the kernel's `NLA_STRING`/`NLA_NUL_STRING` policies expect.
    pub(crate) fn string(&mut self, kind: u16, value: &str) {
        if self.invalid.is_none() {
            self.invalid = name_problem(value);
        }
        let length = NLA_HEADER + value.len() + 1;
        self.buf.extend_from_slice(&(length as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    /// A string without its NUL (`NLA_STRING` takes either), as libnftnl writes some names
    /// (an `objref`'s): the bytes nft sends.
    pub(crate) fn bare_string(&mut self, kind: u16, value: &str) {
        if self.invalid.is_none() {
            self.invalid = name_problem(value);
        }
        self.bytes(kind, value.as_bytes());
    }

    pub(crate) fn u32(&mut self, kind: u16, value: u32) {
        self.bytes(kind, &value.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, kind: u16, value: u64) {
        self.bytes(kind, &value.to_be_bytes());
    }

    pub(crate) fn begin(&mut self, kind: u16) -> Nest {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        Nest(start)
    }

    pub(crate) fn end(&mut self, nest: Nest) {
        let length = self.buf.len() - nest.0;
        let field = (length.min(usize::from(u16::MAX)) as u16).to_ne_bytes();
        self.buf[nest.0..nest.0 + 2].copy_from_slice(&field);
    }

    /// Bytes written since `nest` was opened (to keep a nest under the u16 length limit).
    pub(crate) fn size_since(&self, nest: &Nest) -> usize {
        self.buf.len() - nest.0
    }

    fn pad(&mut self) {
        let aligned = self.buf.len().next_multiple_of(4);
        self.buf.resize(aligned, 0);
    }
}

/// A malformed attribute stream: what was expected where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed nf_tables attribute: {0}")]
pub struct Malformed(pub String);

/// One attribute read from a message: its type (flags removed) and value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attr<'a> {
    pub(crate) kind: u16,
    pub(crate) value: &'a [u8],
}

impl<'a> Attr<'a> {
    pub(crate) fn u32(&self) -> Result<u32, Malformed> {
        let bytes: [u8; 4] = self
            .value
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Malformed(format!("attribute {} is not a u32", self.kind)))?;
        Ok(u32::from_be_bytes(bytes))
    }

    pub(crate) fn u64(&self) -> Result<u64, Malformed> {
        let bytes: [u8; 8] = self
            .value
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Malformed(format!("attribute {} is not a u64", self.kind)))?;
        Ok(u64::from_be_bytes(bytes))
    }

    pub(crate) fn string(&self) -> Result<String, Malformed> {
        let text = self.value.split(|b| *b == 0).next().unwrap_or_default();
        String::from_utf8(text.to_vec())
            .map_err(|_| Malformed(format!("attribute {} is not UTF-8", self.kind)))
    }

    pub(crate) fn nested(&self) -> Attrs<'a> {
        Attrs::new(self.value)
    }
}

/// Iterates over the attributes of a byte range; a length that runs past the end yields
/// one error and stops.
#[derive(Debug, Clone)]
pub(crate) struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < NLA_HEADER {
            return None;
        }
        let length = usize::from(u16::from_ne_bytes([self.rest[0], self.rest[1]]));
        let kind = u16::from_ne_bytes([self.rest[2], self.rest[3]]) & NLA_TYPE_MASK;
        if length < NLA_HEADER || length > self.rest.len() {
            let left = self.rest.len();
            self.rest = &[];
            return Some(Err(Malformed(format!(
                "attribute {kind} of length {length} with {left} bytes left"
            ))));
        }
        let value = &self.rest[NLA_HEADER..length];
        let aligned = length.next_multiple_of(4).min(self.rest.len());
        self.rest = &self.rest[aligned..];
        Some(Ok(Attr { kind, value }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_round_trip_with_padding_and_big_endian_integers() {
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf);
        w.string(1, "kube-proxy");
        let nest = w.begin(2);
        w.u32(1, 0x0102_0304);
        w.bytes(2, &[9, 8, 7]);
        w.end(nest);
        w.u64(3, 7);
        assert_eq!(buf.len() % 4, 0);

        let attrs: Vec<_> = Attrs::new(&buf).collect::<Result<_, _>>().unwrap();
        assert_eq!(attrs.len(), 3);
        assert_eq!(attrs[0].string().unwrap(), "kube-proxy");
        assert_eq!(attrs[1].kind, 2, "the nested flag is masked off");
        let inner: Vec<_> = attrs[1].nested().collect::<Result<_, _>>().unwrap();
        assert_eq!(inner[0].value, &[1, 2, 3, 4], "u32 values are big-endian");
        assert_eq!(inner[1].value, &[9, 8, 7]);
        assert_eq!(attrs[2].u64().unwrap(), 7);
    }

    #[test]
    fn a_length_past_the_end_is_an_error_not_a_panic() {
        let mut buf = Vec::new();
        Writer::new(&mut buf).u32(1, 5);
        buf[0] = 64;
        let items: Vec<_> = Attrs::new(&buf).collect();
        assert_eq!(items.len(), 1);
        assert!(items[0].is_err());
        let short = Attr {
            kind: 1,
            value: &[1, 2],
        };
        assert!(short.u32().is_err());
        assert!(short.u64().is_err());
    }
}
