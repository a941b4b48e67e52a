//! The values the proxy actually uses, read through the mode.
//!
//! In v1alpha1 several settings exist once per mode (`iptables.syncPeriod`,
//! `nftables.syncPeriod`, `ipvs.syncPeriod`, ...) and upstream uses the section of the active
//! mode (ipvs takes its masquerade bit from the iptables section). Callers should ask here
//! rather than pick a section themselves.

use ipnet::IpNet;

use crate::defaults::{MASQUERADE_BIT, OOM_SCORE_ADJ};
use crate::duration::GoDuration;
use crate::logging::{LogFormat, UnknownLogFormat};
use crate::mode::{LocalMode, ModeError, ProxyMode};
use crate::types::KubeProxyConfiguration;

/// Which v1alpha1 section holds the sync periods and masquerade settings for a mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Section {
    Iptables,
    Ipvs,
    Nftables,
}

impl Section {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Ipvs => "ipvs",
            Self::Nftables => "nftables",
        }
    }
}

impl KubeProxyConfiguration {
    pub fn proxy_mode(&self) -> Result<ProxyMode, ModeError> {
        ProxyMode::parse(&self.mode)
    }

    pub fn local_mode(&self) -> Result<LocalMode, ModeError> {
        LocalMode::parse(&self.detect_local_mode)
    }

    pub(crate) fn section(&self) -> Section {
        // A mode that does not parse never runs (validation refuses it).
        self.proxy_mode().map_or(Section::Iptables, ProxyMode::section)
    }

    /// The active mode's full-resync interval.
    pub fn sync_period(&self) -> GoDuration {
        match self.section() {
            Section::Iptables => self.iptables.sync_period,
            Section::Ipvs => self.ipvs.sync_period,
            Section::Nftables => self.nftables.sync_period,
        }
    }

    /// The active mode's minimum interval between syncs.
    pub fn min_sync_period(&self) -> GoDuration {
        match self.section() {
            Section::Iptables => self.iptables.min_sync_period,
            Section::Ipvs => self.ipvs.min_sync_period,
            Section::Nftables => self.nftables.min_sync_period,
        }
    }

    pub fn masquerade_all(&self) -> bool {
        match self.section() {
            Section::Nftables => self.nftables.masquerade_all,
            Section::Iptables | Section::Ipvs => self.iptables.masquerade_all,
        }
    }

    /// The fwmark bit for SNAT (ipvs uses the iptables section's bit, as upstream).
    pub fn masquerade_bit(&self) -> i32 {
        let bit = match self.section() {
            Section::Nftables => self.nftables.masquerade_bit,
            Section::Iptables | Section::Ipvs => self.iptables.masquerade_bit,
        };
        bit.unwrap_or(MASQUERADE_BIT)
    }

    pub fn localhost_node_ports(&self) -> bool {
        self.iptables.localhost_node_ports.unwrap_or(true)
    }

    pub fn oom_score_adj(&self) -> i32 {
        self.oom_score_adj.unwrap_or(OOM_SCORE_ADJ)
    }

    /// The cluster CIDRs that parse (validation rejects the others).
    pub fn cluster_cidrs(&self) -> Vec<IpNet> {
        split_list(&self.cluster_cidr)
            .filter_map(|cidr| cidr.parse().ok())
            .collect()
    }

    /// The ipvs scheduler, blank meaning round robin.
    pub fn ipvs_scheduler(&self) -> &str {
        match self.ipvs.scheduler.as_str() {
            "" => "rr",
            other => other,
        }
    }

    /// `logging.format`; missing means text, as component-base defaults it.
    pub fn log_format(&self) -> Result<LogFormat, UnknownLogFormat> {
        match self.logging.get("format") {
            None | Some(serde_json::Value::Null) => Ok(LogFormat::Text),
            Some(serde_json::Value::String(name)) => LogFormat::parse(name),
            Some(other) => Err(UnknownLogFormat(other.to_string())),
        }
    }

    /// `logging.verbosity` (the `-v` level); 0 when missing or not a number.
    pub fn verbosity(&self) -> u32 {
        self.logging
            .get("verbosity")
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(0)
    }
}

/// Splits a comma-separated setting; blank means none.
pub(crate) fn split_list(text: &str) -> impl Iterator<Item = &str> {
    text.split(',')
        .filter(|part| !text.is_empty() || !part.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_period_follows_the_mode() {
        let mut c = KubeProxyConfiguration::default();
        c.iptables.sync_period = GoDuration::from_secs(10);
        c.ipvs.sync_period = GoDuration::from_secs(20);
        c.nftables.sync_period = GoDuration::from_secs(40);
        assert_eq!(c.sync_period(), GoDuration::from_secs(10));
        c.mode = "ipvs".into();
        assert_eq!(c.sync_period(), GoDuration::from_secs(20));
        c.mode = "nftables".into();
        assert_eq!(c.sync_period(), GoDuration::from_secs(40));
        c.mode = "userspace".into();
        assert_eq!(c.sync_period(), GoDuration::from_secs(10));
    }

    #[test]
    fn masquerade_settings_follow_the_mode() {
        let mut c = KubeProxyConfiguration::default();
        c.iptables.masquerade_bit = Some(3);
        c.nftables.masquerade_bit = Some(5);
        c.nftables.masquerade_all = true;
        assert_eq!(c.masquerade_bit(), 3);
        assert!(!c.masquerade_all());
        c.mode = "ipvs".into();
        assert_eq!(c.masquerade_bit(), 3, "ipvs uses the iptables bit");
        c.mode = "nftables".into();
        assert_eq!(c.masquerade_bit(), 5);
        assert!(c.masquerade_all());
    }

    #[test]
    fn cluster_cidrs_split_on_commas() {
        let mut c = KubeProxyConfiguration::default();
        assert!(c.cluster_cidrs().is_empty());
        c.cluster_cidr = "10.0.0.0/8,fd00::/48".into();
        let cidrs = c.cluster_cidrs();
        assert_eq!(cidrs.len(), 2);
        assert_eq!(cidrs[1].to_string(), "fd00::/48");
    }

    #[test]
    fn blank_scheduler_is_round_robin() {
        let mut c = KubeProxyConfiguration::default();
        assert_eq!(c.ipvs_scheduler(), "rr");
        c.ipvs.scheduler = "lc".into();
        assert_eq!(c.ipvs_scheduler(), "lc");
    }
}
