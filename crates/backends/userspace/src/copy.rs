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
//! Each direction ends at its end of stream, which is passed on as a half-close
//! (`shutdown(SHUT_WR)`), so protocols that close one side first keep working; the
//! connection is done when both directions are, or at the first error. The direction that
//! ends last does not shut down: both sockets are closed right after, and the close sends
//! the same end of stream (a system call fewer per connection). Bytes are counted as they
//! move, so the metrics show long connections while they last.
//!
//! Buffers are allocated, not zeroed (the kernel writes them before anything reads them):
//! per connection, clearing two 16 KiB buffers cost more than the bytes a short exchange
//! moves. The small ones are kept for the thread's next connections (`Buffer`): a
//! 16 KiB block is too big for the allocator's per-thread cache, so each took and gave
//! back a trip through its bins (`_int_malloc`, `_int_free`, `unlink_chunk`: 2 % of a
//! short connection's CPU in the L4 profile), as HAProxy keeps its buffers in pools.
//!
//! A read that returns less than the buffer holds has emptied the socket, so the next read
//! would only say "nothing yet" (`EAGAIN`): that is one wasted system call per message and
//! direction, a tenth of what a short request/answer connection costs. After such a read
//! the socket's readable state is cleared without asking the kernel (`drained`), and the
//! next read waits for the kernel's next readiness event. This is only sound where no other
//! thread turns the reactor between the read and the clearing (else an event for bytes that
//! came in between could be cleared unseen): on a single-threaded runtime, which is where
//! userspace mode carries its connections ([`crate::workers`]). Elsewhere the extra read is
//! kept.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use nix::sys::socket::{Shutdown, shutdown};
use prometheus_client::metrics::counter::Counter;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::runtime::RuntimeFlavor;

use crate::port::PortStats;

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

/// Small buffers a thread keeps for reuse at most: 512 KiB, enough for the connections a
/// busy thread carries at once.
const SPARE_MAX: usize = 32;

thread_local! {
    static SPARES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A read buffer of `size` bytes; a [`SMALL`] one comes from this thread's spares (or is
/// new) and goes back to the spares of the thread that drops it.
struct Buffer(Vec<u8>);

impl Buffer {
    fn take(size: usize) -> Self {
        let reused = if size == SMALL {
            SPARES.with(|spares| spares.borrow_mut().pop())
        } else {
            None
        };
        Self(reused.unwrap_or_else(|| Vec::with_capacity(size)))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.0.capacity() != SMALL {
            return;
        }
        let mut buffer = std::mem::take(&mut self.0);
        buffer.clear();
        // A thread-local that is being torn down just lets the buffer go.
        let _ = SPARES.try_with(|spares| {
            let mut spares = spares.borrow_mut();
            if spares.len() < SPARE_MAX {
                spares.push(buffer);
            }
        });
    }
}

/// Carries `client` <-> `endpoint` until both directions ended.
pub async fn copy_both_ways(
    method: CopyMethod,
    client: &TcpStream,
    endpoint: &TcpStream,
    stats: &PortStats,
) -> io::Result<()> {
    let one_ended = AtomicBool::new(false);
    let reads = Reads::here();
    let up = one_way(
        method,
        reads,
        client,
        endpoint,
        &stats.to_endpoint_bytes,
        &one_ended,
    );
    let down = one_way(
        method,
        reads,
        endpoint,
        client,
        &stats.from_endpoint_bytes,
        &one_ended,
    );
    tokio::try_join!(up, down)?;
    Ok(())
}

/// Whether a short read may clear the socket's readable state (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reads {
    /// On a single-threaded runtime: a short read emptied the socket.
    ShortEmpties,
    /// Read again until the kernel says there is nothing left.
    UntilWouldBlock,
}

impl Reads {
    /// What the runtime this runs on allows.
    fn here() -> Self {
        match tokio::runtime::Handle::current().runtime_flavor() {
            RuntimeFlavor::CurrentThread => Reads::ShortEmpties,
            _ => Reads::UntilWouldBlock,
        }
    }
}

