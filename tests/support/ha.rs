//! A highly available hub for end-to-end tests: a real 3-member etcd cluster (Debian
//! `etcd-server`, which `scripts/test.sh` installs) on loopback ports, hub replicas on it,
//! and spokes that know every replica.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use axle_proto::api::{HubsView, SubmitRequest};

use crate::{Api, HubProc, Ports, Proc, SpokeProc, SpokeSpec, TempPolicy, free_port, temp_dir};

/// How long a probe of one replica may take: a loopback answer takes milliseconds, and a
/// paused replica must not stall the test's view of who leads.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long an etcd cluster gets to elect a leader and answer.
const ETCD_READY: Duration = Duration::from_secs(30);

/// One etcd member.
struct Member {
    name: String,
    client: u16,
    peer: u16,
    proc_: Option<Proc>,
}

/// An etcd cluster of real processes; members are SIGKILLed when dropped.
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: PathBuf,
}

impl EtcdCluster {
    /// Starts `n` members in `dir` and waits until the cluster answers.
    pub fn start(n: usize, dir: &Path) -> EtcdCluster {
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("e{i}"),
                client: free_port(),
                peer: free_port(),
                proc_: None,
            })
            .collect();
        let mut c = EtcdCluster {
            members,
            dir: dir.to_path_buf(),
        };
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_healthy(n);
        c
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) {
        let initial = self.initial_cluster();
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "axle-e2e"])
            // Loopback is fast: elect within ~0.5 s of a member's loss.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"]);
        let log = self.dir.join(format!("{}.log", m.name));
        self.members[i].proc_ = Some(Proc::spawn(&format!("etcd {}", m.name), cmd, &log));
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,…` for `--store`.
    pub fn store_url(&self) -> String {
        let eps: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect();
        format!("etcd://{}", eps.join(","))
    }

    /// SIGKILL member `i`.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc_.take() {
            p.kill9();
        }
    }

    /// Starts member `i` again on its data dir.
    pub fn restart(&mut self, i: usize) {
        self.kill9(i);
        self.spawn(i);
    }

    /// Waits until `want` members answer /health with `"health":"true"`.
    pub fn wait_healthy(&self, want: usize) {
        let deadline = Instant::now() + ETCD_READY;
        loop {
            let healthy = self
                .members
                .iter()
                .filter(|m| m.proc_.is_some())
                .filter(|m| {
                    Command::new("curl")
                        .args(["-sf", "-m", "1"])
                        .arg(format!("http://127.0.0.1:{}/health", m.client))
                        .output()
                        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("true"))
                })
                .count();
            if healthy >= want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd: {healthy} of {want} members healthy after {ETCD_READY:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Hub replicas on an etcd cluster, and spokes that dial them all. Drops spokes first,
/// then hubs, then etcd, then the directories.
pub struct HaEnv {
    pub spokes: Vec<SpokeProc>,
    pub hubs: Vec<HubProc>,
    pub etcd: EtcdCluster,
    pub policy: TempPolicy,
    pub dir: tempfile::TempDir,
    pub lease_ttl: Duration,
}

impl HaEnv {
    /// A 3-member etcd, `replicas` hubs with lease TTL `lease_ttl`, and one spoke per
    /// `(cluster, region, --gpus values)`; waits until one replica leads and sees the
    /// spokes Ready.
    pub async fn start(
        fixtures: &[&str],
        replicas: usize,
        lease_ttl: Duration,
        spokes: &[(&str, &str, &[&str])],
    ) -> HaEnv {
        let dir = temp_dir("axle-e2e-ha");
        let policy = TempPolicy::fixture(fixtures);
        let etcd = EtcdCluster::start(3, dir.path());
        let store = etcd.store_url();
        let hubs: Vec<HubProc> = (0..replicas)
            .map(|i| {
                HubProc::start_with(
                    policy.path(),
                    &dir.path().join(format!("hub-{i}")),
                    Ports::free(),
                    vec![
                        "--store".into(),
                        store.clone(),
                        "--replica-id".into(),
                        format!("r{i}"),
                        "--lease-ttl-ms".into(),
                        lease_ttl.as_millis().to_string(),
                    ],
                )
            })
            .collect();
        let grpc: Vec<String> = hubs.iter().map(HubProc::grpc_url).collect();
        let spokes = spokes
            .iter()
            .map(|(cluster, region, gpus)| {
                let data = dir.path().join(format!("spoke-{cluster}"));
                SpokeProc::start(
                    &grpc.join(","),
                    SpokeSpec::new(cluster, region, gpus, &data),
                )
            })
            .collect();
        let env = HaEnv {
            spokes,
            hubs,
            etcd,
            policy,
            dir,
            lease_ttl,
        };
        let names: Vec<String> = env.spokes.iter().map(|s| s.spec.cluster.clone()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        env.wait_leader_ready(&names, Duration::from_secs(30)).await;
        env
    }

    /// Every replica's HTTP URL, comma-separated (as `axle --hub` takes them).
    pub fn hub_urls(&self) -> String {
        self.hubs
            .iter()
            .map(HubProc::http_url)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The replica whose /readyz is 200, if exactly one.
    pub async fn leader(&self) -> Option<usize> {
        let mut ready = Vec::new();
        for (i, h) in self.hubs.iter().enumerate() {
            // Briefly: a paused replica must not hold the probe up.
            let probe = h.api().try_get_within("/readyz", PROBE_TIMEOUT).await;
            if let Ok((200, _)) = probe {
                ready.push(i);
            }
        }
        match ready.as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }

    /// What replica `i` says about the replicas.
    pub async fn hubs_view(&self, i: usize) -> Result<HubsView, String> {
        match self.hubs[i]
            .api()
            .try_get_within("/api/v1/hubs", PROBE_TIMEOUT)
            .await
        {
            Ok((200, v)) => serde_json::from_value(v).map_err(|e| e.to_string()),
            other => Err(format!("{other:?}")),
        }
    }

    /// Waits until one replica leads (among those not in `except`) and sees `clusters`
    /// Ready; its index.
    pub async fn wait_leader_ready(&self, clusters: &[&str], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.leader().await {
                Some(i) => {
                    let views = self.hubs[i].api().try_get("/api/v1/clusters").await;
                    match views {
                        Ok((200, body)) => {
                            let ready: Vec<String> = body
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter(|c| c["state"] == "Ready")
                                .filter_map(|c| c["name"].as_str().map(str::to_string))
                                .collect();
                            if clusters.iter().all(|c| ready.iter().any(|r| r == c)) {
                                return i;
                            }
                            format!("leader r{i} sees Ready: {ready:?}")
                        }
                        other => format!("leader r{i} clusters: {other:?}"),
                    }
                }
                None => "no single leader".to_string(),
            };
            if Instant::now() >= deadline {
                let logs: Vec<String> = self.hubs.iter().map(HubProc::log).collect();
                panic!(
                    "no leader ready after {timeout:?}: {last}\n{}",
                    logs.join("\n----\n")
                );
            }
            tokio::time::sleep(crate::POLL_PERIOD).await;
        }
    }
}

/// A submit that reached some replica: what the client was told.
#[derive(Debug, Clone)]
pub struct Acked {
    pub key: String,
    pub id: u64,
}

/// Submits `req` (which has an idempotency key) to any of `apis`, starting at `first` and
/// going round while a replica is unreachable, redirects to a leader that is gone, or
/// answers 503, until `deadline`: the way a client that knows every replica retries.
/// `None` when it was never acknowledged.
pub async fn submit_any(
    apis: &[Api],
    first: usize,
    req: &SubmitRequest,
    deadline: Instant,
) -> Option<u64> {
    let mut i = first;
    loop {
        let api = &apis[i % apis.len()];
        let r = api.try_submit(req).await;
        if let Ok((code, body)) = &r
            && (*code == 200 || *code == 201)
        {
            return body["id"].as_u64();
        }
        if let Ok((code, body)) = &r {
            assert!(
                *code == 503 || *code == 307 || *code >= 500,
                "a submit was refused with {code}: {body}"
            );
        }
        if Instant::now() >= deadline {
            return None;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one load client did, in order.
#[derive(Debug, Default)]
pub struct ClientHistory {
    pub client: usize,
    /// Submits acknowledged (200/201), in the order they were made.
    pub acked: Vec<Acked>,
    /// Cancels acknowledged (200): these workloads must end Cancelled.
    pub cancelled: Vec<u64>,
    /// Attempts that got no acknowledgement (a replica down, a redirect to a dead
    /// leader, 503 during an election) and were retried.
    pub retries: u64,
    /// Submits never acknowledged before the load stopped (allowed to exist or not).
    pub unacked: Vec<String>,
}

/// `clients` tasks submitting pending workloads (A100s on a cluster without a spoke)
/// with idempotency keys to any replica, cancelling every 8th they get acknowledged,
/// until stopped.
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<ClientHistory>>,
}

/// How long one submit is retried before the client gives up on it.
const SUBMIT_PATIENCE: Duration = Duration::from_secs(60);

impl Load {
    pub fn start(apis: Vec<Api>, clients: usize, first: usize, tag: &str) -> Load {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|c| {
                let apis = apis.clone();
                let stop = stop.clone();
                let tag = tag.to_string();
                tokio::spawn(async move {
                    let mut h = ClientHistory {
                        client: c,
                        ..ClientHistory::default()
                    };
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        n += 1;
                        let key = format!("{tag}-c{c}-{n}");
                        let team = ["alpha", "beta", "gamma"][(c + n as usize) % 3];
                        let mut req = crate::request(team, 1.0, crate::sh("true"));
                        req.gpu_model = Some("A100".into());
                        req.name = Some(key.clone());
                        req.idempotency_key = Some(key.clone());
                        let deadline = Instant::now() + SUBMIT_PATIENCE;
                        let (id, tries) = submit_counting(&apis, first + c, &req, deadline).await;
                        h.retries += tries;
                        let Some(id) = id else {
                            h.unacked.push(key);
                            continue;
                        };
                        h.acked.push(Acked { key, id });
                        if h.acked.len().is_multiple_of(8) {
                            for k in 0..apis.len() {
                                let api = &apis[(first + c + k) % apis.len()];
                                if let Ok((200, _)) =
                                    api.try_delete(&format!("/api/v1/workloads/{id}")).await
                                {
                                    h.cancelled.push(id);
                                    break;
                                }
                            }
                        }
                    }
                    h
                })
            })
            .collect();
        Load { stop, tasks }
    }

    /// Stops the clients (each finishes the submit it is retrying) and returns what they did.
    pub async fn stop(self) -> Vec<ClientHistory> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut out = Vec::new();
        for t in self.tasks {
            out.push(t.await.expect("load client"));
        }
        out
    }
}

/// [`submit_any`], also counting the attempts that were not acknowledged.
async fn submit_counting(
    apis: &[Api],
    first: usize,
    req: &SubmitRequest,
    deadline: Instant,
) -> (Option<u64>, u64) {
    let mut i = first;
    let mut tries = 0;
    loop {
        let r = apis[i % apis.len()].try_submit(req).await;
        match &r {
            Ok((200 | 201, body)) => return (body["id"].as_u64(), tries),
            Ok((code, body)) => assert!(
                *code == 307 || *code >= 500,
                "a submit was refused with {code}: {body}"
            ),
            Err(_) => {}
        }
        tries += 1;
        if Instant::now() >= deadline {
            return (None, tries);
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Totals of a load run, for the test's report.
pub fn totals(h: &[ClientHistory]) -> (usize, usize, u64, usize) {
    (
        h.iter().map(|c| c.acked.len()).sum(),
        h.iter().map(|c| c.cancelled.len()).sum(),
        h.iter().map(|c| c.retries).sum(),
        h.iter().map(|c| c.unacked.len()).sum(),
    )
}

/// Checks every acknowledged operation against the workloads the hub has now: a submit
/// acknowledged and absent is lost; a key present twice is duplicated; a client's
/// acknowledged submits whose ids do not grow in the order it made them are reordered; a
/// cancel acknowledged on a workload that is not Cancelled is lost too, and so is a
/// completion (`completed`: workloads the hub showed Succeeded) that is no longer
/// Succeeded. One line each.
pub fn check_history(
    histories: &[ClientHistory],
    completed: &[u64],
    workloads: &[axle_proto::api::WorkloadView],
) -> Vec<String> {
    use std::collections::BTreeMap;
    let mut by_name: BTreeMap<&str, Vec<&axle_proto::api::WorkloadView>> = BTreeMap::new();
    for w in workloads {
        by_name.entry(w.name.as_str()).or_default().push(w);
    }
    let mut bad = Vec::new();
    for (name, ws) in &by_name {
        if ws.len() > 1 {
            bad.push(format!(
                "duplicated: {name} is {:?}",
                ws.iter().map(|w| w.id).collect::<Vec<_>>()
            ));
        }
    }
    for h in histories {
        let mut last = 0;
        for a in &h.acked {
            match by_name.get(a.key.as_str()).map(Vec::as_slice) {
                None | Some([]) => bad.push(format!("lost: {} (id {}) acknowledged", a.key, a.id)),
                Some([w, ..]) if w.id != a.id => bad.push(format!(
                    "changed: {} was acknowledged as {} and is {}",
                    a.key, a.id, w.id
                )),
                Some(_) => {}
            }
            if a.id <= last {
                bad.push(format!(
                    "reordered: client {} got {} after {last}",
                    h.client, a.id
                ));
            }
            last = a.id;
        }
        for id in &h.cancelled {
            match workloads.iter().find(|w| w.id == *id) {
                Some(w) if w.state == "Cancelled" => {}
                Some(w) => bad.push(format!("lost cancel: {id} is {}", w.state)),
                None => bad.push(format!("lost cancel: {id} is gone")),
            }
        }
    }
    for id in completed {
        match workloads.iter().find(|w| w.id == *id) {
            Some(w) if w.state == "Succeeded" => {}
            Some(w) => bad.push(format!("lost completion: {id} is {}", w.state)),
            None => bad.push(format!("lost completion: {id} is gone")),
        }
    }
    bad
}
