//! Moving a connection's bytes both ways, as fast as the kernel allows.
//!
//! Three ways, all without `unsafe`: [`CopyMethod::Splice`] moves bytes socket -> pipe ->
//! socket with splice(2), so they never enter this process's memory (the way HAProxy
//! forwards bulk data); [`CopyMethod::Buffer`] reads into a buffer and writes it out;
//! [`CopyMethod::Auto`] (the default) starts with a small buffer and turns to splice at the
//! first read that fills it. Measured side by side with HAProxy (kpr-bench `--parts l4`,
//! BENCHMARKS.md's L4 section): splice wins on bulk streams, the buffer on short
//! request/answer connections (no pipe to create), and Auto keeps the better of both.
//!
//! A [`Direction`] is one way of one connection, driven by the TCP thread's event loop
//! ([`crate::reactor`]): [`Direction::pump`] moves what the two sockets' [`Readiness`]
//! allows and returns; the loop calls it again at the sockets' next readiness events. A
//! pump reads at most [`READS_PER_TURN`] times, then yields with bytes possibly left to
//! read (the loop comes back to it after the thread's other connections): a fast bulk
//! stream would otherwise keep its thread to itself for as long as it lasts.
//! Each direction ends at its end of stream; the connection passes it on as a half-close,
//! so protocols that close one side first keep working. Bytes are counted as they are
//! written, so the metrics show long connections while they last.
//!
//! A direction holds a buffer only while it holds bytes: the buffer goes back to the
//! thread's spares as soon as its bytes are written, so an idle connection holds none and
//! a busy thread cycles through a few. They are zeroed once, when first made (safe reads
//! need initialised memory), not per connection.
//!
//! A read that returns less than the buffer holds has emptied the socket, so the next read
//! would only say "nothing yet" (`EAGAIN`): one wasted system call per message and
//! direction, a tenth of what a short request/answer connection costs. After such a read
//! the socket counts as not readable until its next readiness event. That is sound with
//! epoll's edge-triggered events, which the loop uses: bytes that arrive after the read
//! raise a new event, and bytes that were there went into the read. An end of stream or
//! error the kernel already announced is the exception ([`Readiness::hung_up`]): it raises
//! no new event, so the socket stays readable until a read says so. Splice reads are never
//! taken as emptying the socket: a short one may only have filled the pipe.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use mio::event::Event;
use mio::net::TcpStream;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use prometheus_client::metrics::counter::Counter;

/// How a connection's bytes are moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyMethod {
    /// A small buffer while messages are small; splice(2) from the first read that fills
    /// it (bulk data). Short request/answer connections never pay for a pipe (two
    /// descriptors and a syscall per direction); long transfers move without copies. What
    /// HAProxy's `splice-auto` does.
    #[default]
    Auto,
    /// splice(2) through a pipe per direction (zero copy) from the first byte.
    Splice,
    /// read(2) into a buffer, write(2) out.
    Buffer,
}

/// [`CopyMethod::Auto`]'s buffer: a read that fills it means bulk data.
const SMALL: usize = 16 * 1024;

/// Bytes one splice or read moves at most, and the pipe's capacity.
const CHUNK: usize = 256 * 1024;

/// Reads one pump makes at most before the thread's other connections have their turn: 4
/// MiB of splices, 256 KiB of small reads.
pub const READS_PER_TURN: usize = 16;

/// How a pump ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// A socket would block, or the stream ended: the next readiness event calls again.
    Waits,
    /// Its reads were used up with the source still readable: no event will say so again,
    /// the loop must call again by itself.
    Yields,
}

/// Small buffers a thread keeps for reuse at most: 512 KiB, enough for the connections a
/// busy thread carries at once.
const SPARE_MAX: usize = 32;

