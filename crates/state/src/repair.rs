//! How a backend asks for a sync at once: [`RepairRequest`].
//!
//! A backend that notices (or is told) that someone else changed its kernel objects (a
//! flushed table, a deleted chain) should not wait for the sync period to put them back.
//! The sync loop hands each backend, before its first sync, a handle that asks that
//! family's runner for a sync ([`crate::Backend::repair_with`]); the runner runs it as soon
//! as its minimum interval allows, and the backend's sync repairs what it finds. The handle
//! names no mode and no runner: it is a callback.

use std::fmt;
use std::sync::Arc;

/// Asks for a sync of one family as soon as the runner's minimum interval allows. Cheap to
/// clone and to call from any thread; requests made while a sync runs are not lost (one
/// more sync follows), and requests made together are one sync.
#[derive(Clone)]
pub struct RepairRequest(Arc<dyn Fn() + Send + Sync>);

impl RepairRequest {
    /// A request that calls `fire` (the sync loop's: its runner's trigger).
    pub fn new(fire: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Arc::new(fire))
    }

    /// A request that does nothing (tests, tools, backends run without a sync loop).
    pub fn none() -> Self {
        Self::new(|| {})
    }

    /// Asks for the sync.
    pub fn request(&self) {
        (self.0)();
    }
}

impl fmt::Debug for RepairRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RepairRequest")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn every_clone_fires_the_same_callback() {
        let fired = Arc::new(AtomicUsize::new(0));
        let counter = fired.clone();
        let request = RepairRequest::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let clone = request.clone();
        std::thread::spawn(move || clone.request()).join().unwrap();
        request.request();
        assert_eq!(fired.load(Ordering::SeqCst), 2);
        RepairRequest::none().request();
    }
}
