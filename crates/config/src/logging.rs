//! The log format (`--logging-format`, the file's `logging.format`), as an enum.
//!
//! Upstream's component-base `LoggingConfiguration` carries it as a string; log pipelines
//! built for upstream parse its `json` lines, so the names and the default (`text`) are
//! upstream's. The rest of `logging` (flush frequency, vmodule, JSON stream options) is kept
//! as it came and not acted on.

use std::fmt;

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, shaped as component-base's JSON logger writes them.
    Json,
}

/// A format name component-base does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unsupported log format {0:?}: {SUPPORTED}")]
pub struct UnknownLogFormat(pub String);

/// component-base's list, as its validation error words it.
pub const SUPPORTED: &str = "supported values: \"json\", \"text\"";

impl LogFormat {
    /// Parses upstream's format name; blank means text, as component-base defaults it.
    pub fn parse(text: &str) -> Result<Self, UnknownLogFormat> {
        match text {
            "" | "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(UnknownLogFormat(other.to_string())),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_parse_and_blank_is_text() {
        assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse("json"), Ok(LogFormat::Json));
        assert_eq!(LogFormat::parse(""), Ok(LogFormat::Text));
        assert_eq!(LogFormat::Json.to_string(), "json");
    }

    #[test]
    fn unknown_formats_are_named_with_the_supported_ones() {
        for bad in ["JSON", "xml", " json"] {
            let error = LogFormat::parse(bad).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("unsupported log format {bad:?}: supported values: \"json\", \"text\"")
            );
        }
    }
}
