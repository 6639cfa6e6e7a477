//! The outbound policy (SPEC §6) end to end: addresses and URL tricks refused at registration and
//! at call time, a resolver that changes its answer between the check and the connection, and
//! redirects. Every upstream here listens on loopback; the addresses outside it that appear are
//! refused before any socket is opened, which the tests check by counting connections.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use recast::config::Config;
use recast::policy::{AllowList, Lookup, OutboundPolicy};
use recast::upstream::UpstreamRequest;
use recast::upstream::{UpstreamClient, UpstreamError, UpstreamSettings};

use crate::routes::{MEALS, RULES, register, registered, registration, route_count};
use crate::support::{Reply, Service, Upstream, config, get};

#[tokio::test]
async fn registration_refuses_every_spelling_of_a_loopback_or_private_upstream() {
    let upstream = Upstream::json(MEALS).await;
    let port = upstream.addr.port();
    // No RECAST_UPSTREAM_ALLOW: only public addresses.
    let service = Service::start(Config::default()).await;
    let refused = [
        format!("http://127.0.0.1:{port}/"),
        format!("http://localhost:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://0x7f.1:{port}/"),
        format!("http://0177.0.0.1:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://0x7f000001:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://[::ffff:7f00:1]:{port}/"),
        format!("http://[::1]:{port}/"),
        // 0.0.0.0 reaches the local machine on Linux.
        format!("http://0.0.0.0:{port}/"),
        format!("http://[::]:{port}/"),
        format!("http://LocalHost:{port}/"),
        "http://10.0.0.1/".to_owned(),
        "http://172.16.5.4/".to_owned(),
        "http://192.168.0.1/".to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://[::ffff:169.254.169.254]/".to_owned(),
        "http://100.64.0.1/".to_owned(),
        "http://[fd00::1]/".to_owned(),
        "http://[fe80::1]/".to_owned(),
        "http://224.0.0.1/".to_owned(),
        "https://[64:ff9b::a9fe:a9fe]/".to_owned(),
    ];
    for base in &refused {
        let answer = register(&service, &registration(base, "", ""), &[]).await;
        let problem = answer.assert_problem(400, "upstream-not-allowed");
        let detail = problem.get("detail").and_then(|d| d.as_str()).unwrap_or_default().to_owned();
        assert!(
            detail.contains("RECAST_UPSTREAM_ALLOW") || detail.contains("no address"),
            "{base}: {detail}"
        );
    }
    assert_eq!(upstream.connections(), 0, "no refused registration may reach the upstream");
    assert_eq!(route_count(&service).await, 0);
    service.stop().await;
}

/// A registration whose `originalRoute.path` is `path` (JSON-escaped here).
fn with_path(base: &str, path: &str) -> String {
    let path = serde_json::to_string(path).unwrap();
    format!(
        r#"{{"path":"p","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":{path}}},"rulesAsString":{RULES}}}"#
    )
}

#[tokio::test]
async fn url_tricks_in_a_registration_are_refused_before_any_call() {
    let upstream = Upstream::json(MEALS).await;
    let at = upstream.addr;
    let service = Service::start(config()).await;
    let base = upstream.url("/");
    let tricks = [
        // Credentials in the base URL, including the classic confusion of host and userinfo.
        registration(&format!("http://user:pw@{at}/"), "", ""),
        registration(&format!("http://evil.example@{at}/"), "", ""),
        registration(&format!("http://{at}#@evil.example/"), "", ""),
        registration(&format!("http://{at}/?next=1"), "", ""),
        // Schemes other than http and https.
        registration(&format!("file:///etc/passwd#{at}"), "", ""),
        registration(&format!("gopher://{at}/"), "", ""),
        // Paths that are URLs, or that climb out of the base.
        with_path(&base, "//evil.example/x"),
        with_path(&base, "\\\\evil.example\\x"),
        with_path(&base, "%2e%2e/admin"),
        with_path(&format!("{base}api/"), "a/%2E%2E/%2e%2e/admin"),
        with_path(&base, "http://evil.example/x"),
        with_path(&base, "HTTPS://evil.example"),
    ];
    for body in &tricks {
        let answer = register(&service, body, &[]).await;
        assert_eq!(answer.status, 400, "{body}");
        answer.assert_problem(400, "invalid-request");
    }
    // A header value or token with CR/LF is refused too (header injection).
    for extra in [
        r#","headers":{"X-Key":"a\r\nHost: evil.example"}"#,
        r#","authHeader":{"type":"Bearer","token":"t\r\nX-Injected: 1"}"#,
    ] {
        let answer = register(&service, &registration(&base, extra, ""), &[]).await;
        answer.assert_problem(400, "invalid-request");
    }
    assert_eq!(upstream.connections(), 0, "nothing refused may reach the upstream");
    assert_eq!(route_count(&service).await, 0);
    service.stop().await;
}

