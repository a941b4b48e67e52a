//! IPVS leftovers on a kernel that has IPVS: this host's kernel has none, so these tests
//! run inside a throw-away guest booting Debian's kernel (kpr-vm), in a namespace made
//! there; `ipvsadm` (Debian's) sets up and then shows the virtual services.

#![allow(clippy::unwrap_used)]

use kpr_ipvs::leftovers::remove_all;
use kpr_ipvs_netlink::IPVS_LINK;
use kpr_netns::Netns;
use kpr_vm::in_guest;

#[test]
fn upstreams_virtual_services_go_with_kube_ipvs0_and_foreign_ones_stay() {
    in_guest(
        "upstreams_virtual_services_go_with_kube_ipvs0_and_foreign_ones_stay",
        || {
            let node = Netns::new("ipvs").unwrap();
            node.sh(
                "ip link add kube-ipvs0 type dummy && ip addr add 10.96.0.1/32 dev kube-ipvs0 && \
             ip addr add fd00:96::1/128 dev kube-ipvs0 && \
             ipvsadm -A -t 10.96.0.1:80 -s rr && ipvsadm -a -t 10.96.0.1:80 -r 10.0.0.2:8080 -m && \
             ipvsadm -A -u 10.96.0.1:53 -s rr && ipvsadm -A -t [fd00:96::1]:443 -s rr && \
             ipvsadm -A -t 192.0.2.9:80 -s rr && ipvsadm -A -f 7 -s rr && \
             ipset create KUBE-CLUSTER-IP hash:ip,port",
            )
            .expect("making IPVS leftovers needs ip_vs, dummy, ipset and ipvsadm in the guest");

            let report = node.run(remove_all);
            assert!(report.failures.is_empty(), "{:?}", report.failures);
            let mut removed = report.removed.clone();
            removed.sort();
            assert_eq!(
                removed,
                [
                    "IPVS service TCP 10.96.0.1:80",
                    "IPVS service TCP [fd00:96::1]:443",
                    "IPVS service UDP 10.96.0.1:53",
                    "ipset KUBE-CLUSTER-IP",
                    "link kube-ipvs0",
                ]
            );
            let left = node.sh("ipvsadm -Ln").unwrap();
            assert!(
                !left.contains("10.96.0.1") && !left.contains("fd00:96::1"),
                "{left}"
            );
            assert!(
                left.contains("TCP  192.0.2.9:80 rr"),
                "a service off kube-ipvs0 stays:\n{left}"
            );
            assert!(
                left.contains("FWM  7 rr"),
                "a firewall-mark service stays:\n{left}"
            );
            assert!(node.ip(&["link", "show", IPVS_LINK]).is_err());

            let again = node.run(remove_all);
            assert!(again.failures.is_empty() && again.removed.is_empty(), "{again:?}");
        },
    );
}
