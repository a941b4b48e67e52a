//! Errors from reading flags and the config file, each naming the file, flag or field.
//!
//! The binary prints the error and exits with [`ConfigError::exit_code`]: 2 for anything the
//! operator got wrong on the command line or in the file (a usage error), 0 for `--help`,
//! 1 for failures of the environment (writing `--write-config-to`).

use std::fmt;
use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unknown flag, bad flag value, or `--help`/`--version` (which clap reports as errors).
    #[error(transparent)]
    Cli(#[from] clap::Error),
    #[error("cannot read config file {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// The file is not a KubeProxyConfiguration we can decode.
    #[error("config file {}: {}", path.display(), decode_detail(field.as_deref(), detail))]
    Decode {
        path: PathBuf,
        /// Dotted path of the offending field ("iptables.masqueradeBit"), when known.
        field: Option<String>,
        detail: String,
    },
    /// Fields we do not know, when decoding strictly.
    #[error("config file {}: unknown field(s) {}", path.display(), fields.join(", "))]
    UnknownFields { path: PathBuf, fields: Vec<String> },
    #[error("invalid configuration: {}", join_errors(.0))]
    Invalid(Vec<FieldError>),
    #[error("cannot write config file {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("cannot encode the configuration as YAML: {0}")]
    Encode(String),
}

impl ConfigError {
    /// True when the operator must fix the command line or the config file.
    pub fn is_usage(&self) -> bool {
        match self {
            Self::Cli(e) => e.use_stderr(),
            Self::Write { .. } | Self::Encode(_) => false,
            _ => true,
        }
    }

    /// 0 for `--help`/`--version`, 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Cli(e) if !e.use_stderr() => 0,
            _ if self.is_usage() => 2,
            _ => 1,
        }
    }
}

fn decode_detail(field: Option<&str>, detail: &str) -> String {
    match field {
        Some(field) => format!("field {field}: {detail}"),
        None => detail.to_string(),
    }
}

fn join_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Where a value came from, so an error can point at what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Upstream's default (or no origin known).
    Default,
    File(PathBuf),
    Flag(&'static str),
}

/// One invalid setting: which field, what value, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted v1alpha1 path, e.g. `iptables.masqueradeBit` or `nodePortAddresses[1]`.
    pub field: String,
    pub value: String,
    pub reason: String,
    pub origin: Origin,
}

impl FieldError {
    pub fn new(field: impl Into<String>, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
            origin: Origin::Default,
        }
    }

    /// The field name without an index (`nodePortAddresses[1]` -> `nodePortAddresses`).
    pub fn base_field(&self) -> &str {
        self.field.split('[').next().unwrap_or(&self.field)
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.origin {
            Origin::Flag(flag) => write!(f, "--{flag} ({}) {:?}", self.field, self.value)?,
            Origin::File(path) => write!(f, "{} {:?} in {}", self.field, self.value, path.display())?,
            Origin::Default => write!(f, "{} {:?}", self.field, self.value)?,
        }
        write!(f, ": {}", self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_error_names_flag_or_file() {
        let mut e = FieldError::new("iptables.masqueradeBit", 40, "must be within the range [0, 31]");
        e.origin = Origin::Flag("iptables-masquerade-bit");
        assert_eq!(
            e.to_string(),
            "--iptables-masquerade-bit (iptables.masqueradeBit) \"40\": must be within the range [0, 31]"
        );
        e.origin = Origin::File(PathBuf::from("/etc/kp.yaml"));
        assert_eq!(
            e.to_string(),
            "iptables.masqueradeBit \"40\" in /etc/kp.yaml: must be within the range [0, 31]"
        );
    }

    #[test]
    fn exit_codes_separate_usage_from_environment() {
        let invalid = ConfigError::Invalid(vec![FieldError::new("mode", "x", "bad")]);
        assert!(invalid.is_usage());
        assert_eq!(invalid.exit_code(), 2);
        let write = ConfigError::Write {
            path: "/x".into(),
            source: io::Error::other("disk full"),
        };
        assert!(!write.is_usage());
        assert_eq!(write.exit_code(), 1);
    }
}
