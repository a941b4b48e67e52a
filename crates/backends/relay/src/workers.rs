//! The threads that carry TCP: one per core, each running its own event loop
//! ([`crate::reactor`]) with a listener on every service port and the connections it
//! accepted.
//!
//! Why threads of their own, and no runtime: a connection's work is a handful of short
//! steps (accept, connect, one read and write each way, two closes), each waiting on the
//! network. On a work-stealing runtime every spawned connection and many wake-ups also
//! woke an idle worker to look for work (measured at about 2.5 futex calls per
//! connection); on a runtime per thread, each connection still paid for a task, its
//! wakers, a registration it deletes before closing (`epoll_ctl` DEL) and a timer wheel
//! entry, of the order of the few percent by which HAProxy carried more connections per
//! second (BENCHMARKS.md's L4 turns). Here a connection lives and dies on the thread that
//! accepted it and costs only its system calls: nothing crosses threads.
//!
//! The sync reaches a thread through its [`Worker`]: a command queue and a waker (an
//! eventfd the loop polls). The threads are started in the calling thread's network
//! namespace (new threads inherit it), so the connections to endpoints leave from where
//! the listeners are. Dropping [`Workers`] stops them and waits for them: each loop ends
//! and closes the connections it still carried.

use std::io;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread::{self, JoinHandle};

use mio::{Poll, Waker};

use crate::port::PortState;
use crate::reactor::{Command, Reactor, WAKER};

/// What reaches one TCP thread: its commands and what it holds.
#[derive(Clone, Debug)]
pub struct Worker {
    commands: Sender<Command>,
    waker: Arc<Waker>,
    held: Arc<AtomicUsize>,
}

impl Worker {
    /// Queues `command` and wakes the thread. A thread that stopped takes no more commands
    /// (what they would change went with it).
    pub fn send(&self, command: Command) {
        if self.commands.send(command).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

/// The TCP threads of one relay.
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// `count` threads, each with its own event loop.
    pub fn start(count: NonZeroUsize) -> io::Result<Self> {
        let mut workers = Workers {
            workers: Vec::with_capacity(count.get()),
            threads: Vec::with_capacity(count.get()),
        };
        for index in 0..count.get() {
            let (worker, thread) = start_one(index)?;
            workers.workers.push(worker);
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// Every thread: a listener accepts on each (or on one, see [`crate::Relay`]).
    pub fn threads(&self) -> &[Worker] {
        &self.workers
    }

    /// Ends every connection of `state`'s port, on every thread (the Service port is gone).
    pub fn close_port(&self, state: &Arc<PortState>) {
        for worker in &self.workers {
            worker.send(Command::ClosePort(Arc::clone(state)));
        }
    }

    /// Listeners and connections the threads hold now (tests: nothing may leak).
    pub fn held(&self) -> usize {
        self.workers.iter().map(|w| w.held.load(Ordering::Relaxed)).sum()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in &self.workers {
            worker.send(Command::Stop);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One thread for each core the process may use (at least one).
pub fn default_count() -> NonZeroUsize {
    thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

fn start_one(index: usize) -> io::Result<(Worker, JoinHandle<()>)> {
    // Made here, so that a thread that cannot have its loop is an error of the caller's.
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let (commands, queue) = mpsc::channel();
    let held = Arc::new(AtomicUsize::new(0));
    let reactor = Reactor::new(poll, queue, Arc::clone(&held));
    let thread = thread::Builder::new()
        .name(format!("kpr-tcp-{index}"))
        .spawn(move || reactor.run())?;
    Ok((
        Worker {
            commands,
            waker,
            held,
        },
        thread,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_are_named_and_stop_when_dropped() {
        let workers = Workers::start(NonZeroUsize::new(2).unwrap_or(NonZeroUsize::MIN)).unwrap();
        let names: Vec<Option<&str>> = workers.threads.iter().map(|t| t.thread().name()).collect();
        assert_eq!(names, [Some("kpr-tcp-0"), Some("kpr-tcp-1")]);
        assert_eq!(workers.held(), 0);
        let held: Vec<Arc<AtomicUsize>> = workers.workers.iter().map(|w| Arc::clone(&w.held)).collect();
        drop(workers);
        // Joined in the drop: each loop has ended and let go of its count.
        let left: Vec<usize> = held.iter().map(Arc::strong_count).collect();
        assert_eq!(left, [1, 1]);
    }
}