#[tokio::test]
async fn the_policy_is_checked_again_at_every_call() {
    let upstream = Upstream::json(MEALS).await;
    let dir = tempfile::tempdir().unwrap();
    let allowed = Service::start_in(config(), dir.path()).await;
    let path = registered(&allowed, &registration(&upstream.url("/"), "", ""), &[]).await;
    assert_eq!(upstream.received().len(), 1, "the registration's live call");
    allowed.stop().await;

    // The same stored route, served by a recast whose policy no longer allows loopback.
    let strict = Service::start_in(Config::default(), dir.path()).await;
    let answer = get(&strict.url(&path)).await;
    let problem = answer.assert_problem(502, "upstream-not-allowed");
    let detail = problem.get("detail").and_then(|d| d.as_str()).unwrap().to_owned();
    assert!(!detail.contains("127.0.0.1"), "callers are not told the upstream's addresses: {detail}");
    assert_eq!(upstream.received().len(), 1, "the call was refused before anything was sent");
    strict.stop().await;
}

/// Answers each lookup with the next address of a script, then the last one forever.
struct Script {
    answers: Mutex<Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
}

impl Script {
    fn new(answers: &[&str]) -> Arc<Script> {
        let mut answers: Vec<IpAddr> = answers.iter().map(|a| a.parse().unwrap()).collect();
        answers.reverse();
        Arc::new(Script { answers: Mutex::new(answers), asked: Mutex::new(Vec::new()) })
    }
}

impl Lookup for Script {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>> {
        self.asked.lock().unwrap().push(host.to_owned());
        let mut answers = self.answers.lock().unwrap();
        let answer = if answers.len() > 1 { answers.pop() } else { answers.last().copied() };
        Box::pin(std::future::ready(Ok(answer.into_iter().collect())))
    }
}

fn client(allow: &str, lookup: Arc<Script>) -> UpstreamClient {
    let settings = UpstreamSettings {
        connect_timeout: Duration::from_secs(2),
        total_timeout: Duration::from_secs(5),
        max_body: 1 << 20,
        compression: true,
        workers: 1,
        breaker: recast::config::Config::default().upstream().breaker,
        http2: true,
    };
    let allow: AllowList = allow.parse().unwrap();
    UpstreamClient::new(settings, Arc::new(OutboundPolicy::new(&allow)), lookup)
}

fn request(url: &str) -> UpstreamRequest {
    UpstreamRequest {
        method: Method::GET,
        uri: url.parse().unwrap(),
        headers: HeaderMap::new(),
        body: Default::default(),
    }
}

