//! The OpenAPI description against the real handlers, so the two cannot drift apart: the service
//! serves `docs/openapi.json`; every operation in it is exercised (its request examples sent as
//! written, and the error cases it declares provoked), each answer's status must be one the
//! operation declares and its body must validate against the declared schema; methods the
//! description does not list get 405 with an `Allow` that names exactly the listed ones; and the
//! problem types it lists are exactly the ones the service answers with.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use http::Method;
use serde_json::Value;

use crate::support::{Answer, Reply, Service, Upstream, config, send};

const MEALS: &str = r#"{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken Casserole","strArea":"Japanese","strMeasure1":"3/4 cup","strIngredient1":"soy sauce"}]}"#;

/// The methods a path can be called with.
const METHODS: [Method; 5] = [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

/// The description, and which of its operations the test has exercised.
struct Spec {
    doc: Value,
    exercised: BTreeSet<(String, String)>,
}

impl Spec {
    fn load() -> Spec {
        let doc: Value = serde_json::from_str(recast::server::OPENAPI).expect("the description is JSON");
        Spec { doc, exercised: BTreeSet::new() }
    }

    /// `(path template, method)` of every operation.
    fn operations(&self) -> BTreeSet<(String, String)> {
        let mut all = BTreeSet::new();
        for (path, item) in self.doc["paths"].as_object().expect("paths") {
            for method in METHODS {
                let name = method.as_str().to_ascii_lowercase();
                if item.get(&name).is_some() {
                    all.insert((path.clone(), name));
                }
            }
        }
        all
    }

    /// The request body example `name` of an operation.
    fn example(&self, template: &str, method: &Method, name: &str) -> Value {
        let operation = &self.doc["paths"][template][method.as_str().to_ascii_lowercase()];
        let example = &operation["requestBody"]["content"]["application/json"]["examples"][name]["value"];
        assert!(!example.is_null(), "{method} {template} has no example `{name}`");
        example.clone()
    }

    /// Checks one answer of the operation `method template`: its status is declared (exactly, as
    /// a range like `2XX`, or as `default`), its content type is one declared for that status,
    /// and its body validates against that content's schema.
    fn check(&mut self, template: &str, method: &Method, answer: &Answer) {
        let name = method.as_str().to_ascii_lowercase();
        let operation = &self.doc["paths"][template][&name];
        assert!(operation.is_object(), "{method} {template} is not in the description");
        let status = answer.status.as_u16().to_string();
        let range = format!("{}XX", &status[..1]);
        let responses = &operation["responses"];
        let key = [status.as_str(), range.as_str(), "default"]
            .into_iter()
            .find(|key| responses.get(key).is_some())
            .unwrap_or_else(|| panic!("{method} {template} answered {status}, which it does not declare"));
        let body = String::from_utf8_lossy(&answer.body);
        match responses[key].get("content").and_then(Value::as_object) {
            None => assert!(answer.body.is_empty(), "{method} {template} {status} declares no body: {body}"),
            Some(content) => {
                let media =
                    answer.header("content-type").unwrap_or("").split(';').next().unwrap_or("").trim();
                assert!(
                    content.contains_key(media),
                    "{method} {template} {status}: content type `{media}` is not among {:?}",
                    content.keys().collect::<Vec<_>>()
                );
                if media.ends_with("json") {
                    let instance: Value = serde_json::from_slice(&answer.body)
                        .unwrap_or_else(|e| panic!("{method} {template} {status}: not JSON ({e}): {body}"));
                    let pointer = format!(
                        "#/paths/{}/{name}/responses/{key}/content/{}/schema",
                        escape(template),
                        escape(media)
                    );
                    self.validate(&pointer, &instance)
                        .unwrap_or_else(|why| panic!("{method} {template} {status}: {why}\n{body}"));
                }
            }
        }
        self.exercised.insert((template.to_owned(), name));
    }

    /// Validates `instance` against the schema at `pointer` (JSON Schema 2020-12, with the
    /// description's `$ref`s resolved within it).
    fn validate(&self, pointer: &str, instance: &Value) -> Result<(), String> {
        let mut root = self.doc.clone();
        root["$ref"] = Value::String(pointer.to_owned());
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&root)
            .map_err(|e| format!("the schema at {pointer} does not build: {e}"))?;
        let errors: Vec<String> =
            validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
    }

    /// Every path's unlisted methods get 405 naming exactly the listed ones in `Allow`.
    async fn check_unlisted_methods(&self, service: &Service, concrete: impl Fn(&str) -> String) {
        for (template, item) in self.doc["paths"].as_object().expect("paths") {
            let listed: BTreeSet<String> = METHODS
                .iter()
                .map(Method::as_str)
                .filter(|m| item.get(m.to_ascii_lowercase()).is_some())
                .map(str::to_owned)
                .collect();
            for method in METHODS.iter().filter(|m| !listed.contains(m.as_str())) {
                let answer = send(method.clone(), &service.url(&concrete(template)), &[], "").await;
                answer.assert_problem(405, "method-not-allowed");
                let allow: BTreeSet<String> =
                    answer.header("allow").unwrap_or("").split(',').map(|m| m.trim().to_owned()).collect();
                assert_eq!(
                    allow, listed,
                    "{method} {template}: Allow names other methods than the description"
                );
            }
        }
    }
}

