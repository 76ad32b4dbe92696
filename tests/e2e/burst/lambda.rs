//! The burst lifecycle on the Lambda fake: cheapest offer, capacity
//! fall-through, settlement to the second, budget refusal, join timeout,
//! the orphan reaper, a hub killed mid-launch, a reclaim, a hanging provider.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axle_e2e::lambda_fake::{FakeLambda, FakeType};
use axle_e2e::{bin, bin_dir};
use serde_json::Value;

use super::harness::*;

#[tokio::test(flavor = "multi_thread")]
async fn on_prem_full_bursts_to_the_cheapest_offer_runs_and_settles_to_the_second() {
    let _serial = SERIAL.lock().await;
    assert!(
        bin_dir().join("axle-spoke").exists(),
        "build the workspace first"
    );
    let fake = FakeLambda::start(vec![
        FakeType {
            name: "gpu_1x_h100_sxm5".into(),
            gpu_description: "H100 (80 GB SXM5)".into(),
            gpus: 1,
            cents_per_hour: 199,
            regions: vec!["us-east-1".into()],
        },
        FakeType {
            name: "gpu_1x_h100_pcie".into(),
            gpu_description: "H100 (80 GB PCIe)".into(),
            gpus: 1,
            cents_per_hour: 249,
            regions: vec!["us-east-1".into()],
        },
        // Cheaper, but in a region the team's data may not go to.
        FakeType {
            name: "gpu_1x_h100_eu".into(),
            gpu_description: "H100 (80 GB PCIe)".into(),
            gpus: 1,
            cents_per_hour: 99,
            regions: vec!["europe-central-1".into()],
        },
    ])
    .await;
    // The cheapest in-region offer has no capacity when launched.
    fake.refuse_launches_of("gpu_1x_h100_sxm5");
    let machines = Arc::new(Mutex::new(Vec::new()));
    let boot = Arc::new(Mutex::new(true));
    let mut env = start(&fake).await;
    let hub_tag = Arc::new(Mutex::new(String::new()));
    fake.on_launch(booter(
        env.dir.path().to_path_buf(),
        boot.clone(),
        machines.clone(),
        hub_tag.clone(),
    ));
    let _machines = scopeguard(machines.clone());
    onprem_spoke(&mut env).await;

    // The on-prem GPU is taken; the next workload may burst.
    env.fill_onprem("sleep 120").await;
    let submitted = Instant::now();
    let bursty = env.submit("bursty", "sleep 2", true, 600).await;
    let w = wait("the burst workload to succeed", &env, 60, async || {
        let w = env.workload(bursty).await;
        (w["state"] == "Succeeded").then_some(w)
    })
    .await;
    let cluster = w["cluster"].as_str().unwrap_or_default().to_string();
    assert!(cluster.starts_with("burst-lambda-us-"), "{w}");
    let done_s = submitted.elapsed().as_secs_f64();

    // Capacity fell through to the next-cheapest in-region offer; the EU one was never tried.
    assert_eq!(
        fake.capacity_errors(),
        1,
        "the SXM5 launch was refused once"
    );
    let view = env.get("/api/v1/burst").await;
    let instances = view["instances"].as_array().unwrap().clone();
    let failed: Vec<&Value> = instances
        .iter()
        .filter(|i| i["state"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1, "{view}");
    assert_eq!(failed[0]["instance_type"], "gpu_1x_h100_sxm5");
    assert_eq!(
        micro(&failed[0]["cost_micro_usd"]),
        0,
        "a launch that failed costs nothing"
    );
    let ran = instances
        .iter()
        .find(|i| i["cluster"] == cluster.as_str())
        .unwrap()
        .clone();
    assert_eq!(ran["instance_type"], "gpu_1x_h100_pcie");
    assert_eq!(ran["region"], "us-east-1");
    assert!(
        instances.iter().all(|i| i["region"] == "us-east-1"),
        "data residency: {view}"
    );

    // Idle for 2 s after its work: terminated, and the spend settled to the second.
    let id = ran["id"].as_str().unwrap().to_string();
    let settled = wait(
        "the instance to be terminated and settled",
        &env,
        30,
        async || {
            let v = env.get("/api/v1/burst").await;
            v["instances"]
                .as_array()?
                .iter()
                .find(|i| {
                    i["id"] == id.as_str() && i["state"] == "terminated" && i["settled"] == true
                })
                .cloned()
        },
    )
    .await;
    assert!(
        fake.instances().is_empty(),
        "nothing left running at the provider: {:?}",
        fake.instances()
    );
    let launched = micro(&settled["launched_at_ms"]);
    let joined = micro(&settled["joined_at_ms"]);
    let ended = micro(&settled["ended_at_ms"]);
    let seconds = (ended - launched).div_ceil(1000);
    let price = micro(&settled["price_per_hour_micro_usd"]);
    assert_eq!(price, 2_490_000);
    let expected = (u128::from(price) * u128::from(seconds)).div_ceil(3600) as u64;
    let cost = micro(&settled["cost_micro_usd"]);
    assert_eq!(cost, expected, "{seconds} s at $2.49/h: {settled}");
    assert!(cost <= micro(&settled["reserved_micro_usd"]));
    let team = view_team(&env.get("/api/v1/burst").await, "vision");
    assert_eq!(micro(&team["spent_micro_usd"]), cost);
    assert_eq!(
        micro(&team["committed_micro_usd"]),
        cost,
        "the rest was released"
    );
    // `axle get burst` shows the instance and the team's spend.
    let out = Command::new(bin("axle"))
        .arg("--ca-file")
        .arg(env.dir.path().join("hub").join("spoke-ca.pem"))
        .args(["get", "burst"])
        .env("AXLE_HUB", &env.base)
        .env_remove("AXLE_CA_FILE")
        .env_remove("AXLE_TOKEN")
        .env("NO_COLOR", "1")
        .output()
        .expect("run axle");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains(&id)
            && text.contains("terminated")
            && text.contains("gpu_1x_h100_pcie")
            && text.contains("$2.49")
            && text.contains("spend in ")
            && text.contains("$50.00"),
        "{text}"
    );
    eprintln!(
        "FIGURES burst: submit-to-succeeded {done_s:.1} s; launch-to-joined {} ms (Lambda paces launches 10 s apart, after the refused one); instance lived {seconds} s, settled {cost} micro-USD; capacity errors 1",
        joined - launched
    );

    // A workload whose reservation the budget cannot hold does not launch, and says why.
    let launches = fake.launches();
    let big = env.submit("big", "sleep 1", true, 100 * 3600).await;
    let reason = wait("the budget reason", &env, 30, async || {
        let w = env.workload(big).await;
        let r = w["pending_reason"].as_str().unwrap_or_default().to_string();
        r.contains("burst budget").then_some(r)
    })
    .await;
    assert!(
        reason.contains("team vision burst budget")
            && reason.contains("of $50.00 used")
            && reason.contains("this needs"),
        "{reason}"
    );
    assert_eq!(
        fake.launches(),
        launches,
        "nothing launched past the budget"
    );
    env.cancel(big).await;

    // An instance whose spoke never joins is terminated after the join timeout.
    *boot.lock().unwrap() = false;
    let silent = env.submit("silent", "sleep 1", true, 600).await;
    let t0 = Instant::now();
    wait("a launch that never joins", &env, 30, async || {
        (fake.launches() > launches).then_some(())
    })
    .await;
    let note = wait(
        "the unjoined instance to be terminated",
        &env,
        40,
        async || {
            let v = env.get("/api/v1/burst").await;
            v["instances"].as_array()?.iter().find_map(|i| {
                (i["workload"] == silent && i["state"] == "terminated")
                    .then(|| i["note"].as_str().unwrap_or_default().to_string())
            })
        },
    )
    .await;
    assert!(note.contains("did not join within 8 s"), "{note}");
    eprintln!(
        "FIGURES burst: never-joined instance terminated {:.1} s after its launch",
        t0.elapsed().as_secs_f64()
    );
    env.cancel(silent).await;

    // An instance with this hub's tags that no burst claims is reaped after the grace period.
    let hub_tag = hub_tag.lock().unwrap().clone();
    assert_eq!(hub_tag.len(), 16, "launches carry this hub's tag");
    let orphan = fake.seed(
        "gpu_1x_h100_pcie",
        "us-east-1",
        &[
            ("axle-managed-by", "axle"),
            ("axle-hub", &hub_tag),
            ("axle-burst-id", "0000deadbeef"),
        ],
    );
    // Someone else's instance in the same account is left alone.
    let theirs = fake.seed("gpu_1x_h100_pcie", "us-east-1", &[("team", "ml")]);
    wait("the orphan to be terminated", &env, 30, async || {
        let ids: Vec<String> = fake.instances().into_iter().map(|i| i.0).collect();
        (!ids.contains(&orphan)).then_some(())
    })
    .await;
    let reaped = wait("the reaper's event", &env, 10, async || {
        let e = env.events("burst_orphan_terminated").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert!(
        reaped[0]["message"].as_str().unwrap().contains(&orphan),
        "{reaped:?}"
    );
    let left: Vec<String> = fake.instances().into_iter().map(|i| i.0).collect();
    assert_eq!(left, vec![theirs], "only the other team's instance is left");

    // Every spend stays within the budget, checked against the provider's own list.
    let view = env.get("/api/v1/burst").await;
    let team = view_team(&view, "vision");
    assert!(micro(&team["committed_micro_usd"]) <= micro(&team["budget_micro_usd"]));
    let live: Vec<&Value> = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] != "terminated" && i["state"] != "failed")
        .collect();
    assert!(live.is_empty(), "no live bursts at the end: {view}");
    fake.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hub_killed_mid_launch_adopts_its_instance_and_a_reclaimed_instance_requeues_its_work() {
    let _serial = SERIAL.lock().await;
    killed_mid_launch(None).await
}

/// The same on etcd: the ledger is the burst records, on either store.
#[tokio::test(flavor = "multi_thread")]
async fn on_etcd_a_hub_killed_mid_launch_adopts_its_instance_and_charges_once() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let etcd = axle_e2e::ha::EtcdCluster::start(1, dir.path());
    killed_mid_launch(Some(etcd.store_url())).await
}

