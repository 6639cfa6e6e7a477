//! `POST /v1/preview` over HTTP: answers, traces, and every kind of bad request.

use http::Method;
use recast::config::Config;

use crate::support::{Json, Service, located, post_json, send};

const RULES: &str = r#"{"ignoreEmptyValues":true,"newBodyFields":{"id":{"key":"id","type":"Int"},"n":{"key":"name","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"n":{"keys":["strMeal"],"parents":["meals"]},"spare":{"keys":["x"]}}}"#;

fn body(sample: &str, rules: &str) -> String {
    format!(r#"{{"originalResponse":{sample},"mappingRules":{rules}}}"#)
}

#[tokio::test]
async fn maps_the_sample_and_stamps_request_id_and_timing() {
    let service = Service::start(Config::default()).await;
    let answer =
        post_json(&service.url("/v1/preview"), body(r#"{"meals":[{"idMeal":"7","strMeal":"Soup"}]}"#, RULES))
            .await;
    assert_eq!(answer.status, 200);
    assert_eq!(&answer.body[..], br#"{"id":7,"name":"Soup"}"#);
    assert!(answer.header("x-request-id").is_some_and(|id| !id.is_empty()));
    assert!(answer.header("server-timing").is_some_and(|t| t.starts_with("map;dur=")));

    let echoed = send(
        Method::POST,
        &service.url("/v1/preview"),
        &[("x-request-id", "trace-me-42")],
        body("{}", RULES),
    )
    .await;
    assert_eq!(echoed.header("x-request-id"), Some("trace-me-42"));
    assert_eq!(&echoed.body[..], b"{}");
    service.stop().await;
}

#[tokio::test]
async fn rules_may_come_as_a_json_string() {
    let service = Service::start(Config::default()).await;
    let as_string = serde_json::Value::String(RULES.to_owned()).to_string();
    let answer = post_json(&service.url("/v1/preview"), body(r#"{"meals":{"idMeal":1}}"#, &as_string)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(&answer.body[..], br#"{"id":1}"#);
    service.stop().await;
}

#[tokio::test]
async fn trace_explains_every_target_and_carries_warnings() {
    let service = Service::start(Config::default()).await;
    let answer = post_json(
        &service.url("/v1/preview?trace=true"),
        body(r#"{"meals":[{"idMeal":"abc","strMeal":"Soup"}]}"#, RULES),
    )
    .await;
    assert_eq!(answer.status, 200);
    let traced = answer.json();
    assert_eq!(traced.get("output").unwrap().to_string(), r#"{"name":"Soup"}"#);
    let trace = traced.get("trace").unwrap().as_array();
    assert_eq!(trace.len(), 2);
    let id = &trace[0];
    assert_eq!(id.get("id").and_then(Json::as_str), Some("id"));
    assert_eq!(id.get("resolved"), Some(&Json::Bool(true)));
    assert_eq!(id.get("included"), Some(&Json::Bool(false)));
    assert_eq!(id.get("value"), Some(&Json::Null));
    assert_eq!(
        id.get("note").and_then(Json::as_str),
        Some("a string at /meals/0/idMeal does not convert to Int; left out (ignoreEmptyValues)")
    );
    let name = &trace[1];
    assert_eq!(name.get("value").and_then(Json::as_str), Some("Soup"));
    assert_eq!(name.get("included"), Some(&Json::Bool(true)));
    let warnings = traced.get("warnings").unwrap().as_array();
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].get("location").and_then(Json::as_str), Some("/oldBodyFields/spare"));

    // A missing value says where the walk stopped.
    let missing = post_json(&service.url("/v1/preview?trace"), body(r#"{"meals":[]}"#, RULES)).await.json();
    let note =
        missing.get("trace").unwrap().as_array()[0].get("note").and_then(Json::as_str).map(str::to_owned);
    assert_eq!(note.as_deref(), Some("/meals is an empty list; left out (ignoreEmptyValues)"));
    service.stop().await;
}

#[tokio::test]
async fn trace_of_each_describes_elements_up_to_a_limit() {
    let service = Service::start(Config::default()).await;
    let rules = r#"{"each":["items"],"newBodyFields":{"v":{"key":"v","type":"Int"}},"oldBodyFields":{"v":{"keys":["v"]}}}"#;
    let items: Vec<String> = (0..60).map(|i| format!(r#"{{"v":{i}}}"#)).collect();
    let sample = format!(r#"{{"items":[{}]}}"#, items.join(","));
    let traced = post_json(&service.url("/v1/preview?trace=true"), body(&sample, rules)).await.json();
    assert_eq!(traced.get("output").unwrap().as_array().len(), 60);
    let trace = traced.get("trace").unwrap().as_array();
    assert_eq!(trace.len(), 50);
    assert_eq!(trace[49].get("element"), Some(&Json::Number(49.into())));
    assert_eq!(trace[49].get("note").and_then(Json::as_str), Some("read a number at /items/49/v as Int"));
    let warnings = traced.get("warnings").unwrap().as_array();
    assert!(warnings[0].get("message").and_then(Json::as_str).unwrap().contains("first 50 of 60"));

    // `each` may lead to one object; the trace then points into it.
    let single =
        post_json(&service.url("/v1/preview?trace=true"), body(r#"{"items":{"v":"7"}}"#, rules)).await.json();
    assert_eq!(single.get("output").unwrap().to_string(), r#"[{"v":7}]"#);
    let entry = &single.get("trace").unwrap().as_array()[0];
    assert_eq!(entry.get("note").and_then(Json::as_str), Some("read a string at /items/v as Int"));

    let nowhere =
        post_json(&service.url("/v1/preview?trace=true"), body(r#"{"items":3}"#, rules)).await.json();
    assert_eq!(nowhere.get("output").unwrap().to_string(), "[]");
    let warning = &nowhere.get("warnings").unwrap().as_array()[0];
    assert_eq!(warning.get("location").and_then(Json::as_str), Some("/each"));
    service.stop().await;
}

#[tokio::test]
async fn bad_bodies_get_problems() {
    let service = Service::start(Config::default()).await;
    let url = service.url("/v1/preview");
    post_json(&url, "{not json").await.assert_problem(400, "invalid-json");
    post_json(&url, "").await.assert_problem(400, "invalid-json");
    post_json(&url, b"\"\xff\"".to_vec()).await.assert_problem(400, "invalid-json");
    post_json(&url, "[1,2]").await.assert_problem(400, "invalid-request");
    post_json(&url, r#"{"mappingRules":{}}"#).await.assert_problem(400, "invalid-request");
    post_json(&url, r#"{"originalResponse":{}}"#).await.assert_problem(400, "invalid-request");
    // Every problem of the body in `errors`, at its location, with the name probably meant (and
    // not also as a missing member).
    let typo = post_json(&url, body("{}", RULES).replace("mappingRules", "mappingRule")).await;
    let problem = typo.assert_problem(400, "invalid-request");
    assert_eq!(problem["errors"].as_array().len(), 1, "{problem}");
    assert_eq!(problem["errors"][0]["location"], "/mappingRule");
    assert_eq!(
        problem["errors"][0]["message"],
        "unknown member `mappingRule`; did you mean `mappingRules`? The known members are originalResponse, mappingRules, caller"
    );
    let twice = format!(r#"{{"originalResponse":1,"originalResponse":2,"mappingRules":{RULES},"x":1}}"#);
    let problem = post_json(&url, twice).await.assert_problem(400, "invalid-request");
    let locations: Vec<&str> =
        problem["errors"].as_array().iter().map(|e| e["location"].as_str().unwrap()).collect();
    assert_eq!(locations, ["/originalResponse", "/x"]);
    post_json(&service.url("/v1/preview?trace=maybe"), body("{}", RULES))
        .await
        .assert_problem(400, "invalid-query");
    // Bad JSON is told by line, column and the member it is in, in words.
    let broken = "{\n  \"originalResponse\": {\"a\": 1,},\n  \"mappingRules\": {}\n}";
    let problem = post_json(&url, broken).await.assert_problem(400, "invalid-json");
    assert_eq!(
        problem["detail"],
        "line 2, column 31 (in `originalResponse`): expected a member name, found `}`"
    );
    let problem = post_json(&url, "").await.assert_problem(400, "invalid-json");
    assert_eq!(problem["detail"], "line 1, column 1: the text ends where a value should be");
    service.stop().await;
}

#[tokio::test]
async fn invalid_rules_list_every_problem_with_its_location() {
    let service = Service::start(Config::default()).await;
    let rules = r#"{"newBodyFields":{"a":{"key":"","type":"Integer"},"b":{"key":"b","type":"Int"},"c":{"key":"b","type":"Int"}},"oldBodyFields":{"a":{"keys":[]},"c":{"keys":["x, y"],"extra":1}},"colour":"red"}"#;
    let answer = post_json(&service.url("/v1/preview"), body("{}", rules)).await;
    let problem = answer.assert_problem(400, "invalid-rules");
    let errors: Vec<(String, String)> = problem
        .get("errors")
        .unwrap()
        .as_array()
        .iter()
        .map(|e| {
            let text = |m| e.get(m).and_then(Json::as_str).unwrap().to_owned();
            (text("location"), text("message"))
        })
        .collect();
    let locations: Vec<&str> = errors.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        locations,
        [
            "/newBodyFields/a/key",
            "/newBodyFields/a/type",
            "/oldBodyFields/a/keys",
            "/oldBodyFields/c/extra",
            "/colour",
            "/newBodyFields/b",
            "/newBodyFields/c/key",
            "/newBodyFields/c/type",
        ],
        "{errors:#?}"
    );
    service.stop().await;
}

#[tokio::test]
async fn oversized_bodies_get_413_with_or_without_length() {
    let config = Config { max_request_bytes: 64, ..Config::default() };
    let service = Service::start(config).await;
    let big = body(&format!(r#""{}""#, "x".repeat(100)), RULES);
    post_json(&service.url("/v1/preview"), big.clone()).await.assert_problem(413, "body-too-large");

    // Chunked, so the size is only known while reading.
    let chunks = chunked(big);
    let request = http::Request::post(service.url("/v1/preview"))
        .header("content-type", "application/json")
        .body(chunks)
        .unwrap();
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let response = client.request(request).await.expect("an answer");
    assert_eq!(response.status(), 413);
    assert!(response.headers().get("content-length").is_some());
    service.stop().await;
}

/// A body sent in two chunks with no `Content-Length`.
fn chunked(
    text: String,
) -> http_body_util::StreamBody<
    impl futures_util::Stream<Item = Result<hyper::body::Frame<bytes::Bytes>, std::convert::Infallible>>,
> {
    let (a, b) = text.split_at(text.len() / 2);
    let frames =
        [a.to_owned(), b.to_owned()].map(|part| Ok(hyper::body::Frame::data(bytes::Bytes::from(part))));
    http_body_util::StreamBody::new(futures_util::stream::iter(frames))
}

#[tokio::test]
async fn nesting_deeper_than_the_limit_is_refused() {
    let config = Config { max_depth: 8, ..Config::default() };
    let service = Service::start(config).await;
    let rules = r#"{"newBodyFields":{"a":{"key":"a","type":"Json"}},"oldBodyFields":{"a":{"keys":["a"]}}}"#;
    let nested = |depth: usize| format!(r#"{{"a":{}1{}}}"#, "[".repeat(depth - 1), "]".repeat(depth - 1));
    let ok = post_json(&service.url("/v1/preview"), body(&nested(8), rules)).await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    let deep = post_json(&service.url("/v1/preview"), body(&nested(9), rules)).await;
    let problem = deep.assert_problem(400, "body-too-deep");
    assert_eq!(problem["title"], "The request body nests too deeply");
    assert_eq!(
        problem["detail"],
        "the body nests deeper than 9 levels: the sample (`originalResponse`) may nest at most 8 (RECAST_MAX_DEPTH)"
    );
    service.stop().await;
}

/// Elements `group_by` leaves out (their key is null) are told in the trace's warnings, with the
/// rule and how many, and so is a name that no element has, with the one that exists.
#[tokio::test]
async fn values_lost_without_an_error_are_warned_of() {
    let service = Service::start(Config::default()).await;
    let sample = r#"{"items":[{"title":"x","g":null},{"title":"y","g":"a"},{"title":"z"}]}"#;
    let rules = r#"{"newBodyFields":{"groups":{"key":"groups","type":"Json"},"t":{"key":"t","type":"String"}},"oldBodyFields":{"groups":{"expr":"group_by(items, &g)"},"t":{"keys":["tilte"],"parents":["items"]}}}"#;
    let answer = post_json(&service.url("/v1/preview?trace=true"), body(sample, rules)).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let traced = answer.json();
    assert_eq!(traced["output"].to_string(), r#"{"groups":{"a":[{"title":"y","g":"a"}]},"t":null}"#);
    assert_eq!(
        located(&traced["warnings"]),
        [
            "/oldBodyFields/groups/expr: group_by() left out 2 elements whose key is null (counted over every run of the expression): they are in no group of the output",
            "/oldBodyFields/t: `t` found no value in the document: /items/0 has no member `tilte` (did you mean `title`?)",
        ]
    );
    service.stop().await;
}
