//! The plan written to a real IPVS table (a throw-away guest with Debian's kernel: this
//! host's has no IPVS), with real TCP through the virtual server: what the kernel lists
//! after a sync is the plan, a second sync writes nothing, an endpoint change writes only
//! the difference, and a removed real server with an open connection drains at weight 0
//! while new connections go elsewhere.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kpr_ipvs::reconcile::{Graceful, Operation, reconcile};
use kpr_ipvs::{IpvsPlan, PlanInputs, kernel, plan};
use kpr_ipvs_netlink::{Ipvs, IpvsLinks, Scheduler};
use kpr_model::IpFamily;
use kpr_netns::{Netns, spread};
use kpr_vm::in_guest;
use kpr_world::{World, ep};
use serde_json::json;

const VIP: &str = "10.96.0.10:80";

fn world(endpoints: &[&str]) -> World {
    let mut world = World::new();
    world
        .service(
            "web",
            json!({"type": "ClusterIP", "clusterIP": "10.96.0.10",
                   "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
        )
        .slice(
            "web",
            json!([{"name": "http", "port": 8080}]),
            endpoints.iter().map(|e| ep(e)).collect(),
        );
    world
}

fn plan_for(endpoints: &[&str]) -> IpvsPlan {
    let scheduler = Scheduler::new("rr").unwrap();
    let none = BTreeSet::new();
    let inputs = PlanInputs {
        family: IpFamily::V4,
        scheduler: &scheduler,
        node_port_addresses: &[],
        other_interface_addresses: &none,
        node_ip: None,
    };
    plan(&world(endpoints).state(), &inputs)
}

/// One sync of the IPVS table and kube-ipvs0's addresses; the operations it wrote.
fn sync(node: &Netns, plan: &IpvsPlan, graceful: &mut Graceful) -> Vec<Operation> {
    node.run(|| {
        let mut ipvs = Ipvs::open().unwrap().expect("the guest kernel has IPVS");
        let (listed, unreadable) = kernel::read(&mut ipvs).unwrap();
        assert!(unreadable.is_empty(), "{unreadable:?}");
        let operations = reconcile(&plan.virtual_servers, &listed, graceful, false, |_| true);
        kernel::apply(&mut ipvs, &operations).unwrap();
        let mut links = IpvsLinks::open().unwrap();
        let link = links.ensure().unwrap();
        for &address in &plan.bound {
            links.bind(&link, address).unwrap();
        }
        operations
    })
}

/// Pods on a dummy link in the node's own namespace: IPVS forwards locally made
/// connections to them (NAT at local output), so one namespace is the whole cluster.
fn node_with_pods(pods: &[&str]) -> Netns {
    let node = Netns::new("ipvs").unwrap();
    node.sh(
        "modprobe ip_vs && ip link add pods type dummy && ip link set pods up && \
             sysctl -qw net.ipv4.vs.conntrack=1",
    )
    .unwrap();
    for pod in pods {
        node.ip(&["addr", "add", &format!("{pod}/32"), "dev", "pods"])
            .unwrap();
    }
    node
}

#[test]
fn a_plan_is_written_as_planned_and_then_only_its_changes() {
    in_guest("a_plan_is_written_as_planned_and_then_only_its_changes", || {
        let node = node_with_pods(&["10.244.1.5", "10.244.2.6"]);
        let _a = node
            .tcp_backend("10.244.1.5:8080".parse().unwrap(), "pod-a")
            .unwrap();
        let _b = node
            .tcp_backend("10.244.2.6:8080".parse().unwrap(), "pod-b")
            .unwrap();
        let mut graceful = Graceful::default();

        let first = plan_for(&["10.244.1.5", "10.244.2.6"]);
        assert_eq!(
            sync(&node, &first, &mut graceful).len(),
            3,
            "a server and two real servers"
        );
        assert!(sync(&node, &first, &mut graceful).is_empty(), "nothing differs");
        let vip: SocketAddr = VIP.parse().unwrap();
        let answers = spread(&node, vip, 20);
        assert_eq!(answers.get("pod-a"), Some(&10), "{answers:?}");
        assert_eq!(answers.get("pod-b"), Some(&10), "{answers:?}");

        let second = plan_for(&["10.244.1.5"]);
        let operations = sync(&node, &second, &mut graceful);
        assert_eq!(operations.len(), 1, "one real server removed: {operations:?}");
        assert_eq!(spread(&node, vip, 10).get("pod-a"), Some(&10));

        assert_eq!(sync(&node, &plan_for(&[]), &mut graceful).len(), 1);
        let refused = node.run(|| std::net::TcpStream::connect_timeout(&vip, Duration::from_secs(2)));
        assert!(refused.is_err(), "no real server: the kernel refuses");
    });
}

#[test]
fn a_removed_real_server_with_an_open_connection_drains() {
    in_guest("a_removed_real_server_with_an_open_connection_drains", || {
        let node = node_with_pods(&["10.244.1.5", "10.244.2.6"]);
        let _a = node
            .tcp_backend("10.244.1.5:8080".parse().unwrap(), "pod-a")
            .unwrap();
        let mut graceful = Graceful::default();
        sync(&node, &plan_for(&["10.244.2.6"]), &mut graceful);
        let (connected, wait) = std::sync::mpsc::channel();
        let holder = std::thread::spawn({
            let path = node.path();
            move || hold_one_connection(&path, connected)
        });
        // The held connection to pod-b is open; pod-a joins, then pod-b leaves the Service.
        wait.recv_timeout(Duration::from_secs(10)).unwrap();
        let operations = sync(&node, &plan_for(&["10.244.1.5", "10.244.2.6"]), &mut graceful);
        assert_eq!(operations.len(), 1);
        let operations = sync(&node, &plan_for(&["10.244.1.5"]), &mut graceful);
        assert!(
            matches!(operations.as_slice(), [Operation::UpdateDestination(_, d)] if d.weight == 0),
            "drains instead of deleting: {operations:?}"
        );
        let key = kpr_ipvs_netlink::ServiceKey {
            protocol: kpr_ipvs_netlink::Protocol::Tcp,
            address: "10.96.0.10".parse::<IpAddr>().unwrap(),
            port: 80,
        };
        assert!(graceful.contains(&key, "10.244.2.6:8080".parse().unwrap()));
        let answers = spread(&node, VIP.parse().unwrap(), 10);
        assert_eq!(
            answers.get("pod-a"),
            Some(&10),
            "new connections avoid the draining server: {answers:?}"
        );
        holder.join().unwrap();
    });
}

/// A server on pod-b that accepts one connection through the virtual server, says so, and
/// holds it open for a few seconds.
fn hold_one_connection(netns: &std::path::Path, connected: std::sync::mpsc::Sender<()>) {
    let file = std::fs::File::open(netns).unwrap();
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
    let listener = std::net::TcpListener::bind("10.244.2.6:8080").unwrap();
    let client = std::net::TcpStream::connect(VIP).unwrap();
    let (served, _) = listener.accept().unwrap();
    connected.send(()).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    drop((client, served));
}
