//! nf_tables change notifications: who changed which table, read from the kernel's
//! `NFNLGRP_NFTABLES` multicast group.
//!
//! Every committed nf_tables transaction is announced to that group, message by message:
//! one `NFT_MSG_NEW*` / `NFT_MSG_DEL*` per table, chain, rule, set, element list, object or
//! flowtable it added or deleted (each with the table's name and the `nfgenmsg` family),
//! then one `NFT_MSG_NEWGEN` carrying the new generation and the committing process's pid
//! and name. Each message's netlink header carries the port id of the socket that sent
//! the transaction, so a process can tell its own commits from anyone else's by its
//! sockets' port ids ([`crate::Socket::port_id`]): the pid in `NEWGEN` is the committing
//! thread's, in the kernel's (initial) pid namespace, so it rarely equals `getpid()` and
//! cannot say "this process"; a generation we committed is only known once our `sendmsg`
//! has returned, often after its notifications were read.
//!
//! [`parse`] is pure (unit-tested on datagrams captured from the kernel, in
//! `events/fixtures`); [`EventSocket`] is the subscribed socket. The kernel drops
//! notifications when a listener's receive queue is full and says so once, with
//! `ENOBUFS`: [`Received::Overrun`], after which the listener cannot know what it missed.

use std::os::fd::{AsFd, OwnedFd};

use netlink_sys::{Socket as NetlinkSocket, protocols::NETLINK_NETFILTER};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::attr::{Attrs, Malformed};
use crate::error::Error;
use crate::objects::Family;
use crate::socket::split;
use crate::wire::NFGENMSG_LEN;

/// `NFNLGRP_NFTABLES`: the multicast group of nf_tables notifications.
const NFNLGRP_NFTABLES: u32 = 7;
/// The nf_tables subsystem, the high byte of its message types.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// The table's name is attribute 1 of every object message (`NFTA_TABLE_NAME`,
/// `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`, `NFTA_SET_ELEM_LIST_TABLE`,
/// `NFTA_OBJ_TABLE`, `NFTA_FLOWTABLE_TABLE`).
const TABLE_ATTRIBUTE: u16 = 1;
const NFT_MSG_NEWGEN: u16 = 15;
const NFTA_GEN_ID: u16 = 1;
const NFTA_GEN_PROC_PID: u16 = 2;
const NFTA_GEN_PROC_NAME: u16 = 3;
/// Notification datagrams hold at most a few pages; one 64 KiB read always fits one.
const RECV_BUFFER: usize = 64 * 1024;
/// The receive queue: room for a burst of tens of thousands of notifications (a big
/// transaction's elements) before the kernel drops some and reports an overrun.
const RECEIVE_QUEUE: usize = 4 << 20;
/// `MSG_TRUNC`: recv reports a datagram's real length.
const MSG_TRUNC: i32 = 0x20;

/// The kind of object a notification is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Table,
    Chain,
    Rule,
    Set,
    /// Elements of one set (one message may carry many).
    Elements,
    /// A stateful object (counter, quota, ...).
    Object,
    Flowtable,
}

/// Whether a notification adds or deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    New,
    Delete,
}

/// One object added to or deleted from a table by a committed transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub object: ObjectKind,
    pub operation: Operation,
    /// The table's family (`None`: a family this crate does not speak, e.g. `arp`).
    pub family: Option<Family>,
    /// The table's name (`None` only in a malformed message).
    pub table: Option<String>,
    /// The port id of the socket that sent the transaction (0: the kernel itself).
    pub port_id: u32,
}

/// The end of one committed transaction (`NFT_MSG_NEWGEN`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The ruleset generation after it.
    pub generation: u32,
    /// The committing thread's pid, in the kernel's initial pid namespace.
    pub pid: Option<u32>,
    /// That process's name (`comm`).
    pub process: Option<String>,
    /// The port id of the socket that sent the transaction.
    pub port_id: u32,
}

/// One notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notification {
    Change(Change),
    Commit(Commit),
    /// A message of another kind or subsystem (listed here, never acted on).
    Other {
        message_type: u16,
    },
}

/// The notifications in one datagram from the group, in order.
pub fn parse(datagram: &[u8]) -> Result<Vec<Notification>, Malformed> {
    let messages = split(datagram).map_err(|e| Malformed(e.to_string()))?;
    messages
        .iter()
        .map(|m| parse_message(m.message_type, port_id_of(&m.bytes), m.payload()))
        .collect()
}

