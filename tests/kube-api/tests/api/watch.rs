//! List/watch semantics through `kube::runtime::watcher` and `reflector`:
//! the initial list, selected events, 410 after compaction, bookmarks, and
//! reconnecting after the server was away.

use std::time::Duration;

use axle_kube_testserver::{KubeTestServer, Method};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::{client, eventually, pod};

/// A short name for a watcher event, for assertions.
fn describe(e: &Result<watcher::Event<Pod>, watcher::Error>) -> String {
    match e {
        Ok(watcher::Event::Init) => "Init".into(),
        Ok(watcher::Event::InitApply(p)) => {
            format!("InitApply({})", p.metadata.name.clone().unwrap_or_default())
        }
        Ok(watcher::Event::InitDone) => "InitDone".into(),
        Ok(watcher::Event::Apply(p)) => {
            format!("Apply({})", p.metadata.name.clone().unwrap_or_default())
        }
        Ok(watcher::Event::Delete(p)) => {
            format!("Delete({})", p.metadata.name.clone().unwrap_or_default())
        }
        Err(watcher::Error::WatchError(s)) => format!("WatchError({})", s.code),
        Err(e) => format!("Err({e})"),
    }
}

/// Runs a reflector over `api` with `config` in the background; returns its
/// store and the watcher's events as short strings.
fn reflect(
    api: Api<Pod>,
    config: watcher::Config,
) -> (Store<Pod>, mpsc::UnboundedReceiver<String>) {
    let (reader, writer) = reflector::store();
    let (tx, rx) = mpsc::unbounded_channel();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            if tx.send(describe(&event)).is_err() {
                return;
            }
        }
    });
    (reader, rx)
}

/// Waits for the next event matching `want`, skipping others (returns the skipped ones).
async fn expect(rx: &mut mpsc::UnboundedReceiver<String>, want: &str) -> Vec<String> {
    let mut skipped = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(crate::support::WAIT_MS);
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) if e == want => return skipped,
            Ok(Some(e)) => skipped.push(e),
            other => panic!("waiting for {want}: got {other:?} after {skipped:?}"),
        }
    }
}

