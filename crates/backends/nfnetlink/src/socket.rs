//! The nf_tables netlink socket: sends batches as transactions and reads tables back.
//!
//! A batch goes out as one datagram, `BATCH_BEGIN`, its messages, `BATCH_END`, which the
//! kernel applies all-or-nothing while `sendmsg` runs. Messages carry no `NLM_F_ACK`, so a
//! 500k-element load does not earn hundreds of acknowledgements; the kernel still reports each
//! failing message, by its sequence number, with its errno and extended-ack text. To know
//! that every report is in, the batch is followed by a generation request: its answer
//! comes after everything the batch caused. The generation it returns changes with every
//! committed transaction of any table in the namespace.
//!
//! A socket opens in the network namespace of the calling thread.

use std::time::Duration;

use netlink_sys::{Socket as NetlinkSocket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::attr::{Attrs, Malformed};
use crate::batch::Batch;
use crate::consts::*;
use crate::dump::{self, ChainInfo, ObjectInfo, RuleInfo, SetInfo, TableInfo};
use crate::error::{BatchError, Error, MessageFailure};
use crate::objects::{Counter, Element, ObjectType, Table};
use crate::wire::{self, HEADER_LEN};

/// The kernel answers at once unless something is badly wrong.
const RECV_TIMEOUT: Duration = Duration::from_secs(30);
/// Dump datagrams hold at most 32 KiB; one more page of slack.
const RECV_BUFFER: usize = 64 * 1024;
/// The largest single transaction this socket sends: the kernel copies it into one
/// buffer, and holds the nf_tables mutex while it applies it.
pub const MAX_TRANSACTION_BYTES: usize = 256 * 1024 * 1024;
/// A good `max_bytes` for [`Socket::send_split`]: at 500k elements, 1 MiB transactions
/// each held the kernel's nf_tables mutex for at most ~60 ms, and the whole load took no
/// longer than one big transaction.
pub const SPLIT_TRANSACTION_BYTES: usize = 1 << 20;
/// Receive queue size: ~40k capped error reports.
const RECEIVE_QUEUE: usize = 4 << 20;
/// `MSG_TRUNC`: recv reports a datagram's real length.
const MSG_TRUNC: i32 = 0x20;
/// A dump restarts when a concurrent change interrupted it; this many times at most.
const DUMP_ATTEMPTS: u32 = 8;

/// The table [`Socket::validate`] adds and deletes twice to make a batch fail on purpose.
const VALIDATION_PROBE_TABLE: &str = "kpr-nfnetlink-validation-probe";

/// What the kernel did with a batch.
enum Outcome {
    Committed(u32),
    Refused(Vec<MessageFailure>),
}

/// A netlink socket speaking nf_tables.
pub struct Socket {
    channel: Channel,
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Socket")
            .field("sequence", &self.channel.sequence)
            .field("send_buffer", &self.channel.send_buffer)
            .finish()
    }
}

/// What nf_tables' and ipset's sockets share: one `NETLINK_NETFILTER` socket (see
/// [`open_netfilter`]), its receive buffer, the last sequence number used and the send
/// buffer's size.
pub(crate) struct Channel {
    socket: NetlinkSocket,
    buffer: Vec<u8>,
    pub(crate) sequence: u32,
    pub(crate) send_buffer: usize,
}

impl Channel {
    /// A channel in the calling thread's network namespace.
    pub(crate) fn open() -> Result<Self, Error> {
        let (socket, send_buffer) = open_netfilter()?;
        Ok(Self {
            socket,
            buffer: vec![0; RECV_BUFFER],
            sequence: std::process::id().wrapping_mul(7919),
            send_buffer,
        })
    }

    pub(crate) fn next_sequence(&mut self) -> u32 {
        self.sequence = self.sequence.wrapping_add(1);
        self.sequence
    }

