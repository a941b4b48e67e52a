//! Content negotiation on `Accept` (RFC 9110 12.5.1), between the two formats offered.
//!
//! The header is untrusted: any text gives an answer, and the work is linear in its length.

use super::Format;

/// `application/openmetrics-text`, the OpenMetrics media type.
const OPENMETRICS: (&str, &str) = ("application", "openmetrics-text");
/// The OpenMetrics version prometheus-client writes.
const OPENMETRICS_VERSION: &str = "1.0.0";
/// The text format's version.
const TEXT_VERSION: &str = "0.0.4";

pub(super) fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Format {
    let mut text = Best::default();
    let mut openmetrics = Best::default();
    for value in accept {
        for range in split_outside_quotes(value, ',').filter_map(MediaRange::parse) {
            text.offer(range.text_specificity(), range.quality);
            openmetrics.offer(range.openmetrics_specificity(), range.quality);
        }
    }
    if openmetrics.quality() > text.quality() {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// The most specific range matching one format so far, and its quality.
#[derive(Default)]
struct Best {
    /// (specificity, quality in thousandths); `None` while no range matched.
    matched: Option<(u8, u16)>,
}

impl Best {
    fn offer(&mut self, specificity: Option<u8>, quality: u16) {
        let Some(specificity) = specificity else {
            return;
        };
        self.matched = Some(match self.matched {
            // A more specific range overrides; one as specific (a repeated range) counts
            // with the better of the two qualities.
            Some((best, q)) if best > specificity => (best, q),
            Some((best, q)) if best == specificity => (best, q.max(quality)),
            _ => (specificity, quality),
        });
    }

    /// 0 (not acceptable) when no range matched.
    fn quality(&self) -> u16 {
        self.matched.map_or(0, |(_, quality)| quality)
    }
}

/// One media range of an `Accept` header: type, subtype, the `version` parameter, quality.
#[derive(Debug, PartialEq, Eq)]
struct MediaRange<'a> {
    kind: &'a str,
    subtype: &'a str,
    version: Option<&'a str>,
    /// In thousandths, as the RFC limits its precision (1000 = q=1).
    quality: u16,
}

impl<'a> MediaRange<'a> {
    /// `None` for text that is not a media range, or has a malformed quality: such a range
    /// is ignored rather than guessed at.
    fn parse(text: &'a str) -> Option<Self> {
        let mut parts = split_outside_quotes(text, ';');
        let (kind, subtype) = parts.next()?.trim().split_once('/')?;
        let (kind, subtype) = (kind.trim(), subtype.trim());
        if kind.is_empty() || subtype.is_empty() || (kind == "*" && subtype != "*") {
            return None;
        }
        let mut range = Self {
            kind,
            subtype,
            version: None,
            quality: 1000,
        };
        for parameter in parts {
            let Some((name, value)) = parameter.split_once('=') else {
                continue;
            };
            let value = unquote(value.trim());
            match name.trim() {
                name if name.eq_ignore_ascii_case("q") => {
                    range.quality = parse_quality(value)?;
                    // Parameters after the weight are accept extensions, not the type's.
                    break;
                }
                name if name.eq_ignore_ascii_case("version") => range.version = Some(value),
                _ => {}
            }
        }
        Some(range)
    }

    /// How specifically this range names the text format: 3 with its version, 2 without
    /// one, 1 for `text/*`, 0 for `*/*`; `None` when it does not match it.
    fn text_specificity(&self) -> Option<u8> {
        if self.is("text", "plain") {
            return self.versioned(TEXT_VERSION);
        }
        match (self.kind, self.subtype) {
            (kind, "*") if kind.eq_ignore_ascii_case("text") => Some(1),
            ("*", "*") => Some(0),
            _ => None,
        }
    }

    /// As [`Self::text_specificity`] for OpenMetrics, which only a range naming its type
    /// selects: wildcards stand for the default, the text format.
    fn openmetrics_specificity(&self) -> Option<u8> {
        if self.is(OPENMETRICS.0, OPENMETRICS.1) {
            self.versioned(OPENMETRICS_VERSION)
        } else {
            None
        }
    }

    fn is(&self, kind: &str, subtype: &str) -> bool {
        self.kind.eq_ignore_ascii_case(kind) && self.subtype.eq_ignore_ascii_case(subtype)
    }

    /// 3 when the range asks for `version`, 2 when it names none, `None` for another one.
    fn versioned(&self, version: &str) -> Option<u8> {
        match self.version {
            None => Some(2),
            Some(asked) if asked == version => Some(3),
            Some(_) => None,
        }
    }
}

/// `q=0.5` as thousandths: "0" or "1", optionally with up to three decimals (RFC 9110
/// 12.4.2); anything else is malformed.
fn parse_quality(text: &str) -> Option<u16> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths: u16 = format!("{fraction:0<3}").parse().ok()?;
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// A parameter value without the quotes of a quoted string (escapes inside are kept: no
/// version or quality needs them).
fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

/// `text` split at each `separator` outside a quoted string (a parameter value may be one
/// and hold the separator).
fn split_outside_quotes(text: &str, separator: char) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let text = rest?;
        let mut quoted = false;
        let mut escaped = false;
        for (index, c) in text.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                c if c == separator && !quoted => {
                    rest = Some(&text[index + c.len_utf8()..]);
                    return Some(&text[..index]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(accept: &[&str]) -> Format {
        negotiate(accept.iter().copied())
    }

    #[test]
    fn the_text_format_unless_openmetrics_is_asked_for() {
        assert_eq!(format(&[]), Format::Text);
        assert_eq!(format(&[""]), Format::Text);
        assert_eq!(format(&["*/*"]), Format::Text);
        assert_eq!(format(&["text/plain"]), Format::Text);
        assert_eq!(format(&["text/plain; version=0.0.4"]), Format::Text);
        assert_eq!(format(&["application/json"]), Format::Text);
        assert_eq!(format(&["application/openmetrics-text"]), Format::OpenMetrics);
        assert_eq!(
            format(&["application/openmetrics-text; version=1.0.0"]),
            Format::OpenMetrics
        );
        assert_eq!(
            format(&["Application/OpenMetrics-Text;Version=1.0.0;charset=utf-8"]),
            Format::OpenMetrics
        );
    }

    #[test]
    fn wildcards_and_other_versions_do_not_select_openmetrics() {
        assert_eq!(format(&["application/*"]), Format::Text);
        assert_eq!(
            format(&["application/openmetrics-text; version=0.0.1"]),
            Format::Text
        );
        assert_eq!(
            format(&["application/openmetrics-text; version=2.0.0"]),
            Format::Text
        );
        // A text version this server does not write leaves OpenMetrics the only match.
        assert_eq!(
            format(&["text/plain;version=1.0.0, application/openmetrics-text;q=0.1"]),
            Format::OpenMetrics
        );
    }

    #[test]
    fn qualities_decide_and_ties_go_to_the_text_format() {
        assert_eq!(
            format(&["application/openmetrics-text;q=0.2, text/plain;q=0.8"]),
            Format::Text
        );
        assert_eq!(
            format(&["text/plain;q=0.1, application/openmetrics-text; version=1.0.0; q=0.9"]),
            Format::OpenMetrics
        );
        assert_eq!(
            format(&["application/openmetrics-text;q=0.5, text/plain;q=0.5"]),
            Format::Text
        );
        // Prometheus 2's scrape header, and Prometheus 3's (proto first, which is not offered).
        assert_eq!(
            format(&[
                "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,\
                 text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
            ]),
            Format::OpenMetrics
        );
        assert_eq!(
            format(&[
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,\
                 application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,\
                 application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,\
                 text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
            ]),
            Format::OpenMetrics
        );
    }

    #[test]
    fn the_most_specific_range_gives_a_formats_quality() {
        // text/plain is refused outright; the wildcard does not bring it back.
        assert_eq!(
            format(&["text/plain;q=0, */*, application/openmetrics-text;q=0.1"]),
            Format::OpenMetrics
        );
        // The versioned range overrides the bare one.
        assert_eq!(
            format(&["text/plain;version=0.0.4;q=0.1, text/plain;q=1, application/openmetrics-text;q=0.5"]),
            Format::OpenMetrics
        );
        // Refusing OpenMetrics keeps the text format even at a low quality.
        assert_eq!(
            format(&["application/openmetrics-text;q=0, text/plain;q=0.001"]),
            Format::Text
        );
        // Nothing acceptable: the text format anyway, as upstream answers.
        assert_eq!(
            format(&["text/plain;q=0, application/openmetrics-text;q=0"]),
            Format::Text
        );
    }

    #[test]
    fn the_header_may_come_in_several_values() {
        assert_eq!(
            format(&["text/plain;q=0.3", "application/openmetrics-text;q=0.6"]),
            Format::OpenMetrics
        );
    }

    #[test]
    fn malformed_ranges_are_ignored_not_guessed_at() {
        for accept in [
            "application/openmetrics-text;q=2",
            "application/openmetrics-text;q=-1",
            "application/openmetrics-text;q=0.0001",
            "application/openmetrics-text;q=nan",
            "application/openmetrics-text;q=",
            "application/openmetrics-text;q=1.5",
            "openmetrics",
            "*/openmetrics-text",
            "/",
            ";;;,,,",
            "application/openmetrics-text;version=\"1.0.0",
        ] {
            assert_eq!(format(&[accept]), Format::Text, "{accept}");
        }
        // A comma inside a quoted parameter does not split the range.
        assert_eq!(
            format(&["application/openmetrics-text;x=\"a,text/plain\";q=0.9, text/plain;q=0.5"]),
            Format::OpenMetrics
        );
        assert_eq!(
            format(&["application/openmetrics-text;version=\"1.0.0\""]),
            Format::OpenMetrics
        );
        // Parameters after q are extensions: a version there is not the range's.
        assert_eq!(
            format(&["application/openmetrics-text;q=0.9;version=0.0.1"]),
            Format::OpenMetrics
        );
    }

    #[test]
    fn qualities_parse_as_the_rfc_writes_them() {
        assert_eq!(parse_quality("1"), Some(1000));
        assert_eq!(parse_quality("1.000"), Some(1000));
        assert_eq!(parse_quality("0"), Some(0));
        assert_eq!(parse_quality("0.5"), Some(500));
        assert_eq!(parse_quality("0.25"), Some(250));
        assert_eq!(parse_quality("0.001"), Some(1));
        assert_eq!(parse_quality("0."), Some(0));
        for bad in ["1.001", "2", "", ".5", "0.5x", "+0.5", "0.+5", "00.5"] {
            assert_eq!(parse_quality(bad), None, "{bad}");
        }
    }

    /// A header of 100 000 ranges is answered, in linear time.
    #[test]
    fn a_huge_header_is_answered() {
        let huge = "text/html;q=0.1,".repeat(100_000) + "application/openmetrics-text";
        assert_eq!(format(&[&huge]), Format::OpenMetrics);
        let quotes = "\"".repeat(100_001);
        assert_eq!(format(&[&quotes]), Format::Text);
    }
}
