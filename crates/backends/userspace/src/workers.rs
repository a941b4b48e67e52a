//! The threads that carry TCP: one single-threaded tokio runtime per thread, each running
//! its own accept loop on every listener and the connections it accepted.
//!
//! Why not the proxy's multi-threaded runtime: a connection's work is a handful of short
//! steps (accept, connect, one read and write each way, two closes), each waiting on the
//! network. On a work-stealing runtime every spawned connection and many wake-ups also
//! wake an idle worker to look for work (a futex or eventfd write, a context switch, and
//! the task's memory on another core): measured at about 2.5 futex calls per connection
//! with two workers, which cost more than the copying itself. Here a connection lives and
//! dies on the thread that accepted it; nothing crosses threads. A listener has a socket
//! on each thread, all on its port (`SO_REUSEPORT`, see [`crate::tcp`]): the kernel hands
//! each new connection to one of them, which spreads the load without a hand-off.
//!
//! The threads are started in the calling thread's network namespace (new threads inherit
//! it), so the connections to endpoints leave from where the listeners are. Dropping
//! [`Workers`] stops them: each runtime ends and drops the connections it still carried.

use std::io;
use std::num::NonZeroUsize;
use std::thread;

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// The TCP threads of one backend.
#[derive(Debug)]
pub struct Workers {
    handles: Vec<Handle>,
    /// Dropping a sender ends its thread's runtime.
    _stops: Vec<oneshot::Sender<()>>,
}

impl Workers {
    /// `count` threads, each with its own runtime (I/O and timers).
    pub fn start(count: NonZeroUsize) -> io::Result<Self> {
        let mut handles = Vec::with_capacity(count.get());
        let mut stops = Vec::with_capacity(count.get());
        for index in 0..count.get() {
            let (handle, stop) = start_one(index)?;
            handles.push(handle);
            stops.push(stop);
        }
        Ok(Self {
            handles,
            _stops: stops,
        })
    }

    /// Every thread's runtime: a listener runs an accept loop on each.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

/// One thread for each core the process may use (at least one).
pub fn default_count() -> NonZeroUsize {
    thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

fn start_one(index: usize) -> io::Result<(Handle, oneshot::Sender<()>)> {
    let runtime = Builder::new_current_thread().enable_all().build()?;
    let handle = runtime.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    thread::Builder::new()
        .name(format!("kpr-tcp-{index}"))
        .spawn(move || {
            // Returns when the sender is dropped; the runtime then drops what it carried.
            runtime.block_on(async {
                tokio::select! {
                    _ = stopped => {}
                    () = keep_a_timer_ahead_of_dial_timeouts() => {}
                }
            });
        })?;
    Ok((handle, stop))
}

/// A timer always due sooner than any dial timeout ([`crate::tcp::DIAL_TIMEOUTS`]), so
/// arming one never makes it the thread's next wake-up. tokio wakes a runtime's driver
/// (a write to its eventfd, and one more turn of its loop) whenever a timer is armed that
/// is due before the driver's next wake-up, and on an idle thread's empty timer wheel every
/// dial timer is: that was one system call and one wake-up per connection. This costs
/// the thread a wake-up every [`TIMER_AHEAD`].
async fn keep_a_timer_ahead_of_dial_timeouts() {
    loop {
        tokio::time::sleep(TIMER_AHEAD).await;
    }
}

/// Shorter than the shortest dial timeout.
const TIMER_AHEAD: std::time::Duration = std::time::Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_runs_tasks_on_its_own_thread_and_ends_when_dropped() {
        let workers = Workers::start(NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN)).unwrap();
        let names: Vec<String> = workers
            .handles()
            .iter()
            .map(|handle| {
                let (tx, rx) = std::sync::mpsc::channel();
                handle.spawn(async move {
                    let _ = tx.send(thread::current().name().map(str::to_owned));
                });
                rx.recv().unwrap().unwrap_or_default()
            })
            .collect();
        assert_eq!(names, ["kpr-tcp-0", "kpr-tcp-1"]);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        workers.handles()[0].spawn(async move {
            let _kept = tx;
            std::future::pending::<()>().await;
        });
        drop(workers);
        // The pending task was dropped with its runtime: its sender is gone. (The wait is a
        // ceiling against a hang, not a speed check.)
        let ended = rx.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(ended, Err(std::sync::mpsc::RecvTimeoutError::Disconnected));
    }
}
