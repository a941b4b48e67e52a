//! component-base's JSON log lines (`--logging-format=json`), written from tracing events.
//!
//! Upstream (`k8s.io/component-base/logs/json`: zap behind logr) writes one object per line,
//! keys in this order:
//!
//! ```text
//! {"ts":1700000000123.4568,"caller":"app/server.go:512","msg":"Starting","v":0,"node":{"name":"n1"}}
//! {"ts":1700000000124.001,"caller":"app/server.go:530","msg":"Listen failed","port":10256,"err":"address in use"}
//! ```
//!
//! - `ts`: milliseconds since the Unix epoch, as a float (component-base's time encoder; its
//!   documentation's examples show seconds, its code writes milliseconds, and so do we).
//! - `caller`: `dir/file:line`, the last directory and the file as zap's short caller. Our
//!   sources all sit in `src/`, so that directory is skipped: `sync/intake.rs:87`.
//! - `msg`: the message.
//! - `v`: the verbosity of a non-error line, the lowest `-v` that shows it (info and warn 0,
//!   debug 2, trace 5: klog has no warning level, its warnings are `V(0)` lines). Error lines
//!   have no `v`, as `ErrorS` writes them.
//! - the key/value pairs, in the order given: the fields of the enclosing spans (outermost
//!   first), then the event's own. Upstream's `WithValues` pairs come before `v`, ours after;
//!   JSON readers do not see the difference.
//! - a field named `error` (or `err`) is written as `err`; on error lines it comes last, where
//!   `ErrorS` puts it.
//!
//! Values keep their JSON type (numbers, booleans, strings); a value formatted with `%` or `?`
//! is a string. A dotted field name nests: `service.name = .., service.namespace = ..` is
//! written `"service":{"name":..,"namespace":..}`, the shape of klog's `KObj`. Every string is
//! JSON-escaped, so a name from an API object cannot break or forge a line. Lines from
//! libraries that log through the `log` crate (rustls) take their caller from the record.

use std::fmt;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use super::verbosity_of;

/// Writes every event as one component-base JSON line to its writer.
pub struct JsonLayer<W> {
    make_writer: W,
    clock: fn() -> SystemTime,
}

impl<W> JsonLayer<W> {
    pub fn new(make_writer: W) -> Self {
        Self {
            make_writer,
            clock: SystemTime::now,
        }
    }
}

impl<S, W> Layer<S> for JsonLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Pairs::default();
        attributes.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Pairs>()
        {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut pairs = Pairs::default();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<Pairs>() {
                    pairs.fields.extend(fields.fields.iter().cloned());
                }
            }
        }
        let metadata = event.metadata();
        pairs.bridged_log = metadata.fields().field(LOG_TARGET).is_some();
        event.record(&mut pairs);
        let line = Line {
            ts_millis: millis_since_epoch((self.clock)()),
            caller: pairs.log_caller().or_else(|| caller(metadata)),
            level: *metadata.level(),
            message: pairs.message.unwrap_or_default(),
            fields: pairs.fields,
        };
        // One write per line, so lines from different threads never interleave. A log line
        // that cannot be written has nowhere else to go.
        let _ = self
            .make_writer
            .make_writer_for(metadata)
            .write_all(line.render().as_bytes());
    }
}

/// The fields tracing-log gives an event from the `log` crate (rustls, ...), carrying the
/// record's origin instead of the event's metadata.
const LOG_TARGET: &str = "log.target";
const LOG_FILE: &str = "log.file";
const LOG_LINE: &str = "log.line";
const LOG_MODULE_PATH: &str = "log.module_path";

/// A span's or an event's fields as JSON values, and the event's message.
#[derive(Clone, Debug, Default)]
struct Pairs {
    message: Option<String>,
    fields: Vec<(String, Value)>,
    /// The event came from the `log` crate: its `log.*` fields are its origin, not pairs.
    bridged_log: bool,
    log_file: Option<String>,
    log_line: Option<u32>,
}

impl Pairs {
    fn push(&mut self, field: &Field, value: Value) {
        match (field.name(), value) {
            ("message", Value::String(text)) => self.message = Some(text),
            (LOG_FILE, Value::String(file)) if self.bridged_log => self.log_file = Some(file),
            (LOG_LINE, Value::Number(line)) if self.bridged_log => {
                self.log_line = line.as_u64().and_then(|l| u32::try_from(l).ok());
            }
            (LOG_TARGET | LOG_MODULE_PATH, _) if self.bridged_log => {}
            (name, value) => self.fields.push((name.to_string(), value)),
        }
    }

