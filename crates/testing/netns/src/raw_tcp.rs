//! Crafted TCP segments, for the one behaviour an ordinary socket cannot show: a segment
//! outside the window of a connection that the node DNATed (upstream issue #74839, what
//! upstream's e2e "boom server" sends).
//!
//! Conntrack marks such a segment INVALID, and NAT skips INVALID packets. Unless the node
//! drops it (upstream's rule) or tracks windows liberally (`nf_conntrack_tcp_be_liberal`),
//! it reaches the client with the pod's own address instead of the Service's. The client
//! knows no such connection and answers with a reset, which kills the real connection at
//! the pod.
//!
//! [`Netns::send_tcp_segment`] sends a [`Segment`] as a whole IPv4 packet through a raw
//! socket (`IPPROTO_RAW`): addresses, ports, sequence and acknowledgement numbers are the
//! caller's, checksums are computed here. For the segment to do harm its acknowledgement
//! must be the one the client expects (the reset the client answers with carries it, and a
//! TCP stack takes a reset only at exactly the sequence number it waits for):
//! [`Netns::capture_tcp`] reads the numbers off the connection's own segments.

use std::io::{self, Read};
use std::net::{SocketAddr, SocketAddrV4};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::netns::Netns;

/// `IPPROTO_RAW`: the caller writes the IP header itself.
const IPPROTO_RAW: i32 = 255;
const IPPROTO_TCP: u8 = 6;
const IPV4_HEADER_LEN: usize = 20;
const TCP_HEADER_LEN: usize = 20;
/// TCP flags: ACK and PSH, as a data segment of an established connection carries.
const ACK_PSH: u8 = 0x18;

/// One TCP segment of an established connection (flags ACK and PSH), in an IPv4 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub from: SocketAddrV4,
    pub to: SocketAddrV4,
    pub seq: u32,
    pub ack: u32,
    pub payload: Vec<u8>,
}

impl Segment {
    /// The packet as it goes on the wire: IPv4 header, TCP header, payload.
    pub fn packet(&self) -> Vec<u8> {
        let tcp_len = TCP_HEADER_LEN + self.payload.len();
        let total = IPV4_HEADER_LEN + tcp_len;
        let mut packet = Vec::with_capacity(total);
        // IPv4: version 4, 5 words of header, don't fragment, TTL 64.
        packet.extend_from_slice(&[0x45, 0]);
        packet.extend_from_slice(&u16::try_from(total).unwrap_or(u16::MAX).to_be_bytes());
        packet.extend_from_slice(&[0, 0, 0x40, 0, 64, IPPROTO_TCP, 0, 0]);
        packet.extend_from_slice(&self.from.ip().octets());
        packet.extend_from_slice(&self.to.ip().octets());
        let ip_checksum = checksum(&[&packet[..IPV4_HEADER_LEN]]);
        packet[10..12].copy_from_slice(&ip_checksum.to_be_bytes());
        // TCP: no options, the largest unscaled window.
        let tcp_start = packet.len();
        packet.extend_from_slice(&self.from.port().to_be_bytes());
        packet.extend_from_slice(&self.to.port().to_be_bytes());
        packet.extend_from_slice(&self.seq.to_be_bytes());
        packet.extend_from_slice(&self.ack.to_be_bytes());
        packet.extend_from_slice(&[(TCP_HEADER_LEN as u8 / 4) << 4, ACK_PSH, 0xff, 0xff, 0, 0, 0, 0]);
        packet.extend_from_slice(&self.payload);
        let mut pseudo = Vec::with_capacity(12);
        pseudo.extend_from_slice(&self.from.ip().octets());
        pseudo.extend_from_slice(&self.to.ip().octets());
        pseudo.extend_from_slice(&[0, IPPROTO_TCP]);
        pseudo.extend_from_slice(&u16::try_from(tcp_len).unwrap_or(u16::MAX).to_be_bytes());
        let tcp_checksum = checksum(&[&pseudo, &packet[tcp_start..]]);
        packet[tcp_start + 16..tcp_start + 18].copy_from_slice(&tcp_checksum.to_be_bytes());
        packet
    }
}

/// The TCP segments a namespace receives for one local port, read through a raw socket
/// (`IPPROTO_TCP` sockets get a copy of every TCP packet the namespace takes in).
#[derive(Debug)]
pub struct TcpCapture {
    socket: Socket,
    port: u16,
}

impl TcpCapture {
    /// The first captured segment to the port that carries `payload`, waiting up to
    /// `timeout`; its `from`, `to`, `seq`, `ack` and payload as received.
    pub fn segment_carrying(&self, payload: &[u8], timeout: std::time::Duration) -> io::Result<Segment> {
        let deadline = std::time::Instant::now() + timeout;
        let mut buf = vec![0_u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no segment to port {} carried {payload:?}", self.port),
                ));
            }
            self.socket.set_read_timeout(Some(left))?;
            let n = match (&self.socket).read(&mut buf) {
                Ok(n) => n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                Err(err) => return Err(err),
            };
            if let Some(segment) = parse(&buf[..n])
                && segment.to.port() == self.port
                && segment.payload == payload
            {
                return Ok(segment);
            }
        }
    }
}

