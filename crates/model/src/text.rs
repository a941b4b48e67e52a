//! The one gate for text that ends up in kernel rule text.
//!
//! Names of Services, namespaces and ports, and the interface names of `--detect-local-mode`,
//! are written into `iptables-restore` input (comments, `-i` matches), and later into other
//! modes' kernel text. Sources validate objects, but rule text is where a missed check turns
//! into a takeover of the node's firewall (a newline in a name starts a new restore line), so
//! every such string is checked again here, by type: rule builders accept [`Comment`],
//! [`InterfaceName`] and kpr-naming's `ChainName`, built from checked [`SafeText`], never a plain
//! `String`.
//!
//! What is refused, and why:
//! - control characters (`char::is_control`: C0, DEL, C1): a newline ends the restore line,
//!   a NUL ends the C string iptables parses, a tab is a token separator;
//! - `"` and `\`: iptables-restore's tokenizer treats them as quoting and escaping, and
//!   versions differ in how (older ones keep the backslash), so no quoting of ours is safe
//!   across versions;
//! - a leading `-`: older iptables-restore versions refuse any argument that looks like `-t`
//!   (a table option), quoted or not, and an option-like value invites misreading;
//! - empty text: older versions drop an empty quoted argument, shifting the others.
//!
//! Length is the argument's business: iptables refuses arguments of 1024 bytes or more, and
//! every argument type here is bounded. Comments are the only long free text: a [`Comment`]
//! keeps the first [`COMMENT_MAX_BYTES`] bytes (the kernel's limit is 256 including the NUL),
//! cut on a character boundary, instead of refusing; interface and chain names are refused
//! when longer than the kernel takes them.

use std::fmt;

use std::net::SocketAddr;

/// Longest `--comment` the kernel accepts: 256 bytes including the terminating NUL.
pub const COMMENT_MAX_BYTES: usize = 255;
/// Longest interface name (IFNAMSIZ 16, including the NUL).
pub const INTERFACE_NAME_MAX_BYTES: usize = 15;

/// Why a string may not be written into kernel rule text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum UnsafeText {
    #[error("is empty")]
    Empty,
    #[error("contains the control character {found:?} at byte {at}")]
    Control { found: char, at: usize },
    #[error("contains {found:?} at byte {at}, which iptables-restore reads as quoting")]
    Quoting { found: char, at: usize },
    #[error("starts with '-', which iptables would read as an option")]
    LeadingDash,
    #[error("is {len} bytes long; at most {max} are allowed")]
    TooLong { len: usize, max: usize },
    #[error("contains {found:?} at byte {at}, which {what} cannot contain")]
    NotAllowedIn {
        found: char,
        at: usize,
        what: &'static str,
    },
}

/// The checks every text passes (length is checked by the types that bound it).
fn check_chars(text: &str) -> Result<(), UnsafeText> {
    if text.is_empty() {
        return Err(UnsafeText::Empty);
    }
    if text.starts_with('-') {
        return Err(UnsafeText::LeadingDash);
    }
    for (at, found) in text.char_indices() {
        if found.is_control() {
            return Err(UnsafeText::Control { found, at });
        }
        if found == '"' || found == '\\' {
            return Err(UnsafeText::Quoting { found, at });
        }
    }
    Ok(())
}

fn check_len(text: &str, max: usize) -> Result<(), UnsafeText> {
    if text.len() > max {
        return Err(UnsafeText::TooLong { len: text.len(), max });
    }
    Ok(())
}

/// Text whose characters may appear in rule text: checked by [`SafeText::new`]. Not an
/// argument by itself (it has no length bound): it becomes one as part of a [`Comment`] or
/// as an [`InterfaceName`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SafeText(Box<str>);

