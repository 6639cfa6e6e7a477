//! The key ring with the real binary: a rotation under load (every call answers 200 while the
//! stored routes are re-sealed, and the old key can then go), a crash in the middle of a re-seal
//! (every route opens after the restart with the ring, and a route sealed by a key the ring
//! lacks answers 503 alone, named in the log), and the settings that stop the start.
//!
//! `ROTATION_ROUTES` sets how many routes the rotation run re-seals (60 by default), and
//! `ROTATION_BATCH` how many a step takes (16); the run prints what it measured.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::Value;
use uuid::Uuid;

use crate::binary::Binary;
use crate::support::{Reply, Upstream, get, send};

const MEALS: &str = r#"{"meals":[{"idMeal":"7","strMeal":"Soup"}]}"#;
const RULES: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]}}}"#;

/// A route whose upstream wants `Bearer <token>`.
fn registration(base: &str, token: &str) -> String {
    format!(
        r#"{{"path":"meal","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"meal"}},"authHeader":{{"type":"Bearer","token":"{token}"}},"rulesAsString":{RULES}}}"#
    )
}

/// An upstream that answers 200 only to `Bearer t<n>` (any n), so a route served with the wrong
/// credentials shows.
async fn upstream() -> Upstream {
    Upstream::start(|request| {
        let auth = request.headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        if auth.starts_with("Bearer t") { Reply::json(MEALS) } else { Reply::with(401, "{}") }
    })
    .await
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body).expect("a JSON answer")
}

/// `GET /v1/keys`: each key's id and record count, in the answer's order.
async fn key_counts(binary: &Binary) -> (String, Vec<(String, u64, bool)>) {
    let answer = get(&binary.url("/v1/keys")).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let keys = json(&answer.body);
    let listed = keys["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["id"].as_str().unwrap().to_owned(),
                k["records"].as_u64().unwrap(),
                k["inRing"].as_bool().unwrap(),
            )
        })
        .collect();
    (keys["sealing"].as_str().unwrap().to_owned(), listed)
}

/// A key's id, as the service computes it: the first 8 hex digits of its SHA-256.
fn id(key: &str) -> String {
    let bytes: Vec<u8> = (0..32).map(|i| u8::from_str_radix(&key[2 * i..2 * i + 2], 16).unwrap()).collect();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect()
}

fn new_key() -> String {
    recast::secrets::new_key_hex().unwrap()
}