    /// One datagram, split into its messages.
    pub(crate) fn recv(&mut self) -> Result<Vec<Answer>, Error> {
        recv_answers(&self.socket, &mut self.buffer)
    }

    pub(crate) fn send_all(&self, bytes: &[u8]) -> Result<(), Error> {
        send_datagram(&self.socket, bytes)
    }

    pub(crate) fn fit_send_buffer(&mut self, bytes: usize) -> Result<(), Error> {
        fit_send_buffer(&self.socket, &mut self.send_buffer, bytes)
    }

    /// Sends one request and returns its answers: up to the end of a dump, up to the
    /// acknowledgement of a request that asks for one (`NLM_F_ACK`), else the first
    /// answer. A refusal comes back as [`Exchanged::Refused`] with the kernel's error
    /// message, for the caller to name in its own terms.
    pub(crate) fn exchange(&mut self, mut request: Vec<u8>) -> Result<Exchanged, Error> {
        let sequence = self.next_sequence();
        wire::set_sequence(&mut request, 0, sequence);
        let flags = u16::from_ne_bytes([request[6], request[7]]);
        let is_dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let acknowledged = flags & NLM_F_ACK != 0;
        self.send_all(&request)?;
        let mut answers = Vec::new();
        loop {
            for answer in self.recv()? {
                if answer.sequence != sequence {
                    continue;
                }
                match answer.message_type {
                    NLMSG_DONE => return Ok(Exchanged::Answers(answers)),
                    NLMSG_ERROR => {
                        let (errno, _) = error_of(&answer)?;
                        return Ok(match errno {
                            0 => Exchanged::Answers(answers),
                            _ => Exchanged::Refused(answer),
                        });
                    }
                    _ => answers.push(answer),
                }
                if !is_dump && !acknowledged {
                    return Ok(Exchanged::Answers(answers));
                }
            }
        }
    }
}

/// How [`Channel::exchange`] ended.
pub(crate) enum Exchanged {
    Answers(Vec<Answer>),
    /// The kernel's error message.
    Refused(Answer),
}

/// One answer message.
pub(crate) struct Answer {
    pub(crate) message_type: u16,
    pub(crate) flags: u16,
    pub(crate) sequence: u32,
    pub(crate) bytes: Vec<u8>,
}

impl Answer {
    pub(crate) fn payload(&self) -> &[u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or_default()
    }
}

impl Socket {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, Error> {
        Ok(Self {
            channel: Channel::open()?,
        })
    }

    /// Applies `batch` as one transaction: all of it, or (on error) none of it. Returns
    /// the ruleset generation after the commit. An empty batch sends nothing.
    pub fn send(&mut self, batch: &Batch) -> Result<u32, Error> {
        if batch.is_empty() {
            return self.generation();
        }
        let failures = self.transact(batch)?;
        match failures {
            Outcome::Committed(generation) => Ok(generation),
            Outcome::Refused(failures) => Err(BatchError { failures }.into()),
        }
    }

    /// Has the kernel check `batch` without committing anything: every message is
    /// processed as for [`Socket::send`] (so missing kernel features, unknown expressions
    /// and bad references are reported per message), then the transaction is aborted by a
    /// sentinel that always fails: deleting a probe table twice. For start-up checks.
    pub fn validate(&mut self, batch: &Batch) -> Result<(), Error> {
        let mut probe = batch.clone();
        let table = Table::new(crate::Family::Ip, VALIDATION_PROBE_TABLE);
        probe.add_table(&table);
        probe.delete_table(&table);
        probe.delete_table(&table);
        match self.transact(&probe)? {
            Outcome::Committed(_) => Err(Malformed(
                "the kernel committed a validation batch whose last message must fail".into(),
            )
            .into()),
            Outcome::Refused(failures) => {
                let real: Vec<_> = failures
                    .into_iter()
                    .filter(|f| f.index.is_none_or(|i| i < batch.len()))
                    .collect();
                if real.is_empty() {
                    Ok(())
                } else {
                    Err(BatchError { failures: real }.into())
                }
            }
        }
    }

