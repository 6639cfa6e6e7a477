//! Crash safety with the real binary: clients register, update and delete routes while the
//! process is killed with SIGKILL at a random moment, round after round. After each restart every
//! acknowledged change must be there, and nothing half-written may be visible: each listed route
//! is readable, serves calls, and shows one of the versions its client sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use serde_json::Value;

use crate::binary::Binary;
use crate::support::{Upstream, send, try_send};

const MEALS: &str = r#"{"meals":[{"idMeal":"7","strMeal":"Soup"}]}"#;
const ROUNDS: usize = 50;
const CLIENTS: usize = 3;

/// A small deterministic generator (xorshift), seeded per run and printed on failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a route can be after a change: present with a version, or gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Version(u64),
    Gone,
}

/// One route's changes, in order; all acknowledged but perhaps the last.
#[derive(Debug, Default)]
struct History {
    /// The state after the last acknowledged change.
    acknowledged: Option<Outcome>,
    /// `acknowledged` came from an answer in the round just ended, not from an earlier check: a
    /// state the service acknowledged that no restart has checked yet.
    fresh: bool,
    /// A change that was sent but not answered when the process died.
    pending: Option<Outcome>,
}

impl History {
    fn allowed(&self) -> Vec<Outcome> {
        self.acknowledged.into_iter().chain(self.pending).collect()
    }
}

fn body(base: &str, version: u64) -> String {
    format!(
        r#"{{"path":"meal","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"meal","queries":{{"v":"{version}"}},"authHeader":{{"type":"Bearer","token":"t{version}"}}}},"rulesAsString":{{"newBodyFields":{{"name":{{"key":"name","type":"String"}}}},"oldBodyFields":{{"name":{{"keys":["strMeal"],"parents":["meals"]}}}}}}}}"#
    )
}

fn version_of(view: &Value) -> Option<u64> {
    view["originalRoute"]["queries"]["v"].as_str()?.parse().ok()
}

/// Every stored route as the listing shows it, page by page.
async fn listing(binary: &Binary) -> Vec<Value> {
    let mut routes = Vec::new();
    let mut cursor = String::new();
    loop {
        let answer = send(Method::GET, &binary.url(&format!("/v1/routes?limit=50{cursor}")), &[], "").await;
        assert_eq!(answer.status, 200);
        let page: Value = serde_json::from_slice(&answer.body).unwrap();
        routes.extend(page["routes"].as_array().unwrap().iter().cloned());
        match page["nextCursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return routes,
        }
    }
}