#[tokio::test]
async fn a_rotation_under_load_answers_every_call_and_the_old_key_can_then_go() {
    // The run's own knobs, not settings of the service.
    #[allow(clippy::disallowed_methods)]
    let knob =
        |name: &str, default: usize| std::env::var(name).ok().and_then(|n| n.parse().ok()).unwrap_or(default);
    let (routes, batch) = (knob("ROTATION_ROUTES", 60), knob("ROTATION_BATCH", 16));
    let upstream = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (new_key(), new_key());

    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &old)]).await;
    let mut paths = Vec::new();
    for i in 0..routes {
        let answer = send(
            Method::POST,
            &binary.url("/v1/mapping"),
            &[],
            registration(&upstream.url("/"), &format!("t{i}")),
        )
        .await;
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        paths.push(json(&answer.body)["path"].as_str().unwrap().to_owned());
    }
    let mut binary = binary;
    binary.terminate();

    // The new key first, the old one kept: everything still serves, sealed by the old key.
    let binary =
        Arc::new(Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &format!("{new},{old}"))]).await);
    let (sealing, listed) = key_counts(&binary).await;
    assert_eq!(sealing, id(&new));
    assert_eq!(listed, vec![(id(&new), 0, true), (id(&old), routes as u64, true)]);

    // Calls on every route, two at a time, until the re-seal is done.
    let done = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load: Vec<_> = (0..2)
        .map(|lane| {
            let (binary, paths, done) = (binary.clone(), paths.clone(), done.clone());
            let (answered, failed) = (answered.clone(), failed.clone());
            tokio::spawn(async move {
                let mut i = lane;
                // Bounded: the re-seal ends it, and so does a minute.
                let deadline = Instant::now() + Duration::from_secs(60);
                while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                    let answer = get(&binary.url(&paths[i % paths.len()])).await;
                    answered.fetch_add(1, Ordering::SeqCst);
                    if answer.status != 200 {
                        failed.fetch_add(1, Ordering::SeqCst);
                        eprintln!("{} answered {}: {:?}", paths[i % paths.len()], answer.status, answer.body);
                    }
                    i += 2;
                }
            })
        })
        .collect();
    // Let the calls start first.
    while answered.load(Ordering::SeqCst) < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = answered.load(Ordering::SeqCst);
    let started = Instant::now();
    let resealed = send(Method::POST, &binary.url(&format!("/v1/keys/reseal?batch={batch}")), &[], "").await;
    let took = started.elapsed();
    let during = answered.load(Ordering::SeqCst) - before;
    done.store(true, Ordering::SeqCst);
    for lane in load {
        lane.await.unwrap();
    }
    assert_eq!(resealed.status, 200, "{:?}", resealed.body);
    let report = json(&resealed.body);
    assert_eq!(report["resealed"], routes as u64, "{report}");
    assert_eq!(report["scanned"], routes as u64, "{report}");
    assert_eq!(report["missing"], serde_json::json!([]));
    assert_eq!(failed.load(Ordering::SeqCst), 0, "calls that did not answer 200 during the re-seal");
    assert!(during > 0, "calls were answered while the routes were re-sealed");
    eprintln!(
        "rotation: {routes} routes re-sealed in {:.3} s ({:.0} routes/s, batches of {batch}); {during} calls answered meanwhile, all 200",
        took.as_secs_f64(),
        routes as f64 / took.as_secs_f64()
    );
    assert_eq!(key_counts(&binary).await.1, vec![(id(&new), routes as u64, true), (id(&old), 0, true)]);
    assert!(binary.wait_for_line("stored routes re-sealed").is_some());
    let mut binary = Arc::into_inner(binary).expect("the load is over");
    binary.terminate();

    // The old key gone: every route opens and calls its upstream with its own credentials.
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &new)]).await;
    let sent = upstream.received().len();
    for (i, path) in paths.iter().enumerate() {
        assert_eq!(get(&binary.url(path)).await.status, 200, "{path}");
        let received = upstream.received();
        let auth = received[sent + i].headers.get("authorization").unwrap();
        assert_eq!(auth, &format!("Bearer t{i}"), "route {i} calls with its own token");
    }
    assert_eq!(key_counts(&binary).await.1, vec![(id(&new), routes as u64, true)]);
    drop(binary);

    // And the old key alone no longer opens the store.
    let mut refused = Binary::spawn_with(dir.path(), &[("RECAST_SECRET_KEYS", &old)]);
    assert!(refused.exit_status().is_some_and(|status| !status.success()), "{}", refused.log_text());
    assert!(refused.log_text().contains("is not the one"), "{}", refused.log_text());
}

