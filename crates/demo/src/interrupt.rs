//! Ctrl-C (and SIGTERM, SIGHUP) must not leave namespaces behind, so the demo never dies on
//! them: one thread catches them and raises a flag, the demo checks the flag between steps
//! and returns, and dropping the lab cleans up.
//!
//! Why tokio's signal handling rather than blocking the signals and waiting for them: a
//! blocked mask is inherited by child processes, so the proxy would ignore the SIGTERM its
//! guard sends and only die on the SIGKILL after the grace period. A caught signal is reset
//! to its default in children on exec. tokio installs the handler, so no `unsafe` here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::failure::Failure;

/// Raised once a stop signal arrived.
#[derive(Clone, Debug, Default)]
pub struct Interrupt {
    raised: Arc<AtomicBool>,
}

impl Interrupt {
    /// Starts the thread that catches the stop signals; returns once they are caught.
    pub fn watch() -> Result<Self, Failure> {
        let interrupt = Self::default();
        let raised = Arc::clone(&interrupt.raised);
        let (installed_tx, installed_rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("signals".to_owned())
            .spawn(move || catch_forever(&raised, &installed_tx))
            .map_err(|err| Failure::io("cannot start the signal thread", err))?;
        match installed_rx.recv() {
            Ok(Ok(())) => Ok(interrupt),
            Ok(Err(err)) => Err(Failure::io("cannot catch SIGINT/SIGTERM", err)),
            Err(_) => Err(Failure::io(
                "cannot catch SIGINT/SIGTERM",
                std::io::Error::other("the signal thread ended"),
            )),
        }
    }

    /// Whether a stop signal arrived.
    pub fn raised(&self) -> bool {
        self.raised.load(Ordering::SeqCst)
    }

    /// `Err(Failure::Interrupted)` once a stop signal arrived: the caller returns, and the
    /// lab is dropped on the way out.
    pub fn check(&self) -> Result<(), Failure> {
        if self.raised() {
            Err(Failure::Interrupted)
        } else {
            Ok(())
        }
    }

    #[cfg(test)]
    pub fn raise(&self) {
        self.raised.store(true, Ordering::SeqCst);
    }
}

/// Installs the handlers, reports on `installed`, then raises the flag on every signal.
fn catch_forever(raised: &AtomicBool, installed: &mpsc::SyncSender<std::io::Result<()>>) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let caught = runtime.and_then(|runtime| {
        let streams = runtime.block_on(async {
            Ok::<_, std::io::Error>([
                ("SIGINT", signal(SignalKind::interrupt())?),
                ("SIGTERM", signal(SignalKind::terminate())?),
                ("SIGHUP", signal(SignalKind::hangup())?),
            ])
        })?;
        Ok((runtime, streams))
    });
    let (runtime, mut streams) = match caught {
        Ok(caught) => caught,
        Err(err) => {
            let _ = installed.send(Err(err));
            return;
        }
    };
    let _ = installed.send(Ok(()));
    runtime.block_on(async {
        loop {
            let name = next_signal(&mut streams).await;
            if !raised.swap(true, Ordering::SeqCst) {
                eprintln!("\n{name} received: stopping and cleaning up");
            }
        }
    });
}

async fn next_signal(streams: &mut [(&'static str, Signal); 3]) -> &'static str {
    let [(int_name, int), (term_name, term), (hup_name, hup)] = streams;
    tokio::select! {
        _ = int.recv() => *int_name,
        _ = term.recv() => *term_name,
        _ = hup.recv() => *hup_name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_fails_only_after_a_raise() {
        let interrupt = Interrupt::default();
        assert!(interrupt.check().is_ok());
        interrupt.clone().raise();
        assert!(matches!(interrupt.check(), Err(Failure::Interrupted)));
    }
}