/// The netlink header's port id (bytes 12..16, host order).
fn port_id_of(message: &[u8]) -> u32 {
    message
        .get(12..16)
        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn parse_message(message_type: u16, port_id: u32, payload: &[u8]) -> Result<Notification, Malformed> {
    if message_type >> 8 != NFNL_SUBSYS_NFTABLES {
        return Ok(Notification::Other { message_type });
    }
    let message = message_type & 0xff;
    let header = payload
        .get(..NFGENMSG_LEN)
        .ok_or_else(|| Malformed(format!("a {}-byte nf_tables notification", payload.len())))?;
    let attrs = Attrs::new(&payload[NFGENMSG_LEN..]);
    if message == NFT_MSG_NEWGEN {
        return commit(attrs, port_id).map(Notification::Commit);
    }
    let Some((object, operation)) = classify(message) else {
        return Ok(Notification::Other { message_type });
    };
    let mut table = None;
    for attr in attrs {
        let attr = attr?;
        if attr.kind == TABLE_ATTRIBUTE {
            table = Some(attr.string()?);
            break;
        }
    }
    Ok(Notification::Change(Change {
        object,
        operation,
        family: Family::from_number(header[0]),
        table,
        port_id,
    }))
}

/// The object and operation of an nf_tables message type (low byte); `None` for gets,
/// resets, traces and anything newer than this list.
fn classify(message: u16) -> Option<(ObjectKind, Operation)> {
    use ObjectKind::*;
    use Operation::*;
    Some(match message {
        0 => (Table, New),
        2 | 26 => (Table, Delete),
        3 => (Chain, New),
        5 | 27 => (Chain, Delete),
        6 => (Rule, New),
        8 | 28 => (Rule, Delete),
        9 => (Set, New),
        11 | 29 => (Set, Delete),
        12 => (Elements, New),
        14 | 30 => (Elements, Delete),
        18 => (Object, New),
        20 | 31 => (Object, Delete),
        22 => (Flowtable, New),
        24 | 32 => (Flowtable, Delete),
        _ => return None,
    })
}

fn commit(attrs: Attrs<'_>, port_id: u32) -> Result<Commit, Malformed> {
    let mut generation = None;
    let mut pid = None;
    let mut process = None;
    for attr in attrs {
        let attr = attr?;
        match attr.kind {
            NFTA_GEN_ID => generation = Some(attr.u32()?),
            NFTA_GEN_PROC_PID => pid = Some(attr.u32()?),
            NFTA_GEN_PROC_NAME => process = Some(attr.string()?),
            _ => {}
        }
    }
    Ok(Commit {
        generation: generation.ok_or_else(|| Malformed("a NEWGEN notification without an id".into()))?,
        pid,
        process,
        port_id,
    })
}

/// What one [`EventSocket::recv`] got.
#[derive(Debug)]
pub enum Received {
    /// One datagram's notifications.
    Notifications(Vec<Notification>),
    /// The kernel dropped notifications for this socket (its queue was full): anything
    /// may have happened since the last one read.
    Overrun,
    /// [`Stopper::stop`] was called.
    Stopped,
}

/// A `NETLINK_NETFILTER` socket subscribed to nf_tables notifications, in the network
/// namespace of the thread that opened it, with a pipe that interrupts its wait.
#[derive(Debug)]
pub struct EventSocket {
    socket: NetlinkSocket,
    buffer: Vec<u8>,
    wake: OwnedFd,
}

/// Interrupts an [`EventSocket`]'s wait, from any thread.
#[derive(Debug)]
pub struct Stopper(OwnedFd);

impl Stopper {
    /// Makes the socket's current or next [`EventSocket::recv`] return
    /// [`Received::Stopped`].
    pub fn stop(&self) {
        // A full pipe already holds a wake-up; a closed one means the socket is gone.
        let _ = nix::unistd::write(&self.0, &[1]);
    }
}

impl EventSocket {
    /// Subscribes to nf_tables notifications in the calling thread's network namespace;
    /// also returns what stops its wait.
    pub fn open() -> Result<(Self, Stopper), Error> {
        let mut socket = NetlinkSocket::new(NETLINK_NETFILTER).map_err(Error::Socket)?;
        socket.bind_auto().map_err(Error::Socket)?;
        socket.add_membership(NFNLGRP_NFTABLES).map_err(Error::Socket)?;
        // Without CAP_NET_ADMIN the kernel's default (~200 KiB) stays: more overruns.
        if nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &RECEIVE_QUEUE)
            .is_err()
        {
            let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &RECEIVE_QUEUE);
        }
        let (wake, stop) = nix::unistd::pipe().map_err(|errno| Error::Socket(errno.into()))?;
        Ok((
            Self {
                socket,
                buffer: vec![0; RECV_BUFFER],
                wake,
            },
            Stopper(stop),
        ))
    }

    /// Waits for the next datagram of notifications, an overrun, or the stopper.
    pub fn recv(&mut self) -> Result<Received, Error> {
        loop {
            let mut fds = [
                PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.wake.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(errno) => return Err(Error::Io(errno.into())),
            }
            let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
            if ready(&fds[1]) {
                return Ok(Received::Stopped);
            }
            if !ready(&fds[0]) {
                continue;
            }
            let capacity = self.buffer.len();
            let mut space = &mut self.buffer[..];
            let size = match self.socket.recv(&mut space, MSG_TRUNC) {
                Ok(size) => size,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => return Ok(Received::Overrun),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Io(e)),
            };
            if size > capacity {
                // A datagram this big is not a notification this crate knows; what it
                // said is lost, as after an overrun.
                return Ok(Received::Overrun);
            }
            return Ok(Received::Notifications(parse(&self.buffer[..size])?));
        }
    }
}

#[cfg(test)]
mod tests;