/// An IPv4 TCP packet as a [`Segment`] (its flags aside); `None` for anything else.
fn parse(packet: &[u8]) -> Option<Segment> {
    let header_len = usize::from(packet.first()? & 0x0f) * 4;
    if packet.first()? >> 4 != 4 || *packet.get(9)? != IPPROTO_TCP {
        return None;
    }
    let ip = |at: usize| -> Option<std::net::Ipv4Addr> {
        let octets: [u8; 4] = packet.get(at..at + 4)?.try_into().ok()?;
        Some(octets.into())
    };
    let tcp = packet.get(header_len..)?;
    let word16 =
        |at: usize| -> Option<u16> { Some(u16::from_be_bytes(tcp.get(at..at + 2)?.try_into().ok()?)) };
    let word32 =
        |at: usize| -> Option<u32> { Some(u32::from_be_bytes(tcp.get(at..at + 4)?.try_into().ok()?)) };
    let data_offset = usize::from(tcp.get(12)? >> 4) * 4;
    Some(Segment {
        from: SocketAddrV4::new(ip(12)?, word16(0)?),
        to: SocketAddrV4::new(ip(16)?, word16(2)?),
        seq: word32(4)?,
        ack: word32(8)?,
        payload: tcp.get(data_offset..)?.to_vec(),
    })
}

impl Netns {
    /// Starts capturing the TCP segments this namespace receives for local port `port`
    /// (from any address).
    pub fn capture_tcp(&self, port: u16) -> io::Result<TcpCapture> {
        let socket = self.run(|| Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)))?;
        Ok(TcpCapture { socket, port })
    }

    /// Sends `segment` from inside this namespace, as crafted (see the module docs).
    pub fn send_tcp_segment(&self, segment: &Segment) -> io::Result<()> {
        let packet = segment.packet();
        let to = SockAddr::from(SocketAddr::V4(segment.to));
        self.run(move || {
            let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_RAW)))?;
            let sent = socket.send_to(&packet, &to)?;
            if sent == packet.len() {
                Ok(())
            } else {
                Err(io::Error::other(format!("sent {sent} of {} bytes", packet.len())))
            }
        })
    }
}

/// The Internet checksum (RFC 1071) over `parts`, read as one run of bytes (each part but
/// the last of even length).
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for part in parts {
        for pair in part.chunks(2) {
            let word = match *pair {
                [high, low] => u16::from_be_bytes([high, low]),
                [high] => u16::from_be_bytes([high, 0]),
                _ => 0,
            };
            sum += u32::from(word);
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpListener, TcpStream};
    use std::time::Duration;

    use super::*;
    use crate::{Lab, pod_ip};

    fn segment() -> Segment {
        Segment {
            from: SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 10), 9000),
            to: SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 11), 40000),
            seq: 0x1234_5678,
            ack: 0x9abc_def0,
            payload: b"boom".to_vec(),
        }
    }

    #[test]
    fn both_checksums_verify_to_zero() {
        let packet = segment().packet();
        assert_eq!(packet.len(), 44);
        assert_eq!(checksum(&[&packet[..20]]), 0, "IPv4 header");
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&packet[12..20]);
        pseudo.extend_from_slice(&[0, 6, 0, 24]);
        assert_eq!(checksum(&[&pseudo, &packet[20..]]), 0, "TCP segment");
    }

    #[test]
    fn a_crafted_packet_parses_back_and_other_packets_do_not() {
        assert_eq!(parse(&segment().packet()), Some(segment()));
        let mut udp = segment().packet();
        udp[9] = 17;
        assert_eq!(parse(&udp), None);
        assert_eq!(parse(&[0x45, 0, 0]), None);
    }

    #[test]
    fn fields_sit_where_the_headers_put_them() {
        let packet = segment().packet();
        assert_eq!(&packet[..4], &[0x45, 0, 0, 44]);
        assert_eq!(packet[9], IPPROTO_TCP);
        assert_eq!(&packet[12..16], &[10, 244, 1, 10]);
        assert_eq!(&packet[20..22], &9000_u16.to_be_bytes());
        assert_eq!(&packet[24..28], &0x1234_5678_u32.to_be_bytes());
        assert_eq!(packet[32], 0x50);
        assert_eq!(packet[33], ACK_PSH);
        assert_eq!(&packet[40..], b"boom");
    }

    /// A segment for a connection the receiver does not know is answered with a reset:
    /// the crafted packet really reaches the other pod's TCP stack.
    #[test]
    fn a_segment_for_no_connection_is_answered_with_a_reset() {
        let lab = Lab::new(2).unwrap();
        let server = SocketAddr::from((pod_ip(0), 9000));
        let listener = lab.pod(0).run(|| TcpListener::bind(server).unwrap());
        let (mut client, mut accepted) = lab.pod(1).run(|| {
            let client = TcpStream::connect(server).unwrap();
            (client, listener.accept().unwrap().0)
        });
        let client_addr = match client.local_addr().unwrap() {
            SocketAddr::V4(addr) => addr,
            SocketAddr::V6(addr) => panic!("IPv4 expected, got {addr}"),
        };
        // A segment from another port of pod0: pod1 has no such connection and resets it;
        // the real connection is untouched.
        lab.pod(0)
            .send_tcp_segment(&Segment {
                from: SocketAddrV4::new(pod_ip(0), 9001),
                to: client_addr,
                seq: 1,
                ack: 1,
                payload: b"boom".to_vec(),
            })
            .unwrap();
        accepted.write_all(b"ok").unwrap();
        let mut buf = [0_u8; 2];
        client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
        let counters = lab.pod(1).sh("cat /proc/net/snmp").unwrap();
        let out_rsts = tcp_counter(&counters, "OutRsts");
        assert!(out_rsts >= 1, "pod1 sent no reset:\n{counters}");
    }

    /// `name` in the `Tcp:` lines of `/proc/net/snmp`.
    fn tcp_counter(snmp: &str, name: &str) -> u64 {
        let mut lines = snmp.lines().filter(|l| l.starts_with("Tcp:"));
        let (names, values) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    }
}
