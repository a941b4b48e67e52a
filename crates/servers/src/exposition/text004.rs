//! OpenMetrics text, as prometheus-client writes it, to the Prometheus text format 0.0.4 as
//! client_golang's expfmt writes it.
//!
//! What changes, family by family:
//! - a counter's family is named by its sample, `X_total` (OpenMetrics names it `X`); its
//!   `_created` sample goes, as does a histogram's or summary's;
//! - an info family `X` becomes the gauge `X_info`, a stateset a gauge, unknown `untyped`
//!   (prometheus-client writes none of them today);
//! - `# UNIT` and `# EOF` go, exemplars go, a timestamp turns from seconds into milliseconds;
//! - families are sorted by name, series by their label values, labels by name with `le`
//!   and `quantile` last, a histogram's buckets come before its `_sum` and `_count`, and
//!   numbers are written as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes them
//!   (`1`, `0.001`, `1e+06`, `+Inf`), in values and in `le` and `quantile` alike.
//!
//! A line that does not fit (a sample of no family announced before it, a malformed sample,
//! a second family of one name with another type, a gauge histogram, which the text format
//! cannot carry) is left out, so the answer stays parseable; it is logged at debug level.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::upstream_help;

/// `openmetrics` in the text format 0.0.4.
pub(super) fn from_openmetrics(openmetrics: &str) -> String {
    let mut exposition = Exposition::default();
    for line in openmetrics.split('\n') {
        if line == "# EOF" {
            break;
        }
        exposition.read(line);
    }
    exposition.write()
}

/// OpenMetrics' metric types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenMetricsType {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Info,
    StateSet,
    Unknown,
}

impl OpenMetricsType {
    fn parse(text: &str) -> Self {
        match text {
            "counter" => Self::Counter,
            "gauge" => Self::Gauge,
            "histogram" => Self::Histogram,
            "gaugehistogram" => Self::GaugeHistogram,
            "summary" => Self::Summary,
            "info" => Self::Info,
            "stateset" => Self::StateSet,
            _ => Self::Unknown,
        }
    }
}

/// The text format's metric types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
            Self::Summary => "summary",
            Self::Untyped => "untyped",
        }
    }
}

/// Which sample of a series a line is, by its name's suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The series' value: a counter's `_total`, a gauge, a summary's quantile.
    Value,
    Bucket,
    Sum,
    Count,
}

impl Part {
    /// `Some(None)` for a sample the text format leaves out (`_created`); `None` for a
    /// suffix the type does not have.
    fn of(kind: OpenMetricsType, suffix: &str) -> Option<Option<Self>> {
        use OpenMetricsType as T;
        Some(Some(match (kind, suffix) {
            (T::Counter, "_total")
            | (T::Info, "_info")
            | (T::Gauge | T::StateSet | T::Unknown | T::Summary, "") => Self::Value,
            (T::Histogram, "_bucket") => Self::Bucket,
            (T::Histogram | T::Summary, "_sum") => Self::Sum,
            (T::Histogram | T::Summary, "_count") => Self::Count,
            (T::Counter | T::Histogram | T::Summary, "_created") => return Some(None),
            _ => return None,
        }))
    }

    /// The suffix after the family's name in the text format.
    fn suffix(self) -> &'static str {
        match self {
            Self::Value => "",
            Self::Bucket => "_bucket",
            Self::Sum => "_sum",
            Self::Count => "_count",
        }
    }

    /// expfmt's order within a series: quantiles or buckets, then `_sum`, then `_count`.
    fn rank(self) -> u8 {
        match self {
            Self::Value | Self::Bucket => 0,
            Self::Sum => 1,
            Self::Count => 2,
        }
    }

    /// The label that tells the samples of one part apart (`le`, `quantile`).
    fn bound_label(self, kind: Kind) -> Option<&'static str> {
        match (self, kind) {
            (Self::Bucket, _) => Some("le"),
            (Self::Value, Kind::Summary) => Some("quantile"),
            _ => None,
        }
    }
}