    /// Sends `batch` between begin and end markers, then a generation request as a
    /// barrier, and collects the kernel's reports on the batch's messages.
    fn transact(&mut self, batch: &Batch) -> Result<Outcome, Error> {
        self.transact_range(batch, 0..batch.len())
    }

    /// Like [`Socket::transact`] for messages `range` of `batch` only (failures keep their
    /// index in the whole batch).
    fn transact_range(&mut self, batch: &Batch, range: std::ops::Range<usize>) -> Result<Outcome, Error> {
        if let Some((operation, problem)) = &batch.invalid {
            return Err(Error::InvalidName {
                operation: operation.clone(),
                problem: problem.clone(),
            });
        }
        let first = batch.messages.get(range.start).map_or(0, |m| m.start);
        let last = range.end.checked_sub(1).map_or(first, |i| batch.message_end(i));
        let body = batch.buf.get(first..last).unwrap_or_default();
        let bytes = 2 * (HEADER_LEN + wire::NFGENMSG_LEN) + body.len();
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(Error::TooLarge {
                bytes,
                limit: MAX_TRANSACTION_BYTES,
            });
        }
        self.channel.fit_send_buffer(bytes)?;

        let mut datagram = Vec::with_capacity(bytes);
        let begin = self.channel.next_sequence();
        marker(&mut datagram, NFNL_MSG_BATCH_BEGIN, begin);
        let offset = datagram.len();
        datagram.extend_from_slice(body);
        for message in batch.messages.get(range.clone()).unwrap_or_default() {
            let sequence = self.channel.next_sequence();
            wire::set_sequence(&mut datagram, offset + message.start - first, sequence);
        }
        let end = self.channel.next_sequence();
        marker(&mut datagram, NFNL_MSG_BATCH_END, end);
        self.channel.send_all(&datagram)?;

        let barrier = self.channel.next_sequence();
        let mut request = generation_request();
        wire::set_sequence(&mut request, 0, barrier);
        self.channel.send_all(&request)?;

