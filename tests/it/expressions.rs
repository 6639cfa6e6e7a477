//! Rules with expressions (SPEC §1.8) over HTTP: the JMESPath compliance suites through
//! `POST /v1/preview`, and route calls whose expressions fail or build past their budget.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Method;
use recast::config::Config;

use crate::support::{Json, Reply, Service, Upstream, config, post_json, send};

/// Rules with one target `v` (Json) read by `expr`.
fn rules(expr: &str) -> String {
    let expr = serde_json::to_string(expr).expect("a string");
    format!(
        r#"{{"newBodyFields":{{"v":{{"key":"v","type":"Json"}}}},"oldBodyFields":{{"v":{{"expr":{expr}}}}}}}"#
    )
}

/// Equal as JSON values: numbers by value, objects whatever their member order.
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => x.as_f64() == y.as_f64(),
        (Json::Array(x), Json::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Json::Object(x), Json::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.iter().any(|(l, w)| k == l && same(v, w)))
        }
        _ => a == b,
    }
}

/// The suites' error kinds that are compile errors (400); the others are found while mapping.
fn is_compile_error(kind: &str) -> bool {
    matches!(kind, "syntax" | "unknown-function" | "invalid-arity" | "undefined-variable")
}

/// Runs a sample of each suite file through the preview: every case of a file's first group and
/// the first case of each other group. Returns the number of cases run and the failures.
async fn run_sample(service: &Service, dir: &Path, skip: &[&str]) -> (usize, Vec<String>) {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).expect("a suite folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    let (mut run, mut failures) = (0, Vec::new());
    for path in files {
        let name = path.strip_prefix(dir).unwrap().display().to_string();
        if skip.contains(&name.as_str()) {
            continue;
        }
        let suite = Json::parse(&std::fs::read(&path).unwrap());
        for (n, group) in suite.as_array().iter().enumerate() {
            let given = group.get("given").expect("given").to_string();
            let cases = group.get("cases").map_or(&[][..], Json::as_array);
            let take = if n == 0 { cases.len() } else { 1 };
            for case in cases.iter().filter(|c| c.get("expression").is_some()).take(take) {
                let expression = case.get("expression").and_then(Json::as_str).unwrap();
                let verdict = match (case.get("result"), case.get("error").and_then(Json::as_str)) {
                    (_, Some(kind)) => check_error(service, &given, expression, kind).await,
                    (Some(result), None) => check_result(service, &given, expression, result).await,
                    (None, None) => continue,
                };
                run += 1;
                if let Err(why) = verdict {
                    failures.push(format!("{name}: {expression:?}: {why}"));
                }
            }
        }
    }
    (run, failures)
}

