//! A backend's repair request runs a sync at once, with nothing changed, and only when
//! asked: the handle it gets before its first sync fires its family's runner.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpr_metrics::{Metrics, ProxyHealth};
use kpr_sources::{Event, event_channel};
use kpr_state::{Backend, BackendError, RepairRequest, SyncReport, SyncRequest};
use prometheus_client::registry::Registry;

use crate::test_support::{FAMILY, settings};
use crate::{FamilyBackend, run};

#[derive(Debug, Default)]
struct Seen {
    /// The handle, as given before the first sync.
    repair: Option<RepairRequest>,
    /// Per sync: whether the handle had been given by then, and how many services changed.
    syncs: Vec<(bool, usize)>,
}

struct Repairable(Arc<Mutex<Seen>>);

impl Backend for Repairable {
    fn sync(&mut self, request: &SyncRequest<'_>) -> Result<SyncReport, BackendError> {
        let mut seen = self.0.lock().unwrap();
        let given = seen.repair.is_some();
        seen.syncs.push((given, request.changed.len()));
        Ok(SyncReport::default())
    }

    fn repair_with(&mut self, repair: RepairRequest) {
        self.0.lock().unwrap().repair = Some(repair);
    }
}

async fn syncs_after(seen: &Mutex<Seen>, n: usize) -> Vec<(bool, usize)> {
    for _ in 0..500 {
        let syncs = seen.lock().unwrap().syncs.clone();
        if syncs.len() >= n {
            return syncs;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} syncs, saw {:?}", seen.lock().unwrap().syncs);
}

#[tokio::test]
async fn a_repair_request_runs_one_sync_with_nothing_changed() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (events, rx) = event_channel();
    let mut registry = Registry::default();
    tokio::spawn(run(
        settings(vec!["manifests"]),
        vec![FamilyBackend::new(FAMILY, Box::new(Repairable(seen.clone())))],
        rx,
        Metrics::new(&mut registry),
        Arc::new(ProxyHealth::new(Duration::from_secs(60))),
    ));
    events.send(Event::Synced { source: "manifests" }).await.unwrap();
    assert_eq!(
        syncs_after(&seen, 1).await,
        [(true, 0)],
        "given before the first sync"
    );

    // The period is an hour (test_support::settings): only the request explains a sync.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(seen.lock().unwrap().syncs.len(), 1, "no sync unasked");
    let repair = seen.lock().unwrap().repair.clone().unwrap();
    for _ in 0..10 {
        repair.request();
    }
    assert_eq!(syncs_after(&seen, 2).await, [(true, 0), (true, 0)]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        seen.lock().unwrap().syncs.len(),
        2,
        "requests together are one sync"
    );
}