/// A label as written: name, and value still escaped (OpenMetrics and the text format
/// escape label values alike).
type Label = (String, String);

/// A family as the text format writes it.
struct Family {
    name: String,
    kind: Kind,
    /// As prometheus-client wrote it; [`upstream_help`] makes it upstream's.
    help: String,
    series: Vec<Series>,
    /// Index into `series` by labels (without `le` or `quantile`).
    by_labels: HashMap<Vec<Label>, usize>,
}

/// One series: its labels, sorted by name, and its samples.
struct Series {
    labels: Vec<Label>,
    samples: Vec<Sample>,
}

struct Sample {
    part: Part,
    /// `le` or `quantile`, with its value written as Go writes numbers.
    bound: Option<(&'static str, String)>,
    value: f64,
    timestamp_ms: Option<i64>,
}

/// The OpenMetrics family whose lines are being read.
struct Current {
    name: String,
    kind: Option<OpenMetricsType>,
    help: Option<String>,
    /// Where its samples go, once its first sample resolved it: `Some(None)` when they
    /// are left out.
    target: Option<Option<usize>>,
}

#[derive(Default)]
struct Exposition {
    families: Vec<Family>,
    by_name: HashMap<String, usize>,
    current: Option<Current>,
}

impl Exposition {
    fn read(&mut self, line: &str) {
        if line.is_empty() {
            return;
        }
        if let Some(comment) = line.strip_prefix('#') {
            self.read_comment(comment);
        } else {
            self.read_sample(line);
        }
    }

    /// `# HELP`, `# TYPE` and `# UNIT` announce a family; other comments say nothing.
    fn read_comment(&mut self, comment: &str) {
        let Some((keyword, rest)) = comment.trim_start_matches(' ').split_once(' ') else {
            return;
        };
        if !matches!(keyword, "HELP" | "TYPE" | "UNIT") {
            return;
        }
        let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
        // A family's lines come together; the same name after its samples is the family
        // again, from another registry or collector, and merges by name when resolved.
        let continues = self
            .current
            .as_ref()
            .is_some_and(|current| current.name == name && current.target.is_none());
        if !continues {
            self.current = Some(Current {
                name: name.to_string(),
                kind: None,
                help: None,
                target: None,
            });
        }
        let Some(current) = self.current.as_mut() else {
            return;
        };
        match keyword {
            "HELP" => current.help = Some(text.to_string()),
            "TYPE" => current.kind = Some(OpenMetricsType::parse(text)),
            _ => {}
        }
    }

    fn read_sample(&mut self, line: &str) {
        let Some(raw) = RawSample::parse(line) else {
            tracing::debug!(line, "metrics: malformed sample left out");
            return;
        };
        let Some(current) = self.current.as_mut() else {
            tracing::debug!(line, "metrics: sample of no family left out");
            return;
        };
        let kind = current.kind.unwrap_or(OpenMetricsType::Unknown);
        let part = match raw.name.strip_prefix(current.name.as_str()) {
            Some(suffix) => Part::of(kind, suffix),
            None => None,
        };
        let part = match part {
            Some(Some(part)) => part,
            Some(None) => return,
            None => {
                tracing::debug!(
                    line,
                    family = current.name,
                    "metrics: sample not of its family left out"
                );
                return;
            }
        };
        let target = match current.target {
            Some(target) => target,
            None => {
                let target = resolve(current, &mut self.families, &mut self.by_name);
                current.target = Some(target);
                target
            }
        };
        let Some(index) = target else {
            return;
        };
        let family = &mut self.families[index];
        match raw.into_sample(part, family.kind) {
            Some((labels, sample)) => family.push(labels, sample),
            None => tracing::debug!(line, "metrics: sample with a malformed value left out"),
        }
    }