thread_local! {
    static SPARES: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

/// A read buffer of `size` bytes; a [`SMALL`] one comes from this thread's spares (or is
/// new) and goes back to the spares of the thread that drops it.
struct Buffer(Box<[u8]>);

impl Buffer {
    fn take(size: usize) -> Self {
        let reused = if size == SMALL {
            SPARES.with(|spares| spares.borrow_mut().pop())
        } else {
            None
        };
        Self(reused.unwrap_or_else(|| vec![0; size].into_boxed_slice()))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.0.len() != SMALL {
            return;
        }
        let buffer = std::mem::take(&mut self.0);
        // A thread-local that is being torn down just lets the buffer go.
        let _ = SPARES.try_with(|spares| {
            let mut spares = spares.borrow_mut();
            if spares.len() < SPARE_MAX {
                spares.push(buffer);
            }
        });
    }
}

/// A pipe, its two ends.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        // A bigger pipe moves more per call; the kernel may refuse (pipe-max-size), then
        // the default 64 KiB does.
        let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(CHUNK as i32));
        Ok(Self { read, write })
    }
}

const SPLICE_FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_MOVE.union(SpliceFFlags::SPLICE_F_NONBLOCK);

/// What the kernel said of a socket since the loop last found it would block, from its
/// edge-triggered events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    pub readable: bool,
    pub writable: bool,
    /// End of stream or an error was announced: no further event will come for it.
    pub hung_up: bool,
}

impl Readiness {
    /// Adds what `event` says. A closed or failed socket is readable and writable: the
    /// next read or write returns what happened.
    pub fn note(&mut self, event: &Event) {
        let broken = event.is_error() || event.is_read_closed() || event.is_write_closed();
        self.hung_up |= broken;
        self.readable |= event.is_readable() || broken;
        self.writable |= event.is_writable() || broken;
    }

    /// A read came back short: the socket is empty until its next event (see the module
    /// docs).
    fn emptied(&mut self) {
        if !self.hung_up {
            self.readable = false;
        }
    }
}

/// A socket of a connection and what is known of its readiness.
#[derive(Debug)]
pub struct Side {
    pub socket: TcpStream,
    pub ready: Readiness,
    /// Registered for writable events too. A client's socket is registered for reading
    /// only until a write to it would block (see [`Side::accepted`]).
    pub write_events: bool,
}

impl Side {
    /// A socket registered for both kinds of events (an endpoint's: its connect ends with
    /// a writable event).
    pub fn new(socket: TcpStream) -> Self {
        Self {
            socket,
            ready: Readiness::default(),
            write_events: true,
        }
    }

    /// A just-accepted client's socket, registered for reading only: its send buffer is
    /// empty, so it is writable until a write says otherwise. Registered for writing too, it
    /// would raise an event at once that says nothing new, a turn of the loop per
    /// connection.
    pub fn accepted(socket: TcpStream) -> Self {
        Self {
            socket,
            ready: Readiness {
                writable: true,
                ..Readiness::default()
            },
            write_events: false,
        }
    }

    /// A write to it would block and no writable event would say when it can take more.
    pub fn needs_write_events(&self) -> bool {
        !self.ready.writable && !self.write_events
    }
}

/// One way of a connection: what was read from one side and is not written to the other
/// yet, and whether its end of stream was read.
pub struct Direction {
    /// [`CopyMethod::Auto`] turns into `Splice` at its first full read.
    method: CopyMethod,
    /// Bytes read and not written yet: `buffer[start..end]`.
    buffer: Option<Buffer>,
    start: usize,
    end: usize,
    /// Created at the first splice; `in_pipe` bytes wait in it.
    pipe: Option<Pipe>,
    in_pipe: usize,
    eof: bool,
}

impl std::fmt::Debug for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Direction")
            .field("method", &self.method)
            .field("held", &self.held())
            .field("eof", &self.eof)
            .finish()
    }
}

impl Direction {
    pub fn new(method: CopyMethod) -> Self {
        Self {
            method,
            buffer: None,
            start: 0,
            end: 0,
            pipe: None,
            in_pipe: 0,
            eof: false,
        }
    }

    /// End of stream was read and every byte before it written.
    pub fn ended(&self) -> bool {
        self.eof && self.held() == 0
    }

    fn held(&self) -> usize {
        self.end - self.start + self.in_pipe
    }

    /// Moves bytes `from` -> `to` until one side would block, the stream ended or
    /// [`READS_PER_TURN`] reads were made; counts them into `bytes` as they are written.
    pub fn pump(&mut self, from: &mut Side, to: &mut Side, bytes: &Counter) -> io::Result<Turn> {
        self.pump_reading(from, to, bytes, READS_PER_TURN)
    }

