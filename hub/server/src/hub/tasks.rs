//! The hub's own named tasks, supervised: neither the applier nor the
//! ticker ends while the hub runs, so [`HubTasks::failed`] resolving means
//! one died (a panic), and the process exits saying which and why instead
//! of answering 503 forever.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Command, Hub, TICK_MS};

pub struct HubTasks {
    applier: JoinHandle<()>,
    ticker: JoinHandle<()>,
    /// The burst worker, when the hub bursts.
    pub(super) burst: Option<JoinHandle<()>>,
}

pub(super) fn spawn(hub: Arc<Hub>, rx: mpsc::Receiver<Command>) -> HubTasks {
    // The ticker holds only a sender, so it never keeps the hub alive.
    let tick_tx = hub.tx.clone();
    let applier = tokio::spawn(async move { hub.applier(rx).await });
    let ticker = tokio::spawn(async move {
        let mut t = tokio::time::interval(Duration::from_millis(TICK_MS));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            t.tick().await;
            if tick_tx.send(Command::Tick).await.is_err() {
                break;
            }
        }
    });
    HubTasks {
        applier,
        ticker,
        burst: None,
    }
}

impl HubTasks {
    /// Waits until a task ends; the message names it and says why.
    pub async fn failed(&mut self) -> String {
        let (name, r) = tokio::select! {
            r = &mut self.applier => ("applier", r),
            r = &mut self.ticker => ("ticker", r),
        };
        match r {
            Ok(()) => format!("the hub's {name} task stopped"),
            Err(e) if e.is_panic() => {
                let p = e.into_panic();
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                format!("the hub's {name} task panicked: {msg}")
            }
            Err(e) => format!("the hub's {name} task was cancelled: {e}"),
        }
    }

    /// Stops both tasks (the process is exiting).
    pub fn abort(&self) {
        self.applier.abort();
        self.ticker.abort();
        if let Some(b) = &self.burst {
            b.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HubTasks;

    #[tokio::test]
    async fn a_panicked_applier_is_reported_by_name_and_cause() {
        // Observed: a dead applier left a hub that answered 503 forever.
        let mut tasks = HubTasks {
            applier: tokio::spawn(async { panic!("store invariant broken") }),
            ticker: tokio::spawn(std::future::pending()),
            burst: None,
        };
        let why = tokio::time::timeout(std::time::Duration::from_secs(1), tasks.failed())
            .await
            .expect("reported within a second");
        assert_eq!(
            why,
            "the hub's applier task panicked: store invariant broken"
        );
    }

    #[tokio::test]
    async fn a_ticker_that_stops_is_reported() {
        let mut tasks = HubTasks {
            applier: tokio::spawn(std::future::pending()),
            ticker: tokio::spawn(async {}),
            burst: None,
        };
        assert_eq!(tasks.failed().await, "the hub's ticker task stopped");
    }
}