    fn write(mut self) -> String {
        self.families.retain(|family| !family.series.is_empty());
        self.families.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = String::new();
        for family in &mut self.families {
            family.write(&mut out);
        }
        out
    }
}

/// The family the samples of `current` go to in the text format: a new one, or the one
/// already of that name and type (two registrations of one family merge, as one family);
/// `None` when they are left out.
fn resolve(
    current: &Current,
    families: &mut Vec<Family>,
    by_name: &mut HashMap<String, usize>,
) -> Option<usize> {
    let base = &current.name;
    let (name, kind) = match current.kind.unwrap_or(OpenMetricsType::Unknown) {
        OpenMetricsType::Counter => (format!("{base}_total"), Kind::Counter),
        OpenMetricsType::Info => (format!("{base}_info"), Kind::Gauge),
        OpenMetricsType::Gauge | OpenMetricsType::StateSet => (base.clone(), Kind::Gauge),
        OpenMetricsType::Histogram => (base.clone(), Kind::Histogram),
        OpenMetricsType::Summary => (base.clone(), Kind::Summary),
        OpenMetricsType::Unknown => (base.clone(), Kind::Untyped),
        OpenMetricsType::GaugeHistogram => {
            tracing::debug!(
                family = base,
                "metrics: gauge histogram left out of the text format"
            );
            return None;
        }
    };
    if let Some(&index) = by_name.get(&name) {
        if families[index].kind == kind {
            return Some(index);
        }
        tracing::debug!(
            family = name,
            "metrics: a second family of this name and another type left out"
        );
        return None;
    }
    by_name.insert(name.clone(), families.len());
    families.push(Family {
        name,
        kind,
        help: current.help.clone().unwrap_or_default(),
        series: Vec::new(),
        by_labels: HashMap::new(),
    });
    Some(families.len() - 1)
}

impl Family {
    fn push(&mut self, labels: Vec<Label>, sample: Sample) {
        let index = match self.by_labels.get(&labels) {
            Some(&index) => index,
            None => {
                self.by_labels.insert(labels.clone(), self.series.len());
                self.series.push(Series {
                    labels,
                    samples: Vec::new(),
                });
                self.series.len() - 1
            }
        };
        self.series[index].samples.push(sample);
    }