#[tokio::test]
async fn a_crash_midway_through_a_reseal_leaves_every_route_openable_with_the_ring() {
    const ROUTES: usize = 1500;
    let upstream = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (new_key(), new_key());

    // One route registered by the service, then copies of its record under other uuids, written
    // into the store directly (registering each would make a live call).
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &old)]).await;
    let answer =
        send(Method::POST, &binary.url("/v1/mapping"), &[], registration(&upstream.url("/"), "t0")).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    let first = json(&answer.body)["uuid"].as_str().unwrap().parse::<Uuid>().unwrap();
    let mut binary = binary;
    binary.terminate();
    let mut uuids = vec![first];
    {
        let store =
            recast::storage::Store::open(dir.path(), Some(&recast::secrets::Secret::new(&old))).unwrap();
        let stored = store.get(first).unwrap().unwrap();
        for _ in 1..ROUTES {
            let uuid = Uuid::new_v4();
            store.put(&recast::storage::StoredRoute { uuid, ..stored.clone() }).unwrap();
            uuids.push(uuid);
        }
    }

    // A re-seal one record at a time, killed once some records are re-sealed and some not.
    let ring = format!("{new},{old}");
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &ring)]).await;
    let url = binary.url("/v1/keys/reseal?batch=1");
    let reseal = tokio::spawn(async move { crate::support::try_send(Method::POST, &url, &[], "").await });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, listed) = key_counts(&binary).await;
        if listed[0].1 > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no record re-sealed within a minute");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    binary.kill();
    let _ = reseal.await;

    // The ring opens everything: both keys seal some records.
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &ring)]).await;
    let (_, listed) = key_counts(&binary).await;
    let (by_new, by_old) = (listed[0].1, listed[1].1);
    assert_eq!(by_new + by_old, ROUTES as u64, "{listed:?}");
    assert!(by_new > 0 && by_old > 0, "killed before the re-seal ended: {listed:?}");
    assert!(binary.log_text().contains(&format!("loaded={ROUTES}")), "{}", binary.log_text());
    for uuid in uuids.iter().step_by(97) {
        assert_eq!(get(&binary.url(&format!("/v1/{uuid}/meal"))).await.status, 200, "{uuid}");
    }
    let mut binary = binary;
    binary.terminate();

    // Without the old key, the routes it still seals answer 503 and are named in the log; the
    // others serve.
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &new)]).await;
    let (_, listed) = key_counts(&binary).await;
    assert_eq!(listed, vec![(id(&new), by_new, true), (id(&old), by_old, false)]);
    let (mut served, mut locked) = (0, 0);
    for uuid in &uuids {
        let answer = get(&binary.url(&format!("/v1/{uuid}/meal"))).await;
        match answer.status.as_u16() {
            200 => served += 1,
            503 => {
                let problem = answer.assert_problem(503, "route-unavailable");
                let detail = problem.get("detail").and_then(|d| d.as_str()).unwrap_or("").to_owned();
                assert!(detail.contains(&id(&old)), "{detail}");
                if locked == 0 {
                    let line =
                        binary.wait_for_line(&uuid.to_string()).expect("the route is named in the log");
                    assert!(line.contains(&id(&old)), "{line}");
                    // Under any path, and shown as broken by the API.
                    get(&binary.url(&format!("/v1/{uuid}/elsewhere")))
                        .await
                        .assert_problem(503, "route-unavailable");
                    let shown = json(&get(&binary.url(&format!("/v1/routes/{uuid}"))).await.body);
                    assert_eq!(shown["status"], "locked", "{shown}");
                }
                locked += 1;
            }
            status => panic!("{uuid} answered {status}"),
        }
    }
    assert_eq!((served, locked), (by_new, by_old));
    // A re-seal cannot open them either: it says which, and leaves them.
    let report = json(&send(Method::POST, &binary.url("/v1/keys/reseal"), &[], "").await.body);
    assert_eq!(report["resealed"], 0, "{report}");
    assert_eq!(report["missing"].as_array().map(Vec::len), Some(by_old as usize));
    let mut binary = binary;
    binary.terminate();

    // The old key back: the re-seal finishes, and then the new key alone serves everything.
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &ring)]).await;
    let report = json(&send(Method::POST, &binary.url("/v1/keys/reseal"), &[], "").await.body);
    assert_eq!(report["resealed"], by_old, "{report}");
    let mut binary = binary;
    binary.terminate();
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &new)]).await;
    assert_eq!(key_counts(&binary).await.1, vec![(id(&new), ROUTES as u64, true)]);
    for uuid in uuids.iter().step_by(53) {
        assert_eq!(get(&binary.url(&format!("/v1/{uuid}/meal"))).await.status, 200, "{uuid}");
    }
}

