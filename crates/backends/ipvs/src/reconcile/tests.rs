use kpr_ipvs_netlink::Scheduler;
use kpr_model::ServicePortName;

use super::*;

fn key(protocol: Protocol, address: &str, port: u16) -> ServiceKey {
    ServiceKey {
        protocol,
        address: address.parse().unwrap(),
        port,
    }
}

fn tcp() -> ServiceKey {
    key(Protocol::Tcp, "10.96.0.10", 80)
}

fn service(key: ServiceKey) -> Service {
    Service::new(key, Scheduler::new("rr").unwrap())
}

fn wanted(key: ServiceKey, reals: &[&str]) -> BTreeMap<ServiceKey, VirtualServer> {
    let server = VirtualServer {
        service: service(key),
        real_servers: reals.iter().map(|r| r.parse().unwrap()).collect(),
        owner: ServicePortName::new("default", "web", "http", kpr_model::Protocol::Tcp),
    };
    [(key, server)].into()
}

fn destination(real: &str, weight: u32, active: u32, inactive: u32) -> Destination {
    let socket: SocketAddr = real.parse().unwrap();
    let mut destination = Destination::new(socket.ip(), socket.port(), weight);
    destination.active_connections = active;
    destination.inactive_connections = inactive;
    destination
}

fn kernel(key: ServiceKey, destinations: Vec<Destination>) -> Vec<KernelService> {
    vec![KernelService {
        service: service(key),
        destinations,
    }]
}

fn run(
    wanted: &BTreeMap<ServiceKey, VirtualServer>,
    kernel: &[KernelService],
    graceful: &mut Graceful,
) -> Vec<Operation> {
    reconcile(wanted, kernel, graceful, false, |_| true)
}

#[test]
fn a_new_virtual_server_comes_with_its_real_servers_at_weight_one() {
    let operations = run(
        &wanted(tcp(), &["10.244.1.5:8080"]),
        &[],
        &mut Graceful::default(),
    );
    assert_eq!(
        operations,
        [
            Operation::AddService(service(tcp())),
            Operation::AddDestination(tcp(), destination("10.244.1.5:8080", 1, 0, 0)),
        ]
    );
}

#[test]
fn nothing_differs_nothing_is_written() {
    let current = kernel(tcp(), vec![destination("10.244.1.5:8080", 1, 3, 1)]);
    assert!(
        run(
            &wanted(tcp(), &["10.244.1.5:8080"]),
            &current,
            &mut Graceful::default()
        )
        .is_empty()
    );
}

#[test]
fn changed_settings_update_the_virtual_server_in_place() {
    let mut plan = wanted(tcp(), &[]);
    let server = plan.get_mut(&tcp()).unwrap();
    server.service.flags = kpr_ipvs_netlink::FLAG_PERSISTENT;
    server.service.timeout = 600;
    let operations = run(&plan, &kernel(tcp(), vec![]), &mut Graceful::default());
    assert_eq!(
        operations,
        [Operation::UpdateService(plan[&tcp()].service.clone())]
    );
}

#[test]
fn a_removed_tcp_real_server_with_connections_drains_then_goes() {
    let mut graceful = Graceful::default();
    let plan = wanted(tcp(), &["10.244.1.5:8080"]);
    let busy = kernel(
        tcp(),
        vec![
            destination("10.244.1.5:8080", 1, 0, 0),
            destination("10.244.2.6:8080", 1, 2, 0),
        ],
    );
    assert_eq!(
        run(&plan, &busy, &mut graceful),
        [Operation::UpdateDestination(
            tcp(),
            destination("10.244.2.6:8080", 0, 0, 0)
        )]
    );
    assert!(graceful.contains(&tcp(), "10.244.2.6:8080".parse().unwrap()));

    let still_busy = kernel(
        tcp(),
        vec![
            destination("10.244.1.5:8080", 1, 0, 0),
            destination("10.244.2.6:8080", 0, 1, 1),
        ],
    );
    assert!(
        run(&plan, &still_busy, &mut graceful).is_empty(),
        "waits, writes nothing"
    );

    let idle = kernel(
        tcp(),
        vec![
            destination("10.244.1.5:8080", 1, 0, 0),
            destination("10.244.2.6:8080", 0, 0, 0),
        ],
    );
    assert_eq!(
        run(&plan, &idle, &mut graceful),
        [Operation::DeleteDestination(
            tcp(),
            destination("10.244.2.6:8080", 0, 0, 0)
        )]
    );
    assert!(graceful.is_empty());
}

