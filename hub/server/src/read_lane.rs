//! The read lane: the threads that build list pages. They run at a lower
//! CPU priority (nice +[`LIST_NICE`]) than the hub's async workers, its
//! applier and its store commits, so however many clients poll the list at
//! full speed, a submit that is ready to run gets the CPU first; CPU that
//! writes leave idle still goes to reads. A page is built or checked
//! against the cache here, never on an async worker.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::hub::HubError;

/// Niceness of the list threads: +10 gives a thread about a tenth of the
/// CPU weight of a normal one when both want the CPU (Linux CFS weights
/// 110 against 1024), and all of it when writes are idle.
pub const LIST_NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// See the module documentation. Its threads end when it is dropped. Its
/// queue is bounded by its caller: `Hub::with_list_permit` holds one of
/// `list_concurrency()` permits for each job it runs here.
pub struct ReadLane {
    tx: Mutex<mpsc::Sender<Job>>,
}

impl ReadLane {
    /// `threads` list threads (at least one).
    pub fn new(threads: usize) -> ReadLane {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("axle-list-{i}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(job) = job else { break };
                        // A panic is the job's own failure (its caller sees
                        // the answer dropped); the thread serves on.
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                    }
                });
            if let Err(e) = spawned {
                tracing::error!("cannot start list thread {i}: {e}");
            }
        }
        ReadLane { tx: Mutex::new(tx) }
    }

    /// Runs `f` on a list thread and hands back its result.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HubError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .map_err(|_| HubError::shutting_down())?;
        rx.await
            .map_err(|_| HubError::Internal("a list page failed while it was built".into()))
    }
}

/// Lowers the calling thread's CPU priority to [`LIST_NICE`] (Linux keeps
/// a niceness per thread). Elsewhere, or if refused, reads run at the
/// normal priority and the hub says so once per thread.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        if let Err(e) = rustix::process::setpriority_process(Some(tid), LIST_NICE) {
            tracing::warn!("list thread runs at normal CPU priority: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_niced_threads_and_a_panic_leaves_the_lane_serving() {
        let lane = ReadLane::new(1);
        assert_eq!(lane.run(|| 2 + 2).await.unwrap(), 4);
        #[cfg(target_os = "linux")]
        {
            let nice = lane
                .run(|| rustix::process::getpriority_process(Some(rustix::thread::gettid())))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(nice, LIST_NICE);
        }
        let failed = lane.run(|| -> u32 { panic!("bad page") }).await;
        assert!(matches!(failed, Err(HubError::Internal(_))), "{failed:?}");
        assert_eq!(lane.run(|| "still here").await.unwrap(), "still here");
    }
}
