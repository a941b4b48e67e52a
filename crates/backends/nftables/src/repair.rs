//! Repair at once: a thread reads nf_tables change notifications ([`kpr_nfnetlink::events`])
//! and asks for a sync when someone else changed our table.
//!
//! Every committed nf_tables transaction is announced, object by object, with the port id
//! of the socket that sent it. A change to our table (`ip kube-proxy` or `ip6 kube-proxy`,
//! this backend's family only) from any other socket than our transport's is foreign
//! ([`is_foreign`]): the thread marks the next sync full ([`RepairWatch::take_pending`])
//! and fires the [`RepairRequest`], so the runner syncs as soon as its min interval
//! allows. Our own batches carry our port id and are ignored, so the repair sync does not
//! ask for another one. Each notification costs a comparison (port id, family, name);
//! nothing is listed per event.
//!
//! When the kernel dropped notifications (our listener's queue overflowed, e.g. during our
//! own cold load of 100k+ elements) or sent one this crate cannot read, we cannot know
//! whether anyone else changed our table: the thread fires the request without marking the
//! sync full, and that sync's generation check ([`crate::Transport::foreign_changes`])
//! reads the table back only if someone else committed. Our own overrun thus costs one
//! sync that writes nothing, never a loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use kpr_model::IpFamily;
use kpr_nfnetlink::Family;
use kpr_nfnetlink::events::{Change, EventSocket, Notification, Received, Stopper};
use kpr_state::RepairRequest;

use crate::render::TABLE;

/// Whether `change` is someone else's change to our table of `family`: sent by a socket
/// other than `own_port` (our transport's; 0, the kernel's own, counts as someone else),
/// in our family, to a table named `kube-proxy` (a message without a table name, which
/// the kernel never sends, counts as ours: better one sync too many).
pub fn is_foreign(change: &Change, family: IpFamily, own_port: u32) -> bool {
    let family = match family {
        IpFamily::V4 => Family::Ip,
        IpFamily::V6 => Family::Ip6,
    };
    change.port_id != own_port
        && change.family == Some(family)
        && change.table.as_deref().is_none_or(|table| table == TABLE)
}

/// What one datagram of notifications asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing of ours changed, or only by us.
    Ignore,
    /// Someone else changed our table: a full sync.
    Repair,
}

/// The verdict on one datagram's notifications.
pub fn verdict(notifications: &[Notification], family: IpFamily, own_port: u32) -> Verdict {
    let foreign = notifications.iter().any(|n| match n {
        Notification::Change(change) => is_foreign(change, family, own_port),
        _ => false,
    });
    if foreign { Verdict::Repair } else { Verdict::Ignore }
}

/// The running watch of one family's table; stops and joins its thread when dropped.
#[derive(Debug)]
pub struct RepairWatch {
    pending: Arc<AtomicBool>,
    stopper: Stopper,
    thread: Option<JoinHandle<()>>,
}

impl RepairWatch {
    /// Subscribes in the calling thread's network namespace (the transport's: call it
    /// where the transport was opened) and starts the thread. `own_port` is our
    /// transport's socket's port id.
    pub fn start(
        family: IpFamily,
        own_port: u32,
        repair: RepairRequest,
    ) -> Result<Self, kpr_nfnetlink::Error> {
        let (socket, stopper) = EventSocket::open()?;
        let pending = Arc::new(AtomicBool::new(false));
        let flag = pending.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nft-repair-{}", family.label()))
            .spawn(move || watch(socket, family, own_port, &flag, &repair))
            .map_err(kpr_nfnetlink::Error::Io)?;
        Ok(Self {
            pending,
            stopper,
            thread: Some(thread),
        })
    }

    /// Whether someone else changed our table since the last call (then this sync must be
    /// full); clears the mark.
    pub fn take_pending(&self) -> bool {
        self.pending.swap(false, Ordering::SeqCst)
    }
}

impl Drop for RepairWatch {
    fn drop(&mut self) {
        self.stopper.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(
    mut socket: EventSocket,
    family: IpFamily,
    own_port: u32,
    pending: &AtomicBool,
    repair: &RepairRequest,
) {
    loop {
        match socket.recv() {
            Ok(Received::Notifications(notifications)) => {
                if verdict(&notifications, family, own_port) == Verdict::Repair {
                    if !pending.swap(true, Ordering::SeqCst) {
                        tracing::warn!(
                            family = ?family,
                            "someone else changed table kube-proxy; repairing it now"
                        );
                    }
                    repair.request();
                }
            }
            Ok(Received::Overrun) => {
                tracing::debug!(family = ?family, "nf_tables notifications were lost; checking the table");
                repair.request();
            }
            Ok(Received::Stopped) => return,
            Err(kpr_nfnetlink::Error::Malformed(error)) => {
                tracing::debug!(family = ?family, "an unreadable nf_tables notification ({error}); checking the table");
                repair.request();
            }
            Err(error) => {
                tracing::warn!(
                    family = ?family,
                    "stopped watching nf_tables notifications ({error}); the periodic sync repairs foreign changes"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
