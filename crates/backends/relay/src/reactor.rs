//! A TCP thread's event loop: its listeners, the connections they accepted, and their dial
//! timers, on one epoll instance (through mio) and nothing else.
//!
//! A connection is an entry of a table ([`Slab`]) whose key is its epoll token: the
//! client's socket is token `2 × key`, the endpoint's `2 × key + 1`; listeners have
//! tokens from `LISTENERS` up, the waker [`WAKER`]. Every socket is registered once, for
//! reading and writing, edge-triggered, and never deregistered: closing a socket takes it
//! out of the epoll set, so a connection's end costs its two closes and nothing more.
//! Because a closed connection's events may still be in the batch being handled, its key
//! is given back only after the batch, so a new connection never sees an old one's event.
//!
//! A connection's life: accepted (its slot taken from the limit, else it is closed at
//! once), dialled ([`crate::tcp::start_connect`]), then carried both ways
//! ([`crate::copy::Direction`]) until both directions ended, an error, or its Service port
//! is closed ([`Command::ClosePort`]). The connect's outcome is read from the endpoint
//! socket's first event: writable means connected, an error or hang-up means refused or
//! unreachable, and no event within the dial timeout means the next try, on the next pick.
//!
//! Dial timers: every connect of the same try has the same timeout, so the deadlines of
//! each try's queue come in the order the connects were made, and a queue per try is a
//! timer wheel with no sorting. A connect that finished leaves its timer in the queue; the
//! loop drops such timers from the front before it computes how long to wait, so a thread
//! with no connect under way waits without a timeout (no wake-ups while idle).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::socket::{Shutdown, shutdown};
use slab::Slab;
use tokio::sync::OwnedSemaphorePermit;

use crate::copy::{Direction, Side, Turn};
use crate::limits::Slots;
use crate::port::PortState;
use crate::tcp::{DIAL_TIMEOUTS, start_connect};

/// What the sync asks of a TCP thread ([`crate::workers::Worker::send`]).
#[derive(Debug)]
pub enum Command {
    /// Accept on this listener for this port.
    Listen {
        listener: Arc<TcpListener>,
        state: Arc<PortState>,
        slots: Arc<Slots>,
    },
    /// Stop accepting on it (it was shut down already: see [`crate::tcp::Accepting`]).
    Unlisten(Arc<TcpListener>),
    /// End every connection of the port (the Service port is gone).
    ClosePort(Arc<PortState>),
    /// End the loop, closing everything it holds.
    Stop,
}

/// The waker's token.
pub const WAKER: Token = Token(usize::MAX);

/// Listeners' tokens start here; below are connections' (see the module docs).
const LISTENERS: usize = 1 << (usize::BITS - 2);

/// Events taken per wait.
const EVENTS: usize = 1024;

/// How long a listener rests after an accept failed for want of descriptors or memory,
/// instead of spinning on it.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

fn client_token(key: usize) -> Token {
    Token(key * 2)
}

fn endpoint_token(key: usize) -> Token {
    Token(key * 2 + 1)
}

/// A listener of one port on this thread.
struct Accept {
    listener: Arc<TcpListener>,
    state: Arc<PortState>,
    slots: Arc<Slots>,
    /// Accepting failed: tried again at the loop's `accept_again`.
    paused: bool,
}

/// One carried connection.
struct Connection {
    state: Arc<PortState>,
    peer: SocketAddr,
    client: Side,
    /// From its first connect on; replaced at each try.
    endpoint: Option<Side>,
    /// While a connect is under way.
    dial: Option<Dial>,
    /// Client to endpoint, and back.
    up: Direction,
    down: Direction,
    /// Over: its key is given back after the batch.
    done: bool,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.state.stats.active_connections.dec();
    }
}

/// Where a connection is after [`Connection::carry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carried {
    /// Waiting for its sockets' next events.
    Waits,
    /// A direction used up its reads with bytes left: the loop comes back to it.
    Yields,
    /// Both directions ended.
    Done,
}

