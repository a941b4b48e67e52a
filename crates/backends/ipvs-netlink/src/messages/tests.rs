use super::*;
use crate::types::FLAG_PERSISTENT;

const FAMILY: u16 = 32;

fn hex(text: &str) -> Vec<u8> {
    let digits: String = text.split_whitespace().collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

fn key(address: &str, port: u16) -> ServiceKey {
    ServiceKey {
        protocol: Protocol::Tcp,
        address: address.parse().unwrap(),
        port,
    }
}

fn sticky_service() -> Service {
    let mut service = Service::new(key("10.96.0.1", 80), Scheduler::new("rr").unwrap());
    service.flags = FLAG_PERSISTENT;
    service.timeout = 10800;
    service
}

/// The payload of a built message, as a dump answer carries the same attributes.
fn payload(message: &[u8]) -> &[u8] {
    &message[kpr_netlink::HEADER_LEN..]
}

#[test]
fn a_new_service_is_the_full_entry_byte_for_byte() {
    let expected = hex("68000000 2000 0500 07000000 00000000
         01010000
         5400 0180
           0600 0100 0200 0000
           0600 0200 0600 0000
           1400 0300 0a600001 00000000 00000000 00000000
           0600 0400 0050 0000
           0700 0600 727200 00
           0c00 0700 01000000 ffffffff
           0800 0800 302a0000
           0800 0900 ffffffff");
    assert_eq!(new_service_request(FAMILY, &sticky_service(), 7), expected);
}

#[test]
fn a_new_real_server_names_its_service_and_masquerades_byte_for_byte() {
    let destination = Destination::new("10.244.1.5".parse().unwrap(), 8080, 1);
    let expected = hex("84000000 2000 0500 09000000 00000000
         05010000
         3000 0180
           0600 0100 0200 0000
           0600 0200 0600 0000
           1400 0300 0a600001 00000000 00000000 00000000
           0600 0400 0050 0000
         4000 0280
           1400 0100 0af40105 00000000 00000000 00000000
           0600 0200 1f90 0000
           0800 0300 00000000
           0800 0400 01000000
           0800 0500 00000000
           0800 0600 00000000");
    assert_eq!(
        new_destination_request(FAMILY, &key("10.96.0.1", 80), &destination, 9),
        expected
    );
}

#[test]
fn deleting_needs_only_the_keys() {
    let message = delete_service_request(FAMILY, &key("fd00::1", 443), 3);
    assert_eq!(message[16], Command::DelService as u8);
    assert!(
        parse_service(payload(&message)).is_err(),
        "no scheduler: not a full entry"
    );
    let destination = Destination::new("fd00::5".parse().unwrap(), 8443, 0);
    let message = delete_destination_request(FAMILY, &key("fd00::1", 443), &destination, 4);
    assert_eq!(message[16], Command::DelDest as u8);
    let parsed = parse_destination(payload(&message), "fd00::1".parse().unwrap()).unwrap();
    assert_eq!(parsed.socket(), destination.socket());
}

#[test]
fn services_round_trip_in_both_families() {
    let mut v6 = Service::new(key("fd00::10", 53), Scheduler::new("sh").unwrap());
    v6.key.protocol = Protocol::Udp;
    for service in [sticky_service(), v6] {
        let message = new_service_request(FAMILY, &service, 1);
        assert_eq!(parse_service(payload(&message)).unwrap(), Some(service.clone()));
        let message = set_service_request(FAMILY, &service, 2);
        assert_eq!(message[16], Command::SetService as u8);
        assert_eq!(parse_service(payload(&message)).unwrap(), Some(service));
    }
}

#[test]
fn an_ipv6_service_has_a_prefix_length_as_netmask() {
    let service = Service::new(key("fd00::10", 53), Scheduler::new("rr").unwrap());
    assert_eq!(service.netmask, 128);
    assert_eq!(sticky_service().netmask, u32::MAX);
}

#[test]
fn real_servers_round_trip_with_their_weight() {
    let destination = Destination::new("10.244.1.5".parse().unwrap(), 8080, 0);
    let message = set_destination_request(FAMILY, &key("10.96.0.1", 80), &destination, 1);
    assert_eq!(message[16], Command::SetDest as u8);
    let parsed = parse_destination(payload(&message), "10.96.0.1".parse().unwrap()).unwrap();
    assert_eq!(parsed, destination);
    assert!(parsed.masquerades);
}

/// A real server someone else added with direct routing (`ipvsadm -g`) is listed too, so a
/// sync can correct or remove it.
#[test]
fn a_real_server_that_does_not_masquerade_is_listed_as_such() {
    const FORWARD_DIRECT_ROUTING: u32 = 3;
    let destination = Destination::new("10.244.1.5".parse().unwrap(), 8080, 1);
    let mut attributes = destination_key(&destination);
    attributes.push(u32_attribute(DEST_FWD_METHOD, FORWARD_DIRECT_ROUTING));
    attributes.push(u32_attribute(DEST_WEIGHT, 1));
    let message = request(
        FAMILY,
        Command::NewDest,
        ACKED,
        &[nested(CMD_ATTR_DEST, &attributes)],
        1,
    );
    let parsed = parse_destination(payload(&message), "10.96.0.1".parse().unwrap()).unwrap();
    assert_eq!(parsed.socket(), destination.socket());
    assert!(!parsed.masquerades);
}

#[test]
fn listed_firewall_mark_services_are_not_modelled() {
    let mut attributes = service_key(&key("0.0.0.0", 0));
    attributes.push(u32_attribute(SVC_FWMARK, 7));
    attributes.push(DefaultNla::new(SVC_SCHED_NAME, b"rr\0".to_vec()));
    let message = request(
        FAMILY,
        Command::NewService,
        ACKED,
        &[nested(CMD_ATTR_SERVICE, &attributes)],
        1,
    );
    assert_eq!(parse_service(payload(&message)).unwrap(), None);
}

#[test]
fn the_kernels_hashed_flag_is_not_read_back() {
    let mut attributes = service_key(&key("10.96.0.1", 80));
    attributes.push(DefaultNla::new(SVC_SCHED_NAME, b"rr\0".to_vec()));
    let mut flags = (FLAG_PERSISTENT | crate::types::FLAG_HASHED)
        .to_ne_bytes()
        .to_vec();
    flags.extend_from_slice(&u32::MAX.to_ne_bytes());
    attributes.push(DefaultNla::new(SVC_FLAGS, flags));
    let message = request(
        FAMILY,
        Command::NewService,
        ACKED,
        &[nested(CMD_ATTR_SERVICE, &attributes)],
        1,
    );
    let parsed = parse_service(payload(&message)).unwrap().unwrap();
    assert_eq!(parsed.flags, FLAG_PERSISTENT);
}

#[test]
fn truncated_answers_are_errors_not_panics() {
    let message = new_service_request(FAMILY, &sticky_service(), 1);
    for cut in 0..message.len() - kpr_netlink::HEADER_LEN {
        let _ = parse_service(&payload(&message)[..cut]);
        let _ = parse_destination(&payload(&message)[..cut], "10.0.0.1".parse().unwrap());
        let _ = parse_timeouts(&payload(&message)[..cut]);
    }
    assert!(parse_service(&[]).is_err());
}

#[test]
fn timeouts_round_trip_and_zero_means_unchanged_to_the_kernel() {
    let timeouts = Timeouts {
        tcp: 900,
        tcp_fin: 120,
        udp: 0,
    };
    let message = set_timeouts_request(FAMILY, &timeouts, 1);
    assert_eq!(message[16], Command::SetConfig as u8);
    assert_eq!(parse_timeouts(payload(&message)).unwrap(), timeouts);
}

#[test]
fn the_family_request_asks_the_controller_for_ipvs() {
    let message = family_request(5);
    assert!(message.windows(5).any(|w| w == b"IPVS\0"));
}

/// A delete as `ipvsadm -D` sends it: the nested service key only.
#[test]
fn a_service_deletion_is_its_key_byte_for_byte() {
    let expected = hex("44000000 2200 0500 05000000 00000000
         03010000
         3000 0180
           0600 0100 0a00 0000
           0600 0200 0600 0000
           1400 0300 fd000000 00000000 00000000 00000001
           0600 0400 01bb 0000");
    assert_eq!(delete_service_request(0x22, &key("fd00::1", 443), 5), expected);
}
