//! The role loop of one replica: register, follow, campaign, lead, step down, again.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use axle_policy::Policy;
use tokio::sync::watch;
use tracing::{info, warn};

use super::election::{self, Leader, LeaseSession, ReplicaInfo};
use super::front::{self, Front, GrpcSwitch, Role, Roles};
use super::mirror::{CATCH_UP_TIMEOUT, Mirror};
use super::{FOLLOW_POLL, HaOptions, LEADER_KEY, RETRY_DELAY, TERM_MARKER_KEY};
use crate::hub::{Clock, Command, Hub, HubConfig, HubTasks, OnStoreFailure};
use crate::server::{self, DRAIN_DEADLINE, Listeners};
use crate::store::{EtcdStore, LeaseId, Op, Rev, Store, Txn};

/// What a failover takes beyond the lease TTL: an election (a follower polls every
/// [`FOLLOW_POLL`]), restoring the hub from etcd, spokes redialling.
const FAILOVER_MARGIN: Duration = Duration::from_secs(5);

/// What the replica needs to lead.
struct Ctx {
    store: Arc<EtcdStore>,
    policy: Policy,
    config: HubConfig,
    ha: HaOptions,
    me: ReplicaInfo,
    role: Roles,
    /// The follower's mirror revision (0: cold, or leading), for `/api/v1/hubs`.
    warm: Arc<AtomicU64>,
}

/// A term that was still running at shutdown.
struct Leading {
    hub: Arc<Hub>,
    tasks: HubTasks,
    term: Rev,
}

/// How the role loop ended (on shutdown).
struct Exit {
    leading: Option<Leading>,
    lease: Option<LeaseId>,
}

