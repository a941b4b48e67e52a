//! Golden lines: real tracing macros through [`JsonLayer`] with a fixed clock, compared byte
//! for byte with the lines component-base writes for the same call (its own golden tests
//! in `logs/json/klog_test.go` give the shapes: `InfoS`, `V(n).InfoS`, `ErrorS`, `KObj`).

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_subscriber::layer::SubscriberExt;

use super::*;

/// 2023-11-14T22:13:20.123456789Z.
fn fixed_clock() -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789)
}
const TS: &str = "1700000000123.4568";

/// What the layer wrote, shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `log` with the JSON layer as the only subscriber; returns what it wrote.
fn capture(log: impl FnOnce()) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let layer = JsonLayer {
        make_writer: move || writer.clone(),
        clock: fixed_clock,
    };
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, log);
    String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
}

/// Runs one logging statement; returns what was written and the statement's line.
macro_rules! logged {
    ($($statement:tt)*) => {{
        let line = line!();
        (capture(|| { $($statement)*; }), line)
    }};
}

/// The line component-base writes, with our caller at `line`.
fn golden(line: u32, rest: &str) -> String {
    format!("{{\"ts\":{TS},\"caller\":\"logging/json_tests.rs:{line}\",{rest}}}\n")
}

#[test]
fn info_with_a_pair_is_infos() {
    let (out, line) = logged!(tracing::info!(count = 1, "test"));
    assert_eq!(out, golden(line, r#""msg":"test","v":0,"count":1"#));
}

#[test]
fn debug_and_trace_carry_the_v_that_shows_them() {
    let (out, line) = logged!(tracing::debug!(count = 1, "test"));
    assert_eq!(out, golden(line, r#""msg":"test","v":2,"count":1"#));
    let (out, line) = logged!(tracing::trace!(count = 1, "test"));
    assert_eq!(out, golden(line, r#""msg":"test","v":5,"count":1"#));
}

#[test]
fn a_warning_is_a_v0_line_as_klogs() {
    let (out, line) = logged!(tracing::warn!("test 1"));
    assert_eq!(out, golden(line, r#""msg":"test 1","v":0"#));
}

#[test]
fn an_error_is_errors_without_v_and_err_last() {
    let (out, line) = logged!(tracing::error!(error = %"fail", count = 1, "test"));
    assert_eq!(out, golden(line, r#""msg":"test","count":1,"err":"fail""#));
    let (out, line) = logged!(tracing::error!("test 1"));
    assert_eq!(out, golden(line, r#""msg":"test 1""#));
}

#[test]
fn an_error_value_on_an_info_line_is_err_in_place() {
    let cause = std::io::Error::other("address in use");
    let error: &(dyn std::error::Error + 'static) = &cause;
    let (out, line) = logged!(tracing::info!(error, port = 10256, "retrying"));
    assert_eq!(
        out,
        golden(
            line,
            r#""msg":"retrying","v":0,"err":"address in use","port":10256"#
        )
    );
}

#[test]
fn dotted_fields_are_kobj_objects() {
    let (out, line) = logged!(tracing::info!(
        pod.name = "pod-1",
        pod.namespace = "kube-system",
        "some"
    ));
    assert_eq!(
        out,
        golden(
            line,
            r#""msg":"some","v":0,"pod":{"name":"pod-1","namespace":"kube-system"}"#
        )
    );
    let (out, line) = logged!(tracing::info!(node.name = "n1", "cluster-scoped"));
    assert_eq!(
        out,
        golden(line, r#""msg":"cluster-scoped","v":0,"node":{"name":"n1"}"#)
    );
}

#[test]
fn values_keep_their_json_types() {
    let (out, line) = logged!(tracing::info!(
        on = true,
        delta = -3,
        ratio = 0.5,
        big = u128::MAX,
        shown = %"a b",
        debugged = ?Some(1),
        "typed"
    ));
    let rest = concat!(
        r#""msg":"typed","v":0,"on":true,"delta":-3,"ratio":0.5,"#,
        r#""big":"340282366920938463463374607431768211455","shown":"a b","debugged":"Some(1)""#
    );
    assert_eq!(out, golden(line, rest));
}

#[test]
fn span_fields_come_first_outermost_first() {
    let (out, line) = logged!(
        let outer = tracing::info_span!("sync", family = "IPv4");
        let _outer = outer.enter();
        let inner = tracing::info_span!("service", service = "default/web");
        let _inner = inner.enter();
        tracing::info!(endpoints = 2, "synced")
    );
    // The event is on the macro's last line; `logged!` reports its first.
    let line = line + 5;
    assert_eq!(
        out,
        golden(
            line,
            r#""msg":"synced","v":0,"family":"IPv4","service":"default/web","endpoints":2"#
        )
    );
}

#[test]
fn a_log_crate_record_has_its_own_caller_and_no_log_fields() {
    // What tracing-log makes of a `log` record (rustls logs this way).
    let out = capture(|| {
        tracing::debug!(
            log.target = "rustls::webpki::anchors",
            log.module_path = "rustls::webpki::anchors",
            log.file = "/root/.cargo/registry/src/x/rustls-0.23.46/src/webpki/anchors.rs",
            log.line = 54_u32,
            "processed 145 certs"
        )
    });
    let expected = "{\"ts\":1700000000123.4568,\"caller\":\"webpki/anchors.rs:54\",\"msg\":\"processed 145 certs\",\"v\":2}\n";
    assert_eq!(out, expected);
}

#[test]
fn untrusted_text_cannot_break_or_forge_a_line() {
    let name = "web\n{\"ts\":0,\"msg\":\"forged\"}";
    let (out, _) = logged!(tracing::warn!(object = %name, "rejected {name}"));
    assert_eq!(out.lines().count(), 1, "{out}");
    let parsed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed["object"], name);
    assert_eq!(parsed["msg"], format!("rejected {name}"));
}

#[test]
fn every_line_parses_with_upstreams_keys() {
    let out = capture(|| {
        tracing::info!("one");
        tracing::error!(error = "boom", "two");
        tracing::debug!(n = 3, "three");
    });
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    for line in &lines {
        assert!(line["ts"].is_f64(), "{line}");
        assert!(line["caller"].is_string(), "{line}");
        assert!(line["msg"].is_string(), "{line}");
    }
    assert_eq!(lines[0]["v"], 0);
    assert!(lines[1].get("v").is_none());
    assert_eq!(lines[1]["err"], "boom");
    assert_eq!(lines[2]["v"], 2);
}

#[test]
fn the_timestamp_is_float_milliseconds_as_component_base_writes_it() {
    assert_eq!(millis_since_epoch(fixed_clock()).to_string(), TS);
    let whole = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    assert_eq!(millis_since_epoch(whole).to_string(), "1700000000123");
    assert_eq!(millis_since_epoch(UNIX_EPOCH - Duration::from_secs(1)), 0.0);
}

#[test]
fn the_caller_is_the_last_directory_and_file() {
    assert_eq!(short_caller("crates/sync/src/intake.rs", 87), "sync/intake.rs:87");
    assert_eq!(
        short_caller("crates/backends/iptables/src/proxier.rs", 244),
        "iptables/proxier.rs:244"
    );
    let dependency =
        "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/kube-client-5.0.0/src/client/mod.rs";
    assert_eq!(short_caller(dependency, 1), "client/mod.rs:1");
    assert_eq!(short_caller("main.rs", 3), "main.rs:3");
}
