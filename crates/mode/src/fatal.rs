//! Why the process exits early, and with which code: 2 when the operator must change the
//! command line or config, 1 when the environment failed us.

use kpr_config::ConfigError;

#[derive(Debug)]
pub struct Fatal {
    pub code: u8,
    pub message: String,
}

impl Fatal {
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    pub fn runtime(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }

    pub fn from_config(error: ConfigError) -> Self {
        Self {
            code: u8::try_from(error.exit_code()).unwrap_or(1),
            message: error.to_string(),
        }
    }
}
