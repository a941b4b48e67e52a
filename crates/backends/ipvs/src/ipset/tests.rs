use super::*;

const CLUSTER_IP: SetSpec = SetSpec {
    name: "KUBE-CLUSTER-IP",
    kind: SetKind::IpPort,
    family: Family::V4,
};
const NODE_PORT_TCP: SetSpec = SetSpec {
    name: "KUBE-NODE-PORT-TCP",
    kind: SetKind::Port,
    family: Family::V4,
};
const SOURCE_CIDR: SetSpec = SetSpec {
    name: "KUBE-6-LOAD-BALANCER-SOURCE-CID",
    kind: SetKind::IpPortNet,
    family: Family::V6,
};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn sets(members: &[(SetSpec, Member)]) -> Sets {
    let mut sets = Sets::default();
    for (spec, member) in members {
        sets.declare(*spec);
        sets.insert(spec.name, *member).unwrap();
    }
    sets
}

#[test]
fn a_first_sync_creates_the_sets_and_adds_every_member() {
    let mut wanted = sets(&[
        (CLUSTER_IP, Member::IpPort(ip("10.96.0.1"), Protocol::Tcp, 443)),
        (CLUSTER_IP, Member::IpPort(ip("10.96.0.10"), Protocol::Udp, 53)),
        (NODE_PORT_TCP, Member::Port(30080)),
    ]);
    wanted.declare(SOURCE_CIDR);
    assert_eq!(
        restore_script(&wanted, &Sets::default()),
        "create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536\n\
         create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
         add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n\
         add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n\
         create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n\
         add KUBE-NODE-PORT-TCP 30080\n"
    );
}

#[test]
fn a_later_sync_writes_only_the_difference() {
    let current = sets(&[
        (CLUSTER_IP, Member::IpPort(ip("10.96.0.1"), Protocol::Tcp, 443)),
        (CLUSTER_IP, Member::IpPort(ip("10.96.0.2"), Protocol::Tcp, 80)),
    ]);
    let wanted = sets(&[
        (CLUSTER_IP, Member::IpPort(ip("10.96.0.1"), Protocol::Tcp, 443)),
        (CLUSTER_IP, Member::IpPort(ip("10.96.0.3"), Protocol::Tcp, 80)),
    ]);
    assert_eq!(
        restore_script(&wanted, &current),
        "del KUBE-CLUSTER-IP 10.96.0.2,tcp:80\nadd KUBE-CLUSTER-IP 10.96.0.3,tcp:80\n"
    );
    assert_eq!(restore_script(&wanted, &wanted), "");
}

#[test]
fn members_read_back_as_ipset_save_prints_them() {
    let cases = [
        (
            SetKind::IpPort,
            "fd00::1,tcp:443",
            Member::IpPort(ip("fd00::1"), Protocol::Tcp, 443),
        ),
        (
            SetKind::IpPortIp,
            "10.244.1.5,sctp:8080,10.244.1.5",
            Member::IpPortIp(ip("10.244.1.5"), Protocol::Sctp, 8080, ip("10.244.1.5")),
        ),
        (
            SetKind::IpPortNet,
            "203.0.113.1,tcp:80,192.0.2.0/24",
            Member::IpPortNet(
                ip("203.0.113.1"),
                Protocol::Tcp,
                80,
                "192.0.2.0/24".parse().unwrap(),
            ),
        ),
        (SetKind::Ip, "10.96.0.1", Member::Ip(ip("10.96.0.1"))),
        (SetKind::Port, "30080", Member::Port(30080)),
    ];
    for (kind, text, member) in cases {
        assert_eq!(Member::parse(kind, text), Ok(member), "{text}");
        assert_eq!(member.to_string(), text);
    }
}

#[test]
fn a_host_address_as_a_net_reads_as_a_full_prefix() {
    let member = Member::parse(SetKind::IpPortNet, "203.0.113.1,tcp:80,192.0.2.7").unwrap();
    assert_eq!(
        member,
        Member::IpPortNet(
            ip("203.0.113.1"),
            Protocol::Tcp,
            80,
            "192.0.2.7/32".parse().unwrap()
        )
    );
}

#[test]
fn malformed_members_are_errors() {
    for (kind, text) in [
        (SetKind::IpPort, "10.96.0.1"),
        (SetKind::IpPort, "10.96.0.1,icmp:0"),
        (SetKind::IpPort, "10.96.0.1,tcp:http"),
        (SetKind::IpPort, "10.96.0.1,tcp:70000"),
        (SetKind::Port, "0-65535"),
        (SetKind::Ip, "10.96.0.1,tcp:80"),
        (SetKind::IpPortNet, "1.2.3.4,tcp:80,nonsense"),
    ] {
        assert!(Member::parse(kind, text).is_err(), "{text}");
    }
}

#[test]
fn a_member_of_the_wrong_kind_or_an_undeclared_set_is_refused() {
    let mut sets = Sets::default();
    assert!(sets.insert("KUBE-CLUSTER-IP", Member::Port(80)).is_err());
    sets.declare(CLUSTER_IP);
    assert!(sets.insert("KUBE-CLUSTER-IP", Member::Port(80)).is_err());
    assert!(sets.is_empty("KUBE-CLUSTER-IP"));
}

#[test]
fn save_output_gives_the_known_sets_only() {
    let save = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1f2e3d4c\n\
                add KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n\
                create user-set hash:ip family inet hashsize 1024 maxelem 65536\n\
                add user-set 192.0.2.1\n\
                create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n";
    let parsed = parse_save(save, &[CLUSTER_IP, NODE_PORT_TCP, SOURCE_CIDR]).unwrap();
    let mut expected = sets(&[(CLUSTER_IP, Member::IpPort(ip("10.96.0.1"), Protocol::Tcp, 443))]);
    expected.declare(NODE_PORT_TCP);
    assert_eq!(parsed, expected);
    assert!(parsed.members(SOURCE_CIDR.name).is_none(), "not in the kernel");
}