/// Runs one replica until `shutdown` resolves or a server fails.
pub async fn run(
    data_dir: PathBuf,
    policy: Policy,
    spoke_token: Option<String>,
    listeners: Listeners,
    store: EtcdStore,
    ha: HaOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
    let store = Arc::new(store);
    // The spoke CA is shared by every replica: the first to start writes it.
    let secured = loop {
        match server::secure(&listeners, store.as_ref(), &data_dir).await {
            Ok(s) => break s,
            Err(e) => {
                warn!("cannot set up TLS yet: {e:#}; retrying");
                tokio::time::sleep(RETRY_DELAY).await;
            }
        }
    };
    let clock = Clock::system();
    let me = ReplicaInfo {
        id: ha.replica_id.clone(),
        http: ha.advertise_http.clone(),
        grpc: ha.advertise_grpc.clone(),
        started_at_ms: clock.now_ms(),
    };
    // A spoke fences itself (stops its workloads) after spokeLostAfter without a hub: a
    // failover must be shorter, or it restarts running work.
    let lost_after = Duration::from_secs(policy.settings.spoke_lost_after_s);
    if lost_after < ha.lease_ttl + FAILOVER_MARGIN {
        warn!(
            "spokeLostAfterSeconds ({} s) is shorter than a failover (lease TTL {} ms + {} s): \
             spokes will stop their workloads when the leader changes; raise it",
            lost_after.as_secs(),
            ha.lease_ttl.as_millis(),
            FAILOVER_MARGIN.as_secs()
        );
    }
    let role: Roles = Arc::new(ArcSwap::from_pointee(Role::Follower { leader: None }));
    let log_limits = crate::logs::LogLimits::within(policy.settings.max_log_bytes_per_workload);
    let warm = Arc::new(AtomicU64::new(0));
    let ctx = Ctx {
        store: store.clone(),
        config: HubConfig {
            data_dir,
            spoke_token,
            log_limits,
            clock,
            on_store_failure: OnStoreFailure::StepDown,
            auth: listeners.auth,
            bootstrap_token: listeners.bootstrap_token.clone(),
            rate_limits: listeners.rate_limits,
            spoke_ca: secured.ca.clone(),
            spoke_cert_ttl_ms: secured.cert_ttl_ms,
            oidc: listeners.oidc.clone(),
            burst: crate::server::burst_config(
                &listeners,
                secured.ca.as_deref(),
                listeners.grpc.local_addr()?,
            ),
        },
        policy,
        ha,
        me: me.clone(),
        role: role.clone(),
        warm: warm.clone(),
    };
    info!(
        "replica {} on {} (HTTP) and {} (gRPC), lease TTL {} ms",
        me.id,
        listeners.http.local_addr()?,
        listeners.grpc.local_addr()?,
        ctx.ha.lease_ttl.as_millis()
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut http_stop = stop_rx.clone();
    let mut grpc_stop = stop_rx.clone();
    let app = front::router(Front {
        role: role.clone(),
        store: store.clone(),
        me,
        warm,
        auth: listeners.auth,
        oidc: listeners.oidc.clone(),
    });
    let http = crate::http_serve::serve(
        listeners.http,
        app,
        listeners.http_limits,
        secured.http.as_ref(),
        async move {
            let _ = http_stop.wait_for(|s| *s).await;
        },
    );
    let grpc = server::grpc_server()
        .add_service(GrpcSwitch::new(role.clone(), front::spoke_of))
        .add_service(GrpcSwitch::new(role.clone(), front::user_of))
        .serve_with_incoming_shutdown(
            crate::grpc_serve::incoming(listeners.grpc, secured.grpc, listeners.grpc_limits),
            async move {
                let _ = grpc_stop.wait_for(|s| *s).await;
            },
        );
    let servers = async {
        let http = async { http.await.context("HTTP server failed") };
        let grpc = async { grpc.await.context("gRPC server failed") };
        tokio::try_join!(http, grpc).map(|_| ())
    };
    tokio::pin!(servers);
    let exit = tokio::select! {
        r = &mut servers => return r,
        exit = roles(&ctx, stop_rx) => exit,
    };
    info!(
        "shutting down: draining requests and spoke sessions for at most {} s",
        DRAIN_DEADLINE.as_secs()
    );
    if let Some(l) = &exit.leading {
        let _ = l.hub.send(Command::EndSessions).await;
    }
    if tokio::time::timeout(DRAIN_DEADLINE, &mut servers)
        .await
        .is_err()
    {
        warn!(
            "drain deadline of {} s passed; closing what is still open",
            DRAIN_DEADLINE.as_secs()
        );
    }
    role.store(Arc::new(Role::Follower { leader: None }));
    if let Some(l) = exit.leading {
        l.tasks.abort();
        // Handing the lead over now saves the followers a lease TTL.
        if let Err(e) = election::resign(&store, l.term).await {
            warn!("cannot resign term {}: {e}", l.term);
        }
        store.unfence();
    }
    if let Some(lease) = exit.lease {
        let _ = store.lease_revoke(lease).await;
    }
    Ok(())
}

/// Sleeps `d`, or less when the replica stops; true when it stops.
async fn pause(stop: &mut watch::Receiver<bool>, d: std::time::Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
    *stop.borrow()
}

/// Follows and leads, term after term, until the replica stops.
async fn roles(ctx: &Ctx, mut stop: watch::Receiver<bool>) -> Exit {
    let stopped = |lease| Exit {
        leading: None,
        lease,
    };
    // Kept while following, handed to the term it wins (which drops it once restored).
    let mut mirror: Option<Mirror> = None;
    loop {
        if *stop.borrow() {
            return stopped(None);
        }
        let store: Arc<dyn Store> = ctx.store.clone();
        mirror.get_or_insert_with(|| Mirror::start(store, ctx.warm.clone()));
        let session = match LeaseSession::open(ctx.store.clone(), ctx.ha.lease_ttl).await {
            Ok(s) => s,
            Err(e) => {
                warn!("cannot take a lease in etcd: {e}; retrying");
                ctx.role.store(Arc::new(Role::Follower { leader: None }));
                if pause(&mut stop, RETRY_DELAY).await {
                    return stopped(None);
                }
                continue;
            }
        };
        if let Err(e) = election::register(&ctx.store, &ctx.me, session.id).await {
            warn!(
                "cannot register replica {} in etcd: {e}; retrying",
                ctx.me.id
            );
            if pause(&mut stop, RETRY_DELAY).await {
                return stopped(Some(session.id));
            }
            continue;
        }
        let Some(term) = follow(ctx, &session, &mut stop).await else {
            if *stop.borrow() {
                return stopped(Some(session.id));
            }
            warn!("replica {}: its lease lapsed; taking a new one", ctx.me.id);
            continue;
        };
        match lead(ctx, term, &session, &mut stop, mirror.take()).await {
            Some(leading) => {
                return Exit {
                    leading: Some(leading),
                    lease: Some(session.id),
                };
            }
            None => {
                let _ = ctx.store.lease_revoke(session.id).await;
                if pause(&mut stop, FOLLOW_POLL).await {
                    return stopped(None);
                }
            }
        }
    }
}

/// Follows whoever leads until this replica wins an election (its term), its lease
/// lapses or it stops (`None`).
async fn follow(
    ctx: &Ctx,
    session: &LeaseSession,
    stop: &mut watch::Receiver<bool>,
) -> Option<Rev> {
    let mut known: Option<Leader> = None;
    loop {
        if session.is_lost() || *stop.borrow() {
            return None;
        }
        match election::current_leader(&ctx.store).await {
            Ok(None) => match election::campaign(&ctx.store, &ctx.me, session.id).await {
                Ok(Some(term)) => return Some(term),
                Ok(None) => {}
                Err(e) => warn!("campaign failed: {e}"),
            },
            Ok(Some(l)) => {
                if known.as_ref() != Some(&l) {
                    info!(
                        "replica {} follows {} (term {}) at {}",
                        ctx.me.id, l.info.id, l.term, l.info.http
                    );
                    ctx.role.store(Arc::new(Role::Follower {
                        leader: Some(l.clone()),
                    }));
                    known = Some(l);
                }
            }
            Err(e) => {
                if known.take().is_some() {
                    warn!("cannot read the leader from etcd: {e}");
                }
                ctx.role.store(Arc::new(Role::Follower { leader: None }));
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = stop.wait_for(|s| *s) => return None,
            _ = session.lost() => return None,
        }
    }
}

/// Leads one term: fences the store on it, finishes an interrupted batch, restores the hub
/// (from the warm `mirror` when it catches up with the term's marker, else from etcd) and
/// serves until the lease lapses, a write fails (fenced or etcd gone) or the replica stops
/// (then the running term is handed back to `run` to drain).
async fn lead(
    ctx: &Ctx,
    term: Rev,
    session: &LeaseSession,
    stop: &mut watch::Receiver<bool>,
    mirror: Option<Mirror>,
) -> Option<Leading> {
    let id = &ctx.me.id;
    info!("replica {id} leads (term {term}); restoring the hub");
    ctx.store.fence(LEADER_KEY, term);
    let started = async {
        let recovered = ctx.store.recover_batches().await?;
        if recovered.replayed + recovered.dropped > 0 {
            info!(
                "finished the interrupted batch of the last leader: {} replayed, {} dropped",
                recovered.replayed, recovered.dropped
            );
        }
        // The marker's revision holds nothing else, and nothing of the hub's is written
        // after it until the hub below starts: a copy that has seen it is exact.
        let marker = format!("{{\"term\":{term},\"replica\":{:?}}}", ctx.me.id);
        let marked = ctx
            .store
            .txn(Txn::new().and_then(Op::put_with_lease(TERM_MARKER_KEY, marker, session.id)))
            .await?;
        let store: Arc<dyn Store> = ctx.store.clone();
        let (policy, config) = (ctx.policy.clone(), ctx.config.clone());
        let view = match &mirror {
            Some(m) => m.view_at(marked.rev, CATCH_UP_TIMEOUT).await,
            None => None,
        };
        drop(mirror);
        let started = std::time::Instant::now();
        let (from, hub) = match view {
            Some(view) => {
                let from = format!("its mirror at revision {}", view.revision());
                (from, Hub::start_from(store, &view, policy, config).await?)
            }
            None => (
                "etcd (its mirror was not caught up)".to_string(),
                Hub::start(store, policy, config).await?,
            ),
        };
        let restored = format!(
            "restored from {from} in {} ms",
            started.elapsed().as_millis()
        );
        info!("replica {id} {restored}");
        anyhow::Ok((hub, restored))
    }
    .await;
    let ((hub, mut tasks), restored) = match started {
        Ok(h) => h,
        Err(e) => {
            warn!("replica {id} cannot take the lead of term {term}: {e:#}");
            ctx.store.unfence();
            let _ = election::resign(&ctx.store, term).await;
            return None;
        }
    };
    ctx.role.store(Arc::new(Role::Leader {
        leader: Leader {
            info: ctx.me.clone(),
            term,
        },
        hub: hub.clone(),
        http: crate::http::router(hub.clone()),
        spoke: server::spoke_service(hub.clone()),
        user: server::user_service(hub.clone()),
        restored,
    }));
    info!("replica {id} is the leader (term {term})");
    let why = tokio::select! {
        w = tasks.failed() => hub.store_failure().unwrap_or(w),
        _ = session.lost() => "its lease lapsed".to_string(),
        never = compact(&ctx.store, ctx.ha.compaction_interval) => match never {},
        _ = stop.wait_for(|s| *s) => return Some(Leading { hub, tasks, term }),
    };
    warn!("replica {id} steps down from term {term}: {why}");
    ctx.role.store(Arc::new(Role::Follower { leader: None }));
    tasks.abort();
    hub.close_sessions();
    ctx.store.unfence();
    let _ = election::resign(&ctx.store, term).await;
    None
}

/// Compacts etcd's history every `interval`, to the revision it had one interval before:
/// etcd keeps every revision until compacted, so without this its database grows with
/// every write. A watcher up to one interval behind (a follower's mirror) can still resume.
/// Runs for the whole term; a failed compaction is retried at the next interval.
async fn compact(store: &EtcdStore, interval: Duration) -> std::convert::Infallible {
    let mut last: Option<Rev> = None;
    loop {
        tokio::time::sleep(interval).await;
        if let Some(rev) = last
            && let Err(e) = store.compact(rev).await
        {
            warn!("cannot compact etcd at revision {rev}: {e}");
        }
        match store.rev().await {
            Ok(rev) => last = Some(rev),
            Err(e) => warn!("cannot read etcd's revision to compact: {e}"),
        }
    }
}