        let mut failures = Vec::new();
        loop {
            for answer in self.channel.recv()? {
                if answer.sequence == barrier {
                    return match answer.message_type {
                        NLMSG_ERROR => Err(self.refusal("the generation request", &answer)),
                        _ if failures.is_empty() => generation_of(&answer).map(Outcome::Committed),
                        _ => Ok(Outcome::Refused(failures)),
                    };
                }
                let in_batch = answer.sequence.wrapping_sub(begin) <= end.wrapping_sub(begin);
                if !in_batch || answer.message_type != NLMSG_ERROR {
                    continue;
                }
                let (errno, message) = error_of(&answer)?;
                if errno == 0 {
                    continue;
                }
                // Sequence numbers begin+1 .. end-1 are the batch's messages in order;
                // begin itself stands for the batch as a whole (e.g. its commit).
                let index = answer
                    .sequence
                    .wrapping_sub(begin)
                    .checked_sub(1)
                    .map(|i| range.start + i as usize)
                    .filter(|i| range.contains(i));
                failures.push(MessageFailure {
                    index,
                    operation: index
                        .and_then(|i| batch.messages.get(i))
                        .map(|m| m.operation.clone()),
                    errno,
                    message,
                });
            }
        }
    }

    /// Applies `batch` as several transactions of at most `max_bytes` each (for cold loads:
    /// each transaction holds the kernel's nf_tables mutex only so long). Not atomic: when
    /// one fails, the ones before it stay committed and the error says how many.
    pub fn send_split(&mut self, batch: &Batch, max_bytes: usize) -> Result<u32, Error> {
        // Transactions are cut from the batch's buffer in place: no copy of the batch.
        let ranges = batch.ranges(max_bytes);
        let total = ranges.len();
        let mut generation = None;
        for (committed, range) in ranges.into_iter().enumerate() {
            let outcome = self
                .transact_range(batch, range)
                .and_then(|outcome| match outcome {
                    Outcome::Committed(g) => Ok(g),
                    Outcome::Refused(failures) => Err(BatchError { failures }.into()),
                });
            match outcome {
                Ok(g) => generation = Some(g),
                Err(error) if committed == 0 => return Err(error),
                Err(error) => {
                    return Err(Error::PartlyCommitted {
                        committed,
                        total,
                        error: Box::new(error),
                    });
                }
            }
        }
        match generation {
            Some(generation) => Ok(generation),
            None => self.generation(),
        }
    }

    /// The ruleset generation: it changes with every committed transaction in this
    /// namespace, ours or anyone else's.
    pub fn generation(&mut self) -> Result<u32, Error> {
        let answers = self.exchange("the generation", generation_request())?;
        let answer = answers
            .first()
            .ok_or_else(|| Malformed("no answer to the generation request".into()))?;
        generation_of(answer)
    }

    /// The port id the kernel gave this socket: the notifications of the transactions
    /// it sends carry it ([`crate::events`]), so a listener can tell them apart.
    pub fn port_id(&self) -> Result<u32, Error> {
        let mut address = netlink_sys::SocketAddr::new(0, 0);
        self.channel
            .socket
            .get_address(&mut address)
            .map_err(Error::Socket)?;
        Ok(address.port_number())
    }

    /// The tables of `family` (every family when `None`).
    pub fn tables(&mut self, family: Option<crate::Family>) -> Result<Vec<TableInfo>, Error> {
        let number = family.map_or(0, |f| f.number());
        let request = query(
            "the tables",
            wire::request(NFT_MSG_GETTABLE, NLM_F_DUMP, number, |_| {}),
        )?;
        self.dump("the tables", request)?
            .iter()
            .map(|a| dump::table(a.payload()).map_err(Error::from))
            .collect()
    }

    /// The chains of `table` (none when it does not exist).
    pub fn chains(&mut self, table: &Table) -> Result<Vec<ChainInfo>, Error> {
        let request = wire::request(NFT_MSG_GETCHAIN, NLM_F_DUMP, table.family.number(), |w| {
            w.string(NFTA_CHAIN_TABLE, &table.name)
        });
        let request = query("a dump request", request)?;
        let chains = self.dump(&format!("the chains of table {table}"), request)?;
        let mut result = Vec::new();
        for answer in &chains {
            let chain = dump::chain(answer.payload())?;
            if chain.table == *table {
                result.push(chain);
            }
        }
        Ok(result)
    }

    /// The sets and maps of `table` (`ENOENT` when it does not exist).
    pub fn sets(&mut self, table: &Table) -> Result<Vec<SetInfo>, Error> {
        let request = wire::request(NFT_MSG_GETSET, NLM_F_DUMP, table.family.number(), |w| {
            w.string(NFTA_SET_TABLE, &table.name)
        });
        let request = query("a dump request", request)?;
        let sets = self.dump(&format!("the sets of table {table}"), request)?;
        let mut result = Vec::new();
        for answer in &sets {
            let set = dump::set(answer.payload())?;
            if set.table == *table {
                result.push(set);
            }
        }
        Ok(result)
    }

    /// The elements of set `name` of `table` (`ENOENT` when either does not exist).
    /// Costs the kernel O(n^2) for big sets: see the crate docs.
    pub fn elements(&mut self, table: &Table, name: &str) -> Result<Vec<Element>, Error> {
        let request = wire::request(NFT_MSG_GETSETELEM, NLM_F_DUMP, table.family.number(), |w| {
            w.string(NFTA_SET_ELEM_LIST_TABLE, &table.name);
            w.string(NFTA_SET_ELEM_LIST_SET, name);
        });
        let request = query("a dump request", request)?;
        let answers = self.dump(&format!("the elements of set {table} {name}"), request)?;
        let mut elements = Vec::new();
        for answer in &answers {
            dump::elements(answer.payload(), &mut elements)?;
        }
        Ok(elements)
    }

    /// The rules of `table`, chain by chain; only those of `chain` when given (none when
    /// the table does not exist).
    pub fn rules(&mut self, table: &Table, chain: Option<&str>) -> Result<Vec<RuleInfo>, Error> {
        let request = wire::request(NFT_MSG_GETRULE, NLM_F_DUMP, table.family.number(), |w| {
            w.string(NFTA_RULE_TABLE, &table.name);
            if let Some(chain) = chain {
                w.string(NFTA_RULE_CHAIN, chain);
            }
        });
        let request = query("a dump request", request)?;
        let what = format!("the rules of table {table}");
        let mut result = Vec::new();
        for answer in &self.dump(&what, request)? {
            let rule = dump::rule(answer.payload())?;
            if rule.table == *table && chain.is_none_or(|c| c == rule.chain) {
                result.push(rule);
            }
        }
        Ok(result)
    }

    /// The stateful objects of `table` (named counters, ...), only those of type `kind`
    /// when given; none when the table does not exist. A counter comes with its numbers as
    /// they are now.
    pub fn objects(&mut self, table: &Table, kind: Option<ObjectType>) -> Result<Vec<ObjectInfo>, Error> {
        let request = query("a dump request", objects_request(table, kind))?;
        let what = format!("the objects of table {table}");
        let mut result = Vec::new();
        for answer in &self.dump(&what, request)? {
            let object = dump::object(answer.payload())?;
            if object.table == *table && kind.is_none_or(|k| k == object.kind) {
                result.push(object);
            }
        }
        Ok(result)
    }

    /// The numbers of the named counter `name` of `table`, `None` when it (or the table)
    /// does not exist.
    pub fn counter(&mut self, table: &Table, name: &str) -> Result<Option<Counter>, Error> {
        Ok(self
            .objects(table, Some(ObjectType::COUNTER))?
            .into_iter()
            .find(|object| object.name == name)
            .and_then(|object| object.counter))
    }

    /// A dump, restarted when a concurrent change interrupted it.
    fn dump(&mut self, what: &str, request: Vec<u8>) -> Result<Vec<Answer>, Error> {
        for _ in 0..DUMP_ATTEMPTS {
            let answers = self.exchange(what, request.clone())?;
            if answers.iter().all(|a| a.flags & NLM_F_DUMP_INTR == 0) {
                return Ok(answers);
            }
        }
        Err(Error::DumpInterrupted {
            what: what.to_owned(),
            attempts: DUMP_ATTEMPTS,
        })
    }

    /// Sends one request and returns its answers, up to the end of a dump, or the first
    /// answer of a plain request (nf_tables requests ask for no acknowledgement).
    fn exchange(&mut self, what: &str, request: Vec<u8>) -> Result<Vec<Answer>, Error> {
        match self.channel.exchange(request)? {
            Exchanged::Answers(answers) => Ok(answers),
            Exchanged::Refused(answer) => Err(self.refusal(what, &answer)),
        }
    }

    fn refusal(&self, what: &str, answer: &Answer) -> Error {
        match error_of(answer) {
            Ok((errno, message)) => Error::Kernel {
                request: what.to_owned(),
                errno,
                message,
            },
            Err(malformed) => malformed.into(),
        }
    }
}

