//! Composed routes (SPEC §2.3) through the service, against real upstreams on 127.0.0.1 that
//! count, delay and record what they receive: parallel and chained sources, templates in every
//! place, `forEach` and its concurrency, `when`, optional and required failures, the caller's
//! request reaching sources only through templates, bounds, registration problems, runtime auth.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;
use recast::config::Config;
use serde_json::{Value, json};

use crate::support::{Reply, Service, Upstream, config, get, send};

async fn register(service: &Service, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let answer = send(Method::POST, &service.url("/v1/mapping"), &all, body.to_string()).await;
    (answer.status.as_u16(), serde_json::from_slice(&answer.body).unwrap_or(Value::Null))
}

/// Registers `body` and returns the route's public path.
async fn registered(service: &Service, body: &Value) -> String {
    let (status, answer) = register(service, body, &[]).await;
    assert_eq!(status, 201, "{answer}");
    answer["path"].as_str().unwrap().to_owned()
}

fn source(upstream: &Upstream, path: &str) -> Value {
    json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": path})
}

fn with(mut source: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        source[k] = v.clone();
    }
    source
}

/// Rules that copy what each expression reads into a member of the same name.
pub(crate) fn rules(fields: &[(&str, &str)]) -> Value {
    let mut new = serde_json::Map::new();
    let mut old = serde_json::Map::new();
    for (name, expr) in fields {
        new.insert(name.to_string(), json!({"key": name, "type": "Json"}));
        old.insert(name.to_string(), json!({"expr": expr}));
    }
    json!({"newBodyFields": new, "oldBodyFields": old})
}

fn body(answer: &crate::support::Answer) -> Value {
    serde_json::from_slice(&answer.body).unwrap_or_else(|_| panic!("{:?}", answer.body))
}

#[tokio::test]
async fn parallel_sources_answer_in_the_time_of_the_slowest() {
    let slow = |body: &'static str| {
        Upstream::start(move |_| Reply { delay: Duration::from_millis(200), ..Reply::json(body) })
    };
    let (a, b, c) = (slow(r#"{"v":1}"#).await, slow(r#"{"v":2}"#).await, slow(r#"{"v":3}"#).await);
    let service = Service::start(config()).await;
    let path = registered(
        &service,
        &json!({
            "path": "three",
            "sources": {"a": source(&a, "x"), "b": source(&b, "y"), "c": source(&c, "z")},
            "rulesAsString": rules(&[("sum", "sum([a.v, b.v, c.v])"), ("outcomes", "_sources.*.outcome")]),
        }),
    )
    .await;
    let started = Instant::now();
    let answer = get(&service.url(&path)).await;
    let took = started.elapsed();
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"sum": 6, "outcomes": ["ok", "ok", "ok"]}));
    assert!(took < Duration::from_millis(400), "three 200 ms sources took {took:?}");
    let timing = answer.header("server-timing").unwrap();
    for entry in ["src.a;dur=", "src.b;dur=", "src.c;dur=", "map;dur="] {
        assert!(timing.contains(entry), "{timing}");
    }
    service.stop().await;
}

#[tokio::test]
async fn a_chained_source_reads_earlier_answers_in_path_query_header_and_body() {
    let users = Upstream::json(r#"{"id":"u 7/x","customerNo":1042,"vip":true,"tags":["a","b"]}"#).await;
    let orders = Upstream::start(|_| Reply::json(r#"{"items":[{"price":5},{"price":7}]}"#)).await;
    let service = Service::start(config()).await;
    let orders_source = with(
        source(&orders, "customers/{{user.customerNo}}/orders/{{user.id}}"),
        json!({
            "method": "POST",
            "after": ["user"],
            "queries": {"limit": "5", "vip": "{{user.vip}}", "tag": "{{user.tags}}", "q": "{{request.query.q}}"},
            "headers": {"X-Customer": "c-{{user.customerNo}}"},
            "body": {"customer": "{{user.customerNo}}", "label": "no. {{user.customerNo}}", "tags": "{{user.tags}}", "fixed": [1, {"k": null}]},
        }),
    );
    let path = registered(
        &service,
        &json!({
            "path": "chained",
            "sources": {"user": source(&users, "users/{{request.query.id}}"), "orders": orders_source},
            "sampleRequest": {"query": {"id": "42", "q": "x"}},
            "rulesAsString": rules(&[("total", "sum(orders.items[*].price)"), ("id", "request.query.id")]),
        }),
    )
    .await;
    let answer = get(&service.url(&format!("{path}?id=7&q=a%26b"))).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"total": 12, "id": "7"}));
    let user_calls = users.received();
    assert_eq!(user_calls.last().unwrap().uri.path(), "/users/7");
    // The caller's query is not forwarded: only what templates put there.
    assert_eq!(user_calls.last().unwrap().uri.query(), None);
    let call = orders.received().pop().unwrap();
    assert_eq!(call.method, Method::POST);
    // The value stays in its segment: its space and slash are percent-encoded.
    assert_eq!(call.uri.path(), "/customers/1042/orders/u%207%2Fx");
    let query: Vec<(String, String)> =
        url::form_urlencoded::parse(call.uri.query().unwrap().as_bytes()).into_owned().collect();
    let pairs: Vec<(&str, &str)> = query.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(pairs, [("limit", "5"), ("q", "a&b"), ("tag", "a"), ("tag", "b"), ("vip", "true")]);
    assert_eq!(call.headers["x-customer"], "c-1042");
    let sent: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(
        sent,
        json!({"customer": 1042, "label": "no. 1042", "tags": ["a", "b"], "fixed": [1, {"k": null}]})
    );
    assert_eq!(call.headers["content-type"], "application/json");
    service.stop().await;
}