    fn write(&mut self, out: &mut String) {
        out.push_str("# HELP ");
        out.push_str(&self.name);
        out.push(' ');
        push_escaped_help(out, &upstream_help(&self.help));
        out.push_str("\n# TYPE ");
        out.push_str(&self.name);
        out.push(' ');
        out.push_str(self.kind.as_str());
        out.push('\n');
        self.series.sort_by(go_series_order);
        for series in &mut self.series {
            // Stable: buckets and quantiles keep their order.
            series.samples.sort_by_key(|sample| sample.part.rank());
            for sample in &series.samples {
                write_sample(out, &self.name, &series.labels, sample);
            }
        }
    }
}

/// client_golang's series order: fewer labels first, then label values in label-name order.
/// (Values compare as written, escaped; they differ from Go's order only around a `\`.)
fn go_series_order(a: &Series, b: &Series) -> Ordering {
    a.labels.len().cmp(&b.labels.len()).then_with(|| {
        a.labels
            .iter()
            .map(|(_, value)| value)
            .cmp(b.labels.iter().map(|(_, value)| value))
    })
}

fn write_sample(out: &mut String, family: &str, labels: &[Label], sample: &Sample) {
    out.push_str(family);
    out.push_str(sample.part.suffix());
    let bound = sample.bound.as_ref().map(|(name, value)| (*name, value.as_str()));
    let mut pairs = labels
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .chain(bound)
        .peekable();
    if pairs.peek().is_some() {
        out.push('{');
        for (i, (name, value)) in pairs.enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(name);
            out.push_str("=\"");
            out.push_str(value);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&go_float(sample.value));
    if let Some(ms) = sample.timestamp_ms {
        out.push(' ');
        out.push_str(&ms.to_string());
    }
    out.push('\n');
}

/// The text format escapes `\` and line breaks in help texts.
fn push_escaped_help(out: &mut String, help: &str) {
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `v` as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it, with expfmt's special
/// values: the shortest digits that read back as `v`, in exponent form when the decimal
/// exponent is below -4 or at least 6 (`1e+06`, `1.5e-05`), plain otherwise.
pub(super) fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let scientific = format!("{v:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return scientific;
    };
    let Ok(exponent) = exponent.parse::<i32>() else {
        return scientific;
    };
    if (-4..6).contains(&exponent) {
        // Display writes the same shortest digits without an exponent.
        return format!("{v}");
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

/// One sample line of OpenMetrics, split up.
struct RawSample<'a> {
    name: &'a str,
    labels: Vec<Label>,
    value: &'a str,
    timestamp: Option<&'a str>,
}

impl<'a> RawSample<'a> {
    /// `name{labels} value [timestamp] [# exemplar]`.
    fn parse(line: &'a str) -> Option<Self> {
        let name_end = line.find(['{', ' '])?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return None;
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(after_brace) = rest.strip_prefix('{') {
            let (parsed, after_labels) = parse_labels(after_brace)?;
            labels = parsed;
            rest = after_labels;
        }
        let rest = rest.strip_prefix(' ')?;
        let rest = rest.split(" # ").next().unwrap_or(rest);
        let mut tokens = rest.split_ascii_whitespace();
        let value = tokens.next()?;
        let timestamp = tokens.next();
        if tokens.next().is_some() {
            return None;
        }
        Some(Self {
            name,
            labels,
            value,
            timestamp,
        })
    }

    /// The series' labels (sorted, without the part's bound label) and the sample.
    fn into_sample(self, part: Part, kind: Kind) -> Option<(Vec<Label>, Sample)> {
        let mut labels = self.labels;
        let bound = match part.bound_label(kind) {
            Some(bound_name) => {
                let position = labels.iter().position(|(name, _)| name == bound_name)?;
                let (_, written) = labels.remove(position);
                Some((bound_name, go_float(parse_number(&written)?)))
            }
            None => None,
        };
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        let timestamp_ms = match self.timestamp {
            Some(seconds) => Some(milliseconds(parse_number(seconds)?)?),
            None => None,
        };
        let sample = Sample {
            part,
            bound,
            value: parse_number(self.value)?,
            timestamp_ms,
        };
        Some((labels, sample))
    }
}

/// A number as OpenMetrics writes it (`+Inf`, `-Inf`, `NaN` included).
fn parse_number(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if text
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E')) =>
        {
            text.parse().ok()
        }
        _ => None,
    }
}

/// OpenMetrics' seconds as the text format's milliseconds.
fn milliseconds(seconds: f64) -> Option<i64> {
    let ms = (seconds * 1000.0).round();
    // i64's range, which every finite timestamp of this era is far inside.
    (ms.is_finite() && ms.abs() < 9.0e18).then_some(ms as i64)
}

/// `name="value",...}` up to and without the closing brace: the labels, values still
/// escaped, and the text after the brace.
fn parse_labels(mut rest: &str) -> Option<(Vec<Label>, &str)> {
    let mut labels = Vec::new();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (name, after_name) = rest.split_once('=')?;
        if !is_label_name(name) {
            return None;
        }
        let value_and_rest = after_name.strip_prefix('"')?;
        let end = closing_quote(value_and_rest)?;
        labels.push((name.to_string(), value_and_rest[..end].to_string()));
        rest = &value_and_rest[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// The byte index of the first `"` not escaped by a `\`.
fn closing_quote(text: &str) -> Option<usize> {
    let mut escaped = false;
    for (index, byte) in text.bytes().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(index),
            _ => {}
        }
    }
    None
}

fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}
