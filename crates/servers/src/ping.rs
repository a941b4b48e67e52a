//! The metrics port's `/healthz`: Kubernetes' generic component health handler with its one
//! default check, `ping`.
//!
//! Upstream installs apiserver's healthz handler on the metrics mux without checks, which
//! registers `ping` (always passing). Monitoring scripts use its documented query forms, so
//! they answer as there: `ok` by default; with `?verbose` one line per check and
//! `healthz check passed`; `?exclude=<check>` marks a check as excluded and warns about names
//! that match no check. `/healthz/ping` answers the single check. The headers are the
//! handler's (`text/plain; charset=utf-8`, `nosniff`), for any method.
//!
//! Each `/healthz` request runs the check unless excluded, and records the run in the SLI
//! registry ([`HealthcheckSlis`]) as upstream's handler does; `/healthz/ping` records
//! nothing, as there.

use std::collections::BTreeSet;

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::slis::{HEALTHZ, HealthcheckSlis};

/// The only check upstream's metrics-port `/healthz` has.
const PING: &str = "ping";

/// `/healthz` on the metrics port, for the request's raw query; check runs go to `slis`.
pub(crate) fn healthz(query: Option<&str>, slis: &HealthcheckSlis) -> Response {
    let query = Query::parse(query.unwrap_or(""));
    if !query.excluded.contains(PING) {
        // `ping` always passes.
        slis.observe(PING, HEALTHZ, true);
    }
    let body = if query.verbose {
        verbose_body(&query.excluded)
    } else {
        "ok".to_string()
    };
    plain_text_nosniff(body)
}

/// `/healthz/ping`: the check on its own.
pub(crate) async fn ping() -> &'static str {
    "ok"
}

fn verbose_body(excluded: &BTreeSet<String>) -> String {
    let mut body = if excluded.contains(PING) {
        format!("[+]{PING} excluded: ok\n")
    } else {
        format!("[+]{PING} ok\n")
    };
    let unmatched: Vec<String> = excluded
        .iter()
        .filter(|name| *name != PING)
        .map(|name| format!("{name:?}"))
        .collect();
    if !unmatched.is_empty() {
        body.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            unmatched.join(",")
        ));
    }
    body.push_str("healthz check passed\n");
    body
}

fn plain_text_nosniff(body: String) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// The two query parameters the handler reads.
#[derive(Debug, Default, PartialEq, Eq)]
struct Query {
    /// `verbose` is present, with any value or none.
    verbose: bool,
    /// Every `exclude` value, decoded and deduplicated (sorted, as upstream lists them).
    excluded: BTreeSet<String>,
}

impl Query {
    fn parse(raw: &str) -> Self {
        let mut query = Self::default();
        for pair in raw.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match form_decode(key).as_str() {
                "verbose" => query.verbose = true,
                "exclude" => {
                    query.excluded.insert(form_decode(value));
                }
                _ => {}
            }
        }
        query
    }
}

/// Decodes `application/x-www-form-urlencoded` text: `+` is a space, `%XX` a byte. A
/// malformed escape is kept as written; invalid UTF-8 is replaced, never trusted.
fn form_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match bytes.get(i + 1..i + 3).and_then(hex_byte) {
                Some(byte) => {
                    out.push(byte);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    let text = std::str::from_utf8(pair).ok()?;
    u8::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_forms_are_read_like_go_reads_them() {
        assert_eq!(Query::parse(""), Query::default());
        let q = Query::parse("verbose&exclude=ping&exclude=etcd%2Fx&exclude=a+b&exclude=ping");
        assert!(q.verbose);
        let excluded: Vec<_> = q.excluded.iter().map(String::as_str).collect();
        assert_eq!(excluded, ["a b", "etcd/x", "ping"]);
        assert!(Query::parse("verbose=false").verbose, "present means verbose");
        assert!(!Query::parse("verbosity").verbose);
        assert_eq!(form_decode("100%"), "100%");
        assert_eq!(form_decode("%zz%41"), "%zzA");
        assert_eq!(form_decode("%ff"), "\u{fffd}");
    }

    #[test]
    fn verbose_bodies_are_upstreams() {
        assert_eq!(
            verbose_body(&BTreeSet::new()),
            "[+]ping ok\nhealthz check passed\n"
        );
        let excluded = ["ping".to_string()].into();
        assert_eq!(
            verbose_body(&excluded),
            "[+]ping excluded: ok\nhealthz check passed\n"
        );
        let excluded = ["b".to_string(), "a\n".to_string()].into();
        assert_eq!(
            verbose_body(&excluded),
            "[+]ping ok\nwarn: some health checks cannot be excluded: no matches for \"a\\n\",\"b\"\n\
             healthz check passed\n"
        );
    }
}
