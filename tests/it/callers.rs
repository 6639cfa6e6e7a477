//! Who may call a route (SPEC §2.4), in-process: consumers and their keys through the admin API,
//! a route's `callers` checked before anything else of a call, and what a caller's credential
//! never reaches.

use http::Method;
use recast::config::Config;
use recast::secrets::Secret;

use crate::support::{Answer, Connection, Json, Reply, Service, Upstream, config, send};

const ADMIN: &str = "admin-7c1e";
const MEALS: &str = r#"{"meals":[{"idMeal":"7","strMeal":"Soup"}]}"#;
const RULES: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]}}}"#;

fn admin_config() -> Config {
    Config { admin_token: Some(Secret::new(ADMIN)), ..config() }
}

async fn admin(service: &Service, method: Method, path: &str, body: &str) -> Answer {
    let bearer = format!("Bearer {ADMIN}");
    send(
        method,
        &service.url(path),
        &[("authorization", &bearer), ("content-type", "application/json")],
        body.to_owned(),
    )
    .await
}

fn registration(base: &str, callers: &str) -> String {
    format!(
        r#"{{"path":"meal","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"meal"}},"callers":{callers},"rulesAsString":{RULES}}}"#
    )
}

/// Registers a route; its public path.
async fn register(service: &Service, body: &str) -> String {
    let answer = admin(service, Method::POST, "/v1/mapping", body).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    answer.json().get("path").and_then(Json::as_str).expect("path").to_owned()
}

