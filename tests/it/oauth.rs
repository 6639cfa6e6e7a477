//! OAuth2 client credentials (`"type": "OAuth2ClientCredentials"`, `docs/upstreams.md`) against a
//! real authorization server on 127.0.0.1 that nobody here wrote (oidc-provider on Node.js, from
//! `tests/oauth/server.mjs`) and a resource server that accepts a call only when that server's
//! introspection says its token is active. Both count what they receive, and every test checks
//! their counts: a token fetched or a call sent that should not have been is a failure.
//!
//! The requests recast makes to a token endpoint, and its answers to malformed token answers, are
//! checked against a plain upstream on 127.0.0.1 (no Node.js needed).

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::Value;
use tokio::task::JoinSet;

use crate::process::{Group, Kept};
use crate::routes::{MEALS, RULES, register};
use crate::support::{Json, Reply, Service, Upstream, config, error_locations, free_port, get, send};

/// The file `scripts/test.sh` (`ensure_oauth_server`) writes in the target directory's `tmp` once
/// it has installed Node.js and oidc-provider.
const OAUTH_MARKER: &str = "oauth-test-required";

/// The rules of the routes to the resource server: who the token was issued to, and its scope.
const WHO: &str = r#"{"newBodyFields":{"client":{"key":"client","type":"String"},"scope":{"key":"scope","type":"String"}},"oldBodyFields":{"client":{"keys":["client"]},"scope":{"keys":["scope"]}}}"#;

/// `tests/oauth`, when its parts are installed; else `None`, after saying the test did not run
/// (and failing when `scripts/test.sh` installed them, which means they must be there).
pub(crate) fn oauth_parts() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("oauth");
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    let why = if !node {
        "node is missing (Node.js 20 or newer)"
    } else if !dir.join("node_modules").join("oidc-provider").is_dir() {
        "oidc-provider is not installed (npm ci --prefix tests/oauth)"
    } else {
        return Some(dir);
    };
    let marker = Path::new(env!("CARGO_TARGET_TMPDIR")).join(OAUTH_MARKER);
    assert!(
        !marker.exists(),
        "{why}, but scripts/test.sh installed the OAuth2 tests' parts ({} says so): run it again",
        marker.display()
    );
    eprintln!("NOT RUN: an OAuth2 test did not run, because {why}; ./scripts/test.sh installs what it needs");
    None
}

/// One of the Node.js servers, stopped (its whole process group) when dropped.
pub(crate) struct Node {
    port: u16,
    _group: Group,
}

impl Node {
    async fn start(dir: &Path, args: Vec<String>) -> Node {
        Node::run(dir, "server.mjs", args).await
    }

    /// Runs `node SCRIPT ARGS...` in `dir`, which prints `{"port": N}` once it listens.
    pub(crate) async fn run(dir: &Path, script: &'static str, args: Vec<String>) -> Node {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut command = Command::new("node");
            command.current_dir(&dir).arg(script).args(&args).stdout(Stdio::piped());
            let mut group = Group::spawn_logged(&mut command, "the token endpoint (node)", Kept::Stderr)
                .expect("node runs");
            let stdout = group.child().stdout.take().expect("piped stdout");
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).expect("node's first line");
            let listening: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!("`node {script} {}` did not start ({e}): {line:?}", args.join(" "))
            });
            let port = listening["port"].as_u64().expect("a port") as u16;
            Node { port, _group: group }
        })
        .await
        .unwrap()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) async fn counts(&self) -> Value {
        serde_json::from_slice(&get(&self.url("/test/counts")).await.body).expect("counts as JSON")
    }

    pub(crate) async fn count(&self, name: &str) -> u64 {
        self.counts().await[name].as_u64().unwrap_or_else(|| panic!("no count `{name}`"))
    }

    async fn post(&self, path: &str) {
        let answer = send(Method::POST, &self.url(path), &[], "").await;
        assert_eq!(answer.status, 200, "POST {path}");
    }
}

/// The authorization server (tokens living `ttl` seconds) and the resource server.
struct Servers {
    dir: PathBuf,
    authorization: Node,
    resource: Node,
}