fn value(answer: &Answer) -> Value {
    serde_json::from_slice(&answer.body).expect("a JSON answer")
}

/// RFC 6901 escaping of one pointer token, percent-encoded for a URI fragment.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1").replace('{', "%7B").replace('}', "%7D")
}

#[tokio::test]
async fn every_operation_answers_as_the_description_says() {
    let mut spec = Spec::load();
    // What the upstream answers after registration: 200 with MEALS, or this status.
    let failing = Arc::new(AtomicU16::new(0));
    let upstream = {
        let failing = failing.clone();
        Upstream::start(move |_| match failing.load(Ordering::Relaxed) {
            0 => Reply::json(MEALS),
            status => Reply::with(status, "{}"),
        })
        .await
    };
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/", listener.local_addr().unwrap())
    };
    let service = Service::start(config()).await;
    let url = |path: &str| service.url(path);

    // Operations.
    let served = send(Method::GET, &url("/openapi.json"), &[], "").await;
    spec.check("/openapi.json", &Method::GET, &served);
    assert_eq!(value(&served), spec.doc, "the service serves docs/openapi.json");
    for path in ["/healthz", "/readyz", "/metrics", "/"] {
        let answer = send(Method::GET, &url(path), &[], "").await;
        assert_eq!(answer.status, 200, "{path}");
        spec.check(path, &Method::GET, &answer);
    }

    // Previews: every example, plain and traced, and a body that is not JSON.
    let examples: Vec<String> =
        spec.doc["paths"]["/v1/preview"]["post"]["requestBody"]["content"]["application/json"]["examples"]
            .as_object()
            .expect("preview examples")
            .keys()
            .cloned()
            .collect();
    assert!(examples.len() >= 3, "{examples:?}");
    for name in &examples {
        let body = spec.example("/v1/preview", &Method::POST, name).to_string();
        for query in ["", "?trace=true"] {
            let answer = send(Method::POST, &url(&format!("/v1/preview{query}")), &[], body.clone()).await;
            let expected = if name == "badRules" { 400 } else { 200 };
            assert_eq!(answer.status, expected, "example {name}{query}");
            spec.check("/v1/preview", &Method::POST, &answer);
        }
    }
    let answer = send(Method::POST, &url("/v1/preview"), &[], "{not json").await;
    answer.assert_problem(400, "invalid-json");
    spec.check("/v1/preview", &Method::POST, &answer);

    // Registration: the example (pointed at the local upstream), then a refused one.
    let mut registration = spec.example("/v1/mapping", &Method::POST, "meal");
    registration["originalRoute"]["originalApi"]["baseUrl"] = Value::String(upstream.url("/"));
    let answer = send(Method::POST, &url("/v1/mapping"), &[], registration.to_string()).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    spec.check("/v1/mapping", &Method::POST, &answer);
    let registered = value(&answer);
    let uuid = registered["uuid"].as_str().expect("a uuid").to_owned();
    let call = registered["path"].as_str().expect("a path").to_owned();
    let mut unreachable = registration.clone();
    unreachable["originalRoute"]["originalApi"]["baseUrl"] = Value::String(closed);
    let answer = send(Method::POST, &url("/v1/mapping"), &[], unreachable.to_string()).await;
    answer.assert_problem(502, "upstream-validation-failed");
    spec.check("/v1/mapping", &Method::POST, &answer);
    let answer = send(Method::POST, &url("/v1/mapping"), &[], r#"{"path":"x"}"#).await;
    assert_eq!(answer.status, 400);
    spec.check("/v1/mapping", &Method::POST, &answer);
    // Named, owned, at a uuid of its own (SPEC §2.5); that uuid again is a conflict.
    let mut named = registration.clone();
    named["name"] = Value::String("meal-named".to_owned());
    named["owner"] = Value::String("team-a".to_owned());
    named["uuid"] = Value::String("0b6c7a10-3f1c-4a9e-8b7d-4c1e9a5f0d2e".to_owned());
    let answer = send(Method::POST, &url("/v1/mapping"), &[], named.to_string()).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    spec.check("/v1/mapping", &Method::POST, &answer);
    let answer = send(Method::POST, &url("/v1/mapping"), &[], named.to_string()).await;
    answer.assert_problem(409, "conflict");
    spec.check("/v1/mapping", &Method::POST, &answer);
    for query in ["?owner=team-a", "?name=meal-named"] {
        let answer = send(Method::GET, &url(&format!("/v1/routes{query}")), &[], "").await;
        spec.check("/v1/routes", &Method::GET, &answer);
        assert_eq!(value(&answer)["routes"][0]["name"], "meal-named", "{query}");
    }
    let named_route = "/v1/routes/0b6c7a10-3f1c-4a9e-8b7d-4c1e9a5f0d2e";
    assert_eq!(send(Method::DELETE, &url(named_route), &[], "").await.status, 204);

    // Management.
    for query in ["", "?limit=1", "?limit=0", "?path=meal&host=127.0.0.1", "?host=nowhere", "?owner=nobody"] {
        let answer = send(Method::GET, &url(&format!("/v1/routes{query}")), &[], "").await;
        spec.check("/v1/routes", &Method::GET, &answer);
    }
    let route = format!("/v1/routes/{uuid}");
    let unknown = "/v1/routes/00000000-0000-4000-8000-000000000000";
    for path in [route.as_str(), unknown] {
        let answer = send(Method::GET, &url(path), &[], "").await;
        spec.check("/v1/routes/{uuid}", &Method::GET, &answer);
    }
    let mut update = spec.example("/v1/routes/{uuid}", &Method::PUT, "meal");
    update["originalRoute"]["originalApi"]["baseUrl"] = Value::String(upstream.url("/"));
    // A dry run is asked with `true` only: another value is refused, never taken for an update.
    let misread = send(Method::PUT, &url(&format!("{route}?dryRun=1")), &[], update.to_string()).await;
    misread.assert_problem(400, "invalid-query");
    spec.check("/v1/routes/{uuid}", &Method::PUT, &misread);
    let dry_run = send(Method::PUT, &url(&format!("{route}?dryRun=true")), &[], update.to_string()).await;
    assert_eq!(dry_run.status, 200, "{:?}", dry_run.body);
    spec.check("/v1/routes/{uuid}", &Method::PUT, &dry_run);
    let changes = value(&dry_run)["changes"].clone();
    assert!(
        changes.as_array().unwrap().contains(&Value::from("/rulesAsString/newBodyFields/name/key")),
        "{changes}"
    );
    let answer = send(Method::PUT, &url(&route), &[], update.to_string()).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    spec.check("/v1/routes/{uuid}", &Method::PUT, &answer);

    // Calls: the registered method, the others, and upstream failures.
    let template = "/v1/{uuid}/{path}";
    let answer = send(Method::GET, &url(&call), &[], "").await;
    assert_eq!(answer.status, 200);
    spec.check(template, &Method::GET, &answer);
    for method in &METHODS[1..] {
        let answer = send(method.clone(), &url(&call), &[], "").await;
        answer.assert_problem(405, "method-not-allowed");
        spec.check(template, method, &answer);
    }
    for (upstream_status, answered) in [(404, 404), (429, 429), (500, 502)] {
        failing.store(upstream_status, Ordering::Relaxed);
        let answer = send(Method::GET, &url(&call), &[], "").await;
        answer.assert_problem(answered, "upstream-error");
        spec.check(template, &Method::GET, &answer);
    }
    let answer = send(Method::GET, &url(&format!("/v1/{uuid}/elsewhere")), &[], "").await;
    answer.assert_problem(404, "not-found");
    spec.check(template, &Method::GET, &answer);

    // The route's stats (the calls above counted in them), over a window and a bad one, then
    // an unknown route's.
    let stats = format!("{route}/stats");
    for (query, expected) in [("", 200), ("?minutes=5", 200), ("?minutes=6", 400), ("?minutes=x", 400)] {
        let answer = send(Method::GET, &url(&format!("{stats}{query}")), &[], "").await;
        assert_eq!(answer.status, expected, "{query}: {:?}", answer.body);
        spec.check("/v1/routes/{uuid}/stats", &Method::GET, &answer);
        if expected == 200 {
            let counted = value(&answer);
            assert_eq!(counted["calls"], 9, "{counted}");
            assert_eq!(counted["errors"]["method-not-allowed"], 4, "{counted}");
            assert_eq!(counted["errors"]["upstream-error"], 3, "{counted}");
            assert_eq!(counted["errors"]["not-found"], 1, "{counted}");
        }
    }
    let answer =
        send(Method::GET, &url("/v1/routes/00000000-0000-4000-8000-000000000000/stats"), &[], "").await;
    answer.assert_problem(404, "not-found");
    spec.check("/v1/routes/{uuid}/stats", &Method::GET, &answer);

    // Trying the route: with the upstream failing (502), then answering, its document beside
    // its mapped answer; then an unknown route.
    let answer = send(Method::POST, &url(&format!("{route}/try")), &[], "").await;
    answer.assert_problem(502, "upstream-validation-failed");
    spec.check("/v1/routes/{uuid}/try", &Method::POST, &answer);
    failing.store(0, Ordering::Relaxed);
    let answer = send(Method::POST, &url(&format!("{route}/try")), &[], "").await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    spec.check("/v1/routes/{uuid}/try", &Method::POST, &answer);
    let tried = value(&answer);
    assert_eq!(tried["upstream"], serde_json::from_str::<Value>(MEALS).unwrap());
    assert!(tried["output"].is_object() && tried["trace"].is_array(), "{tried}");
    let sample = spec.example("/v1/routes/{uuid}/try", &Method::POST, "sample");
    let answer = send(
        Method::POST,
        &url(&format!("{route}/try")),
        &[("content-type", "application/json")],
        sample.to_string(),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    spec.check("/v1/routes/{uuid}/try", &Method::POST, &answer);
    let answer =
        send(Method::POST, &url("/v1/routes/00000000-0000-4000-8000-000000000000/try"), &[], "").await;
    answer.assert_problem(404, "not-found");
    spec.check("/v1/routes/{uuid}/try", &Method::POST, &answer);

    // The key ring, and a re-seal (nothing to do: every route is sealed by the one key), with
    // a good and a bad batch.
    let answer = send(Method::GET, &url("/v1/keys"), &[], "").await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    spec.check("/v1/keys", &Method::GET, &answer);
    assert_eq!(value(&answer)["keys"][0]["records"], 1);
    for (query, expected) in [("", 200), ("?batch=1", 200), ("?batch=0", 400), ("?batch=1001", 400)] {
        let answer = send(Method::POST, &url(&format!("/v1/keys/reseal{query}")), &[], "").await;
        assert_eq!(answer.status, expected, "{query}: {:?}", answer.body);
        spec.check("/v1/keys/reseal", &Method::POST, &answer);
    }

    // Consumers and their keys: each operation's example, and its refusals.
    let consumer = spec.example("/v1/consumers", &Method::POST, "app").to_string();
    for expected in [201, 409] {
        let answer = send(Method::POST, &url("/v1/consumers"), &[], consumer.clone()).await;
        assert_eq!(answer.status, expected, "{:?}", answer.body);
        spec.check("/v1/consumers", &Method::POST, &answer);
    }
    let answer = send(Method::POST, &url("/v1/consumers"), &[], r#"{"name":"a b"}"#).await;
    answer.assert_problem(400, "invalid-request");
    spec.check("/v1/consumers", &Method::POST, &answer);
    for (query, expected) in [("", 200), ("?limit=1", 200), ("?limit=0", 400)] {
        let answer = send(Method::GET, &url(&format!("/v1/consumers{query}")), &[], "").await;
        assert_eq!(answer.status, expected, "{query}");
        spec.check("/v1/consumers", &Method::GET, &answer);
    }
    let change = spec.example("/v1/consumers/{name}", &Method::PUT, "app").to_string();
    for (method, name, body, expected) in [
        (Method::GET, "mobile-app", String::new(), 200),
        (Method::GET, "nobody", String::new(), 404),
        (Method::PUT, "mobile-app", change.clone(), 200),
        (Method::PUT, "mobile-app", r#"{"name":"other"}"#.to_owned(), 400),
        (Method::PUT, "nobody", change.clone(), 404),
    ] {
        let answer = send(method.clone(), &url(&format!("/v1/consumers/{name}")), &[], body).await;
        assert_eq!(answer.status, expected, "{method} {name}");
        spec.check("/v1/consumers/{name}", &method, &answer);
    }
    let expiring = spec.example("/v1/consumers/{name}/keys", &Method::POST, "expiring").to_string();
    let answer = send(Method::POST, &url("/v1/consumers/mobile-app/keys"), &[], expiring.clone()).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    spec.check("/v1/consumers/{name}/keys", &Method::POST, &answer);
    let issued = value(&answer);
    let key_id = issued["id"].as_str().expect("an id").to_owned();
    for (name, body, expected) in [("mobile-app", r#"{"expiresAt":1}"#, 400), ("nobody", "", 404)] {
        let answer = send(Method::POST, &url(&format!("/v1/consumers/{name}/keys")), &[], body).await;
        assert_eq!(answer.status, expected, "{name}");
        spec.check("/v1/consumers/{name}/keys", &Method::POST, &answer);
    }
    for (name, expected) in [("mobile-app", 200), ("nobody", 404)] {
        let answer = send(Method::GET, &url(&format!("/v1/consumers/{name}/keys")), &[], "").await;
        assert_eq!(answer.status, expected, "{name}");
        spec.check("/v1/consumers/{name}/keys", &Method::GET, &answer);
    }
    // A route that names the consumer, called without its key and with it.
    let mut protected = registration.clone();
    protected["path"] = Value::String("protected".into());
    protected["callers"] = serde_json::json!({"consumers": ["mobile-app"]});
    let answer = send(Method::POST, &url("/v1/mapping"), &[], protected.to_string()).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    let protected_call = value(&answer)["path"].as_str().expect("a path").to_owned();
    let answer = send(Method::GET, &url(&protected_call), &[], "").await;
    answer.assert_problem(401, "caller-unauthenticated");
    spec.check(template, &Method::GET, &answer);
    let key = issued["key"].as_str().expect("a key").to_owned();
    let answer = send(Method::GET, &url(&protected_call), &[("x-api-key", &key)], "").await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    spec.check(template, &Method::GET, &answer);
    for expected in [204, 404] {
        let answer =
            send(Method::DELETE, &url(&format!("/v1/consumers/mobile-app/keys/{key_id}")), &[], "").await;
        assert_eq!(answer.status, expected);
        spec.check("/v1/consumers/{name}/keys/{id}", &Method::DELETE, &answer);
    }
    for expected in [204, 404] {
        let answer = send(Method::DELETE, &url("/v1/consumers/mobile-app"), &[], "").await;
        assert_eq!(answer.status, expected);
        spec.check("/v1/consumers/{name}", &Method::DELETE, &answer);
    }

    // Purging the route's cached answers, then an unknown route's.
    let purge = format!("{route}/cache");
    for (path, expected) in
        [(purge.as_str(), 204), ("/v1/routes/00000000-0000-4000-8000-000000000000/cache", 404)]
    {
        let answer = send(Method::DELETE, &url(path), &[], "").await;
        assert_eq!(answer.status, expected, "{path}");
        spec.check("/v1/routes/{uuid}/cache", &Method::DELETE, &answer);
    }

    // Deletion, twice.
    for expected in [204, 404] {
        let answer = send(Method::DELETE, &url(&route), &[], "").await;
        assert_eq!(answer.status, expected);
        spec.check("/v1/routes/{uuid}", &Method::DELETE, &answer);
    }

    spec.check_unlisted_methods(&service, |template| {
        template
            .replace("{uuid}", &uuid)
            .replace("{path}", "meals/random")
            .replace("{name}", "x")
            .replace("{id}", "y")
    })
    .await;
    service.stop().await;

    // The admin token: the operations the description marks with `security` refuse without it;
    // the others never ask for it.
    let guarded = Service::start(recast::config::Config {
        admin_token: Some(recast::secrets::Secret::new("t0ken")),
        ..config()
    })
    .await;
    let mut secured = 0;
    for (template, name) in spec.operations() {
        let method = Method::from_bytes(name.to_ascii_uppercase().as_bytes()).expect("a method");
        let path = template
            .replace("{uuid}", &uuid)
            .replace("{path}", "meals/random")
            .replace("{name}", "x")
            .replace("{id}", "y");
        let answer = send(method.clone(), &guarded.url(&path), &[], "{}").await;
        if spec.doc["paths"][&template][&name].get("security").is_some() {
            answer.assert_problem(401, "admin-token-required");
            spec.check(&template, &method, &answer);
            secured += 1;
        } else {
            assert_ne!(answer.status, 401, "{method} {template} asks for the admin token");
        }
    }
    assert_eq!(
        secured, 19,
        "mapping, routes (list, get, put, delete, purge, stats, try), keys, reseal, metrics, consumers (list, create, get, put, delete) and their keys (list, issue, revoke)"
    );
    guarded.stop().await;

    let missing: Vec<_> = spec.operations().difference(&spec.exercised).cloned().collect();
    assert!(missing.is_empty(), "operations never exercised: {missing:?}");
}

#[test]
fn every_answer_example_validates_against_its_schema() {
    let spec = Spec::load();
    let mut checked = 0;
    for (template, method) in spec.operations() {
        let responses = spec.doc["paths"][&template][&method]["responses"].as_object().expect("responses");
        for (status, response) in responses {
            let Some(content) = response.get("content").and_then(Value::as_object) else { continue };
            for (media, described) in content {
                let Some(examples) = described.get("examples").and_then(Value::as_object) else { continue };
                for (name, example) in examples {
                    let pointer = format!(
                        "#/paths/{}/{method}/responses/{status}/content/{}/schema",
                        escape(&template),
                        escape(media)
                    );
                    spec.validate(&pointer, &example["value"])
                        .unwrap_or_else(|why| panic!("{method} {template} {status} example {name}: {why}"));
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 2, "{checked} answer examples");
}

#[test]
fn the_problem_types_listed_are_the_ones_answered() {
    let spec = Spec::load();
    let listed: BTreeSet<String> = spec.doc["components"]["schemas"]["Problem"]["properties"]["type"]["enum"]
        .as_array()
        .expect("an enum of problem types")
        .iter()
        .map(|t| t.as_str().expect("a string").to_owned())
        .collect();
    let answered: BTreeSet<String> = recast::server::problem::SLUGS
        .iter()
        .map(|slug| format!("{}{slug}", recast::server::problem::TYPE_BASE))
        .collect();
    assert_eq!(listed, answered);
}

#[test]
fn the_description_is_openapi_3_1_and_every_reference_resolves() {
    let spec = Spec::load();
    assert_eq!(spec.doc["openapi"], "3.1.0");
    let mut references = Vec::new();
    collect_refs(&spec.doc, &mut references);
    assert!(references.len() > 20, "{} references", references.len());
    for reference in references {
        let pointer = reference.strip_prefix('#').expect("local references only");
        assert!(spec.doc.pointer(pointer).is_some(), "{reference} does not resolve");
    }
    for (template, method) in spec.operations() {
        let operation = &spec.doc["paths"][&template][&method];
        assert!(operation["operationId"].is_string(), "{method} {template} has no operationId");
        assert!(operation["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {template}");
    }
}

fn collect_refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(members) => {
            for (name, member) in members {
                match (name.as_str(), member) {
                    ("$ref", Value::String(target)) => out.push(target.clone()),
                    _ => collect_refs(member, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_refs(item, out)),
        _ => {}
    }
}