/// A route sealed by a key the ring lacks is shown as locked (no configuration, no path) and
/// takes `DELETE` only: an update, as the documented GET → PUT round trip sends it (without
/// `path`), is refused and changes nothing, so the route serves again when the key comes back.
#[tokio::test]
async fn a_locked_route_takes_delete_only_and_serves_again_with_its_key() {
    let upstream = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (new_key(), new_key());
    let register = |binary: &Binary, token: &str| {
        let (url, body) = (binary.url("/v1/mapping"), registration(&upstream.url("/"), token));
        async move {
            let answer = send(Method::POST, &url, &[], body).await;
            assert_eq!(answer.status, 201, "{:?}", answer.body);
            json(&answer.body)["uuid"].as_str().unwrap().to_owned()
        }
    };
    let mut binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &old)]).await;
    let locked = register(&binary, "t1").await;
    let deleted = register(&binary, "t2").await;
    binary.terminate();
    // The new key seals from now on; then the old one goes before a re-seal took the first two
    // (as a re-seal cut short leaves them): the store's key check sealed by the new key.
    let ring = format!("{new},{old}");
    let mut binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &ring)]).await;
    let open = register(&binary, "t3").await;
    binary.terminate();
    recast::storage::Store::open(dir.path(), Some(&recast::secrets::Secret::new(&ring)))
        .unwrap()
        .adopt_key_check()
        .unwrap();
    let mut binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &new)]).await;

    let manage = binary.url(&format!("/v1/routes/{locked}"));
    let shown = get(&manage).await;
    assert_eq!(shown.status, 200);
    let view = json(&shown.body);
    assert_eq!(view["status"], "locked", "{view}");
    assert!(view.get("path").is_none() && view.get("rulesAsString").is_none(), "{view}");
    assert!(view["problem"].as_str().unwrap().contains(&id(&old)), "{view}");
    let tag = shown.header("etag").expect("an ETag").to_owned();
    // The GET → PUT round trip of a route, without `path`; with `If-Match` or without.
    let body = registration(&upstream.url("/"), "t9").replace(r#""path":"meal","#, "");
    for headers in [vec![], vec![("if-match", tag.as_str())]] {
        let refused = send(Method::PUT, &manage, &headers, body.clone()).await;
        let problem = refused.assert_problem(409, "conflict");
        assert!(problem["detail"].as_str().unwrap().contains("DELETE only"), "{problem}");
    }
    let tried = send(Method::POST, &format!("{manage}/try"), &[], "").await;
    tried.assert_problem(409, "conflict");
    send(Method::DELETE, &format!("{manage}/cache"), &[], "").await.assert_problem(409, "conflict");
    assert_eq!(get(&binary.url(&format!("/v1/{locked}/"))).await.status, 503, "no route at an empty path");
    // The listing shows it as it is.
    let listed = json(&get(&binary.url("/v1/routes")).await.body);
    let row = listed["routes"].as_array().unwrap().iter().find(|r| r["uuid"] == locked.as_str()).cloned();
    assert_eq!(row.unwrap()["status"], "locked", "{listed}");
    // DELETE works on a locked route (with its version, too).
    let gone = binary.url(&format!("/v1/routes/{deleted}"));
    let version = get(&gone).await.header("etag").unwrap().to_owned();
    assert_eq!(send(Method::DELETE, &gone, &[("if-match", &version)], "").await.status, 204);
    assert_eq!(get(&binary.url(&format!("/v1/{open}/meal"))).await.status, 200);
    binary.terminate();

    // The old key back: the locked route serves at its path, with its own credentials.
    let binary = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEYS", &format!("{new},{old}"))]).await;
    let sent = upstream.received().len();
    assert_eq!(get(&binary.url(&format!("/v1/{locked}/meal"))).await.status, 200);
    assert_eq!(upstream.received()[sent].headers["authorization"], "Bearer t1");
    assert_eq!(get(&binary.url(&format!("/v1/routes/{deleted}"))).await.status, 404);
}

#[tokio::test]
async fn key_settings_that_cannot_work_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key();
    for (env, says) in [
        (vec![("RECAST_SECRET_KEYS", key.clone()), ("RECAST_SECRET_KEY", key.clone())], "both set"),
        (vec![("RECAST_SECRET_KEYS", format!("{key},{key}"))], "listed twice"),
        (vec![("RECAST_SECRET_KEYS", format!("{key},abc"))], "key 2 of RECAST_SECRET_KEYS"),
        (vec![("RECAST_SECRET_KEYS", " , ".to_owned())], "key 1 of RECAST_SECRET_KEYS"),
    ] {
        let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
        let mut binary = Binary::spawn_with(dir.path(), &env);
        assert!(
            binary.exit_status().is_some_and(|status| !status.success()),
            "{env:?}: {}",
            binary.log_text()
        );
        assert!(binary.log_text().contains(says), "{says}: {}", binary.log_text());
        assert!(!binary.log_text().contains(&key), "the key is never logged");
    }
}