impl Servers {
    async fn start(ttl: u64) -> Option<Servers> {
        let dir = oauth_parts()?;
        let authorization = Servers::authorization_on(&dir, free_port(), ttl).await;
        let introspection = authorization.url("/token/introspection");
        let resource = Node::start(&dir, vec!["resource".into(), "0".into(), introspection]).await;
        Some(Servers { dir, authorization, resource })
    }

    async fn authorization_on(dir: &Path, port: u16, ttl: u64) -> Node {
        Node::start(dir, vec!["authorization".into(), port.to_string(), ttl.to_string()]).await
    }

    /// A registration of a route to the resource server with client credentials.
    fn registration(&self, path: &str, client: &str, secret: &str, extra: &str) -> String {
        registration_to(
            &self.resource.url("/"),
            &self.authorization.url("/token"),
            path,
            client,
            secret,
            extra,
        )
    }
}

fn registration_to(
    base: &str,
    token_url: &str,
    path: &str,
    client: &str,
    secret: &str,
    extra: &str,
) -> String {
    format!(
        r#"{{"path":"{path}","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"api/data"}},"authHeader":{{"type":"OAuth2ClientCredentials","tokenUrl":"{token_url}","clientId":"{client}","clientSecret":"{secret}"{extra}}},"rulesAsString":{WHO}}}"#
    )
}

async fn registered_path(service: &Service, body: &str) -> String {
    let answer = register(service, body, &[]).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    answer.json().get("path").and_then(Json::as_str).unwrap().to_owned()
}

/// Calls `path` and checks it answered 200 with the token's client and scope.
async fn call_ok(service: &Service, path: &str, client: &str) {
    let answer = get(&service.url(path)).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json().get("client").and_then(Json::as_str), Some(client));
}

/// Calls `path` `n` times at once; every call must answer 200.
async fn all_ok(service: &Service, path: &str, n: usize) {
    let mut calls = JoinSet::new();
    for _ in 0..n {
        let url = service.url(path);
        calls.spawn(async move { get(&url).await.status });
    }
    while let Some(status) = calls.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
}

