//! Routes through the service with a real RocksDB in a temp dir and a real upstream on
//! 127.0.0.1:0: registration and its failures, auth modes, header hygiene, precedence, status
//! mapping, methods, management, restarts.

use std::time::Duration;

use http::Method;
use recast::config::Config;

use crate::support::{
    Answer, Json, Reply, Service, Upstream, config, error_locations, get, located, post_json, send,
};

pub(crate) const MEALS: &str =
    r#"{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken","strArea":"Japanese"}]}"#;
pub(crate) const RULES: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"name":{"keys":["strMeal"],"parents":["meals"]},"unused":{"keys":["x"]}}}"#;

/// A registration body for an upstream at `base`, with more members spliced in.
pub(crate) fn registration(base: &str, original_extra: &str, extra: &str) -> String {
    format!(
        r#"{{"path":"meals/random","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"api/random.php"{original_extra}}},"rulesAsString":{RULES}{extra}}}"#
    )
}

pub(crate) async fn register(service: &Service, body: &str, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    send(Method::POST, &service.url("/v1/mapping"), &all, body.to_owned()).await
}

/// Registers and returns the route's public path (`/v1/{uuid}/{path}`).
pub(crate) async fn registered(service: &Service, body: &str, headers: &[(&str, &str)]) -> String {
    let answer = register(service, body, headers).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    answer.json().get("path").and_then(Json::as_str).unwrap().to_owned()
}

pub(crate) async fn route_count(service: &Service) -> usize {
    get(&service.url("/v1/routes")).await.json().get("routes").unwrap().as_array().len()
}

