//! Why an object was refused.
//!
//! A rejection always says which object, which field and why, so an operator can find the
//! typo from the log line alone. `reason` is a short stable code for the metric label; the
//! free text lives in `detail`.

use std::fmt;

use crate::ident::ObjectKind;

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
            self.kind, self.object, self.field, self.detail
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

    pub(crate) fn parse_ip(&self, field: &str, value: &str) -> Result<std::net::IpAddr, Rejection> {
        value.trim().parse().map_err(|_| {
            self.reject(
                field,
                RejectReason::InvalidIp,
                format!("{value:?} is not an IP address"),
            )
        })
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
}