fn store_names(store: &Store<Pod>) -> Vec<String> {
    let mut names: Vec<String> = store
        .state()
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn watcher_sees_selected_changes_and_relists_after_compaction() {
    let server = KubeTestServer::start().await;
    let cluster = server.state();
    let pods: Api<Pod> = Api::namespaced(client(&server), "default");
    let pp = PostParams::default();
    pods.create(&pp, &pod("a", &[("app", "trainer")], None))
        .await
        .unwrap();
    pods.create(&pp, &pod("other", &[("app", "web")], None))
        .await
        .unwrap();

    let (store, mut rx) = reflect(
        pods.clone(),
        watcher::Config::default().labels("app=trainer"),
    );
    assert!(expect(&mut rx, "Init").await.is_empty());
    expect(&mut rx, "InitApply(a)").await;
    expect(&mut rx, "InitDone").await;
    assert_eq!(store_names(&store), ["a"]);

    pods.create(&pp, &pod("b", &[("app", "trainer")], None))
        .await
        .unwrap();
    pods.create(&pp, &pod("c", &[("app", "web")], None))
        .await
        .unwrap();
    assert!(expect(&mut rx, "Apply(b)").await.is_empty());
    cluster.set_pod_running("default", "b").unwrap();
    assert!(expect(&mut rx, "Apply(b)").await.is_empty());
    // Moving out of the selector is a DELETED event for this watch.
    pods.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    assert!(expect(&mut rx, "Delete(a)").await.is_empty());
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    assert!(expect(&mut rx, "Delete(b)").await.is_empty());
    assert!(store_names(&store).is_empty());

    // The watcher listed with limit=500 and watched from the list's RV with bookmarks.
    let requests = cluster.requests();
    let list = requests
        .iter()
        .find(|(m, p)| {
            m == Method::GET
                && p.starts_with("/api/v1/namespaces/default/pods?")
                && !p.contains("watch=")
        })
        .unwrap();
    assert!(
        list.1.contains("limit=500") && list.1.contains("labelSelector=app%3Dtrainer"),
        "{}",
        list.1
    );
    let watch = requests
        .iter()
        .find(|(_, p)| p.contains("watch=true"))
        .unwrap();
    for part in [
        "timeoutSeconds=290",
        "allowWatchBookmarks=true",
        "resourceVersion=",
    ] {
        assert!(watch.1.contains(part), "{}", watch.1);
    }

    // Compaction expires the open watch (410): the watcher relists and the
    // store converges on what exists now.
    pods.create(&pp, &pod("d", &[("app", "trainer")], None))
        .await
        .unwrap();
    expect(&mut rx, "Apply(d)").await;
    cluster.compact();
    expect(&mut rx, "WatchError(410)").await;
    expect(&mut rx, "Init").await;
    expect(&mut rx, "InitApply(d)").await;
    expect(&mut rx, "InitDone").await;
    pods.create(&pp, &pod("e", &[("app", "trainer")], None))
        .await
        .unwrap();
    expect(&mut rx, "Apply(e)").await;
    assert_eq!(store_names(&store), ["d", "e"]);
}

#[tokio::test]
async fn raw_watch_gets_bookmarks_timeouts_and_410() {
    let server = KubeTestServer::start().await;
    let cluster = server.state();
    let pods: Api<Pod> = Api::namespaced(client(&server), "default");
    pods.create(&PostParams::default(), &pod("x", &[], None))
        .await
        .unwrap();
    let old_rv = cluster.resource_version().to_string();

    // RV "0": the current objects as ADDED, then bookmarks while idle.
    let mut stream = pods
        .watch(&WatchParams::default().timeout(3), "0")
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(p)) => assert_eq!(p.metadata.name.as_deref(), Some("x")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    match tokio::time::timeout(Duration::from_secs(3), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Bookmark(b)) => assert_eq!(b.metadata.resource_version, old_rv),
        other => panic!("expected BOOKMARK, got {other:?}"),
    }
    // timeoutSeconds=1 ends the stream.
    let short = pods
        .watch(
            &WatchParams::default().timeout(1).disable_bookmarks(),
            &old_rv,
        )
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let events: Vec<_> = short.collect().await;
    assert!(events.is_empty(), "{events:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));

    // After compaction a watch from an older RV gets a 410 ERROR event.
    pods.create(&PostParams::default(), &pod("y", &[], None))
        .await
        .unwrap();
    cluster.compact();
    let mut expired = pods
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match expired.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    assert!(expired.try_next().await.unwrap().is_none());
    // The current RV still works.
    let now_rv = cluster.resource_version().to_string();
    let mut live = pods
        .watch(&WatchParams::default(), &now_rv)
        .await
        .unwrap()
        .boxed();
    pods.create(&PostParams::default(), &pod("z", &[], None))
        .await
        .unwrap();
    match live.try_next().await.unwrap() {
        Some(WatchEvent::Added(p)) => assert_eq!(p.metadata.name.as_deref(), Some("z")),
        other => panic!("expected ADDED, got {other:?}"),
    }
}

#[tokio::test]
async fn watcher_reconnects_after_the_server_was_away() {
    let server = KubeTestServer::start().await;
    let (cluster, addr) = (server.state(), server.addr());
    let pods: Api<Pod> = Api::namespaced(client(&server), "default");
    pods.create(&PostParams::default(), &pod("a", &[], None))
        .await
        .unwrap();
    let (store, mut rx) = reflect(pods.clone(), watcher::Config::default());
    expect(&mut rx, "InitDone").await;

    server.stop().await;
    // While the API server is away the kubelet keeps reporting.
    cluster.set_pod_running("default", "a").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let server = KubeTestServer::start_with(cluster.clone(), addr).await;
    assert_eq!(server.addr(), addr);

    eventually("the reflector to see pod a Running", || {
        let store = store.clone();
        async move {
            let running = store
                .state()
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
            running.then_some(())
        }
    })
    .await;
    pods.create(&PostParams::default(), &pod("b", &[], None))
        .await
        .unwrap();
    eventually("the reflector to see pod b", || {
        let store = store.clone();
        async move { (store_names(&store) == ["a", "b"]).then_some(()) }
    })
    .await;
    // It resumed from the resourceVersion it had (the history survived the
    // restart), with no second list.
    let requests = cluster.requests();
    let lists = requests
        .iter()
        .filter(|(m, p)| m == Method::GET && !p.contains("watch="))
        .count();
    let watches: Vec<&String> = requests
        .iter()
        .filter(|(_, p)| p.contains("watch=true"))
        .map(|(_, p)| p)
        .collect();
    assert_eq!(lists, 1, "{requests:?}");
    assert!(
        watches.len() >= 2 && watches.iter().all(|w| *w == watches[0]),
        "{watches:?}"
    );
}

#[tokio::test]
async fn streaming_list_watcher_and_node_changes() {
    use k8s_openapi::api::core::v1::Node;

    let server = KubeTestServer::start().await;
    let cluster = server.state();
    let client = client(&server);
    cluster
        .add_node(Node {
            metadata: crate::support::meta("gpu-1"),
            ..Default::default()
        })
        .unwrap();

    // sendInitialEvents=true: the initial state comes on the watch itself,
    // ended by the initial-events-end bookmark.
    let nodes: Api<Node> = Api::all(client.clone());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = watcher(nodes, watcher::Config::default().streaming_lists()).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let text = match event {
                Ok(watcher::Event::InitApply(n)) => {
                    format!("InitApply({})", n.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::Apply(n)) => format!(
                    "Apply({},{})",
                    n.metadata.name.unwrap_or_default(),
                    n.spec.and_then(|s| s.unschedulable).unwrap_or(false)
                ),
                Ok(watcher::Event::Delete(n)) => {
                    format!("Delete({})", n.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::Init) => "Init".into(),
                Ok(watcher::Event::InitDone) => "InitDone".into(),
                Err(e) => format!("Err({e})"),
            };
            if tx.send(text).is_err() {
                return;
            }
        }
    });
    assert!(expect(&mut rx, "Init").await.is_empty());
    assert!(expect(&mut rx, "InitApply(gpu-1)").await.is_empty());
    assert!(expect(&mut rx, "InitDone").await.is_empty());
    let requests = cluster.requests();
    let watch = requests
        .iter()
        .find(|(_, p)| p.contains("watch=true"))
        .unwrap();
    assert!(
        watch.1.contains("sendInitialEvents=true")
            && watch.1.contains("resourceVersionMatch=NotOlderThan"),
        "{}",
        watch.1
    );

    // Cordon and delete, as an admin would.
    cluster
        .update_node("gpu-1", |n| {
            n.spec.get_or_insert_default().unschedulable = Some(true)
        })
        .unwrap();
    assert!(expect(&mut rx, "Apply(gpu-1,true)").await.is_empty());
    cluster.delete_node("gpu-1").unwrap();
    assert!(expect(&mut rx, "Delete(gpu-1)").await.is_empty());
}
