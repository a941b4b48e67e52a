//! List entries the proxy skips while it programs the rest of the object.
//!
//! Upstream kube-proxy drops a malformed entry of `spec.externalIPs`,
//! `status.loadBalancer.ingress`, `spec.loadBalancerSourceRanges` or an EndpointSlice's
//! endpoints and keeps the object: one typo in a list of twenty external IPs must not take the
//! other nineteen (and the cluster IP) away. The conversion cannot log (this crate is pure),
//! so it returns each dropped entry as an [`IgnoredValue`] next to the view, and the caller
//! logs and counts it once per converted object version.

use std::fmt;

use crate::ident::ObjectKind;
use crate::rejection::RejectReason;

/// One list entry that was dropped, and why; the object itself was converted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredValue {
    pub kind: ObjectKind,
    /// `namespace/name` of the object.
    pub object: String,
    /// The entry's field path with its index, e.g. `spec.externalIPs[2]`.
    pub field: String,
    /// The list the entry belongs to, without index (e.g. `spec.externalIPs`): a stable,
    /// low-cardinality metric label, unlike `field`.
    pub list: &'static str,
    pub reason: RejectReason,
    /// What is wrong, quoting the (shortened) value.
    pub detail: String,
}

impl fmt::Display for IgnoredValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ignored an entry of {} {}: field {}: {}; the rest of the object is used",
            self.kind,
            self.object.escape_debug(),
            self.field.escape_debug(),
            self.detail
        )
    }
}

/// A converted object together with the entries the conversion dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted<T> {
    pub view: T,
    pub ignored: Vec<IgnoredValue>,
}

impl<T> Converted<T> {
    /// A conversion that dropped nothing.
    pub fn clean(view: T) -> Self {
        Self {
            view,
            ignored: Vec::new(),
        }
    }

    /// Test support: each dropped entry's field and reason, in order.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> Vec<(&str, RejectReason)> {
        self.ignored
            .iter()
            .map(|w| (w.field.as_str(), w.reason))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_object_field_and_reason_with_control_characters_escaped() {
        let ignored = IgnoredValue {
            kind: ObjectKind::Service,
            object: "default/web".into(),
            field: "spec.externalIPs[1]".into(),
            list: "spec.externalIPs",
            reason: RejectReason::InvalidIp,
            detail: "\"x\" is not an IP address".into(),
        };
        assert_eq!(
            ignored.to_string(),
            "ignored an entry of Service default/web: field spec.externalIPs[1]: \"x\" is not an IP address; \
             the rest of the object is used"
        );
        let evil = IgnoredValue {
            object: "default/a\nb".into(),
            ..ignored
        };
        assert!(!evil.to_string().contains('\n'), "{evil}");
    }
}