impl Connection {
    /// Moves what the sockets allow both ways. An end of stream is passed on as a
    /// half-close, unless the other direction is over too: both sockets are then closed,
    /// which sends the same end of stream (a system call fewer).
    fn carry(&mut self) -> io::Result<Carried> {
        let Some(endpoint) = &mut self.endpoint else {
            return Ok(Carried::Waits);
        };
        let stats = &self.state.stats;
        let ended_before = (self.up.ended(), self.down.ended());
        let up = self
            .up
            .pump(&mut self.client, endpoint, &stats.to_endpoint_bytes)?;
        let down = self
            .down
            .pump(endpoint, &mut self.client, &stats.from_endpoint_bytes)?;
        let ended = (self.up.ended(), self.down.ended());
        if ended == (true, true) {
            return Ok(Carried::Done);
        }
        // The peer may be gone already: the next read or write says so.
        if ended.0 && !ended_before.0 {
            let _ = shutdown(endpoint.socket.as_raw_fd(), Shutdown::Write);
        }
        if ended.1 && !ended_before.1 {
            let _ = shutdown(self.client.socket.as_raw_fd(), Shutdown::Write);
        }
        if up == Turn::Yields || down == Turn::Yields {
            return Ok(Carried::Yields);
        }
        Ok(Carried::Waits)
    }
}

/// A connect under way: which try, to where, and its timer's id.
struct Dial {
    attempt: usize,
    endpoint: SocketAddr,
    id: u64,
}

struct DialTimer {
    deadline: Instant,
    key: usize,
    id: u64,
}

/// Whether `timer` still belongs to a connect under way.
fn is_live(connections: &Slab<Connection>, timer: &DialTimer) -> bool {
    connections
        .get(timer.key)
        .filter(|c| !c.done)
        .and_then(|c| c.dial.as_ref())
        .is_some_and(|dial| dial.id == timer.id)
}

/// One TCP thread's loop (see the module docs).
pub struct Reactor {
    poll: Poll,
    commands: Receiver<Command>,
    /// Listeners and connections held, published after each batch.
    held: Arc<AtomicUsize>,
    listeners: Slab<Accept>,
    connections: Slab<Connection>,
    /// A queue per try of the dial ladder (see the module docs).
    dials: [VecDeque<DialTimer>; DIAL_TIMEOUTS.len()],
    next_dial: u64,
    /// Connections over in this batch, removed after it.
    finished: Vec<usize>,
    /// Connections that yielded in this batch: carried on in the next, which then waits
    /// for no event.
    yielded: Vec<usize>,
    /// When paused listeners accept again.
    accept_again: Option<Instant>,
    stopping: bool,
}

impl Reactor {
    pub fn new(poll: Poll, commands: Receiver<Command>, held: Arc<AtomicUsize>) -> Self {
        Self {
            poll,
            commands,
            held,
            listeners: Slab::new(),
            connections: Slab::new(),
            dials: Default::default(),
            next_dial: 0,
            finished: Vec::new(),
            yielded: Vec::new(),
            accept_again: None,
            stopping: false,
        }
    }

