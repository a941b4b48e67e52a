//! One netlink request and its answers, for the kernel objects kube-proxy-rs reads and
//! removes outside iptables: nfacct counters, nftables tables, links, IPVS services.
//!
//! Why a crate of its own: each of those speaks a different netlink family, but the
//! exchange is always the same: send one request (or one nfnetlink batch), then read until
//! the kernel acknowledges it, reports an error, or ends a dump. Messages are built and
//! parsed by the callers with the rust-netlink packet crates; this crate only moves bytes
//! and reads the 16-byte message headers, so an answer it cannot make sense of is an
//! error here, never a panic.
//!
//! Every [`Channel`] is its own socket, opened in the network namespace of the calling
//! thread, with a receive timeout: a lost answer fails the request instead of hanging
//! the caller. Answers to other sequence numbers (a late answer to an earlier request) are
//! skipped.

use std::time::Duration;

use netlink_sys::{Socket, SocketAddr};

pub use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_NETFILTER, NETLINK_ROUTE};

/// `NLMSG_ERROR`: an acknowledgement (error code 0) or an error.
const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: the end of a dump.
const NLMSG_DONE: u16 = 3;
/// Length of `struct nlmsghdr`.
pub const HEADER_LEN: usize = 16;
/// A dump datagram holds at most 32 KiB (the kernel's cap); twice that leaves room.
const RECV_BUFFER: usize = 64 * 1024;
/// The kernel answers at once unless something is badly wrong.
const RECV_TIMEOUT: Duration = Duration::from_secs(10);

/// `ENOENT`: the object asked for does not exist.
pub const ENOENT: i32 = 2;
/// `ESRCH`: IPVS's "no such service".
pub const ESRCH: i32 = 3;
/// `ENODEV`: no such network device.
pub const ENODEV: i32 = 19;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("cannot open a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("netlink I/O failed: {0}")]
    Io(#[source] std::io::Error),
    /// The kernel refused the request with this errno (positive).
    #[error("the kernel answered: {} (errno {errno})", std::io::Error::from_raw_os_error(*.errno))]
    Kernel { errno: i32 },
    #[error("malformed netlink answer: {0}")]
    Malformed(String),
}

impl NetlinkError {
    /// The errno of a kernel refusal, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { errno } => Some(*errno),
            _ => None,
        }
    }
}

/// One answer message: its type, flags and the whole message (header included), ready
/// for a packet crate's `NetlinkMessage::deserialize`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub message_type: u16,
    pub flags: u16,
    pub bytes: Vec<u8>,
}

impl Answer {
    /// The message without its netlink header.
    pub fn payload(&self) -> &[u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or_default()
    }
}

/// A netlink socket of one protocol, connected to the kernel.
pub struct Channel {
    socket: Socket,
    buffer: Vec<u8>,
    sequence: u32,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("sequence", &self.sequence)
            .finish()
    }
}

impl Channel {
    /// A socket of `protocol` (e.g. [`NETLINK_NETFILTER`]) in the calling thread's network
    /// namespace.
    pub fn open(protocol: isize) -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(protocol).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Socket)?;
        nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(RECV_TIMEOUT.as_secs() as _, 0),
        )
        .map_err(|errno| NetlinkError::Socket(errno.into()))?;
        Ok(Self {
            socket,
            buffer: vec![0; RECV_BUFFER],
            sequence: 0,
        })
    }

    /// Sends what `build` makes for a fresh sequence number (one message, or several that
    /// share it, such as an nfnetlink batch) and returns every answer carrying that number
    /// until the exchange ends: at the acknowledgement of a request sent with `NLM_F_ACK`,
    /// or at `NLMSG_DONE` of a dump. The acknowledgement and the end marker themselves are
    /// not returned; a kernel error ends the exchange as [`NetlinkError::Kernel`].
    pub fn request(&mut self, build: impl FnOnce(u32) -> Vec<u8>) -> Result<Vec<Answer>, NetlinkError> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let bytes = build(sequence);
        let sent = self.socket.send(&bytes, 0).map_err(NetlinkError::Io)?;
        if sent != bytes.len() {
            return Err(NetlinkError::Malformed(format!(
                "sent {sent} of {} bytes",
                bytes.len()
            )));
        }
        let mut answers = Vec::new();
        loop {
            let datagram = self.recv()?;
            for message in split(datagram)? {
                if message.sequence != sequence {
                    continue;
                }
                match message.message_type {
                    NLMSG_DONE => return Ok(answers),
                    NLMSG_ERROR => {
                        return match error_code(message.bytes)? {
                            0 => Ok(answers),
                            code => Err(NetlinkError::Kernel {
                                errno: code.checked_neg().unwrap_or(i32::MAX),
                            }),
                        };
                    }
                    _ => answers.push(Answer {
                        message_type: message.message_type,
                        flags: message.flags,
                        bytes: message.bytes.to_vec(),
                    }),
                }
            }
        }
    }

    fn recv(&mut self) -> Result<&[u8], NetlinkError> {
        let mut space = &mut self.buffer[..];
        let size = self.socket.recv(&mut space, 0).map_err(NetlinkError::Io)?;
        if size > self.buffer.len() {
            return Err(NetlinkError::Malformed(format!(
                "a {size}-byte datagram did not fit the {RECV_BUFFER}-byte buffer"
            )));
        }
        Ok(&self.buffer[..size])
    }
}

/// One message of a datagram, with the header fields read.
#[derive(Debug, PartialEq, Eq)]
struct RawMessage<'a> {
    message_type: u16,
    flags: u16,
    sequence: u32,
    bytes: &'a [u8],
}