/// The dump request for the objects of `table` (of type `kind` when given), as nft sends
/// it for `nft list counters table ...` (which asks for every type).
pub(crate) fn objects_request(table: &Table, kind: Option<ObjectType>) -> Result<Vec<u8>, String> {
    wire::request(NFT_MSG_GETOBJ, NLM_F_DUMP, table.family.number(), |w| {
        w.string(NFTA_OBJ_TABLE, &table.name);
        if let Some(kind) = kind {
            w.u32(NFTA_OBJ_TYPE, kind.0);
        }
    })
}

/// A `NETLINK_NETFILTER` socket connected to the kernel in the calling thread's network
/// namespace, with extended and capped acknowledgements, a receive timeout and a receive
/// queue with room for many reports; and its send buffer size. Shared by nf_tables and
/// ipset ([`crate::ipset`]).
fn open_netfilter() -> Result<(NetlinkSocket, usize), Error> {
    let mut socket = NetlinkSocket::new(NETLINK_NETFILTER).map_err(Error::Socket)?;
    socket.bind_auto().map_err(Error::Socket)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(Error::Socket)?;
    // Errors carry the kernel's explanation, and not a copy of the failed request.
    socket.set_ext_ack(true).map_err(Error::Socket)?;
    socket.set_cap_ack(true).map_err(Error::Socket)?;
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(RECV_TIMEOUT.as_secs() as _, 0),
    )
    .map_err(|errno| Error::Socket(errno.into()))?;
    // Room for the reports on a large refused batch (one small error per message).
    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &RECEIVE_QUEUE)
        .map_err(|errno| Error::Socket(errno.into()))?;
    let send_buffer = nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::SndBuf)
        .map_err(|errno| Error::Socket(errno.into()))?;
    Ok((socket, send_buffer))
}