#[test]
fn an_idle_tcp_real_server_and_any_udp_one_go_at_once() {
    let idle = kernel(tcp(), vec![destination("10.244.2.6:8080", 1, 0, 0)]);
    let operations = run(&wanted(tcp(), &[]), &idle, &mut Graceful::default());
    assert_eq!(
        operations,
        [Operation::DeleteDestination(
            tcp(),
            destination("10.244.2.6:8080", 1, 0, 0)
        )]
    );

    let udp = key(Protocol::Udp, "10.96.0.10", 53);
    let busy = kernel(udp, vec![destination("10.244.2.6:5353", 1, 0, 9)]);
    let mut graceful = Graceful::default();
    let operations = run(&wanted(udp, &[]), &busy, &mut graceful);
    assert_eq!(
        operations,
        [Operation::DeleteDestination(
            udp,
            destination("10.244.2.6:5353", 1, 0, 9)
        )]
    );
    assert!(graceful.is_empty());
}

#[test]
fn a_draining_real_server_that_comes_back_returns_to_weight_one() {
    let mut graceful = Graceful::default();
    let busy = kernel(tcp(), vec![destination("10.244.2.6:8080", 1, 2, 0)]);
    run(&wanted(tcp(), &[]), &busy, &mut graceful);
    let draining = kernel(tcp(), vec![destination("10.244.2.6:8080", 0, 2, 0)]);
    let operations = run(&wanted(tcp(), &["10.244.2.6:8080"]), &draining, &mut graceful);
    assert_eq!(
        operations,
        [Operation::UpdateDestination(
            tcp(),
            destination("10.244.2.6:8080", 1, 0, 0)
        )]
    );
    assert!(graceful.is_empty());
}

#[test]
fn the_first_sync_resets_weights_a_previous_process_left() {
    let left = kernel(tcp(), vec![destination("10.244.2.6:8080", 0, 0, 0)]);
    let plan = wanted(tcp(), &["10.244.2.6:8080"]);
    let operations = reconcile(&plan, &left, &mut Graceful::default(), true, |_| true);
    assert_eq!(
        operations,
        [Operation::UpdateDestination(
            tcp(),
            destination("10.244.2.6:8080", 1, 0, 0)
        )]
    );
    assert!(
        run(&plan, &left, &mut Graceful::default()).is_empty(),
        "later syncs leave it"
    );
}

#[test]
fn virtual_servers_not_wanted_go_only_when_they_are_ours() {
    let foreign = key(Protocol::Tcp, "192.0.2.9", 80);
    let mut listed = kernel(tcp(), vec![destination("10.244.2.6:8080", 1, 5, 0)]);
    listed.extend(kernel(foreign, vec![]));
    let mut graceful = Graceful::default();
    let operations = reconcile(&BTreeMap::new(), &listed, &mut graceful, false, |k| *k != foreign);
    assert_eq!(operations, [Operation::DeleteService(tcp())]);
}

#[test]
fn a_draining_entry_of_a_deleted_server_is_forgotten() {
    let mut graceful = Graceful::default();
    let busy = kernel(tcp(), vec![destination("10.244.2.6:8080", 1, 2, 0)]);
    run(&wanted(tcp(), &[]), &busy, &mut graceful);
    assert_eq!(graceful.len(), 1);
    run(&BTreeMap::new(), &busy, &mut graceful);
    assert!(graceful.is_empty(), "the whole virtual server went");

    run(&wanted(tcp(), &[]), &busy, &mut graceful);
    run(&wanted(tcp(), &[]), &kernel(tcp(), vec![]), &mut graceful);
    assert!(graceful.is_empty(), "someone else deleted the real server");
}

#[test]
fn real_servers_someone_set_to_another_forwarding_method_are_corrected_or_removed() {
    let mut routed = destination("10.244.1.5:8080", 1, 0, 0);
    routed.masquerades = false;
    let mut stray = destination("10.244.9.9:8080", 1, 0, 0);
    stray.masquerades = false;
    let operations = run(
        &wanted(tcp(), &["10.244.1.5:8080"]),
        &kernel(tcp(), vec![routed, stray]),
        &mut Graceful::default(),
    );
    assert_eq!(
        operations,
        [
            Operation::UpdateDestination(tcp(), destination("10.244.1.5:8080", 1, 0, 0)),
            Operation::DeleteDestination(tcp(), stray),
        ]
    );
}