async fn killed_mid_launch(store: Option<String>) {
    assert!(
        bin_dir().join("axle-spoke").exists(),
        "build the workspace first"
    );
    let on = if store.is_some() { "etcd" } else { "redb" };
    let fake = FakeLambda::start(vec![h100_pcie()]).await;
    let machines = Arc::new(Mutex::new(Vec::new()));
    let boot = Arc::new(Mutex::new(true));
    let hub_tag = Arc::new(Mutex::new(String::new()));
    let mut env = start_on(&fake, store).await;
    fake.on_launch(booter(
        env.dir.path().to_path_buf(),
        boot.clone(),
        machines.clone(),
        hub_tag.clone(),
    ));
    let _machines = scopeguard(machines.clone());
    onprem_spoke(&mut env).await;
    let blocker = env.fill_onprem("sleep 300").await;

    // The provider makes the instance, and the hub dies before it hears so.
    fake.hang_launches(true);
    let long = env.submit("long", "sleep 300", true, 600).await;
    wait("the launch to reach the provider", &env, 30, async || {
        (fake.launches() == 1).then_some(())
    })
    .await;
    env.kill9_and_restart().await;
    fake.hang_launches(false);
    let w = wait(
        "the workload to run on the adopted instance",
        &env,
        60,
        async || {
            let w = env.workload(long).await;
            (w["state"] == "Running").then_some(w)
        },
    )
    .await;
    assert!(
        w["cluster"]
            .as_str()
            .unwrap()
            .starts_with("burst-lambda-us-"),
        "{w}"
    );
    assert_eq!(
        fake.launches(),
        1,
        "adopted by its tag, never launched twice"
    );
    assert_eq!(fake.instances().len(), 1);
    let view = env.get("/api/v1/burst").await;
    let live: Vec<&Value> = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "ready")
        .collect();
    assert_eq!(live.len(), 1, "one burst, one reservation: {view}");
    let reserved = micro(&live[0]["reserved_micro_usd"]);
    assert_eq!(
        micro(&view_team(&view, "vision")["committed_micro_usd"]),
        reserved,
        "charged once"
    );

    // The provider takes the instance back (a reclaim): its work is re-queued.
    let (instance, _, _, _, _) = fake.instances().remove(0);
    *boot.lock().unwrap() = false;
    fake.hang_launches(true);
    fake.take_back(&instance);
    wait(
        "the reclaimed instance's work to be re-queued",
        &env,
        30,
        async || {
            let e = env.events("requeued").await;
            e.iter().any(|e| e["workload"] == long).then_some(())
        },
    )
    .await;
    assert!(!env.events("burst_interrupted").await.is_empty());

    // It wants a burst again, and the provider now takes launches and never
    // answers. On-prem placement does not wait on it: the GPU the blocker
    // frees goes to the waiting workload at once.
    wait(
        "the second launch to hang at the provider",
        &env,
        30,
        async || (fake.launches() == 2).then_some(()),
    )
    .await;
    let t0 = Instant::now();
    env.cancel(blocker).await;
    wait(
        "the waiting workload to be placed on-prem",
        &env,
        30,
        async || {
            let w = env.workload(long).await;
            (w["cluster"] == "onprem").then_some(())
        },
    )
    .await;
    let placed_ms = t0.elapsed().as_millis();
    let t1 = Instant::now();
    let quick = env.submit("quick", "sleep 1", false, 600).await;
    let submit_ms = t1.elapsed().as_millis();
    let _ = quick;
    eprintln!(
        "FIGURES burst ({on}): adopted after kill -9 with 1 launch, charged once; with a launch hanging at the provider, cancel-to-placed on-prem {placed_ms} ms (includes the blocker's stop), submit answered in {submit_ms} ms"
    );
    fake.assert_clean();
}

/// Seen: a burst instance that booted while its hub restarted found nothing
/// listening, and its spoke exited; the instance never joined and was paid
/// for until the join timeout. A spoke that cannot reach its hub keeps
/// trying to join (a refusal still ends it at once).
#[tokio::test(flavor = "multi_thread")]
async fn a_spoke_that_finds_its_hub_down_keeps_trying_to_join() {
    let _serial = SERIAL.lock().await;
    let fake = FakeLambda::start(vec![h100_pcie()]).await;
    let mut env = start(&fake).await;
    let token = join_token(&env, "onprem").await;
    env.kill9();
    spawn_onprem_spoke(&mut env, "1xH100:80GB", &token);
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let t0 = Instant::now();
    env.restart().await;
    wait(
        "the spoke to join the restarted hub",
        &env,
        30,
        async || {
            let cs = env.get("/api/v1/clusters").await;
            cs.as_array()?
                .iter()
                .any(|c| c["name"] == "onprem" && c["state"] == "Ready")
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "FIGURES spoke join: started with its hub down for 3 s, Ready {} ms after the hub came back",
        t0.elapsed().as_millis()
    );
}