/// One datagram from `socket` into `buffer`, split into its messages.
fn recv_answers(socket: &NetlinkSocket, buffer: &mut [u8]) -> Result<Vec<Answer>, Error> {
    let capacity = buffer.len();
    let mut space = &mut buffer[..];
    let size = socket.recv(&mut space, MSG_TRUNC).map_err(Error::Io)?;
    if size > capacity {
        return Err(Malformed(format!(
            "a {size}-byte datagram did not fit the {capacity}-byte buffer"
        ))
        .into());
    }
    split(&buffer[..size])
}

/// Sends `bytes` as one datagram.
fn send_datagram(socket: &NetlinkSocket, bytes: &[u8]) -> Result<(), Error> {
    let sent = socket.send(bytes, 0).map_err(Error::Io)?;
    if sent != bytes.len() {
        return Err(Malformed(format!("sent {sent} of {} bytes", bytes.len())).into());
    }
    Ok(())
}

/// Grows `socket`'s send buffer (recorded in `send_buffer`) to hold a `bytes`-long datagram.
fn fit_send_buffer(socket: &NetlinkSocket, send_buffer: &mut usize, bytes: usize) -> Result<(), Error> {
    // The kernel refuses a datagram longer than the send buffer less a little.
    let needed = bytes + 4096;
    if needed <= *send_buffer {
        return Ok(());
    }
    let wanted = needed.next_power_of_two();
    nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::SndBufForce, &wanted)
        .map_err(|errno| Error::Socket(errno.into()))?;
    *send_buffer = nix::sys::socket::getsockopt(socket, nix::sys::socket::sockopt::SndBuf)
        .map_err(|errno| Error::Socket(errno.into()))?;
    Ok(())
}

/// A generation request: no names, so it always encodes.
fn generation_request() -> Vec<u8> {
    wire::request(NFT_MSG_GETGEN, 0, 0, |_| {}).unwrap_or_default()
}

/// A dump request, or why its names cannot be sent.
fn query(what: &str, request: Result<Vec<u8>, String>) -> Result<Vec<u8>, Error> {
    request.map_err(|problem| Error::InvalidQuery {
        what: what.to_owned(),
        problem,
    })
}

/// A batch begin or end marker: nfgenmsg with the nf_tables subsystem as resource id.
fn marker(buf: &mut Vec<u8>, message_type: u16, sequence: u32) {
    let at = wire::start(buf, message_type, 0, 0, NFNL_SUBSYS_NFTABLES);
    wire::finish(buf, at);
    wire::set_sequence(buf, at, sequence);
}

