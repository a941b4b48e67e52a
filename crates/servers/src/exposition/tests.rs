//! The two formats against golden text, and the text format against the rules a Prometheus
//! parser (and `promtool check metrics`) holds it to.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::text004::{from_openmetrics, go_float};
use super::*;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyLabels {
    ip_family: &'static str,
}

/// Declared out of name order: the text format sorts them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZoneLabels {
    zone: &'static str,
    ip_family: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

/// A constant counter written at scrape time, as iptables mode's nfacct collector writes
/// its counters (help text passed as is, without prometheus-client's '.').
#[derive(Debug)]
struct PacketsCollector;

impl Collector for PacketsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counter = ConstCounter::new(42u64);
        let metric = encoder.encode_descriptor(
            "iptables_ct_state_invalid_dropped_packets",
            "packets dropped by iptables to work around conntrack problems",
            None,
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

/// One of each kind of metric, registered out of name order.
fn every_kind() -> Registry {
    let mut registry = Registry::default();

    let kubeproxy = registry.sub_registry_with_prefix("kubeproxy");
    let changes = Family::<FamilyLabels, Counter>::default();
    kubeproxy.register(
        "sync_proxy_rules_endpoint_changes",
        "Cumulative proxy rules Endpoint changes",
        changes.clone(),
    );
    changes
        .get_or_create(&FamilyLabels { ip_family: "IPv6" })
        .inc_by(2);
    changes
        .get_or_create(&FamilyLabels { ip_family: "IPv4" })
        .inc_by(5);
    kubeproxy.register_collector(Box::new(PacketsCollector));
    // Registered, never set: no series, so no family in either format.
    kubeproxy.register(
        "never_counted",
        "Nothing yet",
        Family::<FamilyLabels, Counter>::default(),
    );

    let histogram = Family::<ZoneLabels, Histogram>::new_with_constructor(|| {
        Histogram::new([0.001, 0.25, 1.0, 16.384, 1e6])
    });
    registry.register("sync_seconds", "Sync latency", histogram.clone());
    let series = histogram.get_or_create(&ZoneLabels {
        zone: "a",
        ip_family: "IPv4",
    });
    // Exact in binary, so the sum is too.
    for seconds in [0.0009765625, 0.25, 3.0] {
        series.observe(seconds);
    }

    let depth: Gauge = Gauge::default();
    depth.set(7);
    registry.register("queue_depth", "Items queued", depth);

    let last_sync = Family::<FamilyLabels, Gauge<f64, AtomicU64>>::default();
    last_sync
        .get_or_create(&FamilyLabels { ip_family: "IPv4" })
        .set(1_712_345_678.5);
    registry.register("last_sync_seconds", "The last sync", last_sync);

    let stable: Gauge = Gauge::default();
    stable.set(1);
    registry.register("stable_thing", "[STABLE] Already has a level.", stable);

    let odd = Family::<PathLabels, Gauge>::default();
    odd.get_or_create(&PathLabels { path: "a\"b\\c\nd" }).set(1);
    registry.register("odd_labels", "Label values that need escaping", odd);

    registry.register(
        "build",
        "Build information",
        Info::new(VersionLabels { version: "v1" }),
    );
    registry
}

const EVERY_KIND_TEXT: &str = "\
# HELP build_info [ALPHA] Build information
# TYPE build_info gauge
build_info{version=\"v1\"} 1
# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total [ALPHA] packets dropped by iptables to work around conntrack problems
# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets_total counter
kubeproxy_iptables_ct_state_invalid_dropped_packets_total 42
# HELP kubeproxy_sync_proxy_rules_endpoint_changes_total [ALPHA] Cumulative proxy rules Endpoint changes
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter
kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"} 5
kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv6\"} 2
# HELP last_sync_seconds [ALPHA] The last sync
# TYPE last_sync_seconds gauge
last_sync_seconds{ip_family=\"IPv4\"} 1.7123456785e+09
# HELP odd_labels [ALPHA] Label values that need escaping
# TYPE odd_labels gauge
odd_labels{path=\"a\\\"b\\\\c\\nd\"} 1
# HELP queue_depth [ALPHA] Items queued
# TYPE queue_depth gauge
queue_depth 7
# HELP stable_thing [STABLE] Already has a level.
# TYPE stable_thing gauge
stable_thing 1
# HELP sync_seconds [ALPHA] Sync latency
# TYPE sync_seconds histogram
sync_seconds_bucket{ip_family=\"IPv4\",zone=\"a\",le=\"0.001\"} 1
sync_seconds_bucket{ip_family=\"IPv4\",zone=\"a\",le=\"0.25\"} 2
sync_seconds_bucket{ip_family=\"IPv4\",zone=\"a\",le=\"1\"} 2
sync_seconds_bucket{ip_family=\"IPv4\",zone=\"a\",le=\"16.384\"} 3
sync_seconds_bucket{ip_family=\"IPv4\",zone=\"a\",le=\"1e+06\"} 3
sync_seconds_bucket{ip_family=\"IPv4\",zone=\"a\",le=\"+Inf\"} 3
sync_seconds_sum{ip_family=\"IPv4\",zone=\"a\"} 3.2509765625
sync_seconds_count{ip_family=\"IPv4\",zone=\"a\"} 3
";

#[test]
fn the_text_format_is_upstreams_for_every_kind_of_metric() {
    let text = encode(&every_kind(), Format::Text).unwrap();
    assert_eq!(text, EVERY_KIND_TEXT, "got:\n{text}");
    check_text_format(&text).unwrap();
}

/// OpenMetrics stays prometheus-client's, with upstream's help texts.
#[test]
fn openmetrics_is_prometheus_clients_with_upstreams_help() {
    let registry = every_kind();
    let mut raw = String::new();
    prometheus_client::encoding::text::encode(&mut raw, &registry).unwrap();
    let text = encode(&registry, Format::OpenMetrics).unwrap();
    assert!(text.ends_with("\n# EOF\n"), "{text}");
    assert_eq!(text.lines().count(), raw.lines().count());
    for (ours, theirs) in text.lines().zip(raw.lines()) {
        if theirs.starts_with("# HELP ") {
            assert!(!ours.ends_with('.') || ours.ends_with("level."), "{ours}");
        } else {
            assert_eq!(ours, theirs);
        }
    }
    for line in [
        "# HELP kubeproxy_sync_proxy_rules_endpoint_changes [ALPHA] Cumulative proxy rules Endpoint changes",
        "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes counter",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total{ip_family=\"IPv4\"} 5",
        "# HELP stable_thing [STABLE] Already has a level.",
        "# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets [ALPHA] packets dropped by iptables to work around conntrack problems",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
}

#[test]
fn help_texts_become_upstreams() {
    assert_eq!(
        upstream_help("SyncProxyRules latency in seconds."),
        "[ALPHA] SyncProxyRules latency in seconds"
    );
    assert_eq!(upstream_help("No full stop"), "[ALPHA] No full stop");
    assert_eq!(
        upstream_help("[STABLE] This metric records the result of a single healthcheck.."),
        "[STABLE] This metric records the result of a single healthcheck."
    );
    assert_eq!(upstream_help("[BETA] Beta."), "[BETA] Beta");
    assert_eq!(upstream_help("[ALPHA]no space."), "[ALPHA] [ALPHA]no space");
    assert_eq!(upstream_help("."), "[ALPHA] ");
}

/// The proxy's own registry: every family passes the text format's rules, counters are
/// named by their `_total` samples, and every help text has a stability level and no
/// trailing '.'.
#[test]
fn the_proxys_metrics_pass_the_text_formats_rules() {
    let mut registry = Registry::default();
    let metrics = kpr_metrics::Metrics::new(&mut registry);
    let v4 = kpr_metrics::FamilyLabels { ip_family: "IPv4" };
    metrics
        .sync_proxy_rules_duration_seconds
        .get_or_create(&v4)
        .observe(0.02);
    metrics
        .network_programming_duration_seconds
        .get_or_create(&v4)
        .observe(1.5);
    metrics
        .sync_proxy_rules_endpoint_changes_total
        .get_or_create(&v4)
        .inc();
    metrics
        .sync_proxy_rules_last_timestamp_seconds
        .get_or_create(&v4)
        .set(1_712_345_678.123);
    metrics
        .proxy_healthz_total
        .get_or_create(&kpr_metrics::CodeLabels { code: "200" })
        .inc();
    let text = encode(&registry, Format::Text).unwrap();
    check_text_format(&text).unwrap();
    for line in text.lines() {
        if let Some(help) = line.strip_prefix("# HELP ") {
            let (_, help) = help.split_once(' ').unwrap();
            assert!(help.starts_with("[ALPHA] "), "{line}");
            assert!(!help.ends_with('.'), "{line}");
        }
        if let Some(counter) = line
            .strip_prefix("# TYPE ")
            .and_then(|t| t.strip_suffix(" counter"))
        {
            assert!(counter.ends_with("_total"), "{line}");
        }
    }
    for line in [
        "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter",
        "# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds",
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.032\"} 1",
        "kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"2\"} 1",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.712345678123e+09",
        "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
}

#[test]
fn an_empty_registry_is_an_empty_answer() {
    assert_eq!(encode(&Registry::default(), Format::Text).unwrap(), "");
    assert_eq!(
        encode(&Registry::default(), Format::OpenMetrics).unwrap(),
        "# EOF\n"
    );
}

/// What prometheus-client does not write today but OpenMetrics allows: the conversion
/// still gives valid text, leaving out what the text format cannot carry.
#[test]
fn openmetrics_beyond_prometheus_clients_converts_or_is_left_out() {
    let openmetrics = "\
# HELP requests Requests.
# TYPE requests counter
# UNIT requests requests
requests_total{code=\"200\"} 3 1712345678.5 # {trace_id=\"x\"} 1 1712345678
requests_created{code=\"200\"} 1712345000
# HELP latency Latency.
# TYPE latency summary
latency{quantile=\"0.5\"} 0.25
latency{quantile=\"0.99\"} 1
latency_sum 12
latency_count 40
latency_created 1712345000
# TYPE states stateset
states{states=\"a\"} 1
# HELP thing Thing.
thing 5
# TYPE gh gaugehistogram
gh_bucket{le=\"+Inf\"} 1
gh_gcount 1
# TYPE requests_total gauge
requests_total 9
# TYPE requests counter
requests_total{code=\"500\"} 1
stray_sample 1
# TYPE broken gauge
broken{a=\"1\" 2
broken{1a=\"1\"} 2
broken 1 2 3
broken one
broken 4
# EOF
ignored_after_eof 1
";
    let text = from_openmetrics(openmetrics);
    assert_eq!(
        text,
        "\
# HELP broken [ALPHA] 
# TYPE broken gauge
broken 4
# HELP latency [ALPHA] Latency
# TYPE latency summary
latency{quantile=\"0.5\"} 0.25
latency{quantile=\"0.99\"} 1
latency_sum 12
latency_count 40
# HELP requests_total [ALPHA] Requests
# TYPE requests_total counter
requests_total{code=\"200\"} 3 1712345678500
requests_total{code=\"500\"} 1
# HELP states [ALPHA] 
# TYPE states gauge
states{states=\"a\"} 1
# HELP thing [ALPHA] Thing
# TYPE thing untyped
thing 5
",
        "got:\n{text}"
    );
    check_text_format(&text).unwrap();
}

/// client_golang's order, whatever order prometheus-client's hash maps give: fewer labels
/// first, then by label values in label-name order.
#[test]
fn series_are_sorted_as_go_sorts_them() {
    let openmetrics = "\
# HELP x X.
# TYPE x gauge
x{zone=\"b\",ip_family=\"IPv4\"} 1
x{zone=\"a\",ip_family=\"IPv6\"} 2
x{zone=\"a\",ip_family=\"IPv4\"} 3
x 4
x{zone=\"z\"} 5
# EOF
";
    assert_eq!(
        from_openmetrics(openmetrics),
        "\
# HELP x [ALPHA] X
# TYPE x gauge
x 4
x{zone=\"z\"} 5
x{ip_family=\"IPv4\",zone=\"a\"} 3
x{ip_family=\"IPv4\",zone=\"b\"} 1
x{ip_family=\"IPv6\",zone=\"a\"} 2
"
    );
}

/// Values Go's `strconv.FormatFloat(v, 'g', -1, 64)` gives, as expfmt writes them.
#[test]
fn numbers_are_written_as_go_writes_them() {
    for (value, go) in [
        (1.0, "1"),
        (0.0, "0"),
        (-0.0, "0"),
        (-1.0, "-1"),
        (0.001, "0.001"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (0.000015, "1.5e-05"),
        (16.384, "16.384"),
        (123_456.0, "123456"),
        (999_999.0, "999999"),
        (1e6, "1e+06"),
        (1_234_567.0, "1.234567e+06"),
        (1_712_345_678.5, "1.7123456785e+09"),
        (1e21, "1e+21"),
        (1e100, "1e+100"),
        (-2.5e-7, "-2.5e-07"),
        (f64::MAX, "1.7976931348623157e+308"),
        (5e-324, "5e-324"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
        (f64::NAN, "NaN"),
        (0.1 + 0.2, "0.30000000000000004"),
    ] {
        assert_eq!(go_float(value), go, "{value:?}");
    }
}

#[test]
fn the_check_refuses_what_prometheus_would() {
    // prometheus-client's own OpenMetrics is not the text format.
    let mut openmetrics = String::new();
    prometheus_client::encoding::text::encode(&mut openmetrics, &every_kind()).unwrap();
    assert!(check_text_format(&openmetrics).is_err());
    for bad in [
        "x 1\n",
        "# TYPE x gauge\nx 1\n",
        "# HELP x a\nx 1\n",
        "# HELP x a\n# TYPE x gauge\n# HELP x b\nx 1\n",
        "# HELP x a\n# TYPE x gauge\nx 1\n# HELP x a\n# TYPE x gauge\nx 2\n",
        "# HELP x a\n# TYPE x counter\nx_total 1\n",
        "# HELP x a\n# TYPE x gauge\nx 1\n# EOF\n",
        "# HELP x a\n# TYPE x gauge\n# UNIT x seconds\nx 1\n",
        "# HELP x a\n# TYPE x gauge\nx{a=\"1\",a=\"2\"} 1\n",
        "# HELP x a\n# TYPE x gauge\nx{a=\"1} 1\n",
        "# HELP x a\n# TYPE x gauge\nx 1.0.0\n",
        "# HELP x a\n# TYPE x gauge\nx 1",
        "# HELP x a\n# TYPE x histogram\nx_bucket{le=\"1\"} 2\nx_bucket{le=\"+Inf\"} 1\nx_sum 1\nx_count 1\n",
        "# HELP x a\n# TYPE x histogram\nx_bucket{le=\"1\"} 1\nx_sum 1\nx_count 1\n",
        "# HELP x a\n# TYPE x histogram\nx_bucket{le=\"+Inf\"} 2\nx_sum 1\nx_count 1\n",
        "# HELP x a\n# TYPE x histogram\nx_bucket{le=\"2\"} 1\nx_bucket{le=\"1\"} 1\nx_bucket{le=\"+Inf\"} 1\nx_sum 1\nx_count 1\n",
    ] {
        assert!(check_text_format(bad).is_err(), "accepted:\n{bad}");
    }
    check_text_format("# HELP x a\n# TYPE x gauge\nx{a=\"\\\"\"} -Inf 123\n").unwrap();
}

/// The Prometheus text format 0.0.4, as Prometheus' parser and `promtool check metrics`
/// hold an exposition to it: every family once, with exactly one HELP and one TYPE line
/// before its samples; no other comments (no `# EOF`, no `# UNIT`); each sample named after
/// its family (a histogram's `_bucket`, `_sum` and `_count`, a summary's `_sum` and
/// `_count`), with well-formed, unique labels, a number, and an optional integer
/// timestamp; a histogram's buckets ascending and cumulative, ending in `+Inf`, which
/// equals its `_count`.
pub(crate) fn check_text_format(text: &str) -> Result<(), String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the last line has no line break".into());
    }
    let mut families = BTreeSet::new();
    let mut family: Option<CheckedFamily> = None;
    for (number, line) in text.lines().enumerate() {
        let fail = |why: &str| Err(format!("line {}: {why}: {line:?}", number + 1));
        if let Some(rest) = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
        {
            let is_help = line.starts_with("# HELP ");
            let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
            if !is_metric_name(name) {
                return fail("bad family name");
            }
            if family.as_ref().is_none_or(|f| f.name != name) {
                if let Some(done) = family.take() {
                    done.finish()?;
                }
                if !families.insert(name.to_string()) {
                    return fail("family seen before");
                }
                family = Some(CheckedFamily::new(name));
            }
            let Some(current) = family.as_mut() else {
                return fail("no family");
            };
            if current.samples > 0 {
                return fail("metadata after samples");
            }
            if is_help {
                if current.help {
                    return fail("second HELP");
                }
                if !help_escapes_are_valid(value) {
                    return fail("bad escape in HELP");
                }
                current.help = true;
            } else {
                if current.kind.is_some() {
                    return fail("second TYPE");
                }
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&value) {
                    return fail("unknown type");
                }
                current.kind = Some(value.to_string());
            }
            continue;
        }
        if line.starts_with('#') {
            return fail("a comment the text format does not have");
        }
        let Some(current) = family.as_mut() else {
            return fail("sample before any HELP and TYPE");
        };
        let (Some(kind), true) = (current.kind.clone(), current.help) else {
            return fail("sample of a family without HELP and TYPE");
        };
        let Some((name, labels, value)) = parse_sample(line) else {
            return fail("malformed sample");
        };
        let suffix = name.strip_prefix(current.name.as_str());
        let allowed: &[&str] = match kind.as_str() {
            "histogram" => &["_bucket", "_sum", "_count"],
            "summary" => &["", "_sum", "_count"],
            _ => &[""],
        };
        if !suffix.is_some_and(|s| allowed.contains(&s)) {
            return fail("sample not named after its family");
        }
        let unique: BTreeSet<&str> = labels.iter().map(|(n, _)| n.as_str()).collect();
        if unique.len() != labels.len() {
            return fail("repeated label");
        }
        if kind == "histogram" {
            let mut key: Vec<CheckedLabel> = labels.iter().filter(|(n, _)| n != "le").cloned().collect();
            key.sort();
            let series = current.histograms.entry(key).or_default();
            match suffix {
                Some("_bucket") => {
                    let Some((_, le)) = labels.iter().find(|(n, _)| n == "le") else {
                        return fail("bucket without le");
                    };
                    let Some(le) = parse_go_float(le) else {
                        return fail("bad le");
                    };
                    series.buckets.push((le, value));
                }
                Some("_count") => series.count = Some(value),
                _ => {}
            }
        }
        current.samples += 1;
    }
    match family {
        Some(done) => done.finish(),
        None => Ok(()),
    }
}

struct CheckedFamily {
    name: String,
    help: bool,
    kind: Option<String>,
    samples: usize,
    histograms: HashMap<Vec<CheckedLabel>, CheckedHistogram>,
}

#[derive(Default)]
struct CheckedHistogram {
    buckets: Vec<(f64, f64)>,
    count: Option<f64>,
}

impl CheckedFamily {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            help: false,
            kind: None,
            samples: 0,
            histograms: HashMap::new(),
        }
    }

    fn finish(self) -> Result<(), String> {
        if !self.help || self.kind.is_none() {
            return Err(format!("{}: HELP or TYPE missing", self.name));
        }
        for (labels, histogram) in self.histograms {
            let fail = |why: &str| Err(format!("{} {labels:?}: {why}", self.name));
            let ascending = histogram
                .buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
            if !ascending {
                return fail("buckets not ascending and cumulative");
            }
            match histogram.buckets.last() {
                Some((le, n)) if le.is_infinite() && Some(*n) == histogram.count => {}
                _ => return fail("no +Inf bucket equal to _count"),
            }
        }
        Ok(())
    }
}

/// A label, its value unescaped.
type CheckedLabel = (String, String);

/// `name{labels} value [timestamp]`: name, labels, value.
fn parse_sample(line: &str) -> Option<(String, Vec<CheckedLabel>, f64)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = inner.split_once("=\"")?;
            if !is_label_name(label) {
                return None;
            }
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (_, '\\') => match chars.next()?.1 {
                        '\\' => value.push('\\'),
                        '"' => value.push('"'),
                        'n' => value.push('\n'),
                        _ => return None,
                    },
                    (i, '"') => break i,
                    (_, '\n') => return None,
                    (_, c) => value.push(c),
                }
            };
            labels.push((label.to_string(), value));
            inner = &after[end + 1..];
            inner = match inner.strip_prefix(',') {
                Some(next) => next,
                None if inner.starts_with('}') => inner,
                None => return None,
            };
        }
    }
    let mut tokens = rest.strip_prefix(' ')?.split(' ');
    let value = parse_go_float(tokens.next()?)?;
    if let Some(timestamp) = tokens.next() {
        timestamp.parse::<i64>().ok()?;
    }
    tokens
        .next()
        .is_none()
        .then_some((name.to_string(), labels, value))
}

fn parse_go_float(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ if text.bytes().all(|b| b.is_ascii_digit() || b"+-.e".contains(&b)) => text.parse().ok(),
        _ => None,
    }
}

fn help_escapes_are_valid(help: &str) -> bool {
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        if c == '\\' && !matches!(chars.next(), Some('\\' | 'n')) {
            return false;
        }
    }
    true
}

fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