/// Marks `socket` as not readable until the kernel's next readiness event, without a
/// system call. Only sound as [`Reads::ShortEmpties`] says.
fn drained(socket: &TcpStream) {
    let _ = socket.try_io(Interest::READABLE, || {
        Err::<(), _>(io::ErrorKind::WouldBlock.into())
    });
}

/// One direction; `one_ended` is shared with the other one (see the module docs).
async fn one_way(
    method: CopyMethod,
    reads: Reads,
    from: &TcpStream,
    to: &TcpStream,
    bytes: &Counter,
    one_ended: &AtomicBool,
) -> io::Result<()> {
    match method {
        CopyMethod::Auto => {
            if buffer_one_way(reads, from, to, bytes, SMALL, true).await? == Ended::Bulk {
                splice_one_way(from, to, bytes).await?;
            }
        }
        CopyMethod::Splice => splice_one_way(from, to, bytes).await?,
        CopyMethod::Buffer => {
            buffer_one_way(reads, from, to, bytes, CHUNK, false).await?;
        }
    }
    // End of stream: pass the half-close on, unless the other direction is over too (the
    // caller closes both sockets now). The peer may be gone already.
    if !one_ended.swap(true, Ordering::Relaxed) {
        let _ = shutdown(to.as_raw_fd(), Shutdown::Write);
    }
    Ok(())
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

async fn splice_one_way(from: &TcpStream, to: &TcpStream, bytes: &Counter) -> io::Result<()> {
    let pipe = Pipe::new()?;
    loop {
        let filled = from
            .async_io(Interest::READABLE, || {
                Ok(splice(
                    from.as_fd(),
                    None,
                    &pipe.write,
                    None,
                    CHUNK,
                    SPLICE_FLAGS,
                )?)
            })
            .await?;
        if filled == 0 {
            return Ok(());
        }
        let mut left = filled;
        while left > 0 {
            left -= to
                .async_io(Interest::WRITABLE, || {
                    Ok(splice(&pipe.read, None, to.as_fd(), None, left, SPLICE_FLAGS)?)
                })
                .await?;
        }
        bytes.inc_by(filled as u64);
    }
}

/// Why [`buffer_one_way`] returned.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// End of stream.
    Eof,
    /// A read filled the buffer and the caller asked to hear of it.
    Bulk,
}