#[tokio::test]
async fn a_name_that_rebinds_to_loopback_after_the_check_is_refused_at_connect() {
    let upstream = Upstream::json(MEALS).await;
    let port = upstream.addr.port();
    // First answer public (the registration check), then loopback (what a rebinding DNS server
    // would answer when the connection is made).
    let lookup = Script::new(&["93.184.216.34", "127.0.0.1"]);
    let client = client("", lookup.clone());
    let url = format!("http://rebind.example:{port}/api/random.php");
    client.check_policy(&url.parse().unwrap()).await.expect("the first answer is public");
    let error = client.call(request(&url)).await.expect_err("the second answer is loopback");
    let UpstreamError::NotAllowed(refusal) = error else { panic!("refused by the policy, not {error:?}") };
    assert_eq!(refusal.addresses, ["127.0.0.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(lookup.asked.lock().unwrap().len(), 2, "one lookup for the check, one for the connection");
    assert_eq!(upstream.connections(), 0, "the loopback upstream must receive nothing");
}

#[tokio::test]
async fn an_allowed_name_connects_to_the_address_that_was_checked() {
    let upstream = Upstream::json(MEALS).await;
    let port = upstream.addr.port();
    let lookup = Script::new(&["127.0.0.1"]);
    let client = client("api.internal", lookup.clone());
    let url = format!("http://api.internal:{port}/api/random.php");
    let answer = client.call(request(&url)).await.expect("an allowed name is called");
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(upstream.received().len(), 1);
    assert_eq!(upstream.received()[0].headers.get("host").unwrap(), &format!("api.internal:{port}"));
    // Another name with the same address is not allowed.
    let error = client.call(request(&format!("http://other.internal:{port}/"))).await.unwrap_err();
    assert!(matches!(error, UpstreamError::NotAllowed(_)), "{error:?}");
    assert_eq!(upstream.received().len(), 1);
}

#[tokio::test]
async fn redirects_are_answered_not_followed() {
    let target = Upstream::json(MEALS).await;
    let location = target.url("/api/random.php");
    let redirecting = Upstream::start(move |_| Reply {
        headers: vec![("location", location.clone())],
        ..Reply::with(302, "")
    })
    .await;
    let client = client("127.0.0.1/32", Script::new(&["127.0.0.1"]));
    let answer = client.call(request(&redirecting.url("/"))).await.expect("an answer");
    assert_eq!(answer.status, StatusCode::FOUND);
    assert_eq!(target.connections(), 0, "the redirect's target must receive nothing");

    // Through the service, a redirecting upstream fails the registration.
    let service = Service::start(config()).await;
    let answer = register(&service, &registration(&redirecting.url("/"), "", ""), &[]).await;
    answer.assert_problem(502, "upstream-validation-failed");
    assert_eq!(target.connections(), 0);
    service.stop().await;
}

/// A connection the upstream's host refused reached nothing, so the request is sent once more on
/// a new connection, whatever its method; a second refusal is the answer.
#[tokio::test]
async fn a_refused_connection_is_tried_once_more_for_any_method() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An upstream on 127.0.0.2; the same port on 127.0.0.1 refuses.
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    let server = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut head = vec![0; 4096];
            let _ = stream.read(&mut head).await;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").await;
        }
    });
    let url = format!("http://api.internal:{port}/");
    let post = |url: &str| UpstreamRequest { method: Method::POST, ..request(url) };

    // The first lookup answers the refusing address, the next the listening one.
    let lookup = Script::new(&["127.0.0.1", "127.0.0.2"]);
    let answer = client("api.internal", lookup.clone()).call(post(&url)).await.expect("the second try");
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(lookup.asked.lock().unwrap().len(), 2);
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Refused twice: the answer is the refusal, after two tries and no more.
    let lookup = Script::new(&["127.0.0.1"]);
    let error = client("api.internal", lookup.clone()).call(post(&url)).await.unwrap_err();
    assert!(matches!(&error, UpstreamError::Connect(why) if why.contains("refused")), "{error:?}");
    assert_eq!(lookup.asked.lock().unwrap().len(), 2);
    server.abort();
}

/// A composed registration checks every source's address and token URL before its first call:
/// a source refused by the policy stops it before an earlier source (and its credentials) is
/// called, whatever their order; the refusal names the source.
#[tokio::test]
async fn a_composed_registration_checks_every_source_before_calling_any() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let allowed = serde_json::json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": "meal",
                                     "authHeader": {"type": "Bearer", "token": "first-source-token"}});
    let refused_base =
        serde_json::json!({"originalApi": {"baseUrl": "http://10.1.2.3/"}, "path": "x", "after": ["a"]});
    let refused_token = serde_json::json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": "y", "after": ["a"],
        "authHeader": {"type": "OAuth2ClientCredentials", "tokenUrl": "http://169.254.169.254/token",
                       "clientId": "c", "clientSecret": "s"}});
    for (later, says) in [(refused_base, "RECAST_UPSTREAM_ALLOW"), (refused_token, "the token URL")] {
        let body = serde_json::json!({
            "path": "both",
            "sources": {"a": allowed, "z": later},
            "rulesAsString": {"newBodyFields": {"m": {"key": "m", "type": "Json"}}, "oldBodyFields": {"m": {"expr": "a.meals"}}},
        });
        let answer = register(&service, &body.to_string(), &[]).await;
        let problem = answer.assert_problem(400, "upstream-not-allowed");
        assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("z"), "{problem}");
        assert!(problem["detail"].to_string().contains(says), "{problem}");
    }
    assert_eq!(upstream.connections(), 0, "no source was called");
    assert_eq!(route_count(&service).await, 0);
    service.stop().await;
}
