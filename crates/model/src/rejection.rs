//! Why an object was refused.
//!
//! A rejection always says which object, which field and why, so an operator can find the
//! typo from the log line alone. `reason` is a short stable code for the metric label; the
//! free text lives in `detail`. Object names and field paths are shown with control characters
//! escaped, and quoted values are shortened, so a hostile name cannot forge log lines.

use std::fmt;
use std::net::IpAddr;

use crate::ident::ObjectKind;
use crate::ignored::IgnoredValue;
use crate::syntax::parse_ip_sloppy;

/// Longest part of an offending value quoted in a message; the rest is elided.
const SHOWN_VALUE_MAX: usize = 64;

/// Stable, low-cardinality causes; used as the `reason` label of the rejected-objects counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    MissingField,
    InvalidIp,
    InvalidCidr,
    InvalidPort,
    InvalidProtocol,
    InvalidValue,
    DuplicatePort,
    WrongIpFamily,
    /// The document could not be parsed as the object it claims to be.
    Malformed,
    /// Another object already holds what this one asks for (a nodePort, a cluster IP).
    Conflict,
    /// Over a size limit (a manifest file's bytes, an EndpointSlice's endpoints).
    TooLarge,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingField => "missing_field",
            Self::InvalidIp => "invalid_ip",
            Self::InvalidCidr => "invalid_cidr",
            Self::InvalidPort => "invalid_port",
            Self::InvalidProtocol => "invalid_protocol",
            Self::InvalidValue => "invalid_value",
            Self::DuplicatePort => "duplicate_port",
            Self::WrongIpFamily => "wrong_ip_family",
            Self::Malformed => "malformed",
            Self::Conflict => "conflict",
            Self::TooLarge => "too_large",
        }
    }
}

/// An object the proxy refuses to program, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Rejection {
    pub kind: ObjectKind,
    /// `namespace/name`, or a file path for documents that never became objects.
    pub object: String,
    /// The field path, e.g. `spec.ports[1].port`.
    pub field: String,
    pub reason: RejectReason,
    pub detail: String,
}

impl Rejection {
    pub fn new(
        kind: ObjectKind,
        object: impl Into<String>,
        field: impl Into<String>,
        reason: RejectReason,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            object: object.into(),
            field: field.into(),
            reason,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rejected {} {}: field {}: {}",
            self.kind,
            self.object.escape_debug(),
            self.field.escape_debug(),
            self.detail
        )
    }
}

/// Builds rejections for one object without repeating its kind and name at every field.
pub(crate) struct Rejecter {
    kind: ObjectKind,
    object: String,
}

impl Rejecter {
    pub(crate) fn new(kind: ObjectKind, object: String) -> Self {
        Self { kind, object }
    }

    pub(crate) fn reject(
        &self,
        field: impl Into<String>,
        reason: RejectReason,
        detail: impl Into<String>,
    ) -> Rejection {
        Rejection::new(self.kind, self.object.clone(), field, reason, detail)
    }

    /// Records a dropped list entry of this object (see [`IgnoredValue`]).
    pub(crate) fn ignore(
        &self,
        list: &'static str,
        field: impl Into<String>,
        reason: RejectReason,
        detail: impl Into<String>,
    ) -> IgnoredValue {
        IgnoredValue {
            kind: self.kind,
            object: self.object.clone(),
            field: field.into(),
            list,
            reason,
            detail: detail.into(),
        }
    }

    /// Parses an address as upstream does ([`parse_ip_sloppy`]); a malformed one rejects.
    pub(crate) fn parse_ip(&self, field: &str, value: &str) -> Result<IpAddr, Rejection> {
        parse_ip_sloppy(value).ok_or_else(|| {
            self.reject(
                field,
                RejectReason::InvalidIp,
                format!("{} is not an IP address", shown(value)),
            )
        })
    }

    /// Applies one of the [`crate::syntax`] name rules to `value`.
    pub(crate) fn name(
        &self,
        field: &str,
        value: &str,
        rule: fn(&str) -> Result<(), String>,
    ) -> Result<(), Rejection> {
        rule(value).map_err(|why| self.reject(field, RejectReason::InvalidValue, why))
    }

    pub(crate) fn port(&self, field: &str, value: i32) -> Result<u16, Rejection> {
        u16::try_from(value).ok().filter(|p| *p != 0).ok_or_else(|| {
            self.reject(
                field,
                RejectReason::InvalidPort,
                format!("{value} is outside 1-65535"),
            )
        })
    }

    /// Like [`Self::port`], but 0 (or absent) means "none", as for nodePort.
    pub(crate) fn optional_port(&self, field: &str, value: Option<i32>) -> Result<Option<u16>, Rejection> {
        match value {
            None | Some(0) => Ok(None),
            Some(v) => self.port(field, v).map(Some),
        }
    }
}

/// `value` quoted with control characters escaped, cut after [`SHOWN_VALUE_MAX`] characters.
pub(crate) fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_VALUE_MAX) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &value[..cut], value.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_object_field_and_reason() {
        let r = Rejection::new(
            ObjectKind::Service,
            "default/web",
            "spec.ports[0].port",
            RejectReason::InvalidPort,
            "70000 is outside 1-65535",
        );
        assert_eq!(
            r.to_string(),
            "rejected Service default/web: field spec.ports[0].port: 70000 is outside 1-65535"
        );
    }

    #[test]
    fn message_cannot_span_lines() {
        let r = Rejection::new(
            ObjectKind::Service,
            "default/evil\n-A KUBE-SERVICES -j ACCEPT\n#",
            "metadata.name",
            RejectReason::InvalidValue,
            "not a DNS-1035 label",
        );
        let text = r.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains(r"evil\n-A KUBE-SERVICES"), "{text}");
    }

    #[test]
    fn shown_values_are_escaped_and_bounded() {
        assert_eq!(shown("10.0.0.1"), "\"10.0.0.1\"");
        assert_eq!(shown("a\nb"), "\"a\\nb\"");
        let long = "x".repeat(10_000);
        let text = shown(&long);
        assert!(text.len() < 100, "{text}");
        assert!(text.ends_with("... (10000 bytes)"), "{text}");
    }
}
