//! `$caller` (SPEC §2.4) where rules and templates read it: a composed route's source path, a
//! `when` choosing a tenant's upstream, rules writing the consumer and a nested claim, a cached
//! route that keeps each caller's answers apart, and previews and registrations with a sample
//! caller.

use http::Method;
use serde_json::{Value, json};

use crate::support::{Answer, Json, Reply, Service, Upstream, config, send};

async fn admin(service: &Service, method: Method, path: &str, body: Value) -> Answer {
    send(method, &service.url(path), &[("content-type", "application/json")], body.to_string()).await
}

async fn key_for(service: &Service, name: &str, metadata: Value) -> String {
    let created =
        admin(service, Method::POST, "/v1/consumers", json!({"name": name, "metadata": metadata})).await;
    assert_eq!(created.status, 201);
    let issued = send(Method::POST, &service.url(&format!("/v1/consumers/{name}/keys")), &[], "").await;
    assert_eq!(issued.status, 201);
    issued.json().get("key").and_then(Json::as_str).unwrap().to_owned()
}

async fn register(service: &Service, body: Value) -> String {
    let answer = admin(service, Method::POST, "/v1/mapping", body).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    answer.json().get("path").and_then(Json::as_str).unwrap().to_owned()
}

async fn call(service: &Service, path: &str, key: &str) -> Answer {
    send(Method::GET, &service.url(path), &[("x-api-key", key)], "").await
}

fn body(answer: &Answer) -> String {
    String::from_utf8_lossy(&answer.body).into_owned()
}

