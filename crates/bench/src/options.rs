//! The iptables options of the benchmarked node: upstream's defaults plus what a typical
//! cluster sets (`--cluster-cidr`, so cluster-IP traffic from outside the pod network is
//! masqueraded as on most real nodes; the node's own address comes with its Node object).

use ipnet::IpNet;
use kpr_host::LocalDetector;
use kpr_iptables::IptablesOptions;

use crate::cluster::CLUSTER_CIDR;

pub fn bench_options() -> IptablesOptions {
    let cluster_cidr: IpNet = CLUSTER_CIDR
        .parse()
        .unwrap_or_else(|e| unreachable!("the constant {CLUSTER_CIDR} is a CIDR: {e}"));
    IptablesOptions {
        local_detector: LocalDetector::ClusterCidr(vec![cluster_cidr]),
        ..IptablesOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use kpr_iptables::LocalMatch;

    use super::*;

    #[test]
    fn options_are_valid_and_detect_the_pod_network() {
        let opts = bench_options();
        assert_eq!(opts.validate(), Ok(()));
        assert_eq!(
            opts.local_detector.if_not_local(opts.family),
            Some(vec!["!".to_string(), "-s".to_string(), CLUSTER_CIDR.to_string()])
        );
    }
}
