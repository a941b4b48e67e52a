//! Response and query plumbing shared by every handler, so all answers carry the headers and
//! framing the real server uses (JSON bodies ending in a newline, `Status` objects for errors).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::Value;

use crate::error::ApiError;

/// Every response body: a whole document or a stream of watch events.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

pub(crate) const JSON: &str = "application/json";

/// A JSON document with the given code, serialized as the real server does (compact, with a
/// trailing newline).
pub(crate) fn json_response(code: u16, value: &Value) -> Response<Body> {
    json_response_as(code, value, JSON)
}

/// A JSON document with an explicit media type (aggregated discovery names its own).
pub(crate) fn json_response_as(code: u16, value: &Value, content_type: &'static str) -> Response<Body> {
    let mut text = value.to_string();
    text.push('\n');
    let mut response = Response::new(full(text));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    response
}

pub(crate) fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code(), &error.to_status())
}

pub(crate) fn text_response(code: u16, text: &'static str) -> Response<Body> {
    let mut response = Response::new(full(text));
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

pub(crate) fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into()).boxed_unsync()
}

/// The decoded query string, in order, repeated keys kept.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(raw: Option<&str>) -> Self {
        let pairs = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
        Query(pairs)
    }

    /// The first value of `name` (as the server's parameter decoding takes the first).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// A boolean parameter parsed like Go's `strconv.ParseBool`; absent means false.
    pub(crate) fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None => Ok(false),
            Some(text) => parse_go_bool(text)
                .ok_or_else(|| ApiError::BadRequest(format!("invalid value {text:?} for parameter {name}"))),
        }
    }

    /// A boolean parameter whose absence matters (`sendInitialEvents`).
    pub(crate) fn optional_flag(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name).map(|_| self.flag(name)).transpose()
    }

    /// An integer parameter; absent means `None`.
    pub(crate) fn integer(&self, name: &str) -> Result<Option<i64>, ApiError> {
        self.get(name)
            .map(|text| {
                text.parse::<i64>().map_err(|_| {
                    ApiError::BadRequest(format!(
                        "invalid value {text:?} for parameter {name}: not an integer"
                    ))
                })
            })
            .transpose()
    }

    pub(crate) fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

fn parse_go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decodes_like_kube_rs_encodes() {
        let query = Query::parse(Some(
            "labelSelector=%21service.kubernetes.io%2Fheadless&watch=true&limit=5&watch=false",
        ));
        assert_eq!(
            query.get("labelSelector"),
            Some("!service.kubernetes.io/headless")
        );
        assert!(query.flag("watch").unwrap(), "the first value wins");
        assert_eq!(query.integer("limit").unwrap(), Some(5));
        assert!(!query.flag("allowWatchBookmarks").unwrap());
        assert_eq!(query.optional_flag("sendInitialEvents").unwrap(), None);
    }

    #[test]
    fn malformed_parameters_are_bad_requests() {
        let query = Query::parse(Some("watch=yes&limit=ten"));
        assert_eq!(query.flag("watch").unwrap_err().code(), 400);
        assert_eq!(query.integer("limit").unwrap_err().code(), 400);
    }
}