impl SafeText {
    pub fn new(text: &str) -> Result<Self, UnsafeText> {
        check_chars(text)?;
        Ok(Self(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SafeText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SafeText {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A `--comment` value: checked like [`SafeText`], then cut to [`COMMENT_MAX_BYTES`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Comment(SafeText);

impl Comment {
    pub fn new(text: &str) -> Result<Self, UnsafeText> {
        check_chars(text)?;
        Ok(Self::cut(text))
    }

    /// Composes a comment from pieces that are already safe, so it cannot fail.
    pub fn build() -> CommentBuilder {
        CommentBuilder(String::new())
    }

    fn cut(text: &str) -> Self {
        Self(SafeText(
            truncate_on_char_boundary(text, COMMENT_MAX_BYTES).into(),
        ))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

/// Concatenates checked text, typed values and literals from the source into a [`Comment`].
#[derive(Debug)]
pub struct CommentBuilder(String);

impl CommentBuilder {
    /// Checked text.
    pub fn text(mut self, text: &SafeText) -> Self {
        self.0.push_str(text.as_str());
        self
    }

    /// Text written in the source, e.g. `" cluster IP"`; it must not start the comment with
    /// '-' nor contain characters [`SafeText`] refuses (checked in debug builds).
    pub fn literal(mut self, text: &'static str) -> Self {
        debug_assert!(
            text.is_empty() || check_chars(&format!("x{text}")).is_ok(),
            "literal {text:?}"
        );
        debug_assert!(!(self.0.is_empty() && text.starts_with('-')), "literal {text:?}");
        self.0.push_str(text);
        self
    }

    /// An endpoint address: digits, dots, colons and brackets only.
    pub fn endpoint(mut self, addr: SocketAddr) -> Self {
        use std::fmt::Write as _;
        let _ = write!(self.0, "{addr}");
        self
    }

    /// A kernel object's name (a chain's, say): ASCII letters, digits, `-`, `_` and `.`,
    /// which every name kube-proxy-rs gives an object is made of. Anything else is left out
    /// rather than trusted (kpr-naming checks names when it makes them, so nothing is).
    pub fn object_name(mut self, name: &str) -> Self {
        let allowed = |c: &char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        self.0.extend(name.chars().filter(allowed));
        self
    }

    /// The comment, cut to [`COMMENT_MAX_BYTES`].
    pub fn finish(self) -> Comment {
        debug_assert!(check_chars(&self.0).is_ok(), "{:?}", self.0);
        Comment::cut(&self.0)
    }
}

impl fmt::Display for Comment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn truncate_on_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A network interface name (or name prefix) for `-i` / `-o` matches: [`SafeText`] that the
/// kernel would also take as an interface name (at most 15 bytes, no spaces, '/' or ':').
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InterfaceName(SafeText);

impl InterfaceName {
    /// A whole interface name.
    pub fn new(name: &str) -> Result<Self, UnsafeText> {
        Self::checked(name, INTERFACE_NAME_MAX_BYTES)
    }

    /// A name prefix, matched as `<prefix>+`: one byte shorter, so the wildcard still fits.
    /// Upstream's `interfaceNamePrefix` is used the same way.
    pub fn prefix(prefix: &str) -> Result<Self, UnsafeText> {
        Self::checked(prefix, INTERFACE_NAME_MAX_BYTES - 1)
    }

    fn checked(name: &str, max: usize) -> Result<Self, UnsafeText> {
        let text = SafeText::new(name)?;
        check_len(name, max)?;
        if let Some((at, found)) = name
            .char_indices()
            .find(|(_, c)| c.is_whitespace() || *c == '/' || *c == ':' || *c == '+')
        {
            return Err(UnsafeText::NotAllowedIn {
                found,
                at,
                what: "an interface name",
            });
        }
        Ok(Self(text))
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for InterfaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_in_comments_keep_only_name_characters() {
        let comment = Comment::build()
            .literal("to ")
            .object_name("KUBE-FW-ABC_1.x")
            .object_name("\n\"x -j ACCEPT")
            .finish();
        assert_eq!(comment.as_str(), "to KUBE-FW-ABC_1.xx-jACCEPT");
    }

    #[test]
    fn plain_names_and_spaces_pass() {
        assert_eq!(
            SafeText::new("default/web:http").unwrap().as_str(),
            "default/web:http"
        );
        assert!(SafeText::new("default/web:http cluster IP").is_ok());
        assert!(
            SafeText::new("ünïcödé/名前").is_ok(),
            "non-ASCII is plain bytes to iptables"
        );
    }

    #[test]
    fn comments_compose_from_safe_pieces() {
        let svc = SafeText::new("default/web:http").unwrap();
        let c = Comment::build()
            .literal("masquerade traffic for ")
            .text(&svc)
            .literal(" external destinations")
            .finish();
        assert_eq!(
            c.as_str(),
            "masquerade traffic for default/web:http external destinations"
        );
        let to = Comment::build()
            .text(&svc)
            .literal(" -> ")
            .endpoint("[fd00::1]:80".parse().unwrap())
            .finish();
        assert_eq!(to.as_str(), "default/web:http -> [fd00::1]:80");
        let long = SafeText::new(&"n".repeat(400)).unwrap();
        assert_eq!(
            Comment::build()
                .text(&long)
                .literal(" cluster IP")
                .finish()
                .as_str()
                .len(),
            255
        );
    }

    #[test]
    fn injection_characters_are_refused_with_their_position() {
        assert_eq!(
            SafeText::new("evil\n-A KUBE-SERVICES -j ACCEPT"),
            Err(UnsafeText::Control { found: '\n', at: 4 })
        );
        for (text, found) in [
            ("a\tb", '\t'),
            ("a\0b", '\0'),
            ("a\u{7f}", '\u{7f}'),
            ("a\u{85}", '\u{85}'),
        ] {
            assert!(
                matches!(SafeText::new(text), Err(UnsafeText::Control { found: f, .. }) if f == found),
                "{text:?}"
            );
        }
        assert_eq!(
            SafeText::new(r#"a"b"#),
            Err(UnsafeText::Quoting { found: '"', at: 1 })
        );
        assert_eq!(
            SafeText::new(r"a\b"),
            Err(UnsafeText::Quoting { found: '\\', at: 1 })
        );
        assert_eq!(SafeText::new("-t"), Err(UnsafeText::LeadingDash));
        assert_eq!(SafeText::new(""), Err(UnsafeText::Empty));
    }

    #[test]
    fn comments_are_cut_to_the_kernel_limit_on_a_char_boundary() {
        let long = "x".repeat(300);
        assert_eq!(Comment::new(&long).unwrap().as_str().len(), 255);
        // 254 ASCII bytes then a 2-byte character: it does not fit, so it is dropped whole.
        let edge = format!("{}é", "x".repeat(254));
        let cut = Comment::new(&edge).unwrap();
        assert_eq!(cut.as_str(), "x".repeat(254));
        assert!(
            Comment::new("a\nb").is_err(),
            "characters are checked before cutting"
        );
        let exact = "y".repeat(255);
        assert_eq!(Comment::new(&exact).unwrap().as_str(), exact);
    }

    #[test]
    fn interface_names_follow_the_kernel() {
        assert_eq!(InterfaceName::new("cbr0").unwrap().as_str(), "cbr0");
        assert!(InterfaceName::new("fifteen-chars-x").is_ok());
        assert_eq!(
            InterfaceName::new("sixteen-chars-xx"),
            Err(UnsafeText::TooLong { len: 16, max: 15 })
        );
        assert_eq!(
            InterfaceName::prefix("fifteen-chars-x"),
            Err(UnsafeText::TooLong { len: 15, max: 14 }),
            "`<prefix>+` must fit in 15 bytes"
        );
        assert_eq!(
            InterfaceName::new("br 0"),
            Err(UnsafeText::NotAllowedIn {
                found: ' ',
                at: 2,
                what: "an interface name"
            })
        );
        assert!(
            InterfaceName::prefix("veth+").is_err(),
            "the wildcard is ours to add"
        );
        assert!(InterfaceName::new("eth0\n").is_err());
        assert!(InterfaceName::new("").is_err());
    }
}