async fn preview(service: &Service, given: &str, expression: &str, trace: bool) -> crate::support::Answer {
    let body = format!(r#"{{"originalResponse":{given},"mappingRules":{}}}"#, rules(expression));
    let url = if trace { "/v1/preview?trace=true" } else { "/v1/preview" };
    post_json(&service.url(url), body).await
}

async fn check_result(service: &Service, given: &str, expression: &str, result: &Json) -> Result<(), String> {
    let answer = preview(service, given, expression, false).await;
    if answer.status != 200 {
        return Err(format!("{} {}", answer.status, String::from_utf8_lossy(&answer.body)));
    }
    let got = answer.json();
    let value = got.get("v").ok_or("no member v")?;
    if same(value, result) { Ok(()) } else { Err(format!("gave {value}, expected {result}")) }
}

async fn check_error(service: &Service, given: &str, expression: &str, kind: &str) -> Result<(), String> {
    let answer = preview(service, given, expression, true).await;
    let body = answer.json();
    if is_compile_error(kind) {
        let location = body.get("errors").map(|e| e.as_array()[0].get("location").cloned());
        return match (answer.status.as_u16(), location) {
            (400, Some(Some(Json::String(at)))) if at == "/oldBodyFields/v/expr" => Ok(()),
            _ => Err(format!("expected a compile error ({kind}), got {} {body}", answer.status)),
        };
    }
    let output = body.get("output").map(Json::to_string);
    let warned = body.get("warnings").is_some_and(|w| {
        w.as_array().iter().any(|p| {
            p.get("location").and_then(Json::as_str) == Some("/oldBodyFields/v/expr")
                && p.get("message").and_then(Json::as_str).is_some_and(|m| m.contains(&format!("({kind})")))
        })
    });
    match (answer.status.as_u16(), output.as_deref(), warned) {
        (200, Some(r#"{"v":null}"#), true) => Ok(()),
        _ => Err(format!("expected a missing value with a {kind} warning, got {} {body}", answer.status)),
    }
}

#[tokio::test]
async fn a_sample_of_each_compliance_file_passes_through_the_preview() {
    let service = Service::start(Config::default()).await;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (run, failures) = run_sample(&service, &root.join("tests/data/jmespath"), &[]).await;
    // The one case the Community Edition supersedes (tests/data/jmespath/README.md).
    let failures: Vec<_> =
        failures.into_iter().filter(|f| !f.starts_with(r#"literal.json: "'\\\\'""#)).collect();
    assert!(run > 150, "{run} cases run");
    assert!(failures.is_empty(), "{} of {run} failed:\n{}", failures.len(), failures.join("\n"));
    let community = root.join("../shared/jmespath/community");
    if community.is_dir() {
        let (run, failures) = run_sample(&service, &community, &["legacy/legacy-literal.json"]).await;
        assert!(run > 150, "{run} cases run");
        assert!(failures.is_empty(), "{} of {run} failed:\n{}", failures.len(), failures.join("\n"));
    } else {
        eprintln!("NOT RUN: the Community Edition's suite is not at {}", community.display());
    }
    service.stop().await;
}

/// A route whose upstream answers a list of `n` numbers, `n` growing by call: 2, then 100.
async fn growing_upstream() -> (Upstream, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let upstream = {
        let calls = calls.clone();
        Upstream::start(move |_| {
            let n = if calls.fetch_add(1, Ordering::SeqCst) == 0 { 2 } else { 100 };
            let numbers: Vec<String> = (0..n).map(|i| i.to_string()).collect();
            Reply::json(&format!(r#"{{"a":[{}],"word":"x"}}"#, numbers.join(",")))
        })
        .await
    };
    (upstream, calls)
}

#[tokio::test]
async fn a_call_whose_expressions_build_past_the_budget_answers_mapping_limit() {
    let (upstream, _) = growing_upstream().await;
    let service = Service::start(Config { max_expr_bytes: 1 << 20, ..config() }).await;
    // Two elements at registration build a few hundred bytes; a hundred build gigabytes.
    let expr = "a[*].[$.a[*].[$.a[*].[$.a[*].[$.a[*]]]]]";
    let as_string = serde_json::to_string(&rules(expr)).unwrap();
    let body = format!(
        r#"{{"path":"numbers","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"n"}},"rulesAsString":{as_string}}}"#,
        upstream.url("/")
    );
    let registered =
        send(Method::POST, &service.url("/v1/mapping"), &[("content-type", "application/json")], body).await;
    assert_eq!(registered.status, 201, "{}", String::from_utf8_lossy(&registered.body));
    let uuid = registered.json().get("uuid").and_then(Json::as_str).unwrap().to_owned();
    let answer = send(Method::GET, &service.url(&format!("/v1/{uuid}/numbers")), &[], "").await;
    assert_eq!(answer.status, 502);
    let problem = answer.json();
    assert_eq!(problem.get("type").and_then(Json::as_str), Some("https://recast.dev/problems/mapping-limit"));
    assert!(
        problem
            .get("detail")
            .and_then(Json::as_str)
            .unwrap()
            .contains("1048576 bytes (RECAST_MAX_EXPR_BYTES)")
    );
    let metrics = send(Method::GET, &service.url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(text.contains(r#"recast_upstream_errors_total{kind="mapping_limit"} 1"#), "{text}");
    // The preview answers 422 for the same.
    let sample = format!(r#"{{"a":[{}]}}"#, (0..100).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    let body = format!(r#"{{"originalResponse":{sample},"mappingRules":{}}}"#, rules(expr));
    let previewed = post_json(&service.url("/v1/preview"), body).await;
    assert_eq!(previewed.status, 422);
    assert_eq!(
        previewed.json().get("type").and_then(Json::as_str),
        Some("https://recast.dev/problems/mapping-limit")
    );
    service.stop().await;
}

#[tokio::test]
async fn an_expression_that_fails_on_a_call_is_a_missing_value_counted_in_the_metrics() {
    let (upstream, _) = growing_upstream().await;
    let service = Service::start(config()).await;
    let rules = serde_json::to_string(
        r#"{"newBodyFields":{"n":{"key":"n","type":"Int"},"w":{"key":"w","type":"String"}},
            "oldBodyFields":{"n":{"expr":"abs(word)"},"w":{"expr":"word"}}}"#,
    )
    .unwrap();
    let body = format!(
        r#"{{"path":"numbers","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"n"}},"rulesAsString":{rules}}}"#,
        upstream.url("/")
    );
    let registered =
        send(Method::POST, &service.url("/v1/mapping"), &[("content-type", "application/json")], body).await;
    assert_eq!(registered.status, 201, "{}", String::from_utf8_lossy(&registered.body));
    let uuid = registered.json().get("uuid").and_then(Json::as_str).unwrap().to_owned();
    for _ in 0..2 {
        let answer = send(Method::GET, &service.url(&format!("/v1/{uuid}/numbers")), &[], "").await;
        assert_eq!((answer.status.as_u16(), &answer.body[..]), (200, &br#"{"n":null,"w":"x"}"#[..]));
    }
    let metrics = send(Method::GET, &service.url("/metrics"), &[], "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    // The registration's live call mapped the answer too: three mappings, three failures.
    assert!(text.contains("recast_expression_errors_total 3"), "{text}");
    service.stop().await;
}