/// Splits a datagram into its messages by their length fields.
fn split(datagram: &[u8]) -> Result<Vec<RawMessage<'_>>, NetlinkError> {
    let mut messages = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let header = rest
            .get(..HEADER_LEN)
            .ok_or_else(|| NetlinkError::Malformed(format!("{} trailing bytes", rest.len())))?;
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if length < HEADER_LEN || length > rest.len() {
            return Err(NetlinkError::Malformed(format!(
                "message length {length} with {} bytes left",
                rest.len()
            )));
        }
        messages.push(RawMessage {
            message_type: u16::from_ne_bytes([header[4], header[5]]),
            flags: u16::from_ne_bytes([header[6], header[7]]),
            sequence: u32::from_ne_bytes([header[8], header[9], header[10], header[11]]),
            bytes: &rest[..length],
        });
        // Messages are 4-byte aligned; the last one may end the datagram unpadded.
        let aligned = length.next_multiple_of(4).min(rest.len());
        rest = &rest[aligned..];
    }
    Ok(messages)
}

/// The error code of an `NLMSG_ERROR` message: 0 for an acknowledgement, else `-errno`.
fn error_code(message: &[u8]) -> Result<i32, NetlinkError> {
    let code = message
        .get(HEADER_LEN..HEADER_LEN + 4)
        .ok_or_else(|| NetlinkError::Malformed(format!("a {}-byte error message", message.len())))?;
    Ok(i32::from_ne_bytes([code[0], code[1], code[2], code[3]]))
}

/// A netlink message: the 16-byte header (length, type, flags, sequence, port 0) and
/// `payload`, padded to 4 bytes. For callers that build messages without a packet crate.
pub fn message(message_type: u16, flags: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
    let length = HEADER_LEN + payload.len();
    let mut bytes = Vec::with_capacity(length.next_multiple_of(4));
    bytes.extend_from_slice(&(length as u32).to_ne_bytes());
    bytes.extend_from_slice(&message_type.to_ne_bytes());
    bytes.extend_from_slice(&flags.to_ne_bytes());
    bytes.extend_from_slice(&sequence.to_ne_bytes());
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(payload);
    bytes.resize(length.next_multiple_of(4), 0);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_split_by_their_lengths_and_padding() {
        let mut datagram = message(0x0700, 0, 5, &[1, 2, 3, 4, 5]);
        datagram.extend(message(NLMSG_DONE, 2, 5, &[0; 4]));
        let messages = split(&datagram).unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].message_type, 0x0700);
        assert_eq!(
            messages[0].bytes.len(),
            HEADER_LEN + 5,
            "padding is not part of the message"
        );
        assert_eq!(
            (messages[1].message_type, messages[1].flags, messages[1].sequence),
            (NLMSG_DONE, 2, 5)
        );
    }

    #[test]
    fn a_length_past_the_datagram_is_malformed_not_a_panic() {
        let mut datagram = message(0x0700, 0, 1, &[0; 8]);
        datagram[0] = 200;
        assert!(matches!(split(&datagram), Err(NetlinkError::Malformed(_))));
        assert!(matches!(split(&datagram[..7]), Err(NetlinkError::Malformed(_))));
        assert!(matches!(
            error_code(&datagram[..18]),
            Err(NetlinkError::Malformed(_))
        ));
    }

    #[test]
    fn error_codes_are_negative_errnos() {
        let refusal = message(NLMSG_ERROR, 0, 1, &(-ENOENT).to_ne_bytes());
        assert_eq!(error_code(&refusal).unwrap(), -ENOENT);
        let ack = message(NLMSG_ERROR, 0x100, 1, &0i32.to_ne_bytes());
        assert_eq!(error_code(&ack).unwrap(), 0);
    }

    #[test]
    fn header_layout_is_the_kernels() {
        let bytes = message(0x1234, 0x0305, 0x0a0b0c0d, b"xy");
        assert_eq!(bytes.len(), 20);
        assert_eq!(&bytes[..4], &18u32.to_ne_bytes());
        assert_eq!(&bytes[4..6], &0x1234u16.to_ne_bytes());
        assert_eq!(&bytes[6..8], &0x0305u16.to_ne_bytes());
        assert_eq!(&bytes[8..12], &0x0a0b0c0du32.to_ne_bytes());
        assert_eq!(&bytes[12..16], &[0; 4]);
        assert_eq!(&bytes[16..], b"xy\0\0");
    }

    /// The real kernel: a generic-netlink request for a family that does not exist is
    /// refused with ENOENT (the exchange ends, nothing hangs).
    #[test]
    fn a_refusal_from_the_kernel_ends_the_exchange_with_its_errno() {
        let mut channel = Channel::open(NETLINK_GENERIC).unwrap();
        // CTRL_CMD_GETFAMILY (3) for "kpr-nofamily" (names are at most 15 bytes), to GENL_ID_CTRL (0x10).
        let mut payload = vec![3, 2, 0, 0];
        let name = b"kpr-nofamily\0";
        payload.extend_from_slice(&((4 + name.len()) as u16).to_ne_bytes());
        payload.extend_from_slice(&2u16.to_ne_bytes()); // CTRL_ATTR_FAMILY_NAME
        payload.extend_from_slice(name);
        payload.resize(payload.len().next_multiple_of(4), 0);
        let result = channel.request(|seq| message(0x10, 0x1 | 0x4, seq, &payload));
        assert_eq!(result.unwrap_err().errno(), Some(ENOENT));
    }
}