    fn pump_reading(
        &mut self,
        from: &mut Side,
        to: &mut Side,
        bytes: &Counter,
        reads: usize,
    ) -> io::Result<Turn> {
        let mut made = 0;
        loop {
            if self.held() > 0 {
                if !to.ready.writable {
                    return Ok(Turn::Waits);
                }
                match self.write_out(&to.socket) {
                    // Nothing taken of a non-empty write: the kernel will not take more later.
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(written) => {
                        bytes.inc_by(written as u64);
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        to.ready.writable = false;
                        return Ok(Turn::Waits);
                    }
                    Err(error) => return Err(error),
                }
                continue;
            }
            if self.eof || !from.ready.readable {
                return Ok(Turn::Waits);
            }
            if made == reads {
                return Ok(Turn::Yields);
            }
            made += 1;
            match self.read_in(from) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    from.ready.readable = false;
                    return Ok(Turn::Waits);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One read or splice from `from`, when nothing is held.
    fn read_in(&mut self, from: &mut Side) -> io::Result<()> {
        if self.method == CopyMethod::Splice {
            let pipe = match &mut self.pipe {
                Some(pipe) => pipe,
                None => self.pipe.insert(Pipe::new()?),
            };
            let filled = splice(from.socket.as_fd(), None, &pipe.write, None, CHUNK, SPLICE_FLAGS)?;
            self.eof = filled == 0;
            self.in_pipe = filled;
            return Ok(());
        }
        let size = if self.method == CopyMethod::Auto {
            SMALL
        } else {
            CHUNK
        };
        let mut buffer = self.buffer.take().unwrap_or_else(|| Buffer::take(size));
        let read = (&from.socket).read(&mut buffer.0)?;
        self.eof = read == 0;
        if read < buffer.0.len() {
            from.ready.emptied();
        } else if self.method == CopyMethod::Auto {
            // Bulk data: the rest of this direction goes through a pipe, once this is out.
            self.method = CopyMethod::Splice;
        }
        if read > 0 {
            (self.start, self.end) = (0, read);
            self.buffer = Some(buffer);
        }
        Ok(())
    }

    /// One write or splice of held bytes to `to`; returns how many went out.
    fn write_out(&mut self, to: &TcpStream) -> io::Result<usize> {
        if let Some(buffer) = &self.buffer {
            let written = (&*to).write(&buffer.0[self.start..self.end])?;
            self.start += written;
            if self.start == self.end {
                // Back to the thread's spares while nothing is held.
                self.buffer = None;
                (self.start, self.end) = (0, 0);
            }
            return Ok(written);
        }
        let Some(pipe) = &self.pipe else {
            return Ok(0);
        };
        let written = splice(&pipe.read, None, to.as_fd(), None, self.in_pipe, SPLICE_FLAGS)?;
        self.in_pipe -= written;
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small buffer given back is the next one taken on that thread; a thread keeps at
    /// most [`SPARE_MAX`]; big ones are never kept.
    #[test]
    fn small_buffers_are_reused_on_their_thread_and_only_so_many_kept() {
        let spares = || SPARES.with(|spares| spares.borrow().iter().map(|b| b.len()).collect::<Vec<_>>());
        std::thread::spawn(move || {
            let first = Buffer::take(SMALL);
            let address = first.0.as_ptr();
            drop(first);
            assert_eq!(spares(), [SMALL]);
            assert_eq!(Buffer::take(SMALL).0.as_ptr(), address);
            let many: Vec<Buffer> = (0..SPARE_MAX + 8).map(|_| Buffer::take(SMALL)).collect();
            drop(many);
            drop(Buffer::take(CHUNK));
            assert_eq!(spares(), vec![SMALL; SPARE_MAX]);
        })
        .join()
        .unwrap();
    }

    /// A connected pair on loopback: (the side the test keeps, the proxy's side).
    fn pair() -> (std::net::TcpStream, Side) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        theirs.set_nonblocking(true).unwrap();
        (ours, Side::new(TcpStream::from_std(theirs)))
    }

    /// Pumps until `done` says so, as if every event had come (the sockets are polled, not
    /// waited on: a lost readiness would leave bytes behind, which `done` would not see).
    fn pump_until(
        direction: &mut Direction,
        from: &mut Side,
        to: &mut Side,
        bytes: &Counter,
        done: impl Fn(&Direction) -> bool,
    ) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !done(direction) {
            assert!(
                std::time::Instant::now() < deadline,
                "the direction stalled: {direction:?}"
            );
            from.ready.readable = true;
            from.ready.writable = true;
            to.ready.writable = true;
            direction.pump(from, to, bytes).unwrap();
        }
    }

    /// Every method carries messages of one byte to several buffers' worth whole, turns
    /// Auto into splice at the first full read, and ends at the end of stream.
    #[test]
    fn each_method_carries_messages_whole_and_ends_at_end_of_stream() {
        for method in [CopyMethod::Auto, CopyMethod::Buffer, CopyMethod::Splice] {
            let (mut client, mut from) = pair();
            let (mut server, mut to) = pair();
            let bytes = Counter::default();
            let mut direction = Direction::new(method);
            let mut sent = 0u64;
            for size in [1, 7, 1500, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL] {
                let message: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
                client.write_all(&message).unwrap();
                sent += size as u64;
                let mut heard = vec![0; size];
                let reader = std::thread::spawn(move || {
                    server.read_exact(&mut heard).unwrap();
                    (server, heard)
                });
                pump_until(&mut direction, &mut from, &mut to, &bytes, |_| {
                    bytes.get() == sent
                });
                let (back, heard) = reader.join().unwrap();
                server = back;
                assert_eq!(heard, message, "{method:?}, {size} bytes");
            }
            let expected = if method == CopyMethod::Buffer {
                CopyMethod::Buffer
            } else {
                CopyMethod::Splice
            };
            assert_eq!(direction.method, expected);
            drop(client);
            pump_until(&mut direction, &mut from, &mut to, &bytes, Direction::ended);
            assert!(direction.buffer.is_none(), "nothing held, no buffer kept");
        }
    }

    /// Its reads used up with bytes left, a pump yields (the loop calls again), and the
    /// next pump moves the rest.
    #[test]
    fn a_pump_yields_when_its_reads_are_used_up() {
        let (mut client, mut from) = pair();
        let (mut server, mut to) = pair();
        let bytes = Counter::default();
        let mut direction = Direction::new(CopyMethod::Auto);
        let message: Vec<u8> = (0..SMALL * 5 / 2).map(|i| i as u8).collect();
        client.write_all(&message).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        from.ready.readable = true;
        to.ready.writable = true;
        // The first read fills the small buffer (and turns Auto into splice) and is written
        // out: with one read allowed, the pump yields with the rest unread.
        let turn = direction.pump_reading(&mut from, &mut to, &bytes, 1).unwrap();
        assert_eq!((turn, bytes.get()), (Turn::Yields, SMALL as u64));
        assert!(from.ready.readable, "the rest is still to be read");
        let turn = direction.pump(&mut from, &mut to, &bytes).unwrap();
        assert_eq!((turn, bytes.get()), (Turn::Waits, message.len() as u64));
        let mut heard = vec![0; message.len()];
        server.read_exact(&mut heard).unwrap();
        assert_eq!(heard, message);
    }

    /// A short read empties the socket's readable state, unless an end of stream was
    /// announced (no event would come for it again).
    #[test]
    fn a_short_read_clears_readable_unless_the_socket_hung_up() {
        let (mut client, mut from) = pair();
        let (_server, mut to) = pair();
        let bytes = Counter::default();
        let mut direction = Direction::new(CopyMethod::Auto);
        client.write_all(b"hello").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        from.ready.readable = true;
        to.ready.writable = true;
        direction.pump(&mut from, &mut to, &bytes).unwrap();
        assert_eq!(bytes.get(), 5);
        assert!(!from.ready.readable, "a short read emptied the socket");
        client.write_all(b"world").unwrap();
        drop(client);
        std::thread::sleep(std::time::Duration::from_millis(50));
        from.ready = Readiness {
            readable: true,
            writable: true,
            hung_up: true,
        };
        direction.pump(&mut from, &mut to, &bytes).unwrap();
        assert_eq!(bytes.get(), 10);
        assert!(
            direction.ended(),
            "the end of stream behind the short read was read too"
        );
    }
}