/// The value of `recast_upstream_token_fetches_total` for `reason` and `outcome` (summed over
/// origins).
async fn fetches(service: &Service, reason: &str, outcome: &str) -> u64 {
    let text = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    let labels = format!("reason=\"{reason}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .filter(|l| l.starts_with("recast_upstream_token_fetches_total{") && l.contains(&labels))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[tokio::test]
async fn routes_call_with_a_token_fetched_once_per_credential_set_and_never_shown() {
    let Some(servers) = Servers::start(300).await else { return };
    let dir = tempfile::TempDir::new().unwrap();
    let service = Service::start_in(config(), dir.path()).await;
    let scoped = r#","scope":"read""#;
    let first =
        registered_path(&service, &servers.registration("a", "basic-client", "basic-secret", scoped)).await;
    assert_eq!(servers.authorization.count("issued").await, 1, "the live call fetched one token");
    for _ in 0..5 {
        call_ok(&service, &first, "basic-client").await;
    }
    let answer = get(&service.url(&first)).await;
    assert_eq!(answer.json().get("scope").and_then(Json::as_str), Some("read"));
    // The same credentials share the token; other credentials (client and scope) get their own.
    let second =
        registered_path(&service, &servers.registration("b", "basic-client", "basic-secret", scoped)).await;
    call_ok(&service, &second, "basic-client").await;
    assert_eq!(servers.authorization.count("issued").await, 1);
    let body_auth = r#","clientAuth":"body","audience":"https://api.example/""#;
    let third =
        registered_path(&service, &servers.registration("c", "post-client", "post-secret", body_auth)).await;
    call_ok(&service, &third, "post-client").await;
    let unscoped =
        registered_path(&service, &servers.registration("d", "basic-client", "basic-secret", "")).await;
    call_ok(&service, &unscoped, "basic-client").await;
    assert_eq!(servers.authorization.count("issued").await, 3);
    assert_eq!(servers.authorization.count("tokenRequests").await, 3);
    let resource = servers.resource.counts().await;
    assert_eq!(resource["rejected"], 0, "{resource}");
    assert_eq!(resource["tokens"], 3, "three tokens in all: {resource}");
    assert_eq!(fetches(&service, "new", "ok").await, 3);

    // The secret is masked in the listing; no token is in the listing, the metrics or the store.
    let last_token = resource["lastToken"].as_str().expect("the resource server's last token").to_owned();
    let listing = String::from_utf8(get(&service.url("/v1/routes")).await.body.to_vec()).unwrap();
    let route: Value = serde_json::from_str(&listing).unwrap();
    let auth = &route["routes"][0]["authHeader"];
    assert_eq!(auth["type"], "OAuth2ClientCredentials", "{listing}");
    assert_eq!(auth["clientSecret"], "***", "{listing}");
    assert!(auth["tokenUrl"].as_str().is_some_and(|u| u.ends_with("/token")), "{listing}");
    let metrics = String::from_utf8(get(&service.url("/metrics")).await.body.to_vec()).unwrap();
    for secret in ["basic-secret", "post-secret", last_token.as_str()] {
        assert!(!listing.contains(secret), "{secret} in the listing");
        assert!(!metrics.contains(secret), "{secret} in /metrics");
    }
    service.stop().await;
    for secret in ["basic-secret", "post-secret", last_token.as_str()] {
        assert!(!files_hold(dir.path(), secret.as_bytes()), "{secret} is in the data directory");
    }
    // After a restart the routes serve again, with a token fetched anew (none was kept).
    let restarted = Service::start_in(config(), dir.path()).await;
    call_ok(&restarted, &first, "basic-client").await;
    assert_eq!(servers.authorization.count("issued").await, 4);
    restarted.stop().await;
}

/// Whether any file below `dir` holds `needle`.
fn files_hold(dir: &Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            return files_hold(&path, needle);
        }
        std::fs::read(&path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
    })
}

/// Each source of a composed route (SPEC §2.3) calls with its own credentials: two sources with
/// OAuth2 clients of their own each get that client's token (fetched once, kept for the next
/// calls), a source without `authHeader` sends no `Authorization`, and the listing masks every
/// source's secret.
#[tokio::test]
async fn each_source_of_a_composition_calls_with_its_own_credentials() {
    let Some(servers) = Servers::start(300).await else { return };
    let open = Upstream::json(r#"{"open":true}"#).await;
    let service = Service::start(config()).await;
    let oauth = |client: &str, secret: &str, extra: (&str, &str)| {
        serde_json::json!({"type": "OAuth2ClientCredentials", "tokenUrl": servers.authorization.url("/token"),
                           "clientId": client, "clientSecret": secret, extra.0: extra.1})
    };
    let resource = servers.resource.url("/");
    let registration = serde_json::json!({
        "path": "both",
        "sources": {
            "basic": {"originalApi": {"baseUrl": resource}, "path": "api/data",
                      "authHeader": oauth("basic-client", "basic-secret", ("scope", "read"))},
            "post": {"originalApi": {"baseUrl": resource}, "path": "api/data",
                     "authHeader": oauth("post-client", "post-secret", ("clientAuth", "body"))},
            "open": {"originalApi": {"baseUrl": open.url("/")}, "path": "x"},
        },
        "rulesAsString": {
            "newBodyFields": {"basic": {"key": "basic", "type": "String"}, "scope": {"key": "scope", "type": "String"},
                              "post": {"key": "post", "type": "String"}, "open": {"key": "open", "type": "Boolean"}},
            "oldBodyFields": {"basic": {"expr": "basic.client"}, "scope": {"expr": "basic.scope"},
                              "post": {"expr": "post.client"}, "open": {"expr": "open.open"}},
        },
    });
    let path = registered_path(&service, &registration.to_string()).await;
    for _ in 0..3 {
        let answer = get(&service.url(&path)).await;
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        let mapped: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(
            mapped,
            serde_json::json!({"basic": "basic-client", "scope": "read", "post": "post-client", "open": true})
        );
    }
    // One token per client, for the live call and the three calls after it.
    assert_eq!(servers.authorization.count("issued").await, 2);
    let counts = servers.resource.counts().await;
    assert_eq!(counts["rejected"], 0, "{counts}");
    assert_eq!(counts["tokens"], 2, "{counts}");
    let received = open.received();
    assert_eq!(received.len(), 4);
    assert!(received.iter().all(|r| !r.headers.contains_key("authorization")), "{received:?}");
    let listing = String::from_utf8(get(&service.url("/v1/routes")).await.body.to_vec()).unwrap();
    let route: Value = serde_json::from_str(&listing).unwrap();
    for name in ["basic", "post"] {
        let auth = &route["routes"][0]["sources"][name]["authHeader"];
        assert_eq!(auth["clientSecret"], "***", "{listing}");
    }
    for secret in ["basic-secret", "post-secret"] {
        assert!(!listing.contains(secret), "{secret} in the listing");
    }
    service.stop().await;
}

#[tokio::test]
async fn tokens_are_renewed_before_they_expire_and_fetched_anew_after() {
    // Tokens live 4 seconds by their `expires_in` (3 by recast's count, which allows for the
    // server's rounding): renewed in the background after 2.25, sent until 2.7.
    let Some(servers) = Servers::start(4).await else { return };
    let service = Service::start(config()).await;
    let path =
        registered_path(&service, &servers.registration("r", "basic-client", "basic-secret", "")).await;
    // Called every 100 ms for 7 seconds: no call may meet an expired token, and none waits for one.
    let started = Instant::now();
    let mut calls = 0;
    while started.elapsed() < Duration::from_secs(7) {
        call_ok(&service, &path, "basic-client").await;
        calls += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resource = servers.resource.counts().await;
    assert_eq!(resource["rejected"], 0, "an expired token was sent: {resource}");
    assert_eq!(resource["accepted"], calls + 1, "{resource}");
    // The registration's token, then one renewal about every 2.25 seconds.
    let issued = servers.authorization.count("issued").await;
    assert!((3..=5).contains(&issued), "{issued} tokens issued in 7 s");
    assert_eq!(fetches(&service, "renewal", "ok").await, issued - 1);
    assert_eq!(fetches(&service, "new", "ok").await, 1);
    // Left alone past its end, the token is fetched anew by the next call, which waits for it.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    call_ok(&service, &path, "basic-client").await;
    assert_eq!(fetches(&service, "new", "ok").await, 2);
    assert_eq!(servers.authorization.count("issued").await, issued + 1);
    assert_eq!(servers.resource.count("rejected").await, 0);
    service.stop().await;
}

#[tokio::test]
async fn fifty_concurrent_calls_wait_for_one_fetch() {
    let Some(servers) = Servers::start(2).await else { return };
    let service = Service::start(config()).await;
    let path =
        registered_path(&service, &servers.registration("r", "basic-client", "basic-secret", "")).await;
    // The token runs out (nothing called in its last quarter, so nothing renewed it); the next
    // token takes 300 ms to come.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    servers.authorization.post("/test/delay?ms=300").await;
    let before = servers.authorization.count("tokenRequests").await;
    // A caller that gives up while the fetch runs does not take the fetch with it: the calls
    // after it wait for the same one.
    let gave_up = tokio::time::timeout(Duration::from_millis(100), get(&service.url(&path))).await;
    assert!(gave_up.is_err(), "the call waited for the token");
    all_ok(&service, &path, 50).await;
    assert_eq!(servers.authorization.count("tokenRequests").await, before + 1, "one fetch for 50 calls");
    assert_eq!(servers.resource.count("rejected").await, 0);
    service.stop().await;
}

#[tokio::test]
async fn a_revoked_token_is_replaced_once_and_the_calls_sent_again() {
    let Some(servers) = Servers::start(300).await else { return };
    let service = Service::start(config()).await;
    let path =
        registered_path(&service, &servers.registration("r", "basic-client", "basic-secret", "")).await;
    call_ok(&service, &path, "basic-client").await;
    // A token is replaced after a 401 only once it is a second old.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    servers.authorization.post("/test/revoke-all").await;
    let before = servers.resource.counts().await;
    // 50 calls at once, all with the revoked token: each gets a 401, one new token comes, and
    // each is sent once more with it.
    all_ok(&service, &path, 50).await;
    let after = servers.resource.counts().await;
    let delta = |name: &str| after[name].as_u64().unwrap() - before[name].as_u64().unwrap();
    // Calls that began after the new token came use it at once.
    assert!((1..=50).contains(&delta("rejected")), "{after}");
    assert_eq!(delta("accepted"), 50, "{after}");
    assert_eq!(delta("calls"), 50 + delta("rejected"), "{after}");
    assert_eq!(servers.authorization.count("issued").await, 2, "one new token for 50 rejections");
    assert_eq!(fetches(&service, "rejected", "ok").await, 1);
    service.stop().await;
}

#[tokio::test]
async fn a_401_makes_one_new_token_and_one_more_send_at_most() {
    // A plain upstream that accepts the first token only, then rejects every token.
    let Some(servers) = Servers::start(300).await else { return };
    let first_token = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let seen = first_token.clone();
    let upstream = Upstream::start(move |received| {
        let token = received.headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
        let mut first = seen.lock().unwrap();
        if first.is_none() {
            *first = token.clone();
        }
        if token.is_some() && *first == token { Reply::json(MEALS) } else { Reply::with(401, "{}") }
    })
    .await;
    let service = Service::start(config()).await;
    let body = format!(
        r#"{{"path":"r","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"x"}},"authHeader":{{"type":"OAuth2ClientCredentials","tokenUrl":"{}","clientId":"basic-client","clientSecret":"basic-secret"}},"rulesAsString":{RULES}}}"#,
        upstream.url("/"),
        servers.authorization.url("/token")
    );
    let path = registered_path(&service, &body).await;
    *first_token.lock().unwrap() = Some("none".to_owned());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 401, "the upstream's 401 is answered after one more send");
    let received = upstream.received();
    assert_eq!(received.len(), 3, "the live call, the call, and one more send");
    let sent: Vec<&str> = received.iter().map(|r| r.headers["authorization"].to_str().unwrap()).collect();
    assert_eq!(sent[0], sent[1], "the call used the token held");
    assert_ne!(sent[1], sent[2], "the send after the 401 has a new token");
    assert_eq!(servers.authorization.count("issued").await, 2);
    // The new token is less than a second old: the next 401 is answered as it is, with no token
    // request and no second send.
    assert_eq!(get(&service.url(&path)).await.status, 401);
    assert_eq!(upstream.received().len(), 4);
    assert_eq!(servers.authorization.count("tokenRequests").await, 2);
    service.stop().await;
}

#[tokio::test]
async fn a_wrong_secret_is_refused_with_the_oauth_error_and_nothing_is_stored() {
    let Some(servers) = Servers::start(300).await else { return };
    let service = Service::start(config()).await;
    for (client, extra) in [("basic-client", ""), ("post-client", r#","clientAuth":"body""#)] {
        let answer = register(&service, &servers.registration("r", client, "wrong", extra), &[]).await;
        let problem = answer.assert_problem(502, "upstream-auth-failed");
        assert_eq!(problem.get("oauthError").and_then(Json::as_str), Some("invalid_client"));
        let detail = problem.get("detail").and_then(Json::as_str).unwrap();
        // The endpoint's description ("client authentication failed") is not passed on.
        assert!(detail.contains("invalid_client") && !detail.contains("authentication failed"), "{detail}");
    }
    assert_eq!(crate::routes::route_count(&service).await, 0);
    assert_eq!(servers.resource.count("calls").await, 0, "no upstream call without a token");
    assert_eq!(fetches(&service, "new", "failed").await, 2);

    // An update to a wrong secret is refused too; the route keeps serving with its own.
    let path =
        registered_path(&service, &servers.registration("r", "basic-client", "basic-secret", "")).await;
    let update = servers.registration("r", "basic-client", "wrong", "");
    let url = service.url(&format!("/v1/routes/{}", &path[4..40]));
    let answer = send(Method::PUT, &url, &[("content-type", "application/json")], update).await;
    answer.assert_problem(502, "upstream-auth-failed");
    call_ok(&service, &path, "basic-client").await;

    // Sent back as shown, `"***"` keeps the stored secret (a wrong one would be refused as
    // above), but not for a token URL elsewhere.
    let uuid = &path[4..40];
    let shown = crate::routes::shown_as_update(&service, uuid, |body| {
        assert_eq!(body["authHeader"]["clientSecret"], "***");
    })
    .await;
    let answer = crate::routes::update(&service, uuid, shown).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    call_ok(&service, &path, "basic-client").await;
    let moved = crate::routes::shown_as_update(&service, uuid, |body| {
        body["authHeader"]["tokenUrl"] = servers.resource.url("/token").into();
    })
    .await;
    let problem = crate::routes::update(&service, uuid, moved).await.assert_problem(400, "invalid-request");
    assert_eq!(crate::support::error_locations(&problem), ["/authHeader/clientSecret"]);
    service.stop().await;
}

#[tokio::test]
async fn a_token_endpoint_that_is_down_answers_502_and_calls_recover_when_it_is_back() {
    let Some(mut servers) = Servers::start(2).await else { return };
    let service = Service::start(config()).await;
    // Registering against a token URL where nothing listens fails, and stores nothing.
    let closed = format!("http://127.0.0.1:{}/token", free_port());
    let body =
        registration_to(&servers.resource.url("/"), &closed, "down", "basic-client", "basic-secret", "");
    let problem = register(&service, &body, &[]).await.assert_problem(502, "upstream-auth-failed");
    assert!(problem.get("oauthError").is_none());
    assert_eq!(crate::routes::route_count(&service).await, 0);

    let path =
        registered_path(&service, &servers.registration("r", "basic-client", "basic-secret", "")).await;
    // The endpoint goes down (the restart's placeholder takes its place elsewhere) and the token
    // runs out: calls answer 502 without calling the upstream.
    let port = servers.authorization.port;
    let placeholder = Servers::authorization_on(&servers.dir, free_port(), 2).await;
    drop(std::mem::replace(&mut servers.authorization, placeholder));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let calls_before = servers.resource.count("calls").await;
    for _ in 0..3 {
        get(&service.url(&path)).await.assert_problem(502, "upstream-auth-failed");
    }
    assert_eq!(servers.resource.count("calls").await, calls_before, "no call without a token");
    // Back on its port: after the second in which a failure is answered as is, calls succeed.
    servers.authorization = Servers::authorization_on(&servers.dir, port, 2).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    call_ok(&service, &path, "basic-client").await;
    assert!(fetches(&service, "new", "failed").await >= 1);
    service.stop().await;
}

#[tokio::test]
async fn what_recast_sends_a_token_endpoint_and_what_it_makes_of_bad_answers() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    // A token endpoint answering in turn: no token, a token of another type, a 5xx page, a
    // refusal without a code, then a token.
    let answers = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let turn = answers.clone();
    let endpoint = Upstream::start(move |_| match turn.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
        0 => Reply::json(r#"{"token_type":"Bearer"}"#),
        1 => Reply::json(r#"{"access_token":"t","token_type":"mac"}"#),
        2 => Reply { content_type: "text/html", ..Reply::with(503, "<h1>SECRET PAGE</h1>") },
        3 => Reply::with(400, r#"{"error_description":"nope"}"#),
        _ => Reply::json(r#"{"access_token":"tok-123","token_type":"Bearer","expires_in":60}"#),
    })
    .await;
    let token_url = endpoint.url("/oauth/token");
    // Each registration with a client of its own: a failure is answered as is to the same
    // credentials for a second.
    let body = |path: &str, client: &str| {
        registration_to(
            &upstream.url("/"),
            &token_url,
            path,
            client,
            "p@ss:w&rd",
            r#","clientAuth":"body","scope":"read write","audience":"https://api.example/""#,
        )
        .replace(r#""path":"api/data"}"#, r#""path":"api/random.php"}"#)
        .replace(WHO, RULES)
    };
    for (n, expected) in ["no `access_token`", "not Bearer", "503", "400"].into_iter().enumerate() {
        let registration = body(&format!("r{n}"), &format!("app {n}"));
        let problem =
            register(&service, &registration, &[]).await.assert_problem(502, "upstream-auth-failed");
        let detail = problem.get("detail").and_then(Json::as_str).unwrap();
        assert!(
            detail.contains(expected) && !detail.contains("SECRET PAGE") && !detail.contains("nope"),
            "{detail}"
        );
        assert!(problem.get("oauthError").is_none());
    }
    assert!(upstream.received().is_empty(), "no upstream call without a token");
    let path = registered_path(&service, &body("ok", "my app")).await;
    assert_eq!(upstream.received()[0].headers["authorization"], "Bearer tok-123");
    let asked = endpoint.received();
    assert_eq!(asked.len(), 5);
    let last = &asked[4];
    assert_eq!(last.method, Method::POST);
    assert_eq!(last.uri.path(), "/oauth/token");
    assert_eq!(last.headers["content-type"], "application/x-www-form-urlencoded");
    assert!(!last.headers.contains_key("authorization"));
    let form: Vec<(String, String)> = url::form_urlencoded::parse(&last.body).into_owned().collect();
    let expected = [
        ("grant_type", "client_credentials"),
        ("scope", "read write"),
        ("audience", "https://api.example/"),
        ("client_id", "my app"),
        ("client_secret", "p@ss:w&rd"),
    ];
    assert_eq!(form, expected.map(|(k, v)| (k.to_owned(), v.to_owned())));
    // The caller's X-Mapped-Auth is not sent in place of the token.
    let answer = send(Method::GET, &service.url(&path), &[("x-mapped-auth", "Bearer caller")], "").await;
    assert_eq!(answer.status, 200);
    assert_eq!(upstream.received()[1].headers["authorization"], "Bearer tok-123");
    service.stop().await;
}

#[tokio::test]
async fn oauth2_members_are_checked_with_locations() {
    let service = Service::start(config()).await;
    let base = "http://127.0.0.1:9/";
    let cases: [(&str, &[&str]); 6] = [
        (
            r#"{"type":"OAuth2ClientCredentials"}"#,
            &["/authHeader/clientId", "/authHeader/clientSecret", "/authHeader/tokenUrl"],
        ),
        (
            r#"{"type":"OAuth2ClientCredentials","tokenUrl":"ftp://x/t","clientId":"","clientSecret":"s","token":"t"}"#,
            &["/authHeader/clientId", "/authHeader/token", "/authHeader/tokenUrl"],
        ),
        (
            r#"{"type":"OAuth2ClientCredentials","tokenUrl":"https://u:p@x/t#f","clientId":"a","clientSecret":"s","clientAuth":"jwt","scope":"a  b"}"#,
            &["/authHeader/clientAuth", "/authHeader/scope", "/authHeader/tokenUrl"],
        ),
        (
            r#"{"type":"OAuth2ClientCredentials","tokenUrl":"https://x/t","clientId":"a\u0000","clientSecret":"s","audience":""}"#,
            &["/authHeader/audience", "/authHeader/clientId"],
        ),
        (
            r#"{"type":"Bearer","token":"t","clientSecret":"s","tokenUrl":"https://x/t"}"#,
            &["/authHeader/clientSecret", "/authHeader/tokenUrl"],
        ),
        (r#"{"type":"OAuth2"}"#, &["/authHeader/type"]),
    ];
    for (auth, locations) in cases {
        let body = format!(
            r#"{{"path":"p","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"x"}},"authHeader":{auth},"rulesAsString":{RULES}}}"#
        );
        let problem = register(&service, &body, &[]).await.assert_problem(400, "invalid-request");
        assert_eq!(error_locations(&problem), *locations, "{auth}");
    }
    // A token URL the outbound policy refuses is refused before any call (no socket is opened:
    // the address is a literal the policy decides on).
    let body = registration_to(base, "http://10.0.0.1/token", "p", "a", "s", "");
    let problem = register(&service, &body, &[]).await.assert_problem(400, "upstream-not-allowed");
    let detail = problem.get("detail").and_then(Json::as_str).unwrap();
    assert!(detail.starts_with("the token URL"), "{detail}");
    service.stop().await;
}