    fn log_caller(&self) -> Option<String> {
        Some(short_caller(self.log_file.as_deref()?, self.log_line?))
    }
}

impl Visit for Pairs {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value)
            .map_or_else(|| Value::String(value.to_string()), Value::Number);
        self.push(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, value.into());
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        let value = i64::try_from(value).map_or_else(|_| Value::String(value.to_string()), Value::from);
        self.push(field, value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        let value = u64::try_from(value).map_or_else(|_| Value::String(value.to_string()), Value::from);
        self.push(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, value.into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, format!("{value:?}").into());
    }
}

/// One log line before it is written.
#[derive(Debug)]
struct Line {
    ts_millis: f64,
    caller: Option<String>,
    level: Level,
    message: String,
    fields: Vec<(String, Value)>,
}

impl Line {
    fn render(self) -> String {
        let mut out = format!("{{\"ts\":{}", self.ts_millis);
        if let Some(caller) = &self.caller {
            push_pair(&mut out, "caller", &Value::from(caller.as_str()));
        }
        push_pair(&mut out, "msg", &Value::from(self.message));
        if let Some(v) = verbosity_of(self.level) {
            push_pair(&mut out, "v", &Value::from(v));
        }
        for (key, value) in pairs_in_upstream_order(self.fields, self.level) {
            push_pair(&mut out, &key, &value);
        }
        out.push_str("}\n");
        out
    }
}

fn push_pair(out: &mut String, key: &str, value: &Value) {
    out.push(',');
    out.push_str(&Value::from(key).to_string());
    out.push(':');
    out.push_str(&value.to_string());
}

/// Renames `error` to `err`, moves it last on error lines, and nests dotted keys.
fn pairs_in_upstream_order(fields: Vec<(String, Value)>, level: Level) -> Vec<(String, Value)> {
    let (errors, others): (Vec<_>, Vec<_>) = fields
        .into_iter()
        .map(|(key, value)| match key.as_str() {
            "error" | "err" => ("err".to_string(), value),
            _ => (key, value),
        })
        .partition(|(key, _)| level == Level::ERROR && key == "err");
    let mut nested: Vec<(String, Value)> = Vec::new();
    for (key, value) in others.into_iter().chain(errors) {
        insert_nested(&mut nested, key, value);
    }
    nested
}

/// `a.b` goes into the object under `a` (created where `a` first appears); a key whose head
/// is already a plain value stays as it was given.
fn insert_nested(pairs: &mut Vec<(String, Value)>, key: String, value: Value) {
    let Some((head, rest)) = key
        .split_once('.')
        .filter(|(h, r)| !h.is_empty() && !r.is_empty())
    else {
        pairs.push((key, value));
        return;
    };
    match pairs.iter_mut().find(|(k, _)| k == head) {
        Some((_, Value::Object(object))) => insert_path(object, rest, value),
        Some(_) => pairs.push((key, value)),
        None => {
            let mut object = Map::new();
            insert_path(&mut object, rest, value);
            pairs.push((head.to_string(), Value::Object(object)));
        }
    }
}

fn insert_path(object: &mut Map<String, Value>, path: &str, value: Value) {
    match path.split_once('.') {
        Some((head, rest)) if !head.is_empty() && !rest.is_empty() => {
            let inner = object.entry(head).or_insert_with(|| Value::Object(Map::new()));
            match inner {
                Value::Object(inner) => insert_path(inner, rest, value),
                _ => {
                    object.insert(path.to_string(), value);
                }
            }
        }
        _ => {
            object.insert(path.to_string(), value);
        }
    }
}

/// component-base's timestamp: milliseconds since the epoch, with the nanoseconds as fraction.
fn millis_since_epoch(now: SystemTime) -> f64 {
    let nanos = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    nanos as f64 / 1e6
}

/// zap's short caller (`dir/file:line`), skipping the `src` directory every crate has.
fn caller(metadata: &Metadata<'_>) -> Option<String> {
    Some(short_caller(metadata.file()?, metadata.line()?))
}

fn short_caller(file: &str, line: u32) -> String {
    let parts: Vec<&str> = file
        .split(['/', '\\'])
        .filter(|part| !part.is_empty() && *part != "src")
        .collect();
    let tail = &parts[parts.len().saturating_sub(2)..];
    format!("{}:{line}", tail.join("/"))
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
