//! The ipset socket: one `NETLINK_NETFILTER` socket in the calling thread's network
//! namespace, the same set-up as nf_tables' (`crate::socket::Channel`).
//!
//! Member changes go out many messages to a datagram, each with its own sequence number
//! and `NLM_F_ACK`: the kernel handles the messages of a datagram one after the other and
//! answers each, so a refusal names its message, hence the member. ipset has no
//! transactions: the changes before and after a refused one stay applied, as with
//! `ipset restore`. Datagrams are cut at [`CHANGES_PER_DATAGRAM`] messages so the
//! acknowledgements of one datagram fit the receive queue.

use std::collections::HashMap;

use crate::consts::NLMSG_ERROR;
use crate::error::Error;
use crate::socket::{Answer, Channel, Exchanged, error_of};
use crate::wire;

use super::messages::{self, Change, ListedSet, SetDef, SetType, reason};

/// Messages per datagram: 1024 acknowledgements (a few hundred bytes of receive queue
/// each) stay well inside the 4 MiB queue the socket asks for.
pub const CHANGES_PER_DATAGRAM: usize = 1024;

/// A netlink socket speaking ipset.
pub struct IpsetSocket {
    channel: Channel,
    /// The kernel's newest revision of each type asked about so far.
    revisions: HashMap<SetType, u8>,
}

impl std::fmt::Debug for IpsetSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpsetSocket")
            .field("sequence", &self.channel.sequence)
            .field("revisions", &self.revisions)
            .finish()
    }
}

impl IpsetSocket {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, Error> {
        Ok(Self {
            channel: Channel::open()?,
            revisions: HashMap::new(),
        })
    }

    /// The kernel's newest revision of `set_type`, asked once per socket (the tool asks
    /// every time). `ipset` is missing from a kernel that answers `EPROTONOSUPPORT`.
    pub fn revision(&mut self, set_type: SetType) -> Result<u8, Error> {
        if let Some(revision) = self.revisions.get(&set_type) {
            return Ok(*revision);
        }
        let what = format!("the revision of ipset type {}", set_type.name());
        let answers = self.exchange(&what, messages::type_query(set_type))?;
        let answer = answers
            .first()
            .ok_or_else(|| crate::Malformed(format!("no answer to {what}")))?;
        let (newest, _) = messages::parse_type_answer(answer.payload())?;
        self.revisions.insert(set_type, newest);
        Ok(newest)
    }

    /// Creates `set` (`-exist`: a set of that name, type and options is kept as it is).
    pub fn create(&mut self, set: &SetDef<'_>) -> Result<(), Error> {
        let revision = self.revision(set.set_type)?;
        let what = format!("creating ipset {} ({})", set.name, set.set_type.name());
        let request = messages::create(set, revision).map_err(|problem| invalid(&what, problem))?;
        self.exchange(&what, request).map(drop)
    }

    /// Destroys set `name` (`ENOENT` when there is none; `IPSET_ERR_BUSY` while a rule
    /// uses it).
    pub fn destroy(&mut self, name: &str) -> Result<(), Error> {
        let what = format!("destroying ipset {name}");
        let request = messages::destroy(name).map_err(|problem| invalid(&what, problem))?;
        self.exchange(&what, request).map(drop)
    }

    /// Set `name` with its members (`ENOENT` when there is none), or every set.
    pub fn list(&mut self, name: Option<&str>) -> Result<Vec<ListedSet>, Error> {
        let what = match name {
            Some(name) => format!("the members of ipset {name}"),
            None => "every ipset".to_string(),
        };
        let request = messages::list(name).map_err(|problem| invalid(&what, problem))?;
        let mut sets = Vec::new();
        for answer in self.exchange(&what, request)? {
            messages::parse_list_answer(answer.payload(), &mut sets)?;
        }
        Ok(sets)
    }

    /// Applies `changes` in order (`-exist`: adding a member that is there, or deleting
    /// one that is not, is no error). Every change is tried; the first refusal is
    /// returned, naming the change and the kernel's reason, with how many others failed.
    pub fn apply(&mut self, changes: &[Change<'_>]) -> Result<(), Error> {
        let mut first = None;
        let mut refused = 0;
        for chunk in changes.chunks(CHANGES_PER_DATAGRAM) {
            for (index, errno, message) in self.send_changes(chunk)? {
                refused += 1;
                first.get_or_insert((chunk[index], errno, message));
            }
        }
        match first {
            None => Ok(()),
            Some((change, errno, message)) => Err(Error::IpsetRefused {
                request: change.to_string(),
                errno,
                reason: message.unwrap_or_else(|| reason(errno)),
                others: refused - 1,
            }),
        }
    }

    /// One datagram of `chunk`'s messages; the refusals as (index in `chunk`, errno,
    /// kernel text).
    fn send_changes(&mut self, chunk: &[Change<'_>]) -> Result<Vec<(usize, i32, Option<String>)>, Error> {
        let mut datagram = Vec::with_capacity(chunk.len() * 96);
        let first = self.channel.sequence.wrapping_add(1);
        for change in chunk {
            let start = messages::append_change(&mut datagram, change)
                .map_err(|problem| invalid(&change.to_string(), problem))?;
            let sequence = self.channel.next_sequence();
            wire::set_sequence(&mut datagram, start, sequence);
        }
        self.channel.fit_send_buffer(datagram.len())?;
        self.channel.send_all(&datagram)?;
        let mut acknowledged = 0;
        let mut refusals = Vec::new();
        while acknowledged < chunk.len() {
            for answer in self.channel.recv()? {
                let index = answer.sequence.wrapping_sub(first) as usize;
                if index >= chunk.len() || answer.message_type != NLMSG_ERROR {
                    continue;
                }
                acknowledged += 1;
                let (errno, message) = error_of(&answer)?;
                if errno != 0 {
                    refusals.push((index, errno, message));
                }
            }
        }
        Ok(refusals)
    }

    /// Sends one request and returns its answers (see [`Channel::exchange`]); a refusal
    /// names `what`.
    fn exchange(&mut self, what: &str, request: Vec<u8>) -> Result<Vec<Answer>, Error> {
        match self.channel.exchange(request)? {
            Exchanged::Answers(answers) => Ok(answers),
            Exchanged::Refused(answer) => {
                let (errno, message) = error_of(&answer)?;
                Err(refused(what.to_owned(), errno, message))
            }
        }
    }
}

fn refused(request: String, errno: i32, message: Option<String>) -> Error {
    Error::IpsetRefused {
        request,
        errno,
        reason: message.unwrap_or_else(|| reason(errno)),
        others: 0,
    }
}

fn invalid(what: &str, problem: String) -> Error {
    Error::InvalidIpsetName {
        what: what.to_owned(),
        problem,
    }
}
