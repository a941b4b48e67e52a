//! The proxy's [`Ipset`]: kpr-nfnetlink's ipset client, one socket per backend opened at
//! first use in the calling thread's network namespace. This module only translates the
//! mode's typed sets and members into ipset's netlink vocabulary and back.

use std::net::IpAddr;

use ipnet::IpNet;
use kpr_nfnetlink::ipset::{Change, CreateOptions, Entry, IpsetSocket, Op, SetDef, SetFamily, SetType};

use super::{Family, HASH_SIZE, Ipset, MAX_ELEMENTS, Member, Protocol, SetChange, SetKind, SetSpec, Sets};

/// ipset over netlink in the calling thread's network namespace.
#[derive(Debug, Default)]
pub struct IpsetNetlink {
    socket: Option<IpsetSocket>,
}

impl IpsetNetlink {
    fn socket(&mut self) -> Result<&mut IpsetSocket, String> {
        if self.socket.is_none() {
            let socket = IpsetSocket::open().map_err(|e| e.to_string())?;
            self.socket = Some(socket);
        }
        self.socket.as_mut().ok_or_else(|| "no ipset socket".to_string())
    }
}

impl IpsetNetlink {
    /// Whether this kernel has ipset and every set type the mode uses: each type is asked
    /// for its revision (the kernel loads a type's module on demand). Start-up's check, in
    /// place of upstream's `ipset version`: the proxy needs the kernel's ipset, not the tool.
    pub fn check_kernel(&mut self) -> Result<(), String> {
        let socket = self.socket()?;
        for kind in [
            SetKind::IpPort,
            SetKind::IpPortIp,
            SetKind::IpPortNet,
            SetKind::Ip,
            SetKind::Port,
        ] {
            socket
                .revision(set_type(kind))
                .map_err(|e| format!("ipset type {}: {e}", kind.type_name()))?;
        }
        Ok(())
    }
}

/// `ENOENT`: the set does not exist.
const ENOENT: i32 = 2;

impl Ipset for IpsetNetlink {
    fn read(&mut self, specs: &[SetSpec]) -> Result<Sets, String> {
        let socket = self.socket()?;
        let mut sets = Sets::default();
        for spec in specs {
            let listed = match socket.list(Some(spec.name)) {
                Ok(listed) => listed,
                Err(error) if error.errno() == Some(ENOENT) => continue,
                Err(error) => return Err(error.to_string()),
            };
            for set in listed.iter().filter(|set| set.name == spec.name) {
                if set.set_type != Some(set_type(spec.kind)) {
                    return Err(format!(
                        "ipset {} is a {}, not a {}",
                        spec.name,
                        set.type_name,
                        spec.kind.type_name()
                    ));
                }
                sets.declare(*spec);
                for entry in &set.entries {
                    sets.insert(spec.name, member(entry)?)?;
                }
            }
        }
        Ok(sets)
    }

    fn write(&mut self, changes: &[SetChange]) -> Result<(), String> {
        let socket = self.socket()?;
        let mut members = Vec::with_capacity(changes.len());
        for change in changes {
            match *change {
                SetChange::Create(spec) => socket.create(&definition(&spec)).map_err(|e| e.to_string())?,
                SetChange::Delete(set, member) => members.push(Change {
                    op: Op::Delete,
                    set,
                    entry: entry(&member),
                }),
                SetChange::Add(set, member) => members.push(Change {
                    op: Op::Add,
                    set,
                    entry: entry(&member),
                }),
            }
        }
        socket.apply(&members).map_err(|e| e.to_string())
    }
}

fn set_type(kind: SetKind) -> SetType {
    match kind {
        SetKind::IpPort => SetType::HashIpPort,
        SetKind::IpPortIp => SetType::HashIpPortIp,
        SetKind::IpPortNet => SetType::HashIpPortNet,
        SetKind::Ip => SetType::HashIp,
        SetKind::Port => SetType::BitmapPort,
    }
}

