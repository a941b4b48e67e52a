//! Failures as the API server reports them: each [`ApiError`] maps to the HTTP code and the
//! `Status` reason the real server uses, so clients take the same code paths here as there.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// A request the server refuses, with the same code and reason the real server gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String },
    #[error("the server could not find the requested resource")]
    NoSuchPath,
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String },
    #[error("Operation cannot be fulfilled on {resource} \"{name}\": {reason}")]
    Conflict {
        resource: String,
        name: String,
        reason: String,
    },
    #[error("{0}")]
    BadRequest(String),
    /// The request's parameters or body break a rule (HTTP 422).
    #[error("{0}")]
    Invalid(String),
    /// The requested resourceVersion or continue token is older than the retained history.
    #[error("{0}")]
    Expired(String),
    /// The requested resourceVersion is newer than the server's (it never caught up).
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: u64, current: u64 },
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    #[error("the body of the request was in an unknown format - accepted media types include: {0}")]
    UnsupportedMediaType(String),
}

impl ApiError {
    pub fn not_found(resource: &ResourceType, name: &str) -> Self {
        ApiError::NotFound {
            resource: resource.qualified_name(),
            name: name.to_string(),
        }
    }

    pub fn already_exists(resource: &ResourceType, name: &str) -> Self {
        ApiError::AlreadyExists {
            resource: resource.qualified_name(),
            name: name.to_string(),
        }
    }

    pub fn conflict(resource: &ResourceType, name: &str, reason: impl Into<String>) -> Self {
        ApiError::Conflict {
            resource: resource.qualified_name(),
            name: name.to_string(),
            reason: reason.into(),
        }
    }

    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound { .. } | ApiError::NoSuchPath => 404,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } => 409,
            ApiError::BadRequest(_) => 400,
            ApiError::Invalid(_) => 422,
            ApiError::Expired(_) => 410,
            ApiError::TooLargeResourceVersion { .. } => 504,
            ApiError::MethodNotAllowed => 405,
            ApiError::UnsupportedMediaType(_) => 415,
        }
    }

    /// The machine-readable `Status.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } | ApiError::NoSuchPath => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } => "Conflict",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::Invalid(_) => "Invalid",
            ApiError::Expired(_) => "Expired",
            ApiError::TooLargeResourceVersion { .. } => "Timeout",
            ApiError::MethodNotAllowed => "MethodNotAllowed",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaType",
        }
    }

    /// The `Status` object sent as a response body or inside a watch `ERROR` event.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if let Some(details) = self.details() {
            status["details"] = details;
        }
        status
    }

    fn details(&self) -> Option<Value> {
        match self {
            ApiError::NotFound { resource, name }
            | ApiError::AlreadyExists { resource, name }
            | ApiError::Conflict { resource, name, .. } => {
                let (kind, group) = split_qualified(resource);
                Some(json!({ "name": name, "group": group, "kind": kind }))
            }
            ApiError::TooLargeResourceVersion { .. } => Some(json!({
                "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }],
                "retryAfterSeconds": 1,
            })),
            // The real server sends empty details for unknown paths.
            ApiError::NoSuchPath => Some(json!({})),
            _ => None,
        }
    }
}

/// `services` -> (`services`, ""); `endpointslices.discovery.k8s.io` -> (`endpointslices`, group).
fn split_qualified(resource: &str) -> (&str, &str) {
    resource.split_once('.').unwrap_or((resource, ""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{ENDPOINT_SLICES, SERVICES};

    #[test]
    fn not_found_status_matches_the_real_server_shape() {
        let status = ApiError::not_found(&SERVICES, "web").to_status();
        assert_eq!(status["code"], 404);
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["message"], "services \"web\" not found");
        assert_eq!(status["details"]["name"], "web");
        assert_eq!(status["details"]["kind"], "services");
    }

    #[test]
    fn grouped_resource_names_split_into_kind_and_group() {
        let status = ApiError::already_exists(&ENDPOINT_SLICES, "s").to_status();
        assert_eq!(status["code"], 409);
        assert_eq!(status["details"]["kind"], "endpointslices");
        assert_eq!(status["details"]["group"], "discovery.k8s.io");
    }

    #[test]
    fn expired_is_410() {
        let status = ApiError::Expired("too old resource version: 1 (5)".into()).to_status();
        assert_eq!(status["code"], 410);
        assert_eq!(status["reason"], "Expired");
        assert_eq!(status["message"], "too old resource version: 1 (5)");
    }
}
