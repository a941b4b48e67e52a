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
//! moves.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use nix::sys::socket::{Shutdown, shutdown};
use prometheus_client::metrics::counter::Counter;
use tokio::io::Interest;
use tokio::net::TcpStream;

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

/// Carries `client` <-> `endpoint` until both directions ended.
pub async fn copy_both_ways(
    method: CopyMethod,
    client: &TcpStream,
    endpoint: &TcpStream,
    stats: &PortStats,
) -> io::Result<()> {
    let one_ended = AtomicBool::new(false);
    let up = one_way(method, client, endpoint, &stats.to_endpoint_bytes, &one_ended);
    let down = one_way(method, endpoint, client, &stats.from_endpoint_bytes, &one_ended);
    tokio::try_join!(up, down)?;
    Ok(())
}

/// One direction; `one_ended` is shared with the other one (see the module docs).
async fn one_way(
    method: CopyMethod,
    from: &TcpStream,
    to: &TcpStream,
    bytes: &Counter,
    one_ended: &AtomicBool,
) -> io::Result<()> {
    match method {
        CopyMethod::Auto => {
            if buffer_one_way(from, to, bytes, SMALL, true).await? == Ended::Bulk {
                splice_one_way(from, to, bytes).await?;
            }
        }
        CopyMethod::Splice => splice_one_way(from, to, bytes).await?,
        CopyMethod::Buffer => {
            buffer_one_way(from, to, bytes, CHUNK, false).await?;
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
    from: &TcpStream,
    to: &TcpStream,
    bytes: &Counter,
    size: usize,
    stop_at_bulk: bool,
) -> io::Result<Ended> {
    let mut buffer = Vec::with_capacity(size);
    loop {
        buffer.clear();
        let read = from
            .async_io(Interest::READABLE, || from.try_read_buf(&mut buffer))
            .await?;
        if read == 0 {
            return Ok(Ended::Eof);
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
