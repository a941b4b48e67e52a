//! The client against a kernel with IPVS (a throw-away guest with Debian's kernel: this
//! host's has none), in a namespace made there. Debian's `ipvsadm` is the independent view
//! of what the kernel made of each message.

#![allow(clippy::unwrap_used)]

use kpr_ipvs_netlink::{
    Destination, FLAG_PERSISTENT, Ipvs, IpvsLinks, Protocol, Scheduler, Service, ServiceKey, Timeouts,
};
use kpr_netns::Netns;
use kpr_vm::{in_guest, squeeze_columns};

fn key(protocol: Protocol, address: &str, port: u16) -> ServiceKey {
    ServiceKey {
        protocol,
        address: address.parse().unwrap(),
        port,
    }
}

/// `ipvsadm -Ln` in `node`, columns squeezed.
fn ipvsadm_list(node: &Netns) -> String {
    squeeze_columns(&node.sh("ipvsadm -Ln").unwrap())
}

fn destination(address: &str, port: u16, weight: u32) -> Destination {
    Destination::new(address.parse().unwrap(), port, weight)
}

#[test]
fn services_and_real_servers_are_written_read_and_removed() {
    in_guest("services_and_real_servers_are_written_read_and_removed", || {
        let node = Netns::new("ipvs").unwrap();
        node.sh("modprobe ip_vs && modprobe ip_vs_sh").unwrap();
        let sticky_key = key(Protocol::Tcp, "10.96.0.1", 80);
        let mut sticky = Service::new(sticky_key, Scheduler::new("rr").unwrap());
        sticky.flags = FLAG_PERSISTENT;
        sticky.timeout = 10800;
        let dns_key = key(Protocol::Udp, "fd00::10", 53);
        let dns = Service::new(dns_key, Scheduler::new("sh").unwrap());

        node.run(|| {
            let mut ipvs = Ipvs::open().unwrap().expect("the guest kernel has IPVS");
            ipvs.add_service(&sticky).unwrap();
            ipvs.add_service(&dns).unwrap();
            ipvs.add_destination(&sticky_key, &destination("10.244.1.5", 8080, 1))
                .unwrap();
            ipvs.add_destination(&sticky_key, &destination("10.244.2.6", 8080, 1))
                .unwrap();
            ipvs.add_destination(&dns_key, &destination("fd00:244::5", 5353, 1))
                .unwrap();
            // Graceful termination: weight 0, the server stays for its connections.
            ipvs.update_destination(&sticky_key, &destination("10.244.2.6", 8080, 0))
                .unwrap();
        });
        let shown = ipvsadm_list(&node);
        for line in [
            "TCP 10.96.0.1:80 rr persistent 10800",
            "-> 10.244.1.5:8080 Masq 1 0 0",
            "-> 10.244.2.6:8080 Masq 0 0 0",
            "UDP [fd00::10]:53 sh",
            "-> [fd00:244::5]:5353 Masq 1 0 0",
        ] {
            assert!(shown.contains(line), "{line:?} not in:\n{shown}");
        }

        node.run(|| {
            let mut ipvs = Ipvs::open().unwrap().unwrap();
            let mut services = ipvs.services().unwrap();
            assert!(services.unreadable.is_empty(), "{:?}", services.unreadable);
            services.objects.sort_by_key(|s| s.key);
            assert_eq!(services.objects, [sticky.clone(), dns.clone()]);
            let mut servers = ipvs.destinations(&sticky_key).unwrap().objects;
            servers.sort_by_key(|d| d.socket());
            assert_eq!(
                servers,
                [
                    destination("10.244.1.5", 8080, 1),
                    destination("10.244.2.6", 8080, 0)
                ]
            );

            let mut edited = sticky.clone();
            edited.scheduler = Scheduler::new("lc").unwrap();
            edited.flags = 0;
            ipvs.update_service(&edited).unwrap();
            ipvs.delete_destination(&sticky_key, &destination("10.244.2.6", 8080, 0))
                .unwrap();
            ipvs.delete_service(&dns_key).unwrap();
            let error = ipvs.delete_service(&dns_key).unwrap_err();
            assert_eq!(error.errno(), Some(kpr_netlink::ESRCH), "{error}");
        });
        let shown = ipvsadm_list(&node);
        assert!(shown.contains("TCP 10.96.0.1:80 lc\n"), "{shown}");
        assert!(
            !shown.contains("10.244.2.6") && !shown.contains("fd00::10"),
            "{shown}"
        );

        node.run(|| {
            let mut ipvs = Ipvs::open().unwrap().unwrap();
            ipvs.flush().unwrap();
            assert!(ipvs.services().unwrap().objects.is_empty());
        });
    });
}

#[test]
fn timeouts_are_set_and_a_zero_keeps_the_kernels_value() {
    in_guest("timeouts_are_set_and_a_zero_keeps_the_kernels_value", || {
        let node = Netns::new("ipvs").unwrap();
        node.sh("modprobe ip_vs").unwrap();
        let before = node.run(|| Ipvs::open().unwrap().unwrap().timeouts().unwrap());
        let wanted = Timeouts {
            tcp: 900,
            tcp_fin: 120,
            udp: 0,
        };
        let after = node.run(|| {
            let mut ipvs = Ipvs::open().unwrap().unwrap();
            ipvs.set_timeouts(&wanted).unwrap();
            ipvs.timeouts().unwrap()
        });
        assert_eq!(
            after,
            Timeouts {
                udp: before.udp,
                ..wanted
            }
        );
        let shown = node.sh("ipvsadm -L --timeout").unwrap();
        assert!(shown.contains(&format!("900 120 {}", before.udp)), "{shown}");
    });
}

#[test]
fn kube_ipvs0_is_created_down_and_holds_the_bound_addresses() {
    in_guest("kube_ipvs0_is_created_down_and_holds_the_bound_addresses", || {
        let node = Netns::new("ipvs").unwrap();
        let (v4, v6) = ("10.96.0.1".parse().unwrap(), "fd00::10".parse().unwrap());
        node.run(|| {
            let mut links = IpvsLinks::open().unwrap();
            assert!(links.find().unwrap().is_none());
            let link = links.ensure().unwrap();
            assert_eq!(links.ensure().unwrap().index, link.index, "ensure keeps the link");
            for ip in [v4, v6, v4] {
                links.bind(&link, ip).unwrap();
            }
        });
        let shown = node.sh("ip -d addr show dev kube-ipvs0").unwrap();
        assert!(shown.contains("dummy") && shown.contains("state DOWN"), "{shown}");
        assert!(
            shown.contains("inet 10.96.0.1/32") && shown.contains("inet6 fd00::10/128"),
            "{shown}"
        );

        node.run(|| {
            let mut links = IpvsLinks::open().unwrap();
            let link = links.find().unwrap().unwrap();
            assert_eq!(link.addresses, [v4, v6]);
            links.unbind(&link, v4).unwrap();
            links.unbind(&link, v4).unwrap();
            assert_eq!(links.find().unwrap().unwrap().addresses, [v6]);
            assert!(links.delete(&link).unwrap());
            assert!(!links.delete(&link).unwrap(), "already gone");
            assert!(links.find().unwrap().is_none());
        });
    });
}