/// One client's work until the process dies: changes to its own routes, one at a time.
async fn client(
    url: String,
    base: String,
    routes: Arc<Mutex<HashMap<String, History>>>,
    mine: Arc<Mutex<Vec<String>>>,
    unanswered_registrations: Arc<Mutex<Vec<u64>>>,
    mut rng: Rng,
    versions: Arc<std::sync::atomic::AtomicU64>,
) {
    loop {
        let version = versions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let target = {
            let mine = mine.lock().unwrap();
            (!mine.is_empty() && rng.below(10) < 6)
                .then(|| mine[rng.below(mine.len() as u64) as usize].clone())
        };
        match target {
            None => {
                unanswered_registrations.lock().unwrap().push(version);
                let answer =
                    try_send(Method::POST, &format!("{url}/v1/mapping"), &[], body(&base, version)).await;
                // No answer: the process died; this registration may or may not have landed.
                let Some(answer) = answer else { return };
                assert_eq!(answer.status, 201, "{:?}", answer.body);
                unanswered_registrations.lock().unwrap().retain(|v| *v != version);
                let uuid = answer.json().get("uuid").and_then(|u| u.as_str()).unwrap().to_owned();
                routes.lock().unwrap().insert(
                    uuid.clone(),
                    History { acknowledged: Some(Outcome::Version(version)), fresh: true, pending: None },
                );
                mine.lock().unwrap().push(uuid);
            }
            Some(uuid) => {
                let delete = rng.below(2) == 0;
                let change = if delete { Outcome::Gone } else { Outcome::Version(version) };
                routes.lock().unwrap().get_mut(&uuid).unwrap().pending = Some(change);
                let at = format!("{url}/v1/routes/{uuid}");
                let answer = if delete {
                    try_send(Method::DELETE, &at, &[], "").await
                } else {
                    try_send(Method::PUT, &at, &[], body(&base, version)).await
                };
                // No answer: the change stays pending.
                let Some(answer) = answer else { return };
                assert_eq!(answer.status, if delete { 204 } else { 200 }, "{:?}", answer.body);
                let mut routes = routes.lock().unwrap();
                let history = routes.get_mut(&uuid).unwrap();
                history.acknowledged = Some(change);
                history.fresh = true;
                history.pending = None;
                if delete {
                    mine.lock().unwrap().retain(|u| *u != uuid);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_changes_survive_sigkill_at_random_moments() {
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    let mut rng = Rng(seed);
    let upstream = Upstream::json(MEALS).await;
    let base = upstream.url("/");
    let dir = tempfile::TempDir::new().unwrap();
    let routes: Arc<Mutex<HashMap<String, History>>> = Arc::default();
    let owned: Vec<Arc<Mutex<Vec<String>>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let versions = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let unanswered_registrations: Arc<Mutex<Vec<u64>>> = Arc::default();
    let (mut acknowledged, mut pending_landed, mut pending_lost, mut adopted) = (0, 0, 0, 0);

    // One start more than kills: the last start only checks what the last kill left.
    for round in 0..=ROUNDS {
        let context = format!("seed {seed}, round {round}");
        let binary = Binary::start(dir.path()).await;
        let url = format!("http://{}", binary.addr);

        // Check the state the previous round left.
        let listed = listing(&binary).await;
        let mut seen: HashMap<String, u64> = HashMap::new();
        for view in &listed {
            let uuid = view["uuid"].as_str().unwrap().to_owned();
            assert_eq!(view["status"], "ok", "{context}: a listed route is not whole: {view}");
            let version = version_of(view).unwrap_or_else(|| panic!("{context}: no version in {view}"));
            let shown = send(Method::GET, &format!("{url}/v1/routes/{uuid}"), &[], "").await;
            assert_eq!(shown.status, 200, "{context}: listed but not readable");
            let call = send(Method::GET, &format!("{url}{}", view["path"].as_str().unwrap()), &[], "").await;
            assert_eq!(&call.body[..], br#"{"name":"Soup"}"#, "{context}: a stored route does not serve");
            seen.insert(uuid, version);
        }
        let unanswered = std::mem::take(&mut *unanswered_registrations.lock().unwrap());
        {
            let mut routes = routes.lock().unwrap();
            for (uuid, history) in routes.iter_mut() {
                let now = seen.get(uuid).map_or(Outcome::Gone, |v| Outcome::Version(*v));
                assert!(
                    history.allowed().contains(&now),
                    "{context}: route {uuid} is {now:?}, but its history allows only {:?}",
                    history.allowed()
                );
                // Each acknowledged state counts once, at the first restart after its answer; a
                // route that merely survives another round is not counted again.
                acknowledged += usize::from(history.fresh);
                if let Some(pending) = history.pending {
                    if pending == now { pending_landed += 1 } else { pending_lost += 1 }
                }
                *history = History { acknowledged: Some(now), fresh: false, pending: None };
            }
            for (uuid, version) in &seen {
                if !routes.contains_key(uuid) {
                    // A registration that landed but was not answered: it must be one that was sent.
                    assert!(
                        unanswered.contains(version),
                        "{context}: unknown route {uuid} (version {version})"
                    );
                    routes.insert(
                        uuid.clone(),
                        History {
                            acknowledged: Some(Outcome::Version(*version)),
                            fresh: false,
                            pending: None,
                        },
                    );
                    adopted += 1;
                    owned[rng.below(CLIENTS as u64) as usize].lock().unwrap().push(uuid.clone());
                }
            }
            routes.retain(|_, h| h.acknowledged != Some(Outcome::Gone));
            for mine in &owned {
                mine.lock().unwrap().retain(|uuid| routes.contains_key(uuid));
            }
        }

        if round == ROUNDS {
            break;
        }
        // Change things, and kill the process at a random moment.
        let clients: Vec<_> = owned
            .iter()
            .map(|mine| {
                tokio::spawn(client(
                    url.clone(),
                    base.clone(),
                    routes.clone(),
                    mine.clone(),
                    unanswered_registrations.clone(),
                    Rng(rng.next() | 1),
                    versions.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20 + rng.below(200))).await;
        binary.kill();
        for client in clients {
            tokio::time::timeout(Duration::from_secs(10), client).await.expect("clients stop").unwrap();
        }
    }
    eprintln!(
        "{ROUNDS} SIGKILLs: {acknowledged} distinct acknowledged states checked; unanswered changes: \
         {pending_landed} landed, {pending_lost} did not; {adopted} unanswered registrations landed (seed {seed})"
    );
    // Registrations, updates and deletions answered before a kill, each checked after the restart
    // that followed it: on average at least one a round, or the kills came too early to test much.
    assert!(acknowledged >= ROUNDS, "only {acknowledged} acknowledged changes were checked (seed {seed})");
}