#[tokio::test]
async fn for_each_calls_at_most_concurrency_at_a_time_and_keeps_element_order() {
    let arrivals: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = arrivals.clone();
    const DELAY: Duration = Duration::from_millis(60);
    let cities = Upstream::start(move |received| {
        seen.lock().unwrap().push(Instant::now());
        let id: u64 = received.uri.path().trim_start_matches("/cities/").parse().unwrap();
        // Later elements answer sooner: the order of the list is the elements', not the answers'.
        let delay = DELAY + Duration::from_millis(20 - id.min(20));
        Reply { delay, ..Reply::json(&format!(r#"{{"id":{id},"name":"c{id}"}}"#)) }
    })
    .await;
    let ids: Vec<u64> = (1..=20).collect();
    let users = Upstream::json(Box::leak(json!({"cities": ids}).to_string().into_boxed_str())).await;
    let service = Service::start(config()).await;
    let path = registered(
        &service,
        &json!({
            "path": "cities",
            "sources": {
                "user": source(&users, "u"),
                "city": with(source(&cities, "cities/{{$item}}"), json!({"after": ["user"], "forEach": "user.cities", "concurrency": 4})),
            },
            "rulesAsString": rules(&[("ids", "city[*].id"), ("statuses", "_sources.city.status")]),
        }),
    )
    .await;
    arrivals.lock().unwrap().clear();
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let out = body(&answer);
    assert_eq!(out["ids"], json!(ids));
    assert_eq!(out["statuses"], json!(vec![200; 20]));
    let times = arrivals.lock().unwrap().clone();
    assert_eq!(times.len(), 20);
    // Each call takes at least DELAY: the calls arrived within DELAY of one another were under
    // way together.
    let most =
        times.iter().map(|t| times.iter().filter(|u| *u <= t && t.duration_since(**u) < DELAY).count()).max();
    assert!(most.unwrap() <= 4, "{most:?} calls at once");
    assert!(most.unwrap() >= 2, "the calls ran one at a time");
    service.stop().await;
}

#[tokio::test]
async fn when_skips_a_source_on_false_and_null() {
    let flags = Upstream::json(r#"{"yes":true,"no":false}"#).await;
    let extra = Upstream::json(r#"{"v":1}"#).await;
    let service = Service::start(config()).await;
    let gated = |when: &str| with(source(&extra, "e"), json!({"after": ["flags"], "when": when}));
    let path = registered(
        &service,
        &json!({
            "path": "when",
            "sources": {"flags": source(&flags, "f"), "t": gated("flags.yes"), "f": gated("flags.no"), "n": gated("flags.missing")},
            "rulesAsString": rules(&[("t", "t.v"), ("f", "f"), ("n", "n"), ("o", "_sources.*.outcome")]),
        }),
    )
    .await;
    let before = extra.received().len();
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    // `_sources` and the document hold the sources in name order: f, flags, n, t.
    assert_eq!(body(&answer), json!({"t": 1, "f": null, "n": null, "o": ["skipped", "ok", "skipped", "ok"]}));
    assert_eq!(extra.received().len() - before, 1, "only the true source is called");
    service.stop().await;
}

#[tokio::test]
async fn an_optional_failure_leaves_null_and_is_named_in_recast_partial() {
    let user = Upstream::json(r#"{"name":"Ada"}"#).await;
    let promo = Upstream::start(|_| Reply::with(503, r#"{"e":1}"#)).await;
    let service = Service::start(config()).await;
    let body_json = json!({
        "path": "partial",
        "sources": {"user": source(&user, "u"), "promo": with(source(&promo, "p"), json!({"optional": true}))},
        "rulesAsString": rules(&[("name", "user.name"), ("promo", "promo"), ("why", "_sources.promo")]),
    });
    let (status, registered) = register(&service, &body_json, &[]).await;
    assert_eq!(status, 201, "{registered}");
    let warnings = registered["warnings"].to_string();
    assert!(warnings.contains("/sources/promo") && warnings.contains("optional"), "{warnings}");
    assert_eq!(registered["sources"]["user"]["status"], 200);
    assert_eq!(registered["sources"]["promo"]["status"], 503);
    assert_eq!(registered["sources"]["promo"]["calls"], 1);
    let answer = get(&service.url(registered["path"].as_str().unwrap())).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        body(&answer),
        json!({"name": "Ada", "promo": null, "why": {"status": 503, "outcome": "failed"}})
    );
    assert_eq!(answer.header("recast-partial"), Some("promo;status=503"));
    let metrics = String::from_utf8_lossy(&get(&service.url("/metrics")).await.body).into_owned();
    for line in [
        "recast_composed_calls_total 2",
        "recast_composed_partial_total 2",
        "recast_source_failures_total{kind=\"status_5xx\",required=\"false\"} 2",
        "recast_source_failures_total{kind=\"status_5xx\",required=\"true\"} 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in\n{metrics}");
    }
    service.stop().await;
}

#[tokio::test]
async fn a_required_failure_answers_as_a_single_upstream_would_with_the_source_named() {
    use std::sync::atomic::{AtomicU8, Ordering};
    let ok = Upstream::json(r#"{"v":1}"#).await;
    let mode = Arc::new(AtomicU8::new(0));
    let now = mode.clone();
    let bad = Upstream::start(move |_| match now.load(Ordering::SeqCst) {
        0 => Reply::json(r#"{"v":2}"#),
        1 => Reply::with(404, r#"{"e":1}"#),
        2 => Reply::with(500, r#"{"e":1}"#),
        3 => Reply { delay: Duration::from_millis(1500), ..Reply::json("{}") },
        _ => Reply { content_type: "text/html", ..Reply::json("<p>") },
    })
    .await;
    let service = Service::start(Config { upstream_timeout_ms: 500, ..config() }).await;
    let route = json!({
        "path": "req",
        "sources": {"ok": source(&ok, "o"), "bad": source(&bad, "b")},
        "rulesAsString": rules(&[("v", "ok.v")]),
    });
    let path = registered(&service, &route).await;
    for (m, status, slug) in [
        (1, 404, "upstream-error"),
        (2, 502, "upstream-error"),
        (3, 504, "upstream-timeout"),
        (4, 502, "upstream-not-json"),
    ] {
        mode.store(m, Ordering::SeqCst);
        let answer = get(&service.url(&path)).await;
        let problem = answer.assert_problem(status, slug);
        assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("bad"), "mode {m}");
        let timing = answer.header("server-timing").unwrap();
        if m == 3 {
            // The source that was done before the other timed out has its entry.
            assert!(timing.contains("src.ok;dur="), "{timing}");
        }
        // A registration's live call that fails the same way stores nothing and names it.
        let (got, problem) = register(&service, &route, &[]).await;
        assert_eq!(got, if status == 504 { 504 } else { 502 }, "mode {m}: {problem}");
        assert_eq!(problem["source"], "bad", "mode {m}");
    }
    assert_eq!(
        get(&service.url("/v1/routes")).await.json().get("routes").unwrap().as_array().len(),
        1,
        "failed registrations store nothing"
    );
    service.stop().await;
}

/// An upstream on raw TCP: while `answering`, it answers every request `{"v":1}`; else it reads
/// a request's head and never answers, and counts the connections closed by the other side
/// while such a request was waiting.
struct Silent {
    url: String,
    answering: Arc<std::sync::atomic::AtomicBool>,
    waiting: Arc<std::sync::atomic::AtomicUsize>,
    cancelled: Arc<std::sync::atomic::AtomicUsize>,
}

async fn silent_upstream() -> Silent {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let answering = Arc::new(AtomicBool::new(true));
    let waiting = Arc::new(AtomicUsize::new(0));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let (an, w, c) = (answering.clone(), waiting.clone(), cancelled.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (an, w, c) = (an.clone(), w.clone(), c.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                let mut pending = false;
                loop {
                    match tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf)).await {
                        Ok(Ok(0)) | Ok(Err(_)) => {
                            if pending {
                                c.fetch_add(1, Ordering::SeqCst);
                            }
                            return;
                        }
                        Ok(Ok(n)) => {
                            seen.extend_from_slice(&buf[..n]);
                            if seen.windows(4).any(|w| w == b"\r\n\r\n") {
                                seen.clear();
                                if an.load(Ordering::SeqCst) {
                                    let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{\"v\":1}";
                                    let _ = stream.write_all(reply.as_bytes()).await;
                                } else {
                                    pending = true;
                                    w.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                        }
                        Err(_) => return,
                    }
                }
            });
        }
    });
    Silent { url, answering, waiting, cancelled }
}

#[tokio::test]
async fn a_required_failure_cancels_what_is_under_way_and_starts_nothing_more() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let held = silent_upstream().await;
    let failing_now = Arc::new(AtomicBool::new(false));
    let flag = failing_now.clone();
    let failing = Upstream::start(move |_| {
        if flag.load(Ordering::SeqCst) {
            Reply { delay: Duration::from_millis(150), ..Reply::with(404, "{}") }
        } else {
            Reply::json("{}")
        }
    })
    .await;
    let later = Upstream::json("{}").await;
    // Answers well, but only after `failing` has failed: what waits for it is never started.
    let slow = Upstream::start(|_| Reply { delay: Duration::from_millis(600), ..Reply::json("{}") }).await;
    let service = Service::start(config()).await;
    let path = registered(
        &service,
        &json!({
            "path": "cancel",
            "sources": {
                "held": {"originalApi": {"baseUrl": held.url}, "path": "h"},
                "failing": source(&failing, "f"),
                "slow": source(&slow, "s"),
                "later": with(source(&later, "l"), json!({"after": ["slow"]})),
            },
            "rulesAsString": rules(&[("v", "held.v")]),
        }),
    )
    .await;
    held.answering.store(false, Ordering::SeqCst);
    failing_now.store(true, Ordering::SeqCst);
    let later_before = later.received().len();
    let started = Instant::now();
    let answer = get(&service.url(&path)).await;
    let problem = answer.assert_problem(404, "upstream-error");
    assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("failing"));
    assert!(started.elapsed() < Duration::from_secs(5), "the call waited for the held source");
    assert_eq!(held.waiting.load(Ordering::SeqCst), 1, "the held source was under way");
    crate::support::reached(&held.cancelled, 1, "the held source's connection was not closed").await;
    // `slow` answers after the failure: nothing waits for it any more, and `later` is never called.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(later.received().len(), later_before, "a source was started after a required failure");
    service.stop().await;
}

#[tokio::test]
async fn the_callers_request_reaches_sources_only_through_templates() {
    let upstream = Upstream::json(r#"{"v":1}"#).await;
    let service = Service::start(config()).await;
    let path = registered_with(
        &service,
        &json!({
            "path": "only",
            "method": "POST",
            "forwardHeaders": ["Accept-Language", "X-Trace"],
            "sources": {
                "plain": with(source(&upstream, "plain"), json!({"method": "POST"})),
                "templated": with(source(&upstream, "t"), json!({
                    "method": "POST",
                    "headers": {"X-Lang": "{{request.headers.\"accept-language\" || 'none'}}"},
                    "body": {"echo": "{{request.body.name}}"},
                    "authHeader": {"type": "Runtime"},
                })),
            },
            "sampleRequest": {"query": {"a": "1"}, "body": {"name": "n"}},
            "rulesAsString": rules(&[("v", "plain.v")]),
        }),
        &[("x-mapped-auth", "Bearer sample")],
    )
    .await;
    let before = upstream.received().len();
    let answer = send(
        Method::POST,
        &service.url(&format!("{path}?a=1&b=2")),
        &[
            ("content-type", "application/json"),
            ("accept-language", "fr"),
            ("accept", "application/xml"),
            ("cookie", "session=1"),
            ("authorization", "Bearer caller"),
            ("x-mapped-auth", "Bearer mapped"),
            ("x-trace", "t1"),
        ],
        r#"{"name":"Ada","secret":"s"}"#,
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let calls = &upstream.received()[before..];
    assert_eq!(calls.len(), 2);
    let plain = calls.iter().find(|c| c.uri.path() == "/plain").unwrap();
    let templated = calls.iter().find(|c| c.uri.path() == "/t").unwrap();
    for call in [plain, templated] {
        assert_eq!(call.uri.query(), None);
        for header in ["cookie", "accept-language", "x-trace", "x-mapped-auth"] {
            assert!(!call.headers.contains_key(header), "{header} reached {}", call.uri.path());
        }
        assert_ne!(call.headers.get("accept").map(|v| v.as_bytes()), Some(&b"application/xml"[..]));
    }
    // Nothing of the body reached the plain source; only the named value the templated one.
    assert!(plain.body.is_empty(), "{:?}", plain.body);
    assert!(
        !plain.headers.contains_key("authorization"),
        "X-Mapped-Auth reached a source that is not Runtime"
    );
    assert_eq!(serde_json::from_slice::<Value>(&templated.body).unwrap(), json!({"echo": "Ada"}));
    assert_eq!(templated.headers["x-lang"], "fr");
    assert_eq!(templated.headers["authorization"], "Bearer mapped");
    // Without X-Mapped-Auth the runtime-auth route makes no call.
    let before = upstream.received().len();
    let answer = send(Method::POST, &service.url(&path), &[("content-type", "application/json")], "{}").await;
    answer.assert_problem(401, "auth-required");
    assert_eq!(upstream.received().len(), before);
    service.stop().await;
}

async fn registered_with(service: &Service, body: &Value, headers: &[(&str, &str)]) -> String {
    let (status, answer) = register(service, body, headers).await;
    assert_eq!(status, 201, "{answer}");
    answer["path"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_template_on_a_missing_query_parameter_answers_400_and_calls_nothing() {
    let upstream = Upstream::json(r#"{"v":1}"#).await;
    let service = Service::start(config()).await;
    let path = registered(
        &service,
        &json!({
            "path": "q",
            "sources": {"user": source(&upstream, "users/{{request.query.id}}")},
            "sampleRequest": {"query": {"id": "1"}},
            "rulesAsString": rules(&[("v", "user.v")]),
        }),
    )
    .await;
    let before = upstream.received().len();
    let answer = get(&service.url(&path)).await;
    let problem = answer.assert_problem(400, "bad-request");
    assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("user"));
    let detail = problem.get("detail").and_then(|s| s.as_str()).unwrap();
    assert!(detail.contains("/sources/user/path") && detail.contains("null"), "{detail}");
    // A value that would leave its segment fails the source instead.
    let answer = get(&service.url(&format!("{path}?id=.."))).await;
    answer.assert_problem(400, "bad-request");
    assert_eq!(upstream.received().len(), before, "no call was made");
    // A step up hidden behind an encoded slash fails the source too: an upstream that decodes
    // `%2F` first would take it as one.
    for hidden in ["..%2Fadmin", "a%2F..%2F..%2Fadmin", "%2e%2e%2fadmin", "x%5C..%5Cy"] {
        let answer = get(&service.url(&format!("{path}?id={hidden}"))).await;
        answer.assert_problem(400, "bad-request");
    }
    assert_eq!(upstream.received().len(), before, "no call was made");
    // A value with every other dangerous character stays in its segment.
    let hostile = "%40evil.example%2F%3Fx%3D1%23%20%0A%25";
    let answer = get(&service.url(&format!("{path}?id={hostile}"))).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let call = upstream.received().pop().unwrap();
    assert_eq!(call.uri.path(), "/users/%40evil.example%2F%3Fx%3D1%23%20%0A%25");
    assert_eq!(call.uri.query(), None);
    service.stop().await;
}

#[tokio::test]
async fn registration_refuses_cycles_unknown_names_and_misplaced_members_at_their_location() {
    let upstream = Upstream::json("{}").await;
    let service = Service::start(config()).await;
    let base = upstream.url("/");
    let (status, problem) = register(
        &service,
        &json!({
            "path": "bad",
            "authHeader": {"type": "Bearer", "token": "t"},
            "sources": {
                "a": {"originalApi": {"baseUrl": base}, "path": "x", "after": ["b"]},
                "b": {"originalApi": {"baseUrl": base}, "path": "x", "after": ["a"]},
            },
            "rulesAsString": rules(&[("v", "a")]),
        }),
        &[],
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    let text = problem["errors"].to_string();
    assert!(text.contains("\"/authHeader\""), "{text}");
    let (status, problem) = register(
        &service,
        &json!({
            "path": "bad",
            "sources": {
                "a": {"originalApi": {"baseUrl": base}, "path": "x", "after": ["b"]},
                "b": {"originalApi": {"baseUrl": base}, "path": "x", "after": ["a"]},
            },
            "rulesAsString": rules(&[("v", "a")]),
        }),
        &[],
    )
    .await;
    assert_eq!(status, 400);
    let text = problem["errors"].to_string();
    assert!(text.contains("cycle") && text.contains("/sources/a/after"), "{text}");
    let (status, problem) = register(
        &service,
        &json!({
            "path": "bad",
            "sources": {
                "user": {"originalApi": {"baseUrl": base}, "path": "u", "after": ["usr"], "retrys": 1},
                "orders": {"originalApi": {"baseUrl": base}, "path": "o/{{user.id}}", "queries": {"c": "{{ordrs.x}}"}, "forEach": "[1]"},
                "request": {"originalApi": {"baseUrl": base}, "path": "x"},
                "city": {"originalApi": {"baseUrl": base}, "path": "c?x={{request.query.x}}", "headers": {"Host": "h"}},
            },
            "rulesAsString": rules(&[("v", "user")]),
        }),
        &[],
    )
    .await;
    assert_eq!(status, 400);
    let errors = problem["errors"].as_array().unwrap();
    let at = |location: &str| {
        errors
            .iter()
            .filter(|e| e["location"] == location)
            .map(|e| e["message"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    assert!(at("/sources/user/retrys").contains("did you mean `retry`"), "{problem}");
    assert!(at("/sources/request").contains("request"), "{problem}");
    service.stop().await;
    // The graph and templates are checked once the shape is sound.
    let service = Service::start(config()).await;
    let (status, problem) = register(
        &service,
        &json!({
            "path": "bad",
            "sources": {
                "user": {"originalApi": {"baseUrl": base}, "path": "u", "after": ["usr"]},
                "orders": {"originalApi": {"baseUrl": base}, "path": "o/{{user.id}}", "queries": {"c": "{{ordrs.x}}"}},
                "city": {"originalApi": {"baseUrl": base}, "path": "c?x={{request.query.x}}", "headers": {"Host": "h"}},
                "whole": {"originalApi": {"baseUrl": base}, "path": "w/{{@}}"},
            },
            "rulesAsString": rules(&[("v", "user")]),
        }),
        &[],
    )
    .await;
    assert_eq!(status, 400);
    let errors = problem["errors"].as_array().unwrap();
    let at = |location: &str| {
        errors
            .iter()
            .filter(|e| e["location"] == location)
            .map(|e| e["message"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    assert!(at("/sources/orders/path").contains("add \"user\" to its `after`"), "{problem}");
    assert!(at("/sources/orders/queries/c").contains("did you mean `orders`"), "{problem}");
    assert!(at("/sources/city/path").contains("queries"), "{problem}");
    assert!(at("/sources/whole/path").contains("whole context"), "{problem}");
    assert!(at("/sources/user/after/0").contains("did you mean `user`"), "{problem}");
    assert!(at("/sources/city/headers/Host").contains("cannot"), "{problem}");
    service.stop().await;
}

#[tokio::test]
async fn the_bounds_of_a_composition_hold() {
    let ids = Upstream::json(r#"{"ids":[1,2,3,4,5]}"#).await;
    let item = Upstream::json(r#"{"x":"0123456789"}"#).await;
    let service = Service::start(Config { max_source_calls: 8, max_composed_bytes: 100, ..config() }).await;
    let base = json!({"path": "b", "rulesAsString": rules(&[("v", "ids")])});
    let mut worst = base.clone();
    worst["sources"] = json!({
        "ids": source(&ids, "i"),
        "each": with(source(&item, "e/{{$item}}"), json!({"after": ["ids"], "forEach": "ids.ids", "maxCalls": 4, "retry": {"attempts": 1, "on": [503]}})),
    });
    let (status, problem) = register(&service, &worst, &[]).await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem["errors"].to_string().contains("RECAST_MAX_SOURCE_CALLS"), "{problem}");
    // More elements than `maxCalls` fail the source; the list is never cut short.
    let mut more = base.clone();
    more["sources"] = json!({
        "ids": source(&ids, "i"),
        "each": with(source(&item, "e/{{$item}}"), json!({"after": ["ids"], "forEach": "ids.ids", "maxCalls": 4})),
    });
    let (status, problem) = register(&service, &more, &[]).await;
    assert_eq!(status, 502, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("maxCalls"), "{problem}");
    // The answers together pass RECAST_MAX_COMPOSED_BYTES.
    let mut large = base.clone();
    large["sources"] = json!({
        "ids": source(&ids, "i"),
        "each": with(source(&item, "e/{{$item}}"), json!({"after": ["ids"], "forEach": "ids.ids", "maxCalls": 7})),
    });
    let (status, problem) = register(&service, &large, &[]).await;
    assert_eq!(status, 502, "{problem}");
    assert_eq!(problem["type"], "https://recast.dev/problems/mapping-limit", "{problem}");
    assert_eq!(problem["source"], "each");
    // Identical requests within one call are sent once.
    let dup = Upstream::json(r#"{"ids":[1,1,1,2]}"#).await;
    let mut shared = base.clone();
    shared["sources"] = json!({
        "ids": source(&dup, "i"),
        "each": with(source(&item, "e/{{$item}}"), json!({"after": ["ids"], "forEach": "ids.ids", "maxCalls": 4})),
    });
    let before = item.received().len();
    let (status, answer) = register(&service, &shared, &[]).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(item.received().len() - before, 2, "four elements, two distinct requests");
    assert_eq!(answer["sources"]["each"]["calls"], 2);
    service.stop().await;
}

#[tokio::test]
async fn a_composition_is_listed_masked_and_survives_a_restart() {
    let upstream = Upstream::json(r#"{"v":1}"#).await;
    let dir = tempfile::TempDir::new().unwrap();
    let service = Service::start_in(config(), dir.path()).await;
    let path = registered(
        &service,
        &json!({
            "path": "kept",
            "sources": {"a": with(source(&upstream, "a"), json!({"authHeader": {"type": "Bearer", "token": "s3cret-token"}}))},
            "rulesAsString": rules(&[("v", "a.v")]),
        }),
    )
    .await;
    let listing = get(&service.url("/v1/routes")).await;
    let text = String::from_utf8_lossy(&listing.body).into_owned();
    assert!(!text.contains("s3cret-token"), "{text}");
    let listed: Value = serde_json::from_slice(&listing.body).unwrap();
    assert_eq!(listed["routes"][0]["sources"]["a"]["authHeader"], json!({"type": "Bearer", "token": "***"}));
    assert!(listed["routes"][0].get("originalRoute").is_none());
    service.stop().await;
    // The data directory holds the composition sealed: its token is in no file in the clear.
    fn files_holding(dir: &std::path::Path, needle: &[u8], read: &mut usize) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                found.extend(files_holding(&path, needle, read));
            } else if let Ok(bytes) = std::fs::read(&path) {
                *read += 1;
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(path.display().to_string());
                }
            }
        }
        found
    }
    let mut read = 0;
    assert_eq!(files_holding(dir.path(), b"s3cret-token", &mut read), Vec::<String>::new());
    assert!(read > 0, "the data directory has files");
    let service = Service::start_in(config(), dir.path()).await;
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"v": 1}));
    assert_eq!(upstream.received().last().unwrap().headers["authorization"], "Bearer s3cret-token");
    service.stop().await;
}

/// The fenced block of `docs/composition.md` whose info string is `json <name>`.
fn doc_block(doc: &str, name: &str) -> Value {
    let fence = format!("```json {name}\n");
    let start = doc.find(&fence).unwrap_or_else(|| panic!("no `{name}` block")) + fence.len();
    let end = start + doc[start..].find("```").unwrap();
    serde_json::from_str(&doc[start..end]).unwrap_or_else(|e| panic!("the `{name}` block: {e}"))
}

#[tokio::test]
async fn the_worked_example_of_the_docs_runs_as_written() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/composition.md")).unwrap();
    let answers = doc_block(&doc, "answers");
    let output = doc_block(&doc, "output");
    let upstream = Upstream::start(move |received| {
        let target = received.uri.path_and_query().map(|p| p.as_str()).unwrap_or_default();
        match answers.get(target) {
            Some(answer) => Reply::json(&answer.to_string()),
            None if target == "/promo/today" => Reply::with(503, r#"{"error":"later"}"#),
            None => Reply::with(404, "{}"),
        }
    })
    .await;
    let registration =
        doc_block(&doc, "registration").to_string().replace("http://upstream.example/", &upstream.url("/"));
    let service = Service::start(config()).await;
    let (status, answer) = register(&service, &serde_json::from_str(&registration).unwrap(), &[]).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["sources"]["city"]["calls"], 2, "{answer}");
    assert!(answer["warnings"].to_string().contains("/sources/promo"), "{answer}");
    let path = answer["path"].as_str().unwrap();
    let call = get(&service.url(&format!("{path}?id=42"))).await;
    assert_eq!(call.status, 200, "{:?}", call.body);
    assert_eq!(call.header("recast-partial"), Some("promo;status=503"));
    assert_eq!(body(&call), output);
    service.stop().await;
}

#[test]
fn the_readme_points_to_the_composition_guide_whose_example_runs() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let line =
        readme.lines().find(|l| l.contains("**Composed.**")).expect("the README's composed-routes line");
    assert!(line.contains("several APIs"), "{line}");
    assert!(readme.contains("(docs/composition.md)"), "the README links the guide");
    // The guide's blocks are the ones `the_worked_example_of_the_docs_runs_as_written` runs.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/composition.md")).unwrap();
    for block in ["registration", "answers", "output"] {
        assert!(doc_block(&doc, block).is_object(), "the `{block}` block");
    }
}

#[tokio::test]
async fn a_cached_composition_is_keyed_on_what_it_reads_and_never_keeps_a_partial_answer() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let user = Upstream::json(r#"{"v":1}"#).await;
    let promo_fails = Arc::new(AtomicBool::new(false));
    let flag = promo_fails.clone();
    let promo = Upstream::start(move |_| {
        if flag.load(Ordering::SeqCst) { Reply::with(503, "{}") } else { Reply::json(r#"{"p":1}"#) }
    })
    .await;
    let service = Service::start(config()).await;
    let path = registered_with(
        &service,
        &json!({
            "path": "cached",
            "cache": {"ttlSeconds": 60},
            "forwardHeaders": ["Accept-Language"],
            "sources": {
                "user": with(source(&user, "u/{{request.query.id}}"), json!({"authHeader": {"type": "Runtime"}})),
                "promo": with(source(&promo, "p"), json!({"optional": true})),
            },
            "sampleRequest": {"query": {"id": "1"}},
            "rulesAsString": rules(&[("v", "user.v"), ("p", "promo.p")]),
        }),
        &[("x-mapped-auth", "Bearer a")],
    )
    .await;
    let calls = || user.received().len();
    let call = |query: &'static str, auth: &'static str, lang: &'static str| {
        let url = service.url(&format!("{path}?{query}"));
        async move {
            send(
                Method::GET,
                &url,
                &[("x-mapped-auth", auth), ("accept-language", lang), ("x-other", query)],
                "",
            )
            .await
        }
    };
    let before = calls();
    let first = call("id=1&x=2", "Bearer a", "en").await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(calls() - before, 1);
    // The same query in another order, another header that is not forwarded: the same key.
    let again = call("x=2&id=1", "Bearer a", "en").await;
    assert!(again.header("cache-status").unwrap().contains("hit"), "{:?}", again.headers);
    assert_eq!(calls() - before, 1);
    assert_eq!(again.body, first.body);
    // Another caller's credential, a forwarded header, the query: each its own key.
    for (query, auth, lang) in
        [("id=1&x=2", "Bearer b", "en"), ("id=1&x=2", "Bearer a", "fr"), ("id=1&x=3", "Bearer a", "en")]
    {
        let before = calls();
        let answer = call(query, auth, lang).await;
        assert_eq!(answer.status, 200);
        assert_eq!(calls() - before, 1, "{query} {auth} {lang} was answered from another key");
    }
    // A partial answer is answered, never kept.
    promo_fails.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        let before = calls();
        let answer = call("id=9", "Bearer a", "en").await;
        assert_eq!(answer.header("recast-partial"), Some("promo;status=503"));
        assert_eq!(calls() - before, 1, "a partial answer was kept");
    }
    service.stop().await;
}

#[tokio::test]
async fn past_max_buffered_bytes_new_calls_answer_503_until_the_answers_are_let_go() {
    use std::sync::atomic::Ordering;
    let big =
        Upstream::json(Box::leak(format!(r#"{{"pad":"{}"}}"#, "x".repeat(4000)).into_boxed_str())).await;
    let held = silent_upstream().await;
    let service = Service::start(Config { max_buffered_bytes: 2000, ..config() }).await;
    let path = registered(
        &service,
        &json!({
            "path": "buffered",
            "sources": {"big": source(&big, "b"), "slow": {"originalApi": {"baseUrl": held.url}, "path": "s"}},
            "rulesAsString": rules(&[("v", "slow.v")]),
        }),
    )
    .await;
    let single = crate::routes::registration(&big.url("/"), "", "");
    let (status, single) = register(&service, &serde_json::from_str(&single).unwrap(), &[]).await;
    assert_eq!(status, 201, "{single}");
    held.answering.store(false, Ordering::SeqCst);
    // One call holds the big answer while its slow source is held.
    let url = service.url(&path);
    let holding = tokio::spawn(async move { get(&url).await });
    crate::support::reached(&held.waiting, 1, "the slow source was not called").await;
    let refused = get(&service.url(&path)).await;
    refused.assert_problem(503, "overloaded");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(String::from_utf8_lossy(&refused.body).contains("RECAST_MAX_BUFFERED_BYTES"));
    // A single-upstream route is refused as well: the bound is the process's.
    get(&service.url(single["path"].as_str().unwrap())).await.assert_problem(503, "overloaded");
    holding.abort();
    let _ = holding.await;
    held.answering.store(true, Ordering::SeqCst);
    // The call is gone: what it held is let go, and calls are taken again.
    let mut answered = 0;
    for _ in 0..100 {
        let answer = get(&service.url(&path)).await;
        if answer.status != 503 {
            answered = answer.status.as_u16();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(answered, 200, "calls were still refused after the holding call ended");
    service.stop().await;
}

#[tokio::test]
async fn a_bound_lowered_after_registration_holds_each_call_and_sends_nothing_past_it() {
    let ids = Upstream::json(r#"{"ids":[1,2,3]}"#).await;
    let item = Upstream::json(r#"{"x":1}"#).await;
    let dir = tempfile::TempDir::new().unwrap();
    let service = Service::start_in(config(), dir.path()).await;
    let path = registered(
        &service,
        &json!({
            "path": "lowered",
            "sources": {
                "ids": source(&ids, "i"),
                "each": with(source(&item, "e/{{$item}}"), json!({"after": ["ids"], "forEach": "ids.ids", "maxCalls": 4, "concurrency": 1})),
            },
            "rulesAsString": rules(&[("x", "each[*].x")]),
        }),
    )
    .await;
    service.stop().await;
    let service = Service::start_in(Config { max_source_calls: 2, ..config() }, dir.path()).await;
    let before = item.received().len();
    let answer = get(&service.url(&path)).await;
    let problem = answer.assert_problem(502, "mapping-limit");
    assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("each"));
    assert!(String::from_utf8_lossy(&answer.body).contains("RECAST_MAX_SOURCE_CALLS"));
    // `ids` took one of the two, `each` the other: one element was called, then nothing more.
    assert_eq!(item.received().len() - before, 1);
    service.stop().await;
}

#[tokio::test]
async fn what_a_template_over_item_reads_is_the_sources_and_call_bounds_end_the_call() {
    let ids = Upstream::json(r#"{"ids":[{"id":1},{"nope":2}]}"#).await;
    let item = Upstream::json(r#"{"x":1}"#).await;
    let big = Upstream::json(r#"{"pad":"0123456789012345678901234567890123456789"}"#).await;
    let service = Service::start(Config { max_composed_bytes: 60, ..config() }).await;
    // A `%` that starts no escape before a template is refused at registration.
    let (status, problem) = register(
        &service,
        &json!({"path": "p", "sources": {"a": source(&ids, "files/%{{request.query.a}}")}, "rulesAsString": rules(&[("v", "a")])}),
        &[],
    )
    .await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem["errors"].to_string().contains("must start an escape"), "{problem}");
    // `$item` is a value of `ids`' answer: at registration, a template over a member its live
    // call lacks is the registration's mistake (400 at the template, with the member and the
    // name probably meant); at a call, an answer that changed shape is not the caller's (502
    // template-failed, naming no member of the answer).
    let items = |path: &str, template: &str| {
        json!({
            "path": path,
            "sources": {
                "ids": source(&ids, "i"),
                "each": with(source(&item, template), json!({"after": ["ids"], "forEach": "ids.ids"})),
            },
            "rulesAsString": rules(&[("v", "each")]),
        })
    };
    let (status, problem) = register(&service, &items("items", "e/{{$item.id}}"), &[]).await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(problem["type"], "https://recast.dev/problems/invalid-request");
    assert_eq!(problem["source"], "each");
    // The element whose request failed is named by its index.
    assert_eq!(problem["element"], 1, "{problem}");
    assert_eq!(
        problem["errors"],
        json!([{"location": "/sources/each/path", "message": "its value is null: `$item` has no member `id`"}]),
    );
    let (status, problem) = register(&service, &items("typo", "e/{{ids.ids[0].idd}}"), &[]).await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(
        problem["errors"][0]["message"],
        "its value is null: `ids.ids[0]` has no member `idd` (did you mean `id`?)"
    );
    let shape = Arc::new(Mutex::new(r#"{"ids":[{"id":1}]}"#));
    let changing = {
        let shape = shape.clone();
        Upstream::start(move |_| Reply::json(*shape.lock().unwrap())).await
    };
    let mut later = items("later", "e/{{$item.id}}");
    later["sources"]["ids"] = source(&changing, "i");
    let (status, registered) = register(&service, &later, &[]).await;
    assert_eq!(status, 201, "{registered}");
    *shape.lock().unwrap() = r#"{"ids":[{"secret_name":2}]}"#;
    let failed = get(&service.url(registered["path"].as_str().unwrap())).await;
    failed.assert_problem(502, "template-failed");
    assert!(!String::from_utf8_lossy(&failed.body).contains("secret_name"), "{:?}", failed.body);
    // RECAST_MAX_COMPOSED_BYTES passed by an optional source still ends the call.
    let (status, problem) = register(
        &service,
        &json!({
            "path": "bytes",
            "sources": {"ids": source(&ids, "i"), "big": with(source(&big, "b"), json!({"optional": true, "after": ["ids"]}))},
            "rulesAsString": rules(&[("v", "ids")]),
        }),
        &[],
    )
    .await;
    assert_eq!(status, 502, "{problem}");
    assert_eq!(problem["type"], "https://recast.dev/problems/mapping-limit");
    assert_eq!(problem["source"], "big");
    service.stop().await;
}

#[tokio::test]
async fn an_optional_for_each_past_its_bound_keeps_what_came_and_a_header_credential_is_masked() {
    let list = Upstream::json(r#"{"n":[1,2,3]}"#).await;
    let item = Upstream::start(|received| {
        // Element 2 answers after the source's bound.
        let slow = received.uri.path().ends_with("/2");
        Reply { delay: Duration::from_millis(if slow { 1500 } else { 0 }), ..Reply::json(r#"{"x":1}"#) }
    })
    .await;
    let service = Service::start(config()).await;
    let path = registered(
        &service,
        &json!({
            "path": "partial-list",
            "sources": {
                "list": with(source(&list, "l"), json!({"headers": {"Authorization": "Bearer hdr-secret-1"}})),
                "each": with(source(&item, "e/{{$item}}"), json!({
                    "after": ["list"], "forEach": "list.n", "optional": true, "timeoutMs": 300, "concurrency": 3,
                })),
            },
            "rulesAsString": rules(&[("each", "each"), ("why", "_sources.each")]),
        }),
    )
    .await;
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(
        body(&answer),
        json!({
            "each": [{"x": 1}, null, {"x": 1}],
            "why": {"status": [200, null, 200], "outcome": ["ok", "timeout", "ok"]},
        })
    );
    assert_eq!(answer.header("recast-partial"), Some("each;status=timeout;failed=1"));
    let listing = String::from_utf8_lossy(&get(&service.url("/v1/routes")).await.body).into_owned();
    assert!(!listing.contains("hdr-secret-1"), "{listing}");
    assert!(listing.contains(r#""Authorization":"***""#), "{listing}");
    service.stop().await;
}

#[tokio::test]
async fn identical_requests_of_different_sources_are_sent_once_per_call() {
    let upstream = Upstream::json(r#"{"v":1}"#).await;
    let other = Upstream::json(r#"{"v":2}"#).await;
    let service = Service::start(config()).await;
    let path = registered(
        &service,
        &json!({
            "path": "shared",
            "sources": {
                "a": source(&upstream, "same"),
                "b": source(&upstream, "same"),
                // The same path with another credential is another request.
                "c": with(source(&upstream, "same"), json!({"authHeader": {"type": "Bearer", "token": "t"}})),
                "d": source(&other, "same"),
            },
            "rulesAsString": rules(&[("v", "[a.v, b.v, c.v, d.v]")]),
        }),
    )
    .await;
    let before = upstream.received().len();
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"v": [1, 1, 1, 2]}));
    assert_eq!(upstream.received().len() - before, 2, "a and b share one request; c sends its own");
    service.stop().await;
}

#[tokio::test]
async fn a_composition_is_updated_like_a_route_and_an_update_that_fails_keeps_the_old_one() {
    let first = Upstream::json(r#"{"v":1}"#).await;
    let second = Upstream::json(r#"{"v":2}"#).await;
    let service = Service::start(config()).await;
    let route_body = |upstream: &Upstream| json!({"path": "updated", "sources": {"a": source(upstream, "x")}, "rulesAsString": rules(&[("v", "a.v")])});
    let path = registered(&service, &route_body(&first)).await;
    let uuid = path.split('/').nth(2).unwrap().to_owned();
    let put = |value: Value| {
        let url = service.url(&format!("/v1/routes/{uuid}"));
        async move { send(Method::PUT, &url, &[("content-type", "application/json")], value.to_string()).await }
    };
    // A cycle is refused at its place; the route keeps serving as it was.
    let mut cyclic = route_body(&second);
    cyclic["sources"]["a"]["after"] = json!(["a"]);
    let refused = put(cyclic).await;
    assert_eq!(refused.status, 400, "{:?}", refused.body);
    assert!(String::from_utf8_lossy(&refused.body).contains("/sources/a/after"));
    assert_eq!(body(&get(&service.url(&path)).await), json!({"v": 1}));
    // A sound update is validated by its live call and serves from then on.
    let updated = put(route_body(&second)).await;
    assert_eq!(updated.status, 200, "{:?}", updated.body);
    let answer: Value = serde_json::from_slice(&updated.body).unwrap();
    assert_eq!(answer["sources"]["a"]["status"], 200);
    assert_eq!(body(&get(&service.url(&path)).await), json!({"v": 2}));
    service.stop().await;
}

/// A source's `rateLimit` holds for that source alone, as a route's does for its upstream: past
/// it an optional source is `null` and named in `Recast-Partial` (nothing sent), a required one
/// answers 429 `upstream-rate-limited` naming it, and the other sources of the call are not held.
#[tokio::test]
async fn a_source_s_rate_limit_holds_for_that_source_alone() {
    let free = Upstream::json(r#"{"v":1}"#).await;
    let limited = Upstream::json(r#"{"w":2}"#).await;
    let service = Service::start(config()).await;
    let limit = json!({"requestsPerSecond": 1, "burst": 1, "maxWaitMs": 0});
    let composition = |optional: bool| {
        json!({
            "path": format!("limited-{optional}"),
            "sources": {"free": source(&free, "f"),
                        "limited": with(source(&limited, "l"), json!({"rateLimit": limit, "optional": optional}))},
            "rulesAsString": rules(&[("v", "free.v"), ("w", "limited.w")]),
        })
    };
    // The live call takes the one request a second the limit allows; the call after it at once
    // finds none.
    let optional = registered(&service, &composition(true)).await;
    let answer = get(&service.url(&optional)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"v": 1, "w": null}));
    let partial = answer.header("recast-partial").unwrap_or_default();
    assert!(partial.starts_with("limited;status=") && partial.contains("rate"), "{partial}");
    assert_eq!((free.received().len(), limited.received().len()), (2, 1));
    // A required source past its limit answers as a single route would, naming the source.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let required = registered(&service, &composition(false)).await;
    let refused = get(&service.url(&required)).await;
    assert_eq!(refused.status, 429, "{:?}", refused.body);
    let problem = body(&refused);
    assert_eq!(problem["type"], "https://recast.dev/problems/upstream-rate-limited", "{problem}");
    assert_eq!(problem["source"], "limited", "{problem}");
    assert_eq!(limited.received().len(), 2, "nothing is sent past the limit");
    service.stop().await;
}

/// A composed route's registration warns of a name its rules read that the live call's document
/// lacks, with the name probably meant: the live call's document is read whole for that, though
/// a call reads only what the rules read.
#[tokio::test]
async fn a_composed_registration_suggests_the_names_its_rules_may_have_meant() {
    let orders = Upstream::json(r#"{"total":3,"items":[{"price":5}]}"#).await;
    let service = Service::start(config()).await;
    let mut registration = json!({
        "path": "typo",
        "sources": {"orders": source(&orders, "o")},
        "rulesAsString": {"newBodyFields": {"n": {"key": "n", "type": "Int"}, "p": {"key": "p", "type": "Int"}},
                          "oldBodyFields": {"n": {"keys": ["totl"], "parents": ["orders"]},
                                            "p": {"keys": ["price"], "parents": ["ordrs", "items"]}}},
    });
    let (status, answer) = register(&service, &registration, &[]).await;
    assert_eq!(status, 201, "{answer}");
    let warnings = answer["warnings"].to_string();
    for expected in
        ["has no member `totl` (did you mean `total`?)", "has no member `ordrs` (did you mean `orders`?)"]
    {
        assert!(warnings.contains(expected), "{expected} in {warnings}");
    }
    // The same route without the typos maps, and warns of neither.
    registration["path"] = json!("fixed");
    registration["rulesAsString"]["oldBodyFields"]["n"]["keys"] = json!(["total"]);
    registration["rulesAsString"]["oldBodyFields"]["p"]["parents"] = json!(["orders", "items"]);
    let (status, answer) = register(&service, &registration, &[]).await;
    assert_eq!(status, 201, "{answer}");
    assert!(!answer["warnings"].to_string().contains("did you mean"), "{answer}");
    let path = answer["path"].as_str().unwrap().to_owned();
    assert_eq!(body(&get(&service.url(&path)).await), json!({"n": 3, "p": 5}));
    // `expr` rules, as composed routes are mostly written: a plain path, one under a function
    // and a projection, one after `||`; and one that finds its value, which is not told.
    registration["path"] = json!("exprs");
    registration["rulesAsString"] = rules(&[
        ("t", "orders.totl"),
        ("s", "sum(orders.itms[*].price)"),
        ("d", "orders.discount || orders.items[0].prise"),
        ("ok", "orders.items[0].price"),
    ]);
    let (status, answer) = register(&service, &registration, &[]).await;
    assert_eq!(status, 201, "{answer}");
    let warnings: Vec<(String, String)> = answer["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["location"].as_str().unwrap().to_owned(), w["message"].as_str().unwrap().to_owned()))
        .collect();
    let told = |id: &str| warnings.iter().find(|(at, _)| at == &format!("/rulesAsString/oldBodyFields/{id}"));
    assert!(
        told("t").is_some_and(|(_, m)| m.contains("/orders has no member `totl` (did you mean `total`?)")),
        "{warnings:?}"
    );
    // `sum` of nothing is 0, not null: nothing to tell.
    assert!(told("s").is_none(), "{warnings:?}");
    // Of two names missing, the one with a name probably meant is told.
    assert!(told("d").is_some_and(|(_, m)| m.contains("/orders/items/0 has no member `prise` (did you mean `price`?)")), "{warnings:?}");
    assert!(told("ok").is_none(), "{warnings:?}");
    service.stop().await;
}

#[tokio::test]
async fn a_for_each_source_alone_in_its_route_keeps_to_the_call_s_one_deadline() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let slow = Arc::new(AtomicBool::new(false));
    let now = slow.clone();
    let item = Upstream::start(move |_| {
        let delay = if now.load(Ordering::SeqCst) { 300 } else { 0 };
        Reply { delay: Duration::from_millis(delay), ..Reply::json(r#"{"x":1}"#) }
    })
    .await;
    let service = Service::start(Config { upstream_timeout_ms: 500, ..config() }).await;
    let route = json!({
        "path": "one-deadline",
        "sources": {"each": with(source(&item, "e/{{$item}}"), json!({"forEach": "request.query.id", "concurrency": 1}))},
        "rulesAsString": rules(&[("each", "each")]),
    });
    let path = registered(&service, &route).await;
    let url = service.url(&format!("{path}?id=1&id=2&id=3&id=4"));
    let answer = get(&url).await;
    assert_eq!(body(&answer), json!({"each": [{"x": 1}, {"x": 1}, {"x": 1}, {"x": 1}]}));
    // One after another, the four calls would take 1.2 s, each well within its own 500 ms: the
    // call's one deadline ends them at 500 ms.
    slow.store(true, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let answer = get(&url).await;
    let took = started.elapsed();
    let problem = answer.assert_problem(504, "upstream-timeout");
    assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("each"));
    assert!(took < Duration::from_millis(1000), "{took:?}");
    service.stop().await;
}

#[tokio::test]
async fn request_and_sources_are_in_the_document_for_the_rules_that_read_them_and_a_body_is_json_either_way()
{
    let upstream = Upstream::json(r#"{"v":1}"#).await;
    let service = Service::start(config()).await;
    // No source reads `request`: the rules do, and `_sources`.
    let reading = registered(
        &service,
        &json!({
            "path": "reading", "method": "POST",
            "sources": {"a": source(&upstream, "a")},
            "rulesAsString": rules(&[("v", "a.v"), ("q", "request.query.q"), ("k", "request.body.k"), ("s", "_sources.a.status")]),
        }),
    )
    .await;
    let url = service.url(&format!("{reading}?q=x"));
    let answer = send(Method::POST, &url, &[("content-type", "application/json")], r#"{"k":[1]}"#).await;
    assert_eq!(body(&answer), json!({"v": 1, "q": "x", "k": [1], "s": 200}));
    // Nothing reads either: the answer is the same without them, and a body that is not JSON
    // is still refused before anything is called.
    let blind = registered(
        &service,
        &json!({
            "path": "blind", "method": "POST",
            "sources": {"a": source(&upstream, "a")},
            "rulesAsString": rules(&[("v", "a.v")]),
        }),
    )
    .await;
    let url = service.url(&blind);
    let answer = send(Method::POST, &url, &[("content-type", "application/json")], r#"{"k":[1]}"#).await;
    assert_eq!(body(&answer), json!({"v": 1}));
    let before = upstream.received().len();
    let refused = send(Method::POST, &url, &[("content-type", "application/json")], "{not json").await;
    refused.assert_problem(400, "invalid-json");
    assert_eq!(upstream.received().len(), before, "no call was made");
    service.stop().await;
}

/// `sampleRequest` is stored with the route (SPEC §2.1): `GET` shows it; *Try it* calls as it
/// says (or as the sample a try gives, once) and answers the document the rules map; an update
/// that gives none makes its live call with the stored one and keeps it; one that gives `{}`
/// clears it, and the live call then finds no `request.query.id` (nothing stored).
#[tokio::test]
async fn the_sample_request_is_stored_shown_and_used_by_try_and_an_update_that_gives_none() {
    let upstream = Upstream::json(r#"{"v":1}"#).await;
    let service = Service::start(config()).await;
    let registration = json!({
        "path": "sampled",
        "sources": {"a": with(source(&upstream, "items/{{request.query.id}}"), json!({
            "headers": {"x-name": "{{request.body.name}}"},
        }))},
        "sampleRequest": {"query": {"id": "42"}, "body": {"name": "Ada", "deep": [[{"x": 1.50}]]}},
        "rulesAsString": rules(&[("v", "a.v"), ("id", "request.query.id")]),
    });
    let path = registered(&service, &registration).await;
    let uuid = path.split('/').nth(2).unwrap().to_owned();
    let manage = service.url(&format!("/v1/routes/{uuid}"));
    let last = |upstream: &Upstream| {
        upstream.received().last().map(|c| (c.uri.path().to_owned(), c.headers.get("x-name").cloned()))
    };
    assert_eq!(last(&upstream), Some(("/items/42".to_owned(), Some(http::HeaderValue::from_static("Ada")))));
    // Shown as given.
    assert_eq!(body(&get(&manage).await)["sampleRequest"], registration["sampleRequest"]);
    // Try it: as the stored sample says; its document holds the request and each source's value.
    let tried = send(Method::POST, &format!("{manage}/try"), &[], "").await;
    assert_eq!(tried.status, 200, "{:?}", tried.body);
    let tried = body(&tried);
    assert_eq!(tried["upstream"]["a"], json!({"v": 1}));
    assert_eq!(tried["upstream"]["request"]["query"], json!({"id": "42"}));
    assert_eq!(tried["output"], json!({"v": 1, "id": "42"}));
    assert_eq!(tried["trace"].as_array().map(Vec::len), Some(2), "{tried}");
    assert_eq!(last(&upstream).unwrap().0, "/items/42");
    // A try may give its own, used once.
    let json_body = [("content-type", "application/json")];
    let given = r#"{"sampleRequest": {"query": {"id": "7"}, "body": {"name": "Bo"}}}"#;
    let tried = send(Method::POST, &format!("{manage}/try"), &json_body, given).await;
    assert_eq!(body(&tried)["output"], json!({"v": 1, "id": "7"}));
    assert_eq!(last(&upstream), Some(("/items/7".to_owned(), Some(http::HeaderValue::from_static("Bo")))));
    let misspelt =
        send(Method::POST, &format!("{manage}/try"), &json_body, r#"{"sampleRequest": {"qurey": {}}}"#).await;
    misspelt.assert_problem(400, "invalid-request");
    assert!(String::from_utf8_lossy(&misspelt.body).contains("/sampleRequest/qurey"), "{:?}", misspelt.body);
    // The console's round trip: the view, saved back without it, keeps it.
    let mut view = body(&get(&manage).await);
    for written in
        ["uuid", "path", "auth", "createdAt", "updatedAt", "status", "problem", "revision", "sampleRequest"]
    {
        view.as_object_mut().unwrap().remove(written);
    }
    let updated = send(Method::PUT, &manage, &json_body, view.to_string()).await;
    assert_eq!(updated.status, 200, "{:?}", updated.body);
    assert_eq!(body(&updated)["preview"], json!({"v": 1, "id": "42"}));
    assert_eq!(last(&upstream).unwrap().0, "/items/42");
    assert_eq!(body(&get(&manage).await)["sampleRequest"]["query"], json!({"id": "42"}));
    // `{}` clears it: the live call then has no `request.query.id`, and nothing is stored.
    view["sampleRequest"] = json!({});
    let calls = upstream.received().len();
    let cleared = send(Method::PUT, &manage, &json_body, view.to_string()).await;
    assert_eq!(cleared.status, 400, "{:?}", cleared.body);
    assert_eq!(upstream.received().len(), calls);
    assert_eq!(body(&get(&manage).await)["sampleRequest"]["query"], json!({"id": "42"}));
    // A route that does not read `request` takes `{}`, and no longer has one.
    let plain = json!({
        "path": "plain",
        "sources": {"a": source(&upstream, "items")},
        "sampleRequest": {"query": {"id": "1"}},
        "rulesAsString": rules(&[("v", "a.v")]),
    });
    let path = registered(&service, &plain).await;
    let manage = service.url(&format!("/v1/routes/{}", path.split('/').nth(2).unwrap()));
    let mut view = body(&get(&manage).await);
    assert_eq!(view["sampleRequest"], json!({"query": {"id": "1"}}));
    for written in ["uuid", "path", "auth", "createdAt", "updatedAt", "status", "problem", "revision"] {
        view.as_object_mut().unwrap().remove(written);
    }
    view["sampleRequest"] = json!({});
    let cleared = send(Method::PUT, &manage, &json_body, view.to_string()).await;
    assert_eq!(cleared.status, 200, "{:?}", cleared.body);
    assert_eq!(body(&get(&manage).await).get("sampleRequest"), None);
    service.stop().await;
}

/// A `forEach` whose value is not a list (an upstream that changed shape, a path that misses)
/// makes no call, but not silently: the registration warns at `/sources/<name>/forEach`, and each
/// call names it in `_sources` (`not-a-list`) and counts it in `recast_source_not_a_list_total`.
#[tokio::test]
async fn a_for_each_over_what_is_not_a_list_is_warned_of_named_and_counted() {
    let shape = Arc::new(Mutex::new(r#"{"addresses":"none"}"#));
    let user = {
        let shape = shape.clone();
        Upstream::start(move |_| Reply::json(*shape.lock().unwrap())).await
    };
    let city = Upstream::json(r#"{"name":"Lyon"}"#).await;
    let service = Service::start(config()).await;
    let (status, registered) = register(
        &service,
        &json!({
            "path": "cities",
            "sources": {
                "user": source(&user, "u"),
                "city": with(source(&city, "c/{{$item}}"), json!({"after": ["user"], "forEach": "user.addresses"})),
            },
            "rulesAsString": rules(&[("cities", "city[*].name"), ("why", "_sources.city")]),
        }),
        &[],
    )
    .await;
    assert_eq!(status, 201, "{registered}");
    let warnings = registered["warnings"].as_array().unwrap();
    let warning = warnings
        .iter()
        .find(|w| w["location"] == "/sources/city/forEach")
        .unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(warning["message"].as_str().unwrap().contains("gave a string, not a list"), "{warning}");
    assert_eq!(city.received().len(), 0);
    let path = registered["path"].as_str().unwrap().to_owned();
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"cities": [], "why": {"status": null, "outcome": "not-a-list"}}));
    assert_eq!(answer.header("recast-partial"), None);
    // The upstream gives a list again: the source is called per element.
    *shape.lock().unwrap() = r#"{"addresses":[7]}"#;
    let answer = get(&service.url(&path)).await;
    assert_eq!(body(&answer), json!({"cities": ["Lyon"], "why": {"status": [200], "outcome": ["ok"]}}));
    let metrics = String::from_utf8_lossy(&get(&service.url("/metrics")).await.body).into_owned();
    assert!(metrics.lines().any(|l| l == "recast_source_not_a_list_total 2"), "{metrics}");
    service.stop().await;
}

/// A required `forEach` source that fails names the element that failed (its index) in the
/// problem, beside the source.
#[tokio::test]
async fn a_failed_for_each_element_is_named_by_its_index() {
    let user = Upstream::json(r#"{"addresses":[7,8,9]}"#).await;
    let city = Upstream::start(|received| {
        if received.uri.path().ends_with("/8") {
            Reply::with(500, "{}")
        } else {
            Reply::json(r#"{"name":"x"}"#)
        }
    })
    .await;
    let service = Service::start(config()).await;
    let (status, problem) = register(
        &service,
        &json!({
            "path": "cities",
            "sources": {
                "user": source(&user, "u"),
                "city": with(source(&city, "c/{{$item}}"), json!({"after": ["user"], "forEach": "user.addresses", "concurrency": 1})),
            },
            "rulesAsString": rules(&[("cities", "city[*].name")]),
        }),
        &[],
    )
    .await;
    assert_eq!(status, 502, "{problem}");
    assert_eq!(
        (problem["source"].as_str(), problem["element"].as_u64()),
        (Some("city"), Some(1)),
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().starts_with("element 1: the upstream answered 500"),
        "{problem}"
    );
    assert_eq!(problem["upstreamStatus"], 500);
    service.stop().await;
}

/// `RECAST_MAX_BUFFERED_BYTES` bounds what a call holds once admitted, not only admission: a
/// source waiting for an answer that passed it is not started, and a `forEach` whose rendered
/// requests pass it sends none of them (503 `overloaded`, the source named, `Retry-After`).
#[tokio::test]
async fn a_call_admitted_under_max_buffered_bytes_starts_nothing_more_once_past_it() {
    let big =
        Upstream::json(Box::leak(format!(r#"{{"pad":"{}","ids":[]}}"#, "x".repeat(30_000)).into_boxed_str()))
            .await;
    let ids = Upstream::json(Box::leak(
        format!(r#"{{"ids":[{}]}}"#, (0..100).map(|i| i.to_string()).collect::<Vec<_>>().join(","))
            .into_boxed_str(),
    ))
    .await;
    let item = Upstream::json(r#"{"x":1}"#).await;
    let dir = tempfile::TempDir::new().unwrap();
    let roomy = Config { max_source_calls: 200, ..config() };
    let service = Service::start_in(roomy.clone(), dir.path()).await;
    let after_big = registered(
        &service,
        &json!({
            "path": "after-big",
            "sources": {"big": source(&big, "b"), "next": with(source(&item, "n"), json!({"after": ["big"]}))},
            "rulesAsString": rules(&[("x", "next.x")]),
        }),
    )
    .await;
    let long = "p".repeat(1000);
    let rendered = registered(
        &service,
        &json!({
            "path": "rendered",
            "sources": {
                "ids": source(&ids, "i"),
                "each": with(source(&item, &format!("e/{{{{$item}}}}/{long}")), json!({"after": ["ids"], "forEach": "ids.ids", "maxCalls": 100})),
            },
            "rulesAsString": rules(&[("n", "length(each)")]),
        }),
    )
    .await;
    assert_eq!(body(&get(&service.url(&rendered)).await), json!({"n": 100}));
    service.stop().await;
    let service = Service::start_in(Config { max_buffered_bytes: 20_000, ..roomy }, dir.path()).await;
    let sent = item.received().len();
    let answer = get(&service.url(&after_big)).await;
    let problem = answer.assert_problem(503, "overloaded");
    assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("next"));
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert!(String::from_utf8_lossy(&answer.body).contains("RECAST_MAX_BUFFERED_BYTES"));
    let answer = get(&service.url(&rendered)).await;
    let problem = answer.assert_problem(503, "overloaded");
    assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("each"));
    assert_eq!(item.received().len(), sent, "nothing past the bound is sent");
    let metrics = String::from_utf8_lossy(&get(&service.url("/metrics")).await.body).into_owned();
    for line in [
        "recast_source_failures_total{kind=\"buffered\",required=\"true\"} 2",
        "recast_upstream_errors_total{kind=\"buffered\"} 2",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in\n{metrics}");
    }
    // What the calls held is let go: a call under the bound is taken again.
    let small = registered(
        &service,
        &json!({"path": "small", "sources": {"a": source(&item, "s")}, "rulesAsString": rules(&[("x", "a.x")])}),
    )
    .await;
    assert_eq!(body(&get(&service.url(&small)).await), json!({"x": 1}));
    service.stop().await;
}