#[tokio::test]
async fn templates_and_when_read_the_caller_of_a_composed_route() {
    // Each tenant's upstream answers who it is and the path it was asked.
    let echo = |tenant: &'static str| {
        Upstream::start(move |request| {
            Reply::json(&json!({"tenant": tenant, "path": request.uri.path()}).to_string())
        })
    };
    let (acme, globex) = (echo("acme").await, echo("globex").await);
    let service = Service::start(config()).await;
    let a = key_for(&service, "app-a", json!({"tenant": "acme", "profile": {"tier": "gold"}})).await;
    let g = key_for(&service, "app-g", json!({"tenant": "globex", "profile": {"tier": "free"}})).await;
    let source = |upstream: &Upstream, tenant: &str| {
        json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": "users/{{$caller.id}}",
               "when": format!("$caller.metadata.tenant == '{tenant}'")})
    };
    let path = register(
        &service,
        json!({
            "path": "me",
            "sources": {"acme": source(&acme, "acme"), "globex": source(&globex, "globex")},
            "callers": {"consumers": ["app-*"]},
            "caller": {"kind": "key", "id": "app-a", "consumer": "app-a", "metadata": {"tenant": "acme", "profile": {"tier": "gold"}}},
            "rulesAsString": {
                "newBodyFields": {"who": {"key": "who", "type": "String"}, "tier": {"key": "tier", "type": "String"},
                                  "tenant": {"key": "tenant", "type": "String"}, "path": {"key": "path", "type": "String"}},
                "oldBodyFields": {"who": {"expr": "$caller.consumer"}, "tier": {"expr": "$caller.metadata.profile.tier"},
                                  "tenant": {"expr": "acme.tenant || globex.tenant"}, "path": {"expr": "acme.path || globex.path"}}
            }
        }),
    )
    .await;
    let answer = call(&service, &path, &a).await;
    assert_eq!(body(&answer), r#"{"path":"/users/app-a","tenant":"acme","tier":"gold","who":"app-a"}"#);
    let answer = call(&service, &path, &g).await;
    assert_eq!(body(&answer), r#"{"path":"/users/app-g","tenant":"globex","tier":"free","who":"app-g"}"#);
    // Each tenant's upstream was asked by its own callers only: the live call as the sample
    // caller, then app-a's call; app-g's went to the other.
    assert_eq!(acme.received().len(), 2);
    assert_eq!(globex.received().len(), 1);
    service.stop().await;
}

#[tokio::test]
async fn a_cached_route_that_reads_the_caller_never_answers_one_caller_with_another_s() {
    let upstream = Upstream::json(r#"{"orders":[1,2]}"#).await;
    let service = Service::start(config()).await;
    let (a, b) = (key_for(&service, "a", json!(null)).await, key_for(&service, "b", json!(null)).await);
    let path = register(
        &service,
        json!({
            "path": "orders",
            "originalRoute": {"originalApi": {"baseUrl": upstream.url("/")}, "path": "orders"},
            "callers": {"consumers": ["*"]},
            "cache": {"ttlSeconds": 60},
            "rulesAsString": {"newBodyFields": {"who": {"key": "who", "type": "String"}, "n": {"key": "n", "type": "Int"}},
                              "oldBodyFields": {"who": {"expr": "$caller.id"}, "n": {"expr": "length(orders)"}}}
        }),
    )
    .await;
    for _ in 0..2 {
        assert_eq!(body(&call(&service, &path, &a).await), r#"{"n":2,"who":"a"}"#);
        assert_eq!(body(&call(&service, &path, &b).await), r#"{"n":2,"who":"b"}"#);
    }
    // The live call, then one miss per caller; the rest came from the cache.
    assert_eq!(upstream.received().len(), 3);
    service.stop().await;
}

#[tokio::test]
async fn previews_and_registrations_take_a_sample_caller() {
    let service = Service::start(config()).await;
    // (`json!` keeps members by name: the output's order.)
    let rules = json!({"newBodyFields": {"sub": {"key": "sub", "type": "String"}, "org": {"key": "org", "type": "String"}},
                       "oldBodyFields": {"sub": {"expr": "$caller.claims.sub"}, "org": {"expr": "$caller.claims.org.name"}}});
    let preview = |caller: Value| json!({"originalResponse": {}, "mappingRules": rules, "caller": caller});
    let answer = admin(
        &service,
        Method::POST,
        "/v1/preview",
        preview(json!({"kind": "jwt", "claims": {"sub": "u1", "org": {"name": "acme"}}})),
    )
    .await;
    assert_eq!(body(&answer), r#"{"org":"acme","sub":"u1"}"#);
    // Without a caller, `$caller` is null.
    let answer =
        admin(&service, Method::POST, "/v1/preview", json!({"originalResponse": {}, "mappingRules": rules}))
            .await;
    assert_eq!(body(&answer), r#"{"org":null,"sub":null}"#);
    let answer = admin(&service, Method::POST, "/v1/preview", preview(json!("u1"))).await;
    answer.assert_problem(400, "invalid-request");
    // A registration's template that reads `$caller` needs a sample caller for its live call,
    // which is stored and shown.
    let upstream = Upstream::json("{}").await;
    let mut registration = json!({
        "path": "me",
        "originalRoute": {"originalApi": {"baseUrl": upstream.url("/")}, "path": "users/{{$caller.claims.sub}}"},
        "callers": {"jwt": [{"issuer": "https://id.test/", "audiences": ["a"], "jwksUri": upstream.url("/keys")}]},
        "rulesAsString": rules,
    });
    let answer = admin(&service, Method::POST, "/v1/mapping", registration.clone()).await;
    assert_eq!(answer.status, 400, "{}", body(&answer));
    registration["caller"] = json!({"kind": "jwt", "id": "u1", "issuer": "https://id.test/", "claims": {"sub": "u1", "org": {"name": "acme"}}});
    let answer = admin(&service, Method::POST, "/v1/mapping", registration).await;
    assert_eq!(answer.status, 201, "{}", body(&answer));
    assert_eq!(
        answer.json().get("preview").map(Json::to_string).as_deref(),
        Some(r#"{"org":"acme","sub":"u1"}"#)
    );
    // The live call went to the sample caller's path (beside it, the key set fetched ahead of the
    // first call).
    let asked: Vec<String> = upstream.received().iter().map(|r| r.uri.path().to_owned()).collect();
    assert!(asked.contains(&"/users/u1".to_owned()), "{asked:?}");
    let uuid = answer.json().get("uuid").and_then(Json::as_str).unwrap().to_owned();
    let shown = body(&send(Method::GET, &service.url(&format!("/v1/routes/{uuid}")), &[], "").await);
    assert!(shown.contains(r#""caller":{"claims":{"org":{"name":"acme"},"sub":"u1"},"id":"u1""#), "{shown}");
    service.stop().await;
}
