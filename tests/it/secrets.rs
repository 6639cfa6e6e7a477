//! Secrets with the real binary: a canary token goes through every admin endpoint and route call
//! while recast logs at trace level; then no answer, no log line and no file of the data directory
//! may hold it in plain text. And a wrong secret key stops the start.

use std::path::Path;

use http::Method;

use crate::binary::Binary;
use crate::support::{Answer, Json, Reply, Upstream, send};

const MEALS: &str = r#"{"meals":[{"idMeal":"7","strMeal":"Soup"}]}"#;
const RULES: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]}}}"#;

fn registration(base: &str, auth: &str) -> String {
    format!(
        r#"{{"path":"meal","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"meal"{auth}}},"rulesAsString":{RULES}}}"#
    )
}

/// An answer as bytes: status, headers and body.
fn transcript(answer: &Answer) -> Vec<u8> {
    let mut text = format!("{}\n", answer.status).into_bytes();
    for (name, value) in &answer.headers {
        text.extend_from_slice(name.as_str().as_bytes());
        text.extend_from_slice(b": ");
        text.extend_from_slice(value.as_bytes());
        text.push(b'\n');
    }
    text.extend_from_slice(&answer.body);
    text
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Every file under `dir` that holds `needle`, with how many files were read.
pub fn files_holding(dir: &Path, needle: &str, read: &mut usize) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle, read));
        } else {
            *read += 1;
            if holds(&std::fs::read(&path).unwrap(), needle) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test]
async fn a_canary_token_never_appears_in_answers_logs_or_the_data_directory() {
    let stored = format!("canary-stored-{}", uuid::Uuid::new_v4().simple());
    let updated = format!("canary-updated-{}", uuid::Uuid::new_v4().simple());
    let runtime = format!("canary-runtime-{}", uuid::Uuid::new_v4().simple());
    let canaries = [&stored, &updated, &runtime];
    let upstream = Upstream::json(MEALS).await;
    let failing = Upstream::start(|_| Reply::with(500, r#"{"error":"boom"}"#)).await;
    let dir = tempfile::TempDir::new().unwrap();
    let mut binary = Binary::start_with(dir.path(), &[("RECAST_LOG", "trace")]).await;
    let url = |path: &str| binary.url(path);
    let json = [("content-type", "application/json")];
    let bearer = |token: &str| format!(r#","authHeader":{{"type":"Bearer","token":"{token}"}}"#);

    let mut answers = Vec::new();
    let created =
        send(Method::POST, &url("/v1/mapping"), &json, registration(&upstream.url("/"), &bearer(&stored)))
            .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    let uuid = path[4..40].to_owned();
    answers.push(created);
    answers.push(send(Method::GET, &url(&path), &[], "").await);
    answers.push(send(Method::GET, &url("/v1/routes"), &[], "").await);
    answers.push(send(Method::GET, &url(&format!("/v1/routes/{uuid}")), &[], "").await);
    let update = registration(&upstream.url("/"), &bearer(&updated));
    answers.push(send(Method::PUT, &url(&format!("/v1/routes/{uuid}")), &json, update).await);
    answers.push(send(Method::GET, &url(&path), &[], "").await);
    answers.push(send(Method::GET, &url(&format!("/v1/routes/{uuid}")), &[], "").await);
    // Failures that carry a token: a live call that fails, invalid rules, a bad header value.
    answers.push(
        send(Method::POST, &url("/v1/mapping"), &json, registration(&failing.url("/"), &bearer(&stored)))
            .await,
    );
    let bad_rules =
        registration(&upstream.url("/"), &bearer(&stored)).replace(r#""type":"Int""#, r#""type":"Integer""#);
    answers.push(send(Method::POST, &url("/v1/mapping"), &json, bad_rules).await);
    let bad_update = registration(&failing.url("/"), &bearer(&updated));
    answers.push(send(Method::PUT, &url(&format!("/v1/routes/{uuid}")), &json, bad_update).await);
    // A runtime-auth route: the token comes with each call and is never stored.
    let with_runtime = [("content-type", "application/json"), ("x-mapped-auth", runtime.as_str())];
    let runtime_route =
        send(Method::POST, &url("/v1/mapping"), &with_runtime, registration(&upstream.url("/"), "")).await;
    assert_eq!(runtime_route.status, 201);
    let runtime_path = runtime_route.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    answers.push(runtime_route);
    answers.push(send(Method::GET, &url(&runtime_path), &[("x-mapped-auth", runtime.as_str())], "").await);
    answers.push(send(Method::GET, &url("/v1/routes"), &[], "").await);
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    assert_eq!(statuses, [201, 200, 200, 200, 200, 200, 200, 502, 400, 502, 201, 200, 200]);

    // The tokens did their work: the upstream received each of them.
    let sent: Vec<String> = upstream
        .received()
        .iter()
        .filter_map(|r| r.headers.get("authorization").map(|v| v.to_str().unwrap().to_owned()))
        .collect();
    for canary in canaries {
        assert!(sent.iter().any(|v| v.contains(canary.as_str())), "{canary} was sent upstream: {sent:?}");
    }
    // Trace logging is on: the most a log can say, said for every call.
    let traced = binary.log_text().lines().filter(|line| line.contains(" TRACE ")).count();
    assert!(traced >= 6, "one trace line per upstream answer at least ({traced})");
    binary.terminate();

    let answered: Vec<u8> = answers.iter().flat_map(transcript).collect();
    let log = binary.log_text();
    for canary in canaries {
        assert!(!holds(&answered, canary), "{canary} in an answer: {}", String::from_utf8_lossy(&answered));
        assert!(!log.contains(canary.as_str()), "{canary} in the log");
        let mut read = 0;
        assert_eq!(files_holding(dir.path(), canary, &mut read), Vec::<String>::new(), "{canary} on disk");
        assert!(read >= 5, "the data directory's files were read ({read})");
    }
    assert!(holds(&answered, r#""token":"***""#), "tokens are shown masked");
}

#[tokio::test]
async fn a_wrong_secret_key_stops_the_start_and_the_right_one_serves_again() {
    let upstream = Upstream::json(MEALS).await;
    let dir = tempfile::TempDir::new().unwrap();
    let right = "11".repeat(32);
    let wrong = "22".repeat(32);
    let mut first = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEY", &right)]).await;
    let auth = r#","authHeader":{"type":"Bearer","token":"kept"}"#;
    let created =
        send(Method::POST, &first.url("/v1/mapping"), &[], registration(&upstream.url("/"), auth)).await;
    assert_eq!(created.status, 201);
    let path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    first.terminate();
    assert!(!dir.path().join("secret.key").exists(), "the setting gives the key; no key file");

    for (env, message) in [
        (vec![("RECAST_SECRET_KEY", wrong.as_str())], "not the one the stored routes"),
        (vec![], "set RECAST_SECRET_KEY or restore the key file"),
        (vec![("RECAST_SECRET_KEY", "short")], "64 hex digits"),
    ] {
        let mut refused = Binary::spawn_with(dir.path(), &env);
        let status = refused.exit_status().expect("the binary exits by itself");
        assert!(!status.success());
        let log = refused.log_text();
        assert!(log.contains(message), "{log}");
        assert!(!log.contains(&right) && !log.contains(&wrong), "keys are never printed");
    }

    let again = Binary::start_with(dir.path(), &[("RECAST_SECRET_KEY", &right)]).await;
    let answer = send(Method::GET, &again.url(&path), &[], "").await;
    assert_eq!(answer.status, 200);
    assert_eq!(upstream.received().last().unwrap().headers.get("authorization").unwrap(), "Bearer kept");
}