/// Upstream's creation options (as [`SetKind::create_options`] writes them for the tool).
fn definition(spec: &SetSpec) -> SetDef<'static> {
    let options = match spec.kind {
        SetKind::Port => CreateOptions::Ports {
            from: 0,
            to: u16::MAX,
        },
        _ => CreateOptions::Hash {
            family: match spec.family {
                Family::V4 => SetFamily::Inet,
                Family::V6 => SetFamily::Inet6,
            },
            hash_size: HASH_SIZE,
            max_elements: MAX_ELEMENTS,
        },
    };
    SetDef {
        name: spec.name,
        set_type: set_type(spec.kind),
        options,
    }
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol(number: u8) -> Result<Protocol, String> {
    match number {
        6 => Ok(Protocol::Tcp),
        17 => Ok(Protocol::Udp),
        132 => Ok(Protocol::Sctp),
        other => Err(format!(
            "IP protocol {other} in an ipset member is none of TCP, UDP, SCTP"
        )),
    }
}

fn entry(member: &Member) -> Entry {
    match *member {
        Member::IpPort(ip, proto, port) => Entry::IpPort {
            ip,
            protocol: protocol_number(proto),
            port,
        },
        Member::IpPortIp(ip, proto, port, ip2) => Entry::IpPortIp {
            ip,
            protocol: protocol_number(proto),
            port,
            ip2,
        },
        Member::IpPortNet(ip, proto, port, net) => Entry::IpPortNet {
            ip,
            protocol: protocol_number(proto),
            port,
            net: net.network(),
            prefix: net.prefix_len(),
        },
        Member::Ip(ip) => Entry::Ip(ip),
        Member::Port(port) => Entry::Port(port),
    }
}

fn member(entry: &Entry) -> Result<Member, String> {
    Ok(match *entry {
        Entry::IpPort {
            ip,
            protocol: p,
            port,
        } => Member::IpPort(ip, protocol(p)?, port),
        Entry::IpPortIp {
            ip,
            protocol: p,
            port,
            ip2,
        } => Member::IpPortIp(ip, protocol(p)?, port, ip2),
        Entry::IpPortNet {
            ip,
            protocol: p,
            port,
            net,
            prefix,
        } => Member::IpPortNet(ip, protocol(p)?, port, net_of(net, prefix)?),
        Entry::Ip(ip) => Member::Ip(ip),
        Entry::Port(port) => Member::Port(port),
    })
}

fn net_of(address: IpAddr, prefix: u8) -> Result<IpNet, String> {
    IpNet::new(address, prefix).map_err(|_| format!("{address}/{prefix} is not a network"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_of_every_kind_survive_the_translation_both_ways() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let members = [
            Member::IpPort(ip("10.96.0.1"), Protocol::Tcp, 443),
            Member::IpPortIp(ip("fd00::5"), Protocol::Sctp, 80, ip("fd00::5")),
            Member::IpPortNet(
                ip("203.0.113.1"),
                Protocol::Udp,
                53,
                "192.0.2.0/24".parse().unwrap(),
            ),
            Member::Ip(ip("10.96.0.1")),
            Member::Port(30080),
        ];
        for m in members {
            assert_eq!(member(&entry(&m)), Ok(m));
            assert_eq!(entry(&m).set_type(), set_type(m.kind()), "{m}");
        }
        assert!(
            member(&Entry::IpPort {
                ip: ip("10.96.0.1"),
                protocol: 1,
                port: 0
            })
            .is_err()
        );
    }

    #[test]
    fn sets_are_created_with_upstreams_options() {
        let spec = SetSpec {
            name: "KUBE-6-CLUSTER-IP",
            kind: SetKind::IpPort,
            family: Family::V6,
        };
        assert_eq!(
            definition(&spec).options,
            CreateOptions::Hash {
                family: SetFamily::Inet6,
                hash_size: 1024,
                max_elements: 65536
            }
        );
        let ports = SetSpec {
            kind: SetKind::Port,
            ..spec
        };
        assert_eq!(
            definition(&ports).options,
            CreateOptions::Ports { from: 0, to: 65535 }
        );
    }
}
