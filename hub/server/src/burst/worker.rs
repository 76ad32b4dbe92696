//! The burst applier: performs provider calls off the hub's applier task,
//! at most [`MAX_PROVIDER_CALLS`] at once, and hands every result back as a
//! [`Command::Burst`], so a slow or failing provider never holds up the
//! scheduling of on-prem work. It decides nothing: the reconciler
//! (`hub/burst/`) says what to call, and reads what came of it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axle_burst::{
    Instance, InstanceState, LaunchSpec, Offer, Provider, ProviderError, TAG_BURST_ID,
};
use tokio::sync::{Semaphore, mpsc};
use tracing::warn;

use crate::hub::Command;

/// Provider calls in flight at once, all providers together: enough to
/// launch a burst of instances in parallel, few enough that a provider
/// answering slowly never piles up thousands of connections.
pub const MAX_PROVIDER_CALLS: usize = 16;

/// Calls waiting for a permit; more are dropped and asked again by the
/// reconciler on a later tick (what it asks for is derived from the records).
pub const MAX_QUEUED_CALLS: usize = 1024;

/// The most one call may take, the provider's own timeout included.
pub const CALL_DEADLINE: Duration = Duration::from_secs(45);

/// What the reconciler asks of a provider.
#[derive(Debug, Clone)]
pub enum Job {
    Catalog {
        provider: String,
    },
    /// Launch burst `id`; a launch that already happened (its answer lost,
    /// or the hub restarted) is found by its tag and returned instead.
    Launch {
        id: String,
        provider: String,
        spec: Box<LaunchSpec>,
    },
    /// Terminate instance `instance_id` (of burst `id`, or an orphan).
    Terminate {
        id: Option<String>,
        provider: String,
        instance_id: String,
    },
    /// Every instance carrying this hub's tag, for adoption and the reaper.
    List {
        provider: String,
        hub_tag: (String, String),
    },
}

/// What came of a [`Job`].
#[derive(Debug)]
pub enum Outcome {
    Catalog {
        provider: String,
        result: Result<Vec<Offer>, ProviderError>,
    },
    Launched {
        id: String,
        provider: String,
        result: Result<Instance, ProviderError>,
    },
    Terminated {
        id: Option<String>,
        provider: String,
        instance_id: String,
        result: Result<(), ProviderError>,
    },
    Listed {
        provider: String,
        result: Result<Vec<Instance>, ProviderError>,
    },
}

/// The handle the hub queues jobs on.
#[derive(Clone)]
pub struct Worker {
    tx: mpsc::Sender<Job>,
}

impl Worker {
    /// Starts the worker; results go to `commands` (the hub's applier).
    pub fn spawn(
        providers: BTreeMap<String, Arc<dyn Provider>>,
        commands: mpsc::Sender<Command>,
    ) -> (Worker, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<Job>(MAX_QUEUED_CALLS);
        let permits = Arc::new(Semaphore::new(MAX_PROVIDER_CALLS));
        let task = tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let providers = providers.clone();
                let commands = commands.clone();
                tokio::spawn(async move {
                    let outcome = run(&providers, job).await;
                    drop(permit);
                    // The hub is shutting down when this fails: nothing to tell.
                    let _ = commands.send(Command::Burst(Box::new(outcome))).await;
                });
            }
        });
        (Worker { tx }, task)
    }

    /// Queues `job`; false when the queue is full (the reconciler asks again).
    pub fn queue(&self, job: Job) -> bool {
        match self.tx.try_send(job) {
            Ok(()) => true,
            Err(e) => {
                warn!("burst worker queue full or closed: {e}");
                false
            }
        }
    }
}

fn missing(provider: &str) -> ProviderError {
    ProviderError::permanent(
        "burst",
        format!("burst provider {provider} is not configured on this hub"),
    )
}

async fn deadline<T>(
    f: impl std::future::Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    match tokio::time::timeout(CALL_DEADLINE, f).await {
        Ok(r) => r,
        Err(_) => Err(ProviderError::retryable(
            "burst",
            format!("no answer within {} s", CALL_DEADLINE.as_secs()),
        )),
    }
}

async fn run(providers: &BTreeMap<String, Arc<dyn Provider>>, job: Job) -> Outcome {
    match job {
        Job::Catalog { provider } => {
            let result = match providers.get(&provider) {
                Some(p) => deadline(p.catalog()).await,
                None => Err(missing(&provider)),
            };
            Outcome::Catalog { provider, result }
        }
        Job::Launch { id, provider, spec } => {
            let result = match providers.get(&provider) {
                Some(p) => deadline(launch_once(p.as_ref(), &id, &spec)).await,
                None => Err(missing(&provider)),
            };
            Outcome::Launched {
                id,
                provider,
                result,
            }
        }
        Job::Terminate {
            id,
            provider,
            instance_id,
        } => {
            let result = match providers.get(&provider) {
                Some(p) => deadline(p.terminate(&instance_id)).await,
                None => Err(missing(&provider)),
            };
            Outcome::Terminated {
                id,
                provider,
                instance_id,
                result,
            }
        }
        Job::List { provider, hub_tag } => {
            let result = match providers.get(&provider) {
                Some(p) => deadline(p.list(&hub_tag.0, &hub_tag.1)).await,
                None => Err(missing(&provider)),
            };
            Outcome::Listed { provider, result }
        }
    }
}

/// Lists by the burst's tag before launching: an instance already made for
/// this burst (a launch whose answer was lost, a hub that restarted between
/// the launch and recording it) is returned, never launched twice.
async fn launch_once(
    p: &dyn Provider,
    id: &str,
    spec: &LaunchSpec,
) -> Result<Instance, ProviderError> {
    let existing = p.list(TAG_BURST_ID, id).await?;
    if let Some(i) = existing.into_iter().find(|i| {
        i.is_axles() && !matches!(i.state, InstanceState::Terminated | InstanceState::Stopping)
    }) {
        return Ok(i);
    }
    p.launch(spec).await
}
