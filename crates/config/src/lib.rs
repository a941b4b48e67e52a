//! kube-proxy's configuration: upstream's flags and `KubeProxyConfiguration` file.
//!
//! Operators move from upstream kube-proxy by keeping their DaemonSet flags and ConfigMap, so
//! names, defaults, duration notation and validation follow upstream
//! (`kubeproxy.config.k8s.io/v1alpha1`). [`load`] turns a command line into validated
//! [`Settings`]: upstream defaults, then the `--config` file, then the flags that were
//! explicitly given. Nothing here touches the network or the kernel.

mod defaults;
mod duration;
mod effective;
mod error;
mod file;
mod flags;
mod gates;
mod hostport;
mod load;
mod logging;
mod mode;
mod types;
mod validate;

pub use defaults::{
    HEALTHZ_PORT, MASQUERADE_BIT, METRICS_PORT, NODE_PORT_ADDRESS_KEYWORDS, NODE_PORT_ADDRESSES_ALL,
    NODE_PORT_ADDRESSES_LOCALHOST, NODE_PORT_ADDRESSES_PRIMARY, OOM_SCORE_ADJ, PROTOBUF_CONTENT_TYPE,
    apply_defaults, apply_platform_defaults,
};
pub use duration::{DurationError, GoDuration};
pub use error::{ConfigError, FieldError, Origin};
pub use file::{
    DecodedFile, Strictness, decode_config, from_json_value, read_config_file, to_yaml, write_config_file,
};
pub use flags::{Flags, parse_feature_gates, parse_go_bool, parse_port_range, proxy_port_range};
pub use gates::{FeatureGates, Gate};
pub use load::{Settings, load, settings_from_flags};
pub use logging::{LogFormat, UnknownLogFormat};
pub use mode::{LocalMode, ModeError, ProxyMode};
pub use types::{
    API_VERSION, ClientConnectionConfiguration, DetectLocalConfiguration, GROUP_NAME, KIND,
    KubeProxyConfiguration, KubeProxyConntrackConfiguration, KubeProxyIPTablesConfiguration,
    KubeProxyIPVSConfiguration, KubeProxyNFTablesConfiguration, KubeProxyWinkernelConfiguration,
};
pub use validate::validate;