/// Creates a consumer and issues it a key; the key.
async fn consumer_with_key(service: &Service, name: &str) -> (String, String) {
    let created = admin(
        service,
        Method::POST,
        "/v1/consumers",
        &format!(r#"{{"name":"{name}","metadata":{{"tier":"gold"}}}}"#),
    )
    .await;
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    let issued = admin(service, Method::POST, &format!("/v1/consumers/{name}/keys"), "").await;
    assert_eq!(issued.status, 201, "{}", String::from_utf8_lossy(&issued.body));
    assert_eq!(issued.header("cache-control"), Some("no-store"));
    let issued = issued.json();
    let key = issued.get("key").and_then(Json::as_str).expect("key").to_owned();
    let id = issued.get("id").and_then(Json::as_str).expect("id").to_owned();
    assert!(key.starts_with("rk_") && key.len() == 46, "{key}");
    (key, id)
}

async fn call(service: &Service, path: &str, headers: &[(&str, &str)]) -> Answer {
    send(Method::GET, &service.url(path), headers, "").await
}

#[tokio::test]
async fn keys_are_checked_at_the_door_and_never_reach_the_upstream() {
    let upstream = Upstream::start(|_| Reply::json(MEALS)).await;
    let dir = tempfile::TempDir::new().unwrap();
    let service = Service::start_in(admin_config(), dir.path()).await;
    let path = register(&service, &registration(&upstream.url(""), r#"{"consumers":["mobile-*"]}"#)).await;
    let (key, id) = consumer_with_key(&service, "mobile-app").await;
    let (other, _) = consumer_with_key(&service, "web").await;

    // No credential: 401, with the challenge of RFC 6750 and no error code.
    let answer = call(&service, &path, &[]).await;
    answer.assert_problem(401, "caller-unauthenticated");
    assert_eq!(answer.header("www-authenticate"), Some(r#"Bearer realm="recast""#));
    // A key nobody holds: 401, invalid_token.
    let wrong = format!("rk_{}", "A".repeat(43));
    let answer = call(&service, &path, &[("x-api-key", &wrong)]).await;
    answer.assert_problem(401, "caller-unauthenticated");
    assert_eq!(answer.header("www-authenticate"), Some(r#"Bearer realm="recast", error="invalid_token""#));
    // The key, as X-Api-Key and as a bearer token.
    let answer = call(&service, &path, &[("x-api-key", &key)]).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.json().to_string(), r#"{"id":7}"#);
    let bearer = format!("Bearer {key}");
    assert_eq!(call(&service, &path, &[("authorization", &bearer)]).await.status, 200);
    // A consumer the route does not name: 403.
    let problem =
        call(&service, &path, &[("x-api-key", &other)]).await.assert_problem(403, "caller-forbidden");
    assert!(!problem.to_string().contains(&other[3..]), "{problem}");
    // In the URL, even beside a valid header: refused, never read.
    let answer =
        send(Method::GET, &service.url(&format!("{path}?api_key={key}")), &[("x-api-key", &key)], "").await;
    let problem = answer.assert_problem(401, "caller-unauthenticated");
    assert!(!problem.to_string().contains(&key[3..]), "{problem}");
    // Only the registration's live call and the two good calls went upstream, and neither call
    // carried the caller's credential.
    let received = upstream.received();
    assert_eq!(received.len(), 3);
    for request in &received {
        assert!(request.headers.get("authorization").is_none() && request.headers.get("x-api-key").is_none());
        assert!(!format!("{:?}", request.headers).contains(&key[3..]));
    }
    // The listing shows prefixes and the last use, never the key.
    let listed = admin(&service, Method::GET, "/v1/consumers/mobile-app/keys", "").await;
    assert_eq!(listed.status, 200);
    let text = String::from_utf8_lossy(&listed.body).into_owned();
    assert!(
        !text.contains(&key[3..]) && text.contains(&key[..11]) && text.contains("\"lastUsedAt\":1"),
        "{text}"
    );
    let shown =
        admin(&service, Method::GET, &format!("/v1/routes/{}", path.split('/').nth(2).unwrap()), "").await;
    assert!(String::from_utf8_lossy(&shown.body).contains(r#""callers":{"consumers":["mobile-*"]}"#));

    // A restart keeps consumers and keys.
    service.stop().await;
    let service = Service::start_in(admin_config(), dir.path()).await;
    assert_eq!(call(&service, &path, &[("x-api-key", &key)]).await.status, 200);
    // Revoked: refused at once.
    let revoked = admin(&service, Method::DELETE, &format!("/v1/consumers/mobile-app/keys/{id}"), "").await;
    assert_eq!(revoked.status, 204);
    call(&service, &path, &[("x-api-key", &key)]).await.assert_problem(401, "caller-unauthenticated");
    // Deleted with its consumer: refused, and gone after a restart too.
    let (again, _) = {
        let issued = admin(
            &service,
            Method::POST,
            "/v1/consumers/mobile-app/keys",
            r#"{"expiresAt":"2999-01-01T00:00:00Z"}"#,
        )
        .await;
        assert_eq!(issued.status, 201, "{}", String::from_utf8_lossy(&issued.body));
        (issued.json().get("key").and_then(Json::as_str).unwrap().to_owned(), ())
    };
    assert_eq!(call(&service, &path, &[("x-api-key", &again)]).await.status, 200);
    assert_eq!(admin(&service, Method::DELETE, "/v1/consumers/mobile-app", "").await.status, 204);
    call(&service, &path, &[("x-api-key", &again)]).await.assert_problem(401, "caller-unauthenticated");
    service.stop().await;
    let service = Service::start_in(admin_config(), dir.path()).await;
    call(&service, &path, &[("x-api-key", &again)]).await.assert_problem(401, "caller-unauthenticated");
    assert_eq!(admin(&service, Method::GET, "/v1/consumers/mobile-app", "").await.status, 404);
    // The data directory holds no key, only digests.
    service.stop().await;
    for entry in walk(dir.path()) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        for secret in [&key, &other, &again] {
            assert!(!contains(&bytes, &secret.as_bytes()[3..]), "{} holds a key", entry.display());
        }
    }
}

/// A client repeating its key on one kept-alive connection: the connection keeps what the key
/// made (`src/callers/memo.rs`), so the same bytes are not digested again; other bytes are looked
/// up; and a key revoked, a consumer's metadata changed or the consumer deleted is seen on that
/// connection at once — whether the lane serves the connection's route calls or hyper does
/// (once a request of another endpoint moved the connection to it).
#[tokio::test]
async fn a_connection_repeating_a_key_sees_its_revocation_and_its_consumer_s_changes_at_once() {
    for through_hyper in [false, true] {
        let upstream = Upstream::start(|_| Reply::json(MEALS)).await;
        let service = Service::start(admin_config()).await;
        let body = serde_json::json!({
            "path": "meal",
            "originalRoute": {"originalApi": {"baseUrl": upstream.url("")}, "path": "meal"},
            "callers": {"consumers": ["mobile-*"]},
            "caller": {"kind": "key", "id": "mobile-app", "consumer": "mobile-app", "metadata": {"tier": "gold"}},
            "rulesAsString": {"newBodyFields": {"tier": {"key": "tier", "type": "String"}},
                              "oldBodyFields": {"tier": {"expr": "$caller.metadata.tier"}}}
        });
        let path = register(&service, &body.to_string()).await;
        let (key, id) = consumer_with_key(&service, "mobile-app").await;
        let (other, _) = consumer_with_key(&service, "web").await;
        let mut connection = Connection::open(&service).await;
        if through_hyper {
            assert_eq!(connection.get("/healthz", &[]).await.status, 200);
        }
        for _ in 0..3 {
            let answer = connection.get(&path, &[("x-api-key", &key)]).await;
            assert_eq!(
                String::from_utf8_lossy(&answer.body),
                r#"{"tier":"gold"}"#,
                "through hyper: {through_hyper}"
            );
        }
        // Other bytes on the same connection: a consumer the route does not name, a key one
        // character off, the key as a bearer token; then the key again.
        connection.get(&path, &[("x-api-key", &other)]).await.assert_problem(403, "caller-forbidden");
        let last = if key.ends_with('A') { "B" } else { "A" };
        let off = format!("{}{last}", &key[..key.len() - 1]);
        connection.get(&path, &[("x-api-key", &off)]).await.assert_problem(401, "caller-unauthenticated");
        let bearer = format!("Bearer {key}");
        assert_eq!(connection.get(&path, &[("authorization", &bearer)]).await.status, 200);
        assert_eq!(connection.get(&path, &[("x-api-key", &key)]).await.status, 200);
        // The consumer's metadata changes: the next call on the connection reads the new.
        let changed =
            admin(&service, Method::PUT, "/v1/consumers/mobile-app", r#"{"metadata":{"tier":"free"}}"#).await;
        assert_eq!(changed.status, 200);
        let answer = connection.get(&path, &[("x-api-key", &key)]).await;
        assert_eq!(String::from_utf8_lossy(&answer.body), r#"{"tier":"free"}"#);
        // Revoked: refused at once on the connection that used it.
        let revoked =
            admin(&service, Method::DELETE, &format!("/v1/consumers/mobile-app/keys/{id}"), "").await;
        assert_eq!(revoked.status, 204);
        connection.get(&path, &[("x-api-key", &key)]).await.assert_problem(401, "caller-unauthenticated");
        // A new key, used twice; then its consumer deleted.
        let issued = admin(&service, Method::POST, "/v1/consumers/mobile-app/keys", "").await;
        let again = issued.json().get("key").and_then(Json::as_str).unwrap().to_owned();
        for _ in 0..2 {
            assert_eq!(connection.get(&path, &[("x-api-key", &again)]).await.status, 200);
        }
        assert_eq!(admin(&service, Method::DELETE, "/v1/consumers/mobile-app", "").await.status, 204);
        connection.get(&path, &[("x-api-key", &again)]).await.assert_problem(401, "caller-unauthenticated");
        service.stop().await;
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() { files.extend(walk(&path)) } else { files.push(path) }
    }
    files
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

#[tokio::test]
async fn consumers_are_managed_behind_the_admin_token() {
    let service = Service::start(admin_config()).await;
    let open = send(Method::GET, &service.url("/v1/consumers"), &[], "").await;
    open.assert_problem(401, "admin-token-required");
    assert_eq!(admin(&service, Method::POST, "/v1/consumers", r#"{"name":"a b"}"#).await.status, 400);
    assert_eq!(admin(&service, Method::POST, "/v1/consumers", r#"{"nme":"x"}"#).await.status, 400);
    assert_eq!(
        admin(&service, Method::POST, "/v1/consumers", r#"{"name":"x","metadata":{"plan":"pro"}}"#)
            .await
            .status,
        201
    );
    assert_eq!(admin(&service, Method::POST, "/v1/consumers", r#"{"name":"x"}"#).await.status, 409);
    let changed = admin(&service, Method::PUT, "/v1/consumers/x", r#"{"metadata":{"plan":"max"}}"#).await;
    assert_eq!(changed.status, 200);
    assert!(changed.json().to_string().contains(r#""metadata":{"plan":"max"}"#));
    for name in ["y", "z"] {
        assert_eq!(
            admin(&service, Method::POST, "/v1/consumers", &format!(r#"{{"name":"{name}"}}"#)).await.status,
            201
        );
    }
    let page = admin(&service, Method::GET, "/v1/consumers?limit=2", "").await.json();
    assert_eq!(page.get("next").and_then(Json::as_str), Some("y"));
    let rest = admin(&service, Method::GET, "/v1/consumers?limit=2&cursor=y", "").await.json();
    assert!(rest.to_string().contains(r#""name":"z""#) && rest.get("next").is_none(), "{rest}");
    let past = admin(&service, Method::POST, "/v1/consumers/x/keys", r#"{"expiresAt":1000}"#).await;
    past.assert_problem(400, "invalid-request");
    assert_eq!(admin(&service, Method::POST, "/v1/consumers/nobody/keys", "").await.status, 404);
    assert_eq!(admin(&service, Method::DELETE, "/v1/consumers/x/keys/0000", "").await.status, 404);
    service.stop().await;
}

#[tokio::test]
async fn a_registration_s_callers_are_checked_where_they_stand() {
    let upstream = Upstream::start(|_| Reply::json(MEALS)).await;
    let service = Service::start(admin_config()).await;
    let body = registration(
        &upstream.url(""),
        r#"{"consumers":["ok","no way"],"jwt":[{"issuer":"https://id.example.com/","algorithms":["HS256"]}],"limit":{"requests":0,"perSecond":1}}"#,
    );
    let answer = admin(&service, Method::POST, "/v1/mapping", &body).await;
    let problem = answer.assert_problem(400, "invalid-request");
    let text = problem.to_string();
    for expected in [
        "/callers/consumers/1",
        "/callers/jwt/0/audiences",
        "/callers/jwt/0/algorithms/0",
        "/callers/limit/perSecond",
        "/callers/limit/requests",
    ] {
        assert!(text.contains(expected), "{expected} in {text}");
    }
    assert!(upstream.received().is_empty());
    service.stop().await;
}

#[tokio::test]
async fn each_caller_is_held_to_the_limit_and_told_when_to_come_back() {
    let upstream = Upstream::start(|_| Reply::json(MEALS)).await;
    let service = Service::start(admin_config()).await;
    let path = register(
        &service,
        &registration(&upstream.url(""), r#"{"consumers":["*"],"limit":{"requests":3,"perSeconds":60}}"#),
    )
    .await;
    let (a, _) = consumer_with_key(&service, "a").await;
    let (b, _) = consumer_with_key(&service, "b").await;
    for _ in 0..3 {
        assert_eq!(call(&service, &path, &[("x-api-key", &a)]).await.status, 200);
    }
    let answer = call(&service, &path, &[("x-api-key", &a)]).await;
    answer.assert_problem(429, "caller-rate-limited");
    let retry: u64 = answer.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    assert_eq!(answer.header("ratelimit-policy"), Some(r#""callers";q=3;w=60"#));
    assert_eq!(answer.header("ratelimit"), Some(format!(r#""callers";r=0;t={retry}"#).as_str()));
    // Another caller is not held by the first one's count.
    assert_eq!(call(&service, &path, &[("x-api-key", &b)]).await.status, 200);
    // The registration's live call, and the four calls let through.
    assert_eq!(upstream.received().len(), 5);
    service.stop().await;
}

#[tokio::test]
async fn open_routes_with_credentials_are_warned_of_and_refused_when_callers_are_required() {
    let upstream = Upstream::start(|_| Reply::json(MEALS)).await;
    let with_token = |callers: &str| {
        let callers = if callers.is_empty() { String::new() } else { format!(r#""callers":{callers},"#) };
        format!(
            r#"{{"path":"meal","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"meal"}},"authHeader":{{"type":"Bearer","token":"paid-7d1"}},{callers}"rulesAsString":{RULES}}}"#,
            upstream.url("")
        )
    };
    let service = Service::start(admin_config()).await;
    let warnings = |answer: &Answer| answer.json().get("warnings").map(Json::to_string).unwrap_or_default();
    let open = admin(&service, Method::POST, "/v1/mapping", &with_token("")).await;
    assert_eq!(open.status, 201);
    assert!(
        warnings(&open).contains(r#""location":"/callers""#) && warnings(&open).contains("/authHeader"),
        "{}",
        warnings(&open)
    );
    // Said on purpose, or named: no warning.
    for callers in [r#""open""#, r#"{"consumers":["*"]}"#] {
        let answer = admin(&service, Method::POST, "/v1/mapping", &with_token(callers)).await;
        assert_eq!(answer.status, 201);
        assert!(!warnings(&answer).contains("/callers"), "{callers}: {}", warnings(&answer));
    }
    service.stop().await;

    let strict = Service::start(Config { callers_required: true, ..admin_config() }).await;
    let refused = admin(&strict, Method::POST, "/v1/mapping", &with_token("")).await;
    let problem = refused.assert_problem(400, "invalid-request");
    assert!(problem.to_string().contains("RECAST_CALLERS_REQUIRED"), "{problem}");
    assert_eq!(admin(&strict, Method::POST, "/v1/mapping", &with_token(r#""open""#)).await.status, 201);
    // The refused registration made no live call: only the one that was accepted did.
    assert_eq!(upstream.received().len(), 4);
    strict.stop().await;
}

/// Every file under `dir`, read.
fn all_bytes(dir: &std::path::Path) -> Vec<u8> {
    walk(dir).iter().flat_map(|path| std::fs::read(path).unwrap_or_default()).collect()
}

#[tokio::test]
async fn a_caller_s_key_and_token_reach_no_upstream_log_span_cache_key_store_or_answer() {
    use crate::tokens::{ISSUER, Key, claims};
    use crate::traces::{Collector, Mode};
    let signer = Key::ecdsa("es", false);
    let jwks = serde_json::json!({"keys": [signer.jwk()]}).to_string();
    let jwks: &'static str = Box::leak(jwks.into_boxed_str());
    // One upstream for every path: the key set, good answers, and a failing one.
    let upstream = Upstream::start(move |request| match request.uri.path() {
        "/keys" => Reply::json(jwks),
        "/fail" => Reply::with(500, r#"{"error":"boom"}"#),
        _ => Reply::json(MEALS),
    })
    .await;
    let collector = Collector::start(Mode::Take).await;
    let dir = tempfile::TempDir::new().unwrap();
    let mut binary = crate::binary::Binary::start_with(
        dir.path(),
        &[
            ("RECAST_LOG", "trace"),
            ("RECAST_UPSTREAM_ALLOW", "127.0.0.0/8"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url()),
            ("OTEL_BSP_SCHEDULE_DELAY", "20"),
        ],
    )
    .await;
    let url = |path: &str| binary.url(path);
    let json = [("content-type", "application/json")];
    let created = send(Method::POST, &url("/v1/consumers"), &json, r#"{"name":"app"}"#).await;
    assert_eq!(created.status, 201);
    let issued = send(Method::POST, &url("/v1/consumers/app/keys"), &[], "").await;
    let key = issued.json().get("key").and_then(Json::as_str).unwrap().to_owned();
    let token = signer.token(serde_json::json!({}), &claims(serde_json::json!({})));
    let signature = token.rsplit('.').next().unwrap().to_owned();
    let callers = format!(
        r#"{{"consumers":["app"],"jwt":[{{"issuer":"{ISSUER}","audiences":["orders"],"jwksUri":"{}","algorithms":["ES256"]}}]}}"#,
        upstream.url("/keys")
    );
    let single = format!(
        r#"{{"path":"one","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"meal"}},"callers":{callers},"cache":{{"ttlSeconds":60}},"rulesAsString":{RULES}}}"#,
        upstream.url("")
    );
    let failing =
        single.replace(r#""path":"meal""#, r#""path":"fail""#).replace(r#""path":"one""#, r#""path":"two""#);
    let composed = format!(
        r#"{{"path":"three","sources":{{"meals":{{"originalApi":{{"baseUrl":"{}"}},"path":"meal"}}}},"callers":{callers},"rulesAsString":{{"newBodyFields":{{"id":{{"key":"id","type":"Int"}}}},"oldBodyFields":{{"id":{{"expr":"meals.meals[0].idMeal"}}}}}}}}"#,
        upstream.url("")
    );
    // The registrations come with the caller's credentials too: they go nowhere.
    let bearer = format!("Bearer {token}");
    let with_credentials = [("content-type", "application/json"), ("x-api-key", key.as_str())];
    let mut answers = Vec::new();
    let mut paths = Vec::new();
    for body in [&single, &failing, &composed] {
        let answer = send(Method::POST, &url("/v1/mapping"), &with_credentials, body.clone()).await;
        assert!(answer.status == 201 || answer.status == 502, "{}", String::from_utf8_lossy(&answer.body));
        if answer.status == 201 {
            paths.push(answer.json().get("path").and_then(Json::as_str).unwrap().to_owned());
        }
        answers.push(answer);
    }
    assert_eq!(paths.len(), 2, "the failing route is refused by its live call");
    for path in &paths {
        for credential in [("x-api-key", key.as_str()), ("authorization", bearer.as_str())] {
            for _ in 0..2 {
                answers.push(send(Method::GET, &url(path), &[credential], "").await);
            }
        }
        // Refused ones: a bad key, a token in the URL, a token for a consumer's route.
        answers.push(send(Method::GET, &url(&format!("{path}?access_token={token}")), &[], "").await);
        answers.push(send(Method::GET, &url(path), &[("x-api-key", &format!("{key}x"))], "").await);
        answers.push(send(Method::GET, &url(path), &[("authorization", &format!("{bearer}x"))], "").await);
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(
        statuses,
        [201, 502, 201, 200, 200, 200, 200, 401, 401, 401, 200, 200, 200, 200, 401, 401, 401]
    );
    // The failing upstream: a call through a route whose upstream fails, with each credential.
    let failing_open = failing
        .replace(r#""path":"fail""#, r#""path":"meal""#)
        .replace(r#""path":"two""#, r#""path":"four""#);
    let registered = send(Method::POST, &url("/v1/mapping"), &json, failing_open).await;
    let four = registered.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    let uuid = &four[4..40];
    let broken = failing.replace(r#""path":"two""#, r#""path":"four""#);
    assert_eq!(send(Method::PUT, &url(&format!("/v1/routes/{uuid}")), &json, broken).await.status, 502);
    answers.push(send(Method::GET, &url("/v1/routes"), &[], "").await);
    answers.push(send(Method::GET, &url("/metrics"), &[], "").await);
    // Spans reached the collector, naming the consumer and the issuer.
    let mut spans = Vec::new();
    for _ in 0..200 {
        spans = collector.spans();
        if spans.len() >= 12 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let spans_text = format!("{spans:?}");
    assert!(spans_text.contains("recast.caller.consumer") && spans_text.contains(ISSUER), "{spans_text}");
    binary.terminate();
    let received = format!("{:?}", upstream.received());
    let answered: Vec<u8> = answers
        .iter()
        .flat_map(|a| [format!("{:?}", a.headers).into_bytes(), a.body.to_vec()].concat())
        .collect();
    let log = binary.log_text();
    let stored = all_bytes(dir.path());
    for (what, secret) in [("the key", &key[3..]), ("the token's signature", signature.as_str())] {
        assert!(!received.contains(secret), "{what} reached an upstream");
        assert!(!contains(&answered, secret.as_bytes()), "{what} is in an answer");
        assert!(!log.contains(secret), "{what} is in the log");
        assert!(!spans_text.contains(secret), "{what} is in a span");
        assert!(!contains(&stored, secret.as_bytes()), "{what} is in the data directory");
    }
    assert!(log.lines().filter(|line| line.contains(" TRACE ")).count() > 5, "trace logging was on");
}