async fn buffer_one_way(
    reads: Reads,
    from: &TcpStream,
    to: &TcpStream,
    bytes: &Counter,
    size: usize,
    stop_at_bulk: bool,
) -> io::Result<Ended> {
    let mut taken = Buffer::take(size);
    let buffer = &mut taken.0;
    loop {
        buffer.clear();
        let read = from
            .async_io(Interest::READABLE, || from.try_read_buf(buffer))
            .await?;
        if read == 0 {
            return Ok(Ended::Eof);
        }
        if read < buffer.capacity() && reads == Reads::ShortEmpties {
            drained(from);
        }
        let mut written = 0;
        while written < read {
            written += to
                .async_io(Interest::WRITABLE, || to.try_write(&buffer[written..read]))
                .await?;
        }
        bytes.inc_by(read as u64);
        if stop_at_bulk && read == buffer.capacity() {
            return Ok(Ended::Bulk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A small buffer given back is the next one taken on that thread; a thread keeps at
    /// most [`SPARE_MAX`], emptied; big ones are never kept.
    #[test]
    fn small_buffers_are_reused_on_their_thread_and_only_so_many_kept() {
        let spares = || {
            SPARES.with(|spares| {
                spares
                    .borrow()
                    .iter()
                    .map(|b| (b.len(), b.capacity()))
                    .collect::<Vec<_>>()
            })
        };
        std::thread::spawn(move || {
            let mut first = Buffer::take(SMALL);
            first.0.extend_from_slice(b"left over");
            let address = first.0.as_ptr();
            drop(first);
            assert_eq!(spares(), [(0, SMALL)]);
            assert_eq!(Buffer::take(SMALL).0.as_ptr(), address);
            let many: Vec<Buffer> = (0..SPARE_MAX + 8).map(|_| Buffer::take(SMALL)).collect();
            drop(many);
            drop(Buffer::take(CHUNK));
            assert_eq!(spares(), vec![(0, SMALL); SPARE_MAX]);
        })
        .join()
        .unwrap();
    }

    /// A connected pair on loopback: (the side we keep, the side the copy gets).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (theirs, _) = listener.accept().await.unwrap();
        (ours, theirs)
    }

    /// Request and answer, each waiting for the other: the exchange where a cleared
    /// readable state that missed bytes would stall for good. Messages of one byte to
    /// more than the small buffer, in pieces with pauses, so reads come short and full.
    async fn ping_pong(method: CopyMethod) {
        let (mut client, proxy_client) = pair().await;
        let (mut server, proxy_endpoint) = pair().await;
        let stats = PortStats::default();
        let copying = async {
            copy_both_ways(method, &proxy_client, &proxy_endpoint, &stats)
                .await
                .unwrap();
        };
        let talking = async {
            for round in 0..60usize {
                let size = [1, 7, 1500, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL][round % 7];
                let message: Vec<u8> = (0..size).map(|i| (i + round) as u8).collect();
                let (first, rest) = message.split_at(size / 2);
                client.write_all(first).await.unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
                client.write_all(rest).await.unwrap();
                let mut heard = vec![0; size];
                server.read_exact(&mut heard).await.unwrap();
                assert_eq!(heard, message, "round {round}, to the endpoint");
                server.write_all(&message).await.unwrap();
                client.read_exact(&mut heard).await.unwrap();
                assert_eq!(heard, message, "round {round}, back to the client");
            }
            client.shutdown().await.unwrap();
            let mut rest = Vec::new();
            server.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty(), "the client's half-close reaches the endpoint");
            drop(server);
        };
        // A ceiling against a hang, not a speed check.
        let both = async { tokio::join!(copying, talking) };
        tokio::time::timeout(Duration::from_secs(60), both)
            .await
            .expect("the exchange stalled");
        assert!(stats.to_endpoint_bytes.get() > 0);
    }

    /// A read that fills the buffer may have left bytes behind, which no new readiness event
    /// will announce: they must be read at once, not waited for.
    #[test]
    fn a_full_read_is_followed_by_another_read() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (mut client, proxy_client) = pair().await;
            let (mut server, proxy_endpoint) = pair().await;
            let bytes = Counter::default();
            let copying = buffer_one_way(
                Reads::ShortEmpties,
                &proxy_client,
                &proxy_endpoint,
                &bytes,
                64,
                false,
            );
            let talking = async {
                // One write, all there before the copy reads: one readiness event for 1000 bytes.
                let message: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
                client.write_all(&message).await.unwrap();
                let mut heard = vec![0; message.len()];
                server.read_exact(&mut heard).await.unwrap();
                assert_eq!(heard, message);
                client.shutdown().await.unwrap();
            };
            // A ceiling against a hang, not a speed check.
            let (copied, ()) =
                tokio::time::timeout(Duration::from_secs(20), async { tokio::join!(copying, talking) })
                    .await
                    .expect("bytes left behind by a full read were not read");
            assert_eq!(copied.unwrap(), Ended::Eof);
            assert_eq!(bytes.get(), 1000);
        });
    }

    /// Every copy method through [`ping_pong`] on `runtime`, which allows `reads`.
    fn conversations_on(runtime: tokio::runtime::Runtime, reads: Reads) {
        runtime.block_on(async {
            assert_eq!(Reads::here(), reads);
            for method in [CopyMethod::Auto, CopyMethod::Buffer, CopyMethod::Splice] {
                ping_pong(method).await;
            }
        });
    }

    #[test]
    fn a_conversation_arrives_whole_on_a_single_threaded_runtime() {
        let mut runtime = tokio::runtime::Builder::new_current_thread();
        conversations_on(runtime.enable_all().build().unwrap(), Reads::ShortEmpties);
    }

    #[test]
    fn a_conversation_arrives_whole_on_a_multi_threaded_runtime() {
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        let runtime = runtime.worker_threads(2).enable_all().build().unwrap();
        conversations_on(runtime, Reads::UntilWouldBlock);
    }
}