/// Splits a datagram into its messages by their length fields.
pub(crate) fn split(datagram: &[u8]) -> Result<Vec<Answer>, Error> {
    let mut answers = Vec::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let header = rest
            .get(..HEADER_LEN)
            .ok_or_else(|| Malformed(format!("{} trailing bytes", rest.len())))?;
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if length < HEADER_LEN || length > rest.len() {
            return Err(Malformed(format!("message length {length} with {} bytes left", rest.len())).into());
        }
        answers.push(Answer {
            message_type: u16::from_ne_bytes([header[4], header[5]]),
            flags: u16::from_ne_bytes([header[6], header[7]]),
            sequence: u32::from_ne_bytes([header[8], header[9], header[10], header[11]]),
            bytes: rest[..length].to_vec(),
        });
        let aligned = length.next_multiple_of(4).min(rest.len());
        rest = &rest[aligned..];
    }
    Ok(answers)
}

/// The errno (positive, 0 for an acknowledgement) and extended-ack text of an
/// `NLMSG_ERROR` answer.
pub(crate) fn error_of(answer: &Answer) -> Result<(i32, Option<String>), Malformed> {
    let payload = answer.payload();
    let code = payload
        .get(..4)
        .ok_or_else(|| Malformed(format!("a {}-byte error message", answer.bytes.len())))?;
    let errno = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]).saturating_neg();
    if answer.flags & NLM_F_ACK_TLVS == 0 {
        return Ok((errno, None));
    }
    // After the code: the failed request's header (all of it when capped), then TLVs.
    let request_len = if answer.flags & NLM_F_CAPPED != 0 {
        HEADER_LEN
    } else {
        payload
            .get(4..8)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .unwrap_or(HEADER_LEN)
            .next_multiple_of(4)
    };
    let tlvs = payload.get(4 + request_len..).unwrap_or_default();
    let mut message = None;
    for attr in Attrs::new(tlvs) {
        let attr = attr?;
        if attr.kind == NLMSGERR_ATTR_MSG {
            message = Some(attr.string()?).filter(|m| !m.is_empty());
        }
    }
    Ok((errno, message))
}

fn generation_of(answer: &Answer) -> Result<u32, Error> {
    // NEWGEN answers carry AF_UNSPEC: skip nfgenmsg without reading a family from it.
    let attrs = answer.payload().get(wire::NFGENMSG_LEN..).unwrap_or_default();
    for attr in Attrs::new(attrs) {
        let attr = attr?;
        if attr.kind == NFTA_GEN_ID {
            return Ok(attr.u32()?);
        }
    }
    Err(Malformed("a generation answer without an id".into()).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Writer;

    #[test]
    fn an_extended_ack_names_the_kernels_reason() {
        let mut payload = (-2i32).to_ne_bytes().to_vec();
        payload.extend_from_slice(&[0; HEADER_LEN]);
        let mut tlvs = Vec::new();
        Writer::new(&mut tlvs).string(NLMSGERR_ATTR_MSG, "no such set");
        payload.extend_from_slice(&tlvs);
        let answer = Answer {
            message_type: NLMSG_ERROR,
            flags: NLM_F_CAPPED | NLM_F_ACK_TLVS,
            sequence: 1,
            bytes: [vec![0; HEADER_LEN], payload].concat(),
        };
        assert_eq!(error_of(&answer).unwrap(), (2, Some("no such set".into())));
    }

    #[test]
    fn truncated_answers_are_malformed_not_a_panic() {
        let answer = Answer {
            message_type: NLMSG_ERROR,
            flags: NLM_F_ACK_TLVS,
            sequence: 1,
            bytes: vec![0; HEADER_LEN + 2],
        };
        assert!(error_of(&answer).is_err());
        assert!(split(&[20, 0, 0, 0, 1]).is_err());
        let mut long = vec![0u8; 20];
        long[0] = 200;
        assert!(split(&long).is_err());
    }
}