#[tokio::test]
async fn registration_makes_one_live_call_stores_and_answers_201() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let answer = register(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    let body = answer.json();
    let uuid = body.get("uuid").and_then(Json::as_str).unwrap().to_owned();
    let path = format!("/v1/{uuid}/meals/random");
    assert_eq!(answer.header("location"), Some(path.as_str()));
    assert_eq!(body.get("path").and_then(Json::as_str), Some(path.as_str()));
    assert_eq!(body.get("method").and_then(Json::as_str), Some("GET"));
    assert_eq!(body.get("preview").unwrap().to_string(), r#"{"id":52772,"name":"Teriyaki Chicken"}"#);
    let warnings = body.get("warnings").unwrap().as_array();
    assert_eq!(
        warnings[0].get("location").and_then(Json::as_str),
        Some("/rulesAsString/oldBodyFields/unused")
    );
    let calls = upstream.received();
    assert_eq!(calls.len(), 1, "one live call");
    assert_eq!(calls[0].uri.path(), "/api/random.php");

    let call = get(&service.url(&path)).await;
    assert_eq!(call.status, 200);
    assert_eq!(&call.body[..], br#"{"id":52772,"name":"Teriyaki Chicken"}"#);
    assert_eq!(call.header("content-type"), Some("application/json"));
    let timing = call.header("server-timing").unwrap();
    assert!(timing.contains("upstream;dur=") && timing.contains("map;dur="), "{timing}");
    assert!(call.header("x-request-id").is_some());
    service.stop().await;
}

#[tokio::test]
async fn a_failed_registration_stores_nothing() {
    let service = Service::start(Config { upstream_timeout_ms: 300, ..config() }).await;
    let failing = [
        (Upstream::start(|_| Reply::with(500, r#"{"error":"boom"}"#)).await, 502, Some(500)),
        (Upstream::start(|_| Reply::with(404, r#"{"error":"gone"}"#)).await, 502, Some(404)),
        (
            Upstream::start(|_| Reply { content_type: "text/html", ..Reply::json("<html>oops</html>") })
                .await,
            502,
            None,
        ),
        (Upstream::start(|_| Reply { delay: Duration::from_secs(2), ..Reply::json(MEALS) }).await, 504, None),
    ];
    for (upstream, status, upstream_status) in &failing {
        let answer = register(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
        let problem = answer.assert_problem(*status, "upstream-validation-failed");
        let expected = upstream_status.map(|s| Json::Number(s.into()));
        assert_eq!(problem.get("upstreamStatus"), expected.as_ref(), "{problem}");
        assert!(!String::from_utf8_lossy(&answer.body).contains("boom"), "the upstream body is never echoed");
    }
    let refused = format!("http://{}/", closed_port().await);
    register(&service, &registration(&refused, "", ""), &[])
        .await
        .assert_problem(502, "upstream-validation-failed");

    let upstream = Upstream::json(MEALS).await;
    let bad_rules =
        registration(&upstream.url("/"), "", "").replace(r#""type":"Int""#, r#""type":"Integer""#);
    register(&service, &bad_rules, &[]).await.assert_problem(400, "invalid-rules");
    let bad_route = registration(&upstream.url("/"), "", "").replace("meals/random", "a/../b");
    let problem = register(&service, &bad_route, &[]).await.assert_problem(400, "invalid-request");
    assert_eq!(
        problem.get("errors").unwrap().as_array()[0].get("location").and_then(Json::as_str),
        Some("/path")
    );
    register(&service, "{", &[]).await.assert_problem(400, "invalid-json");
    register(&service, r#"{"path":"x"}"#, &[]).await.assert_problem(400, "invalid-request");
    assert!(upstream.received().is_empty(), "invalid registrations make no live call");
    assert_eq!(route_count(&service).await, 0);
    service.stop().await;
}

/// A loopback port that nothing listens on.
async fn closed_port() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn stored_auth_modes_send_their_authorization() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let cases = [
        (r#","authHeader":{"type":"Bearer","token":"b-token"}"#, "", Some("Bearer b-token")),
        (r#","authHeader":{"type":"basic","token":"dTpw"}"#, "", Some("Basic dTpw")),
        (r#","authHeader":{"type":"None","token":"key=raw"}"#, "", Some("key=raw")),
        (r#","authHeader":{"type":"None"}"#, "", None),
        ("", r#","authHeader":{"type":"Bearer","token":"inner"}"#, Some("Bearer inner")),
    ];
    for (top, inner, expected) in cases {
        let path = registered(&service, &registration(&upstream.url("/"), inner, top), &[]).await;
        // The stored authHeader wins over the caller's X-Mapped-Auth.
        let answer = send(Method::GET, &service.url(&path), &[("x-mapped-auth", "Bearer caller")], "").await;
        assert_eq!(answer.status, 200);
        let last = upstream.received().pop().unwrap();
        assert_eq!(last.headers.get("authorization").map(|v| v.to_str().unwrap()), expected, "{top}{inner}");
    }
    let both = registration(
        &upstream.url("/"),
        r#","authHeader":{"type":"Bearer","token":"a"}"#,
        r#","authHeader":{"type":"Bearer","token":"b"}"#,
    );
    register(&service, &both, &[]).await.assert_problem(400, "invalid-request");
    service.stop().await;
}

#[tokio::test]
async fn runtime_auth_routes_need_x_mapped_auth_on_every_call() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(
        &service,
        &registration(&upstream.url("/"), "", ""),
        &[("x-mapped-auth", "Bearer at-registration")],
    )
    .await;
    assert_eq!(
        upstream.received()[0].headers.get("authorization").unwrap(),
        "Bearer at-registration",
        "the live call uses the registration's X-Mapped-Auth"
    );
    let calls_before = upstream.received().len();
    get(&service.url(&path)).await.assert_problem(401, "auth-required");
    assert_eq!(upstream.received().len(), calls_before, "no outbound call without X-Mapped-Auth");
    let answer = send(Method::GET, &service.url(&path), &[("x-mapped-auth", "Token abc")], "").await;
    assert_eq!(answer.status, 200);
    assert_eq!(upstream.received().pop().unwrap().headers.get("authorization").unwrap(), "Token abc");
    // The token of a runtime-auth route is never stored or shown.
    let listed = get(&service.url("/v1/routes")).await;
    assert!(!String::from_utf8_lossy(&listed.body).contains("at-registration"));
    assert_eq!(
        listed.json().get("routes").unwrap().as_array()[0].get("auth").and_then(Json::as_str),
        Some("runtime")
    );

    // A route registered with neither needs none, and passes a caller's X-Mapped-Auth on.
    let open =
        registered(&service, &registration(&upstream.url("/"), "", "").replace("meals/random", "open"), &[])
            .await;
    assert!(upstream.received().pop().unwrap().headers.get("authorization").is_none());
    assert_eq!(get(&service.url(&open)).await.status, 200);
    send(Method::GET, &service.url(&open), &[("x-mapped-auth", "Bearer passed")], "").await;
    assert_eq!(upstream.received().pop().unwrap().headers.get("authorization").unwrap(), "Bearer passed");
    service.stop().await;
}

#[tokio::test]
async fn only_accept_headers_and_configured_headers_reach_the_upstream() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let body = registration(
        &upstream.url("/"),
        r#","headers":{"X-Route":"original","X-Both":"original"},"authHeader":{"type":"Bearer","token":"stored"}"#,
        r#","preConfiguredHeaders":{"X-Both":"pre"}"#,
    );
    let path = registered(&service, &body, &[]).await;
    let client_headers = [
        ("accept", "application/json"),
        ("accept-language", "fr"),
        ("cookie", "session=secret"),
        ("authorization", "Bearer client-secret"),
        ("x-mapped-auth", "Bearer mapped-secret"),
        ("x-forwarded-for", "10.0.0.1"),
        ("x-custom", "1"),
        ("user-agent", "test"),
    ];
    assert_eq!(send(Method::GET, &service.url(&path), &client_headers, "").await.status, 200);
    let received = upstream.received().pop().unwrap();
    let mut names: Vec<&str> = received.headers.keys().map(|k| k.as_str()).collect();
    names.sort();
    // `traceparent`: the attempt's trace context, written into every upstream call
    // (docs/observability.md).
    assert_eq!(
        names,
        [
            "accept",
            "accept-encoding",
            "accept-language",
            "authorization",
            "host",
            "traceparent",
            "x-both",
            "x-route"
        ],
        "{:?}",
        received.headers
    );
    assert_eq!(
        received.headers["accept-encoding"], "gzip, br",
        "the codings recast decodes, not the client's"
    );
    assert_eq!(received.headers["authorization"], "Bearer stored");
    assert_eq!(received.headers["x-both"], "pre");
    assert_eq!(received.headers["accept-language"], "fr");
    service.stop().await;
}

#[tokio::test]
async fn queries_and_bodies_follow_their_precedence() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let body = format!(
        r#"{{"path":"search","method":"Post","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"v2/search?fixed=path","method":"POST","queries":{{"c":"original","o":"original"}}}},"preConfiguredQueries":{{"o":"pre"}},"rulesAsString":{RULES}}}"#,
        upstream.url("/base")
    );
    let path = registered(&service, &body, &[]).await;
    let answer = send(
        Method::POST,
        &service.url(&format!("{path}?c=client&o=client&k=client")),
        &[("content-type", "application/json")],
        r#"{"from":"client"}"#,
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let received = upstream.received().pop().unwrap();
    assert_eq!(received.method, Method::POST);
    assert_eq!(received.uri.path(), "/base/v2/search");
    let mut query: Vec<&str> = received.uri.query().unwrap().split('&').collect();
    query.sort();
    assert_eq!(query, ["c=original", "fixed=path", "k=client", "o=pre"]);
    assert_eq!(&received.body[..], br#"{"from":"client"}"#);

    // A configured body wins over the client's.
    let with_body = body
        .replace(r#""method":"POST","#, r#""method":"POST","body":{"from":"route"},"#)
        .replace("search", "searchb");
    let path = registered(&service, &with_body, &[]).await;
    send(Method::POST, &service.url(&path), &[], r#"{"from":"client"}"#).await;
    let received = upstream.received().pop().unwrap();
    assert_eq!(&received.body[..], br#"{"from":"route"}"#);
    assert_eq!(received.headers["content-type"], "application/json");
    service.stop().await;
}

#[tokio::test]
async fn upstream_answers_map_to_documented_statuses() {
    let config = Config { upstream_timeout_ms: 300, max_upstream_bytes: 4096, ..config() };
    let service = Service::start(config).await;
    let mode = std::sync::Arc::new(std::sync::Mutex::new(200u16));
    let upstream = {
        let mode = mode.clone();
        Upstream::start(move |_| match *mode.lock().unwrap() {
            200 => Reply::json(MEALS),
            1 => Reply { content_type: "text/plain", ..Reply::json("not json") },
            2 => Reply::json(&format!(r#"{{"big":"{}"}}"#, "x".repeat(10_000))),
            3 => Reply { delay: Duration::from_secs(2), ..Reply::json(MEALS) },
            status => Reply::with(status, r#"{"secret":"upstream body"}"#),
        })
        .await
    };
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let url = service.url(&path);
    let set = |m: u16| *mode.lock().unwrap() = m;

    for (upstream_status, status) in [(404, 404), (429, 429), (400, 400), (500, 502), (503, 502), (302, 502)]
    {
        set(upstream_status);
        let answer = get(&url).await;
        assert_eq!(answer.status, status, "upstream {upstream_status}: {:?}", answer.body);
        let problem = answer.assert_problem(status, "upstream-error");
        assert_eq!(problem.get("upstreamStatus"), Some(&Json::Number(upstream_status.into())));
        assert!(!String::from_utf8_lossy(&answer.body).contains("upstream body"));
        assert!(answer.header("x-request-id").is_some());
        assert!(answer.header("server-timing").is_some_and(|t| t.starts_with("upstream;dur=")));
    }
    set(1);
    get(&url).await.assert_problem(502, "upstream-not-json");
    set(2);
    get(&url).await.assert_problem(502, "upstream-too-large");
    set(3);
    get(&url).await.assert_problem(504, "upstream-timeout");
    set(200);
    assert_eq!(get(&url).await.status, 200);
    drop(upstream);
    tokio::time::sleep(Duration::from_millis(50)).await;
    get(&url).await.assert_problem(502, "upstream-unreachable");
    service.stop().await;
}

#[tokio::test]
async fn methods_paths_and_unknown_routes() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", r#","method":"post""#), &[]).await;
    let answer = get(&service.url(&path)).await;
    answer.assert_problem(405, "method-not-allowed");
    assert_eq!(answer.header("allow"), Some("POST"));
    assert_eq!(send(Method::POST, &service.url(&path), &[], "").await.status, 200);
    send(Method::POST, &service.url(&format!("{path}/more")), &[], "").await.assert_problem(404, "not-found");
    let other = path.replace("meals/random", "meals/other");
    send(Method::POST, &service.url(&other), &[], "").await.assert_problem(404, "not-found");
    let unknown = format!("/v1/{}/meals/random", uuid::Uuid::new_v4());
    send(Method::POST, &service.url(&unknown), &[], "").await.assert_problem(404, "not-found");
    get(&service.url("/v1/not-a-uuid/x")).await.assert_problem(404, "not-found");
    let unknown_answer = get(&service.url(&unknown)).await;
    assert_eq!(unknown_answer.header("server-timing"), Some("upstream;dur=0.000, map;dur=0.000"));
    service.stop().await;
}

#[tokio::test]
async fn routes_are_listed_newest_first_with_secrets_masked() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let mut paths = Vec::new();
    for i in 0..5 {
        let body = registration(
            &upstream.url("/"),
            "",
            r#","authHeader":{"type":"Bearer","token":"canary-token-123"}"#,
        )
        .replace("meals/random", &format!("r{i}"));
        paths.push(registered(&service, &body, &[]).await);
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let url = match &cursor {
            Some(c) => service.url(&format!("/v1/routes?limit=2&cursor={c}")),
            None => service.url("/v1/routes?limit=2"),
        };
        let page = get(&url).await;
        assert!(!String::from_utf8_lossy(&page.body).contains("canary-token-123"), "tokens are masked");
        let page = page.json();
        for route in page.get("routes").unwrap().as_array() {
            seen.push(route.get("path").and_then(Json::as_str).unwrap().to_owned());
            assert_eq!(route.get("authHeader").unwrap().get("token").and_then(Json::as_str), Some("***"));
        }
        match page.get("nextCursor") {
            Some(Json::String(next)) => cursor = Some(next.clone()),
            _ => break,
        }
    }
    paths.reverse();
    assert_eq!(seen, paths, "newest first, every route once");
    let one = get(&service.url(&format!("/v1/routes/{}", &paths[0][4..40]))).await;
    assert_eq!(one.status, 200);
    assert!(!String::from_utf8_lossy(&one.body).contains("canary-token-123"));
    let problem = get(&service.url("/v1/routes?limit=0")).await.assert_problem(400, "invalid-query");
    assert_eq!(problem["title"], "The query is not what this endpoint takes");
    get(&service.url("/v1/routes?cursor=nope")).await.assert_problem(400, "invalid-query");
    service.stop().await;
}

/// Every route a listing with `query` shows, page by page (`limit=2`): their paths, and how many
/// pages it took.
async fn listed(service: &Service, query: &str) -> (Vec<String>, usize) {
    let (mut seen, mut pages, mut cursor) = (Vec::new(), 0, None::<String>);
    loop {
        let after = cursor.as_ref().map(|c| format!("&cursor={c}")).unwrap_or_default();
        let page = get(&service.url(&format!("/v1/routes?limit=2{query}{after}"))).await;
        assert_eq!(page.status, 200, "{query}: {:?}", page.body);
        let page = page.json();
        pages += 1;
        for route in page.get("routes").unwrap().as_array() {
            let path = route.get("path").and_then(Json::as_str).unwrap();
            seen.push(path.rsplit('/').next().unwrap().to_owned());
        }
        match page.get("nextCursor") {
            Some(Json::String(next)) => cursor = Some(next.clone()),
            _ => return (seen, pages),
        }
    }
}

#[tokio::test]
async fn a_listing_filtered_by_path_and_upstream_host_pages_through_the_routes_it_keeps() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let by_name = upstream.url("/").replace("127.0.0.1", "localhost");
    for (i, base) in
        [&upstream.url("/"), &by_name, &upstream.url("/"), &by_name, &upstream.url("/")].iter().enumerate()
    {
        let name = if i % 2 == 0 { format!("shop/Orders{i}") } else { format!("users{i}") };
        let body = registration(base, "", "").replace("meals/random", &name);
        registered(&service, &body, &[]).await;
    }
    // Newest first, as without a filter; the texts are matched in any case.
    assert_eq!(listed(&service, "&path=orders").await.0, vec!["Orders4", "Orders2", "Orders0"]);
    assert_eq!(listed(&service, "&host=LOCALHOST").await.0, vec!["users3", "users1"]);
    assert_eq!(listed(&service, "&host=127.0.0&path=shop").await.0, vec!["Orders4", "Orders2", "Orders0"]);
    assert_eq!(listed(&service, "&path=nothing-like-it").await, (vec![], 1));
    // Two kept a page: the last page holds the last kept route, with no cursor after it.
    let (all, pages) = listed(&service, "&path=s").await;
    assert_eq!((all.len(), pages), (5, 3));
    // An empty filter is no filter.
    assert_eq!(listed(&service, "&path=&host=").await.0.len(), 5);
    let long = "x".repeat(257);
    get(&service.url(&format!("/v1/routes?path={long}"))).await.assert_problem(400, "invalid-query");
    service.stop().await;
}

#[tokio::test]
async fn trying_a_route_shows_the_upstreams_document_beside_the_mapped_answer_and_counts_no_call() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let uuid = &path[4..40];
    let sent = upstream.received().len();
    let tried = send(Method::POST, &service.url(&format!("/v1/routes/{uuid}/try")), &[], "").await;
    assert_eq!(tried.status, 200, "{:?}", tried.body);
    let tried: serde_json::Value = serde_json::from_slice(&tried.body).unwrap();
    assert_eq!(tried["upstream"], serde_json::from_str::<serde_json::Value>(MEALS).unwrap());
    assert_eq!(tried["output"], serde_json::json!({"id": 52772, "name": "Teriyaki Chicken"}));
    let keys: Vec<&str> =
        tried["trace"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["id", "name"]);
    assert_eq!(upstream.received().len(), sent + 1, "one real upstream call");
    // Not a call of the route.
    let stats = get(&service.url(&format!("/v1/routes/{uuid}/stats"))).await.json();
    assert_eq!(stats.get("calls"), Some(&Json::Number(0.into())));
    let get_try = get(&service.url(&format!("/v1/routes/{uuid}/try"))).await;
    get_try.assert_problem(405, "method-not-allowed");
    assert_eq!(get_try.header("allow"), Some("POST"));
    service.stop().await;
}

#[tokio::test]
async fn a_routes_stats_count_its_calls_errors_and_latency_and_outlive_an_update() {
    let mode = std::sync::Arc::new(std::sync::Mutex::new(200u16));
    let upstream = {
        let mode = mode.clone();
        Upstream::start(move |_| match *mode.lock().unwrap() {
            200 => Reply { delay: Duration::from_millis(20), ..Reply::json(MEALS) },
            status => Reply::with(status, "{}"),
        })
        .await
    };
    let service = Service::start(config()).await;
    let registered_at = std::time::SystemTime::now();
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let uuid = &path[4..40];
    let stats = |query: &str| {
        let url = service.url(&format!("/v1/routes/{uuid}/stats{query}"));
        async move { get(&url).await }
    };
    let number = |value: &Json| match value {
        Json::Number(n) => n.as_f64().unwrap(),
        other => panic!("{other} is not a number"),
    };

    // The live call of the registration is not a call of the route.
    let fresh = stats("").await.json();
    assert_eq!(fresh.get("calls"), Some(&Json::Number(0.into())));
    assert_eq!(fresh.get("errors").map(Json::to_string).as_deref(), Some("{}"));
    assert_eq!(fresh.get("latencyMs").map(Json::to_string).as_deref(), Some(r#"{"p50":null,"p99":null}"#));
    let since = number(fresh.get("since").unwrap()) as u128;
    let registered_ms = registered_at.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    assert!(since >= registered_ms && since < registered_ms + 10_000, "{since} {registered_ms}");

    for _ in 0..6 {
        assert_eq!(get(&service.url(&path)).await.status, 200);
    }
    *mode.lock().unwrap() = 500;
    for _ in 0..2 {
        get(&service.url(&path)).await.assert_problem(502, "upstream-error");
    }
    send(Method::POST, &service.url(&path), &[], "").await.assert_problem(405, "method-not-allowed");
    *mode.lock().unwrap() = 200;

    for query in ["", "?minutes=1", "?minutes=5"] {
        let counted = stats(query).await;
        assert_eq!(counted.status, 200, "{query}");
        let counted = counted.json();
        assert_eq!(counted.get("calls"), Some(&Json::Number(9.into())), "{query}");
        assert_eq!(
            counted.get("errors").map(Json::to_string).as_deref(),
            Some(r#"{"method-not-allowed":1,"upstream-error":2}"#),
            "{query}"
        );
        // The wrong method was refused before any step, so it is not timed.
        assert_eq!(counted.get("timedCalls"), Some(&Json::Number(8.into())), "{query}");
        let latency = counted.get("latencyMs").unwrap();
        let (p50, p99) = (number(latency.get("p50").unwrap()), number(latency.get("p99").unwrap()));
        // Six of eight timed calls waited 20 ms upstream: the median did, within its bucket.
        assert!(p50 >= 20.0 * 0.75, "p50 {p50} ms");
        assert!(p99 >= p50, "p99 {p99} < p50 {p50}");
        let window_since = number(counted.get("since").unwrap()) as u128;
        assert!(window_since >= since, "a window never begins before the route was loaded");
    }

    // An update keeps the counts; the route's calls after it add to them.
    let updated = send(
        Method::PUT,
        &service.url(&format!("/v1/routes/{uuid}")),
        &[],
        registration(&upstream.url("/"), "", ""),
    )
    .await;
    assert_eq!(updated.status, 200, "{:?}", updated.body);
    assert_eq!(get(&service.url(&path)).await.status, 200);
    assert_eq!(stats("").await.json().get("calls"), Some(&Json::Number(10.into())));

    for bad in ["?minutes=0", "?minutes=6", "?minutes=-1", "?minutes=two"] {
        stats(bad).await.assert_problem(400, "invalid-query");
    }
    let unknown = format!("/v1/routes/{}/stats", uuid::Uuid::new_v4());
    get(&service.url(&unknown)).await.assert_problem(404, "not-found");
    get(&service.url("/v1/routes/not-a-uuid/stats")).await.assert_problem(404, "not-found");
    let post = send(Method::POST, &service.url(&format!("/v1/routes/{uuid}/stats")), &[], "").await;
    post.assert_problem(405, "method-not-allowed");
    assert_eq!(post.header("allow"), Some("GET"));

    // A deleted route's counts go with it.
    assert_eq!(send(Method::DELETE, &service.url(&format!("/v1/routes/{uuid}")), &[], "").await.status, 204);
    stats("").await.assert_problem(404, "not-found");
    service.stop().await;
}

#[tokio::test]
async fn updates_are_validated_and_a_failed_update_keeps_the_old_route() {
    let mode = std::sync::Arc::new(std::sync::Mutex::new(200u16));
    let upstream = {
        let mode = mode.clone();
        Upstream::start(move |_| Reply::with(*mode.lock().unwrap(), MEALS)).await
    };
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let uuid = &path[4..40];
    let manage = service.url(&format!("/v1/routes/{uuid}"));
    let only_name = registration(&upstream.url("/"), "", "")
        .replace(r#""id":{"key":"id","type":"Int"},"#, "")
        .replace(r#""id":{"keys":["idMeal"],"parents":["meals"]},"#, "");
    let updated = send(Method::PUT, &manage, &[], only_name.clone()).await;
    assert_eq!(updated.status, 200, "{:?}", updated.body);
    assert_eq!(updated.json().get("preview").unwrap().to_string(), r#"{"name":"Teriyaki Chicken"}"#);
    assert_eq!(&get(&service.url(&path)).await.body[..], br#"{"name":"Teriyaki Chicken"}"#);

    *mode.lock().unwrap() = 500;
    send(Method::PUT, &manage, &[], registration(&upstream.url("/"), "", ""))
        .await
        .assert_problem(502, "upstream-validation-failed");
    *mode.lock().unwrap() = 200;
    assert_eq!(
        &get(&service.url(&path)).await.body[..],
        br#"{"name":"Teriyaki Chicken"}"#,
        "the old route stays"
    );

    let moved = only_name.replace("meals/random", "elsewhere");
    send(Method::PUT, &manage, &[], moved).await.assert_problem(400, "invalid-request");
    let unknown = service.url(&format!("/v1/routes/{}", uuid::Uuid::new_v4()));
    send(Method::PUT, &unknown, &[], only_name).await.assert_problem(404, "not-found");
    service.stop().await;
}

/// What `GET /v1/routes/{uuid}` shows, as the body of an update: its members but the ones the
/// service writes (`uuid`, `auth`, the times, `status`, `problem`, `revision`) and `path` (shown
/// as the public path; it cannot change), edited by `edit`.
pub(crate) async fn shown_as_update(
    service: &Service,
    uuid: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> String {
    let shown = get(&service.url(&format!("/v1/routes/{uuid}"))).await;
    assert_eq!(shown.status, 200);
    let mut body: serde_json::Value = serde_json::from_slice(&shown.body).unwrap();
    let members = body.as_object_mut().unwrap();
    for written in ["uuid", "path", "auth", "createdAt", "updatedAt", "status", "problem", "revision"] {
        members.remove(written);
    }
    edit(&mut body);
    body.to_string()
}

/// Sends `body` as an update of route `uuid`.
pub(crate) async fn update(service: &Service, uuid: &str, body: String) -> Answer {
    let url = service.url(&format!("/v1/routes/{uuid}"));
    send(Method::PUT, &url, &[("content-type", "application/json")], body).await
}

/// A stored body nested deeper than 64 levels is shown as it is (it used to read `null`), and
/// the view sent back stores it again.
#[tokio::test]
async fn a_deep_body_is_shown_and_kept_by_the_round_trip() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(Config { max_depth: 300, ..config() }).await;
    let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let body = format!(r#","method":"POST","body":{{"deep":{deep}}}"#);
    let path = registered(&service, &registration(&upstream.url("/"), &body, ""), &[]).await;
    let uuid = &path[4..40];
    let shown: serde_json::Value =
        serde_json::from_slice(&get(&service.url(&format!("/v1/routes/{uuid}"))).await.body).unwrap();
    let shown_body = shown["originalRoute"]["body"].to_string();
    assert_eq!(shown_body, format!(r#"{{"deep":{deep}}}"#));
    let edited = shown_as_update(&service, uuid, |_| {}).await;
    let answer = update(&service, uuid, edited).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let sent = upstream.received().pop().unwrap();
    assert_eq!(String::from_utf8_lossy(&sent.body), format!(r#"{{"deep":{deep}}}"#), "the live call's body");
    let again = get(&service.url(&format!("/v1/routes/{uuid}"))).await;
    assert!(String::from_utf8_lossy(&again.body).contains(&deep), "kept");

    service.stop().await;
}

#[tokio::test]
async fn a_route_as_shown_and_sent_back_keeps_its_secrets_where_they_were_given() {
    let upstream = Upstream::json(MEALS).await;
    let elsewhere = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let token = r#","authHeader":{"type":"Bearer","token":"kept-token-7"}"#;
    let path = registered(&service, &registration(&upstream.url("/"), "", token), &[]).await;
    let uuid = &path[4..40];
    let authorization = |upstream: &Upstream| {
        let last = upstream.received().pop().unwrap();
        last.headers.get("authorization").map(|v| v.to_str().unwrap().to_owned())
    };

    // Shown with the token masked and sent back with other rules: the token is the stored one.
    let edited = shown_as_update(&service, uuid, |body| {
        assert_eq!(body["authHeader"]["token"], "***");
        body["rulesAsString"]["newBodyFields"].as_object_mut().unwrap().remove("id");
    })
    .await;
    let answer = update(&service, uuid, edited).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(authorization(&upstream).as_deref(), Some("Bearer kept-token-7"), "the live call");
    assert_eq!(&get(&service.url(&path)).await.body[..], br#"{"name":"Teriyaki Chicken"}"#);
    assert_eq!(authorization(&upstream).as_deref(), Some("Bearer kept-token-7"), "a call");

    // The mask does not take a stored token anywhere else: to another origin, or as another type.
    let before = (upstream.received().len(), elsewhere.received().len());
    let moved = shown_as_update(&service, uuid, |body| {
        body["originalRoute"]["originalApi"]["baseUrl"] = elsewhere.url("/").into();
        body["path"] = "elsewhere".into();
    })
    .await;
    let problem = update(&service, uuid, moved).await.assert_problem(400, "invalid-request");
    // Told with the body's other problems, in one answer.
    assert_eq!(error_locations(&problem), ["/authHeader/token", "/path"], "{problem:?}");
    let errors = problem["errors"].to_string();
    assert!(errors.contains("only while it goes to http://127.0.0.1:"), "{errors}");
    let retyped = shown_as_update(&service, uuid, |body| body["authHeader"]["type"] = "Basic".into()).await;
    let problem = update(&service, uuid, retyped).await.assert_problem(400, "invalid-request");
    assert!(problem["errors"].to_string().contains("stores no Basic token here"), "{problem:?}");
    assert_eq!((upstream.received().len(), elsewhere.received().len()), before, "no live call was made");
    assert_eq!(&get(&service.url(&path)).await.body[..], br#"{"name":"Teriyaki Chicken"}"#, "unchanged");
    assert_eq!(authorization(&upstream).as_deref(), Some("Bearer kept-token-7"));

    // Given again, the token goes where it is sent.
    let given = shown_as_update(&service, uuid, |body| {
        body["originalRoute"]["originalApi"]["baseUrl"] = elsewhere.url("/").into();
        body["authHeader"]["token"] = "new-token-8".into();
    })
    .await;
    assert_eq!(update(&service, uuid, given).await.status, 200);
    assert_eq!(authorization(&elsewhere).as_deref(), Some("Bearer new-token-8"));

    // A route without a token has none to keep.
    let open =
        registered(&service, &registration(&upstream.url("/"), "", "").replace("meals/random", "open"), &[])
            .await;
    let masked = shown_as_update(&service, &open[4..40], |body| {
        body["authHeader"] = serde_json::json!({"type": "Bearer", "token": "***"});
    })
    .await;
    let problem = update(&service, &open[4..40], masked).await.assert_problem(400, "invalid-request");
    assert!(problem["errors"].to_string().contains("stores no Bearer token here"), "{problem:?}");
    // A registration has nothing stored: its `***` is a token like any other.
    let literal = r#","authHeader":{"type":"Bearer","token":"***"}"#;
    registered(&service, &registration(&upstream.url("/"), "", literal).replace("meals/random", "lit"), &[])
        .await;
    assert_eq!(authorization(&upstream).as_deref(), Some("Bearer ***"));
    service.stop().await;
}

#[tokio::test]
async fn a_composed_route_as_shown_and_sent_back_keeps_each_source_s_credentials() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let body = serde_json::json!({
        "path": "both",
        "sources": {
            "meal": {"originalApi": {"baseUrl": upstream.url("/")}, "path": "a",
                     "authHeader": {"type": "Bearer", "token": "source-token-1"}},
            "keyed": {"originalApi": {"baseUrl": upstream.url("/")}, "path": "b",
                      "headers": {"Authorization": "Key source-key-2"}},
        },
        "rulesAsString": {"newBodyFields": {"name": {"key": "name", "type": "String"}},
                          "oldBodyFields": {"name": {"keys": ["strMeal"], "parents": ["meal", "meals"]}}},
    });
    let path = registered(&service, &body.to_string(), &[]).await;
    let uuid = &path[4..40];
    let sent_back = shown_as_update(&service, uuid, |body| {
        assert_eq!(body["sources"]["meal"]["authHeader"]["token"], "***");
        assert_eq!(body["sources"]["keyed"]["headers"]["Authorization"], "***");
    })
    .await;
    let answer = update(&service, uuid, sent_back).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(&get(&service.url(&path)).await.body[..], br#"{"name":"Teriyaki Chicken"}"#);
    let received = upstream.received();
    let to_meal = received.iter().rev().find(|r| r.uri.path().ends_with("/a")).unwrap();
    assert_eq!(to_meal.headers.get("authorization").unwrap(), "Bearer source-token-1");
    let to_keyed = received.iter().rev().find(|r| r.uri.path().ends_with("/b")).unwrap();
    assert_eq!(to_keyed.headers.get("authorization").unwrap(), "Key source-key-2", "its own header");
    // The mask in a source with no token of its own is refused at that source, and a header
    // kept only for its origin.
    let borrowed = shown_as_update(&service, uuid, |body| {
        body["sources"]["keyed"]["headers"] = serde_json::json!({});
        body["sources"]["keyed"]["authHeader"] = serde_json::json!({"type": "Bearer", "token": "***"});
    })
    .await;
    let problem = update(&service, uuid, borrowed).await.assert_problem(400, "invalid-request");
    assert_eq!(error_locations(&problem), ["/sources/keyed/authHeader/token"], "{problem:?}");
    let moved = shown_as_update(&service, uuid, |body| {
        body["sources"]["keyed"]["originalApi"]["baseUrl"] = "http://localhost:9/".into();
    })
    .await;
    let problem = update(&service, uuid, moved).await.assert_problem(400, "invalid-request");
    assert_eq!(error_locations(&problem), ["/sources/keyed/headers/Authorization"], "{problem:?}");
    service.stop().await;
}

#[tokio::test]
async fn if_match_changes_only_the_version_it_names() {
    let held = crate::support::Held::start(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&held.url, "", ""), &[]).await;
    let uuid = path[4..40].to_owned();
    let manage = service.url(&format!("/v1/routes/{uuid}"));
    let version = |answer: &Answer| answer.header("etag").expect("an ETag").to_owned();
    let shown = get(&manage).await;
    let first = version(&shown);
    assert_eq!(first, format!("\"{}\"", shown.json().get("revision").unwrap()), "its revision");
    let put = |tag: &str, body: String| {
        let (url, tag) = (manage.clone(), tag.to_owned());
        async move {
            let mut headers = vec![("content-type", "application/json")];
            if !tag.is_empty() {
                headers.push(("if-match", tag.as_str()));
            }
            send(Method::PUT, &url, &headers, body).await
        }
    };
    let body = registration(&held.url, "", "");
    let updated = put(&first, body.clone()).await;
    assert_eq!(updated.status, 200);
    let second = version(&get(&manage).await);
    assert_ne!(second, first, "a change moves the version");
    assert_eq!(version(&updated), second, "the update answers the version it made");

    // A stale, weak or unknown tag changes nothing; a list holding the version, or `*`, does.
    let renamed = body.replace(r#""key":"name""#, r#""key":"title""#);
    for stale in [first.as_str(), &format!("W/{second}"), "\"1\""] {
        let problem = put(stale, renamed.clone()).await.assert_problem(412, "precondition-failed");
        assert!(problem["detail"].to_string().contains(&second.replace('"', "\\\"")), "{problem:?}");
    }
    assert_eq!(version(&get(&manage).await), second, "nothing changed");
    assert_eq!(put(&format!("\"1\", {second}"), renamed.clone()).await.status, 200);
    assert_eq!(put("*", body.clone()).await.status, 200);

    // A change that lands during an update's live call: the update names the version it began
    // from, and is refused once its live call is over.
    let now = version(&get(&manage).await);
    let waiting = tokio::spawn(put(&now, registration(&held.url, r#","queries":{"hold":"1"}"#, "")));
    held.arrived(1).await;
    assert_eq!(put("", renamed.clone()).await.status, 200, "an update without If-Match");
    held.release();
    waiting.await.unwrap().assert_problem(412, "precondition-failed");
    assert_eq!(&get(&service.url(&path)).await.body[..], br#"{"id":52772,"title":"Teriyaki Chicken"}"#);

    // A delete with If-Match deletes only that version.
    let last = version(&get(&manage).await);
    send(Method::DELETE, &manage, &[("if-match", &now)], "").await.assert_problem(412, "precondition-failed");
    assert_eq!(get(&service.url(&path)).await.status, 200, "still there");
    assert_eq!(send(Method::DELETE, &manage, &[("if-match", &last)], "").await.status, 204);
    assert_eq!(get(&service.url(&path)).await.status, 404);
    service.stop().await;
}

/// Two updates without `If-Match` whose live calls overlap land as two versions, tagged in the
/// order they land (the store gives the tag as it writes): a client that read the version the
/// first to land made cannot pass over the second, which it never saw.
#[tokio::test]
async fn overlapping_updates_are_tagged_in_the_order_they_land() {
    let held = crate::support::Held::start(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&held.url, "", ""), &[]).await;
    let manage = service.url(&format!("/v1/routes/{}", &path[4..40]));
    let version = |answer: &Answer| -> u64 {
        answer.header("etag").expect("an ETag").trim_matches('"').parse().expect("a number")
    };
    let put = |body: String, tag: Option<u64>| {
        let url = manage.clone();
        async move {
            let tag = tag.map(|tag| format!("\"{tag}\""));
            let mut headers = vec![("content-type", "application/json")];
            if let Some(tag) = &tag {
                headers.push(("if-match", tag.as_str()));
            }
            send(Method::PUT, &url, &headers, body).await
        }
    };
    // The first update's live call is held at the upstream; the second passes it and lands.
    let slow = tokio::spawn(put(registration(&held.url, r#","queries":{"hold":"1"}"#, ""), None));
    held.arrived(1).await;
    let renamed = registration(&held.url, "", "").replace(r#""key":"name""#, r#""key":"title""#);
    let fast = put(renamed.clone(), None).await;
    assert_eq!(fast.status, 200, "{:?}", fast.body);
    let read = version(&get(&manage).await);
    assert_eq!(read, version(&fast));
    held.release();
    let slow = slow.await.unwrap();
    assert_eq!(slow.status, 200, "{:?}", slow.body);
    assert!(version(&slow) > version(&fast), "{} after {}", version(&slow), version(&fast));
    assert_eq!(version(&get(&manage).await), version(&slow));
    // The client that read between them: its update names a version that is gone.
    put(renamed, Some(read)).await.assert_problem(412, "precondition-failed");
    service.stop().await;
}

#[tokio::test]
async fn deleted_routes_are_gone_at_once_and_after_a_restart() {
    let upstream = Upstream::json(MEALS).await;
    let dir = tempfile::TempDir::new().unwrap();
    let service = Service::start_in(config(), dir.path()).await;
    let kept = registered(
        &service,
        &registration(&upstream.url("/"), "", r#","authHeader":{"type":"Bearer","token":"t"}"#),
        &[],
    )
    .await;
    let deleted =
        registered(&service, &registration(&upstream.url("/"), "", "").replace("meals/random", "gone"), &[])
            .await;
    let answer =
        send(Method::DELETE, &service.url(&format!("/v1/routes/{}", &deleted[4..40])), &[], "").await;
    assert_eq!(answer.status, 204);
    assert!(answer.body.is_empty());
    get(&service.url(&deleted)).await.assert_problem(404, "not-found");
    get(&service.url(&format!("/v1/routes/{}", &deleted[4..40]))).await.assert_problem(404, "not-found");
    send(Method::DELETE, &service.url(&format!("/v1/routes/{}", &deleted[4..40])), &[], "")
        .await
        .assert_problem(404, "not-found");
    service.stop().await;

    // A new service on the same directory serves the kept route without re-registration.
    let calls = upstream.received().len();
    let restarted = Service::start_in(config(), dir.path()).await;
    let answer = get(&restarted.url(&kept)).await;
    assert_eq!(&answer.body[..], br#"{"id":52772,"name":"Teriyaki Chicken"}"#);
    assert_eq!(upstream.received().len(), calls + 1, "no live call at start, one for the call");
    assert_eq!(upstream.received().pop().unwrap().headers["authorization"], "Bearer t");
    get(&restarted.url(&deleted)).await.assert_problem(404, "not-found");
    assert_eq!(route_count(&restarted).await, 1);
    restarted.stop().await;
}

#[tokio::test]
async fn a_stored_route_that_no_longer_compiles_answers_503() {
    let dir = tempfile::TempDir::new().unwrap();
    let uuid = uuid::Uuid::new_v4();
    {
        let store = recast::storage::Store::open(dir.path(), None).unwrap();
        let config = serde_json::json!({
            "path": "broken", "method": "GET", "baseUrl": "http://127.0.0.1:9", "upstreamPath": "",
            "upstreamMethod": "GET", "headers": {}, "queries": {}, "body": null, "preQueries": {},
            "preHeaders": {}, "preBody": null, "auth": {"mode": "none"},
            "rules": r#"{"newBodyFields":{"a":{"key":"a","type":"Integer"}},"oldBodyFields":{"a":{"keys":["a"]}}}"#,
        });
        let stored = recast::storage::StoredRoute {
            v: recast::storage::SCHEMA_VERSION,
            uuid,
            created_at: 1,
            updated_at: 1,
            config: config.to_string(),
        };
        store.put(&stored).unwrap();
    }
    let service = Service::start_in(config(), dir.path()).await;
    let answer = get(&service.url(&format!("/v1/{uuid}/broken"))).await;
    let problem = answer.assert_problem(503, "route-unavailable");
    assert!(problem.get("detail").and_then(Json::as_str).unwrap().contains("Integer"), "{problem}");
    let shown = get(&service.url(&format!("/v1/routes/{uuid}"))).await.json();
    assert_eq!(shown.get("status").and_then(Json::as_str), Some("unavailable"));
    service.stop().await;
}

#[tokio::test]
async fn a_data_directory_in_use_is_refused_with_a_clear_error() {
    let service = Service::start(config()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = Config { data_dir: service.dir.clone(), ..config() };
    let error = recast::server::run(listener, config, std::future::pending()).await.unwrap_err();
    assert!(error.to_string().contains("in use by another recast process"), "{error}");
    assert_eq!(get(&service.url("/readyz")).await.status, 200, "the first one is unharmed");
    service.stop().await;
}

#[tokio::test]
async fn preview_still_works_without_routes() {
    let service = Service::start(config()).await;
    let answer = post_json(
        &service.url("/v1/preview"),
        format!(r#"{{"originalResponse":{MEALS},"mappingRules":{RULES}}}"#),
    )
    .await;
    assert_eq!(&answer.body[..], br#"{"id":52772,"name":"Teriyaki Chicken"}"#);
    service.stop().await;
}

#[tokio::test]
async fn every_problem_of_a_registration_is_listed_at_its_location_in_the_body() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    // A misspelt member, a member of the wrong kind, a rule problem and a misspelt `keys`: all
    // in one answer, each located in the registration, with the name probably meant.
    let body = registration(&upstream.url("/"), r#","headers":{"a":1}"#, "")
        .replace("originalApi", "originalAPI")
        .replace(r#""type":"Int""#, r#""type":"Itn""#)
        .replace(r#""keys":["strMeal"]"#, r#""kyes":["strMeal"]"#);
    let problem = register(&service, &body, &[]).await.assert_problem(400, "invalid-request");
    let errors = located(&problem["errors"]);
    let at = |location: &str| {
        errors
            .iter()
            .find_map(|e| e.strip_prefix(location)?.strip_prefix(": "))
            .unwrap_or_else(|| panic!("{location} in {errors:?}"))
    };
    assert!(
        at("/originalRoute/originalAPI")
            .starts_with("unknown member `originalAPI`; did you mean `originalApi`?")
    );
    assert_eq!(at("/originalRoute/headers/a"), "must be a string, found a number");
    assert!(
        at("/rulesAsString/newBodyFields/id/type").starts_with("unknown type `Itn`; did you mean `Int`?")
    );
    assert!(
        at("/rulesAsString/oldBodyFields/name/kyes")
            .starts_with("unknown member `kyes`; did you mean `keys`?")
    );
    assert_eq!(errors.len(), 4, "{errors:?}: a misspelt member is not also reported missing");
    // Rules problems alone are `invalid-rules`, located in the body too.
    let body = registration(&upstream.url("/"), "", "").replace(r#""type":"Int""#, r#""type":"Itn""#);
    let problem = register(&service, &body, &[]).await.assert_problem(400, "invalid-rules");
    assert_eq!(problem["errors"][0]["location"], "/rulesAsString/newBodyFields/id/type");
    // Bad JSON: line, column and member.
    let body =
        registration(&upstream.url("/"), "", "").replace(r#""path":"api/random.php""#, "\n\"path\":api");
    let problem = register(&service, &body, &[]).await.assert_problem(400, "invalid-json");
    assert_eq!(problem["detail"], "line 2, column 8 (in `originalRoute`): not a value, found `a`");
    assert!(upstream.received().is_empty(), "invalid registrations make no live call");
    service.stop().await;
}

#[tokio::test]
async fn the_live_call_is_made_as_the_sample_request_which_is_stored_for_later_ones() {
    // An upstream that needs a body and a query: without them it answers 400.
    let upstream = Upstream::start(|r| {
        let query = r.uri.query().unwrap_or_default().to_owned();
        if r.body.is_empty() || !query.contains("page=2") {
            return Reply::with(400, "{}");
        }
        Reply::json(MEALS)
    })
    .await;
    let service = Service::start(config()).await;
    let plain = registration(&upstream.url("/"), r#","method":"POST""#, r#","method":"POST""#);
    register(&service, &plain, &[]).await.assert_problem(502, "upstream-validation-failed");
    let sampled = registration(
        &upstream.url("/"),
        r#","method":"POST""#,
        r#","method":"POST","sampleRequest":{"query":{"page":"2","q":"a b"},"body":{"order":1042}}"#,
    );
    let answer = register(&service, &sampled, &[]).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let live = upstream.received().pop().unwrap();
    assert_eq!(live.body, r#"{"order":1042}"#);
    assert_eq!(live.uri.query(), Some("page=2&q=a+b"));
    assert_eq!(live.headers.get("content-type").unwrap(), "application/json");
    // Stored with the route, and shown (it holds no secret).
    let uuid = answer.json()["uuid"].as_str().unwrap().to_owned();
    let shown = get(&service.url(&format!("/v1/routes/{uuid}"))).await;
    assert!(
        String::from_utf8_lossy(&shown.body)
            .contains(r#""sampleRequest":{"query":{"page":"2","q":"a b"},"body":{"order":1042}}"#),
        "{:?}",
        shown.body
    );
    // An update that gives none makes its live call with the stored one, and keeps it.
    let before = upstream.received().len();
    let update = send(
        Method::PUT,
        &service.url(&format!("/v1/routes/{uuid}")),
        &[("content-type", "application/json")],
        plain.clone(),
    )
    .await;
    assert_eq!(update.status, 200, "{}", String::from_utf8_lossy(&update.body));
    assert_eq!(upstream.received().len(), before + 1);
    let live = upstream.received().pop().unwrap();
    assert_eq!(live.body, r#"{"order":1042}"#);
    assert_eq!(live.uri.query(), Some("page=2&q=a+b"));
    let shown = get(&service.url(&format!("/v1/routes/{uuid}"))).await;
    assert!(String::from_utf8_lossy(&shown.body).contains(r#""body":{"order":1042}"#), "{:?}", shown.body);
    // A sample body the live call does not send is not dropped without a word.
    let unsent = registration(
        &upstream.url("/"),
        "",
        r#","sampleRequest":{"query":{"page":"2"},"body":{"order":1042}}"#,
    );
    let upstream_gets = Upstream::json(MEALS).await;
    let answer = register(&service, &unsent.replace(&upstream.url("/"), &upstream_gets.url("/")), &[]).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let warnings = answer.json()["warnings"].to_string();
    assert!(
        warnings.contains(r#"{"location":"/sampleRequest/body","message":"not sent by the live call: the upstream is called with GET, which carries no body (POST, PUT and PATCH do)"}"#),
        "{warnings}"
    );
    service.stop().await;
}

#[tokio::test]
async fn a_registration_warns_of_names_no_element_has_and_of_a_mapping_to_nothing() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let misspelt =
        registration(&upstream.url("/"), "", "").replace("strMeal", "strMeall").replace("idMeal", "idMea");
    let answer = register(&service, &misspelt, &[]).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let told = located(&answer.json()["warnings"]);
    assert!(
        told.contains(&"/rulesAsString/oldBodyFields/name: `name` found no value in the document: /meals/0 has no member `strMeall` (did you mean `strMeal`?)".to_owned()),
        "{told:?}"
    );
    assert!(
        told.iter().any(|w| w.starts_with("/rulesAsString/oldBodyFields/id: `id` found no value")),
        "{told:?}"
    );
    assert!(
        told.iter().any(|w| w.starts_with("/rulesAsString: the live call's answer maps to nothing")),
        "{told:?}"
    );
    // Rules that find their values get neither warning.
    let answer = register(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let warnings = answer.json()["warnings"].to_string();
    assert!(!warnings.contains("found no value") && !warnings.contains("maps to nothing"), "{warnings}");
    service.stop().await;
}

#[tokio::test]
async fn an_upstream_answer_that_is_not_json_is_told_by_what_it_said_it_is() {
    let upstream = Upstream::start(|r| match r.uri.path() {
        "/html/api/random.php" => {
            Reply { content_type: "text/html; charset=utf-8", ..Reply::json("<html>hi</html>") }
        }
        "/empty/api/random.php" => Reply::json(""),
        _ => Reply::json(r#"{"meals": [1,}"#),
    })
    .await;
    let service = Service::start(config()).await;
    let detail = |base: &str| {
        let body = registration(&upstream.url(base), "", "");
        let service = &service;
        async move {
            let problem =
                register(service, &body, &[]).await.assert_problem(502, "upstream-validation-failed");
            problem["detail"].as_str().unwrap().to_owned()
        }
    };
    assert_eq!(detail("/html/").await, "the upstream answered with `text/html`, not JSON");
    assert_eq!(detail("/empty/").await, "the upstream answered with an empty body, not JSON");
    assert_eq!(
        detail("/broken/").await,
        "the upstream's answer says it is JSON (`application/json`) but is not valid JSON: not a value at byte 13"
    );
    service.stop().await;
}

#[tokio::test]
async fn a_route_answers_at_its_path_percent_encoded() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let encoded = path.replace("meals/random", "meals%2Frandom");
    let answer = get(&service.url(&encoded)).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.body, get(&service.url(&path)).await.body);
    get(&service.url(&path.replace("meals/random", "meals%2Frandom%2Fx")))
        .await
        .assert_problem(404, "not-found");
    service.stop().await;
}

/// A route without `authHeader` may send an `Authorization` header of its own (as a source may):
/// shown masked, kept by the GET → PUT round trip, never replaced by a caller's `X-Mapped-Auth`.
/// A body configured for a method that carries none is never sent, and the registration says so.
#[tokio::test]
async fn a_routes_own_authorization_header_is_a_credential_and_an_unsent_body_is_warned_of() {
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    let extra = r#","headers":{"Authorization":"Token own-5ecret"},"body":{"never":"sent"}"#;
    let answer = register(&service, &registration(&upstream.url("/"), extra, ""), &[]).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let warnings = answer.json()["warnings"].to_string();
    assert!(warnings.contains("/originalRoute/body") && warnings.contains("never sent"), "{warnings}");
    let path = answer.json()["path"].as_str().unwrap().to_owned();
    let sent = upstream.received().pop().unwrap();
    assert_eq!(sent.headers["authorization"], "Token own-5ecret");
    assert!(sent.body.is_empty(), "GET sends no body");
    let uuid = &path[4..40];
    let shown = get(&service.url(&format!("/v1/routes/{uuid}"))).await;
    assert!(!String::from_utf8_lossy(&shown.body).contains("own-5ecret"), "masked when shown");
    let edited = shown_as_update(&service, uuid, |body| {
        assert_eq!(body["originalRoute"]["headers"]["Authorization"], "***");
    })
    .await;
    assert_eq!(update(&service, uuid, edited).await.status, 200);
    let with_caller = send(Method::GET, &service.url(&path), &[("x-mapped-auth", "Bearer caller")], "").await;
    assert_eq!(with_caller.status, 200);
    assert_eq!(upstream.received().pop().unwrap().headers["authorization"], "Token own-5ecret");
    service.stop().await;
}