    /// Runs until [`Command::Stop`] or the commands' senders are gone.
    pub fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS);
        while !self.stopping {
            let timeout = if self.yielded.is_empty() {
                self.next_deadline()
                    .map(|at| at.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(error) = self.poll.poll(&mut events, timeout) {
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(%error, "a TCP thread's event loop failed; its connections end");
                return;
            }
            let yielded = std::mem::take(&mut self.yielded);
            for event in &events {
                self.dispatch(event);
            }
            for key in yielded {
                self.drive(key);
            }
            self.after_batch(Instant::now());
        }
    }

    fn dispatch(&mut self, event: &Event) {
        match event.token() {
            WAKER => self.take_commands(),
            Token(token) if token >= LISTENERS => self.accept(token - LISTENERS),
            Token(token) => self.socket_event(token / 2, token % 2 == 1, event),
        }
    }

    fn after_batch(&mut self, now: Instant) {
        self.expire_dials(now);
        if self.accept_again.is_some_and(|at| at <= now) {
            self.accept_again = None;
            let paused: Vec<usize> = self
                .listeners
                .iter()
                .filter(|(_, a)| a.paused)
                .map(|(key, _)| key)
                .collect();
            for key in paused {
                self.listeners[key].paused = false;
                self.accept(key);
            }
        }
        for key in std::mem::take(&mut self.finished) {
            self.connections.try_remove(key);
        }
        self.held
            .store(self.listeners.len() + self.connections.len(), Ordering::Relaxed);
    }

    /// The earliest live dial timer's or paused listener's deadline.
    fn next_deadline(&mut self) -> Option<Instant> {
        for queue in &mut self.dials {
            while queue
                .front()
                .is_some_and(|timer| !is_live(&self.connections, timer))
            {
                queue.pop_front();
            }
        }
        let dials = self
            .dials
            .iter()
            .filter_map(|queue| queue.front().map(|t| t.deadline));
        dials.chain(self.accept_again).min()
    }

    fn take_commands(&mut self) {
        loop {
            match self.commands.try_recv() {
                Ok(Command::Listen {
                    listener,
                    state,
                    slots,
                }) => self.listen(listener, state, slots),
                Ok(Command::Unlisten(listener)) => self.unlisten(&listener),
                Ok(Command::ClosePort(state)) => self.close_port(&state),
                Ok(Command::Stop) | Err(TryRecvError::Disconnected) => {
                    self.stopping = true;
                    return;
                }
                Err(TryRecvError::Empty) => return,
            }
        }
    }

    fn listen(&mut self, listener: Arc<TcpListener>, state: Arc<PortState>, slots: Arc<Slots>) {
        let entry = self.listeners.vacant_entry();
        let token = Token(LISTENERS + entry.key());
        let fd = listener.as_raw_fd();
        if let Err(error) = self
            .poll
            .registry()
            .register(&mut SourceFd(&fd), token, Interest::READABLE)
        {
            // Out of the port's reuse-port group, so the kernel hands its connections to
            // the port's other listeners instead of queueing them here unanswered.
            let _ = shutdown(fd, Shutdown::Read);
            tracing::error!(service = %state.name, %error, "a TCP thread cannot accept on a listener");
            return;
        }
        entry.insert(Accept {
            listener,
            state,
            slots,
            paused: false,
        });
    }

    fn unlisten(&mut self, listener: &Arc<TcpListener>) {
        let found = self
            .listeners
            .iter()
            .find(|(_, a)| Arc::ptr_eq(&a.listener, listener));
        if let Some(key) = found.map(|(key, _)| key) {
            let accept = self.listeners.remove(key);
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&accept.listener.as_raw_fd()));
        }
    }

    fn close_port(&mut self, state: &Arc<PortState>) {
        for (key, connection) in &mut self.connections {
            if Arc::ptr_eq(&connection.state, state) && !connection.done {
                connection.done = true;
                self.finished.push(key);
            }
        }
    }

    /// Accepts what the listener at `key` has queued (edge-triggered: all of it).
    fn accept(&mut self, key: usize) {
        loop {
            let Some(accept) = self.listeners.get_mut(key).filter(|a| !a.paused) else {
                return;
            };
            match accept.listener.accept() {
                Ok((client, peer)) => {
                    // At the limit the client is closed at once (Slots logs and counts).
                    let Some(slot) = accept.slots.try_take() else {
                        continue;
                    };
                    let state = Arc::clone(&accept.state);
                    self.admit(state, client, peer, slot);
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                // Shut down: its Unlisten is on the way.
                Err(error) if error.kind() == io::ErrorKind::InvalidInput => return,
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(error) => {
                    // EMFILE and friends: wait a little rather than spin.
                    tracing::warn!(service = %accept.state.name, %error, "accept failed");
                    accept.paused = true;
                    self.accept_again.get_or_insert(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    fn admit(
        &mut self,
        state: Arc<PortState>,
        client: TcpStream,
        peer: SocketAddr,
        slot: OwnedSemaphorePermit,
    ) {
        state.stats.connections.inc();
        state.stats.active_connections.inc();
        let entry = self.connections.vacant_entry();
        let key = entry.key();
        let mut connection = Connection {
            peer,
            client: Side::accepted(client),
            endpoint: None,
            dial: None,
            up: Direction::new(state.copy),
            down: Direction::new(state.copy),
            done: false,
            _slot: slot,
            state,
        };
        if let Err(error) = self.poll.registry().register(
            &mut connection.client.socket,
            client_token(key),
            Interest::READABLE,
        ) {
            tracing::debug!(service = %connection.state.name, %peer, %error, "cannot carry a connection");
            return;
        }
        entry.insert(connection);
        self.dial(key, 0);
    }

    /// Connects the connection at `key` to an endpoint, from try `attempt` of the ladder
    /// on; ends it when no endpoint is left to try.
    fn dial(&mut self, key: usize, mut attempt: usize) {
        let Some(connection) = self.connections.get_mut(key).filter(|c| !c.done) else {
            return;
        };
        let Connection {
            state,
            peer,
            endpoint: endpoint_side,
            dial,
            ..
        } = connection;
        while let Some(timeout) = DIAL_TIMEOUTS.get(attempt) {
            // After a failed try the client's affinity is reset, as upstream does.
            let Some(endpoint) = state.pick(peer.ip(), attempt > 0) else {
                tracing::debug!(service = %state.name, "no endpoint to connect to");
                break;
            };
            if attempt > 0 {
                state.stats.endpoint_retries.inc();
            }
            let registered = start_connect(endpoint).and_then(|mut socket| {
                let both = Interest::READABLE | Interest::WRITABLE;
                self.poll
                    .registry()
                    .register(&mut socket, endpoint_token(key), both)?;
                Ok(socket)
            });
            match registered {
                Ok(socket) => {
                    *endpoint_side = Some(Side::new(socket));
                    let id = self.next_dial;
                    self.next_dial += 1;
                    *dial = Some(Dial {
                        attempt,
                        endpoint,
                        id,
                    });
                    let deadline = Instant::now() + *timeout;
                    self.dials[attempt].push_back(DialTimer { deadline, key, id });
                    return;
                }
                Err(error) => {
                    tracing::debug!(service = %state.name, %endpoint, %error, "connect failed");
                    state.stats.connect_failures.inc();
                    attempt += 1;
                }
            }
        }
        if attempt == DIAL_TIMEOUTS.len() {
            tracing::warn!(service = %state.name, client = %peer.ip(), "no endpoint accepted the connection after {} tries", DIAL_TIMEOUTS.len());
        }
        self.finish(key);
    }

    /// The connect under way of the connection at `key` failed or timed out: the next try.
    fn dial_failed(&mut self, key: usize, timed_out: bool) {
        let Some(connection) = self.connections.get_mut(key) else {
            return;
        };
        let Some(dial) = connection.dial.take() else {
            return;
        };
        let socket = connection.endpoint.take().map(|side| side.socket);
        let name = &connection.state.name;
        if timed_out {
            let timeout = DIAL_TIMEOUTS[dial.attempt];
            tracing::debug!(service = %name, endpoint = %dial.endpoint, ?timeout, "connect timed out");
        } else {
            let error = socket.as_ref().and_then(|s| s.take_error().ok().flatten());
            let error = error.unwrap_or_else(|| io::ErrorKind::ConnectionRefused.into());
            tracing::debug!(service = %name, endpoint = %dial.endpoint, %error, "connect failed");
        }
        connection.state.stats.connect_failures.inc();
        // Closed before the next try registers a socket under the same token.
        drop(socket);
        self.dial(key, dial.attempt + 1);
    }

    fn expire_dials(&mut self, now: Instant) {
        for attempt in 0..self.dials.len() {
            while let Some(timer) = self.dials[attempt].pop_front() {
                if timer.deadline > now {
                    self.dials[attempt].push_front(timer);
                    break;
                }
                if is_live(&self.connections, &timer) {
                    self.dial_failed(timer.key, true);
                }
            }
        }
    }

    fn socket_event(&mut self, key: usize, is_endpoint: bool, event: &Event) {
        let Some(connection) = self.connections.get_mut(key).filter(|c| !c.done) else {
            return;
        };
        if !is_endpoint {
            connection.client.ready.note(event);
        } else if let Some(endpoint) = &mut connection.endpoint {
            endpoint.ready.note(event);
        }
        if connection.dial.is_some() {
            if !is_endpoint {
                // Remembered until the endpoint is connected.
                return;
            }
            if event.is_error() || event.is_write_closed() {
                self.dial_failed(key, false);
                return;
            }
            if !event.is_writable() {
                return;
            }
            connection.dial = None;
        }
        self.drive(key);
    }

    /// Carries the connection at `key` as far as its sockets allow, if it is connected.
    fn drive(&mut self, key: usize) {
        let Some(connection) = self
            .connections
            .get_mut(key)
            .filter(|c| !c.done && c.dial.is_none())
        else {
            return;
        };
        let mut carried = connection.carry();
        let open = matches!(carried, Ok(Carried::Waits | Carried::Yields));
        if open && connection.client.needs_write_events() {
            // From now on the client's writable events are needed (see `Side::accepted`);
            // the change reports the socket at once if it took more in the meantime.
            let client = &mut connection.client;
            let both = Interest::READABLE | Interest::WRITABLE;
            match self
                .poll
                .registry()
                .reregister(&mut client.socket, client_token(key), both)
            {
                Ok(()) => client.write_events = true,
                Err(error) => carried = Err(error),
            }
        }
        match carried {
            Ok(Carried::Waits) => {}
            Ok(Carried::Yields) => self.yielded.push(key),
            Ok(Carried::Done) => self.finish(key),
            Err(error) => {
                tracing::debug!(service = %connection.state.name, peer = %connection.peer, %error, "connection ended");
                self.finish(key);
            }
        }
    }

    /// The connection at `key` is over; its key is given back after the batch.
    fn finish(&mut self, key: usize) {
        if let Some(connection) = self.connections.get_mut(key).filter(|c| !c.done) {
            connection.done = true;
            self.finished.push(key);
        }
    }
}
