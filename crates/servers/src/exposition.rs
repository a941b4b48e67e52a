//! What `/metrics` and `/metrics/slis` answer: the registry as upstream's handler writes it.
//!
//! Upstream serves its registries through promhttp without OpenMetrics, so every scraper gets
//! the Prometheus text format 0.0.4 (`text/plain; version=0.0.4; charset=utf-8`). This server
//! does the same by default and answers OpenMetrics 1.0.0 only to a scraper whose `Accept`
//! header names `application/openmetrics-text` with a higher quality than the text format
//! ([`Format::negotiate`]). Upstream never serves OpenMetrics; that is the one deliberate
//! difference.
//!
//! prometheus-client writes OpenMetrics only, so the text format is converted from it
//! (`text004`): HELP and TYPE name a counter by its `_total` sample, `_created` samples,
//! `# UNIT` and `# EOF` go, and families, series, labels and numbers are written in the order
//! and form client_golang writes them (families and series sorted, labels sorted with `le`
//! last, `le="1"` rather than `le="1.0"`), so a selector written against upstream's output
//! selects the same series here.
//!
//! HELP texts are upstream's in both formats ([`upstream_help`]): the stability level in
//! front (`[ALPHA]` unless the registered text names one; upstream's kube-proxy metrics are
//! all ALPHA and this project marks its own the same), and without the '.' prometheus-client
//! appends to every registered help text.

mod accept;
mod text004;

use prometheus_client::registry::Registry;

/// The Prometheus text format, as upstream's handler labels it.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics as prometheus-client writes it, for scrapers that ask for it.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The stability levels Kubernetes' metrics framework writes in front of a help text.
const STABILITY_LEVELS: [&str; 4] = ["[ALPHA] ", "[BETA] ", "[STABLE] ", "[INTERNAL] "];

/// The level of a metric whose registered help names none: upstream's kube-proxy metrics
/// are all ALPHA, and this project's own metrics are marked the same.
const DEFAULT_STABILITY: &str = "[ALPHA] ";

/// An exposition format the metrics endpoints write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4: the default, and all upstream ever writes.
    Text,
    /// OpenMetrics 1.0.0, only when asked for.
    OpenMetrics,
}

impl Format {
    /// The format for a request's `Accept` header values (every value of the header, in
    /// order; none when the header is absent).
    ///
    /// OpenMetrics when a range names `application/openmetrics-text` (without a version, or
    /// `version=1.0.0`) with a quality above the text format's; the text format otherwise,
    /// also for ties, wildcards, unknown types, malformed headers and when nothing offered
    /// is acceptable (upstream answers the text format then too, never 406). Each format
    /// takes the quality of the most specific range that matches it (RFC 9110 12.5.1).
    pub fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Self {
        accept::negotiate(accept)
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text => TEXT_CONTENT_TYPE,
            Self::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// `registry` in `format`, with upstream's help texts.
pub fn encode(registry: &Registry, format: Format) -> Result<String, std::fmt::Error> {
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, registry)?;
    Ok(match format {
        Format::Text => text004::from_openmetrics(&openmetrics),
        Format::OpenMetrics => with_upstream_help(&openmetrics),
    })
}

/// The help text upstream writes for a help text prometheus-client wrote: one trailing '.'
/// less (prometheus-client appends it to every registered text, so a registered text that
/// ends in '.' itself, as the SLI metrics' do, keeps it), and the stability level in front.
pub fn upstream_help(written: &str) -> String {
    let help = written.strip_suffix('.').unwrap_or(written);
    if STABILITY_LEVELS.iter().any(|level| help.starts_with(level)) {
        help.to_string()
    } else {
        format!("{DEFAULT_STABILITY}{help}")
    }
}

/// The OpenMetrics exposition with each `# HELP` line's text replaced by upstream's. Every
/// other line is kept as written (label values escape their line breaks, so a line that
/// starts `# HELP ` is a help line).
fn with_upstream_help(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + openmetrics.len() / 16);
    for line in openmetrics.split_inclusive('\n') {
        let (content, end) = match line.strip_suffix('\n') {
            Some(content) => (content, "\n"),
            None => (line, ""),
        };
        match content
            .strip_prefix("# HELP ")
            .and_then(|rest| rest.split_once(' '))
        {
            Some((name, help)) => {
                out.push_str("# HELP ");
                out.push_str(name);
                out.push(' ');
                out.push_str(&upstream_help(help));
                out.push_str(end);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Also the text format's rules, for the servers' tests.
#[cfg(test)]
pub(crate) mod tests;
