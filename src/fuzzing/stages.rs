//! Fuzz bodies for single stages: compiling rules, executing fixed plans on arbitrary documents,
//! and building upstream requests from route configurations.

use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use http::HeaderMap;
use uuid::Uuid;

use super::LIMITS;
use super::Reached;
use crate::exec;
use crate::json;
use crate::route::{FromClient, Registration, Route};
use crate::rules::{Compiled, compile_json};

/// Rules text → compile. Checks: nothing panics; a refusal names at least one problem, each with
/// a JSON-pointer location; an accepted document stays within the limits; an object compiles the
/// same way when sent as a string holding it (SPEC §1: `rulesAsString` takes both).
pub fn rules_compile(data: &[u8]) -> Reached {
    match compile_json(data, &LIMITS) {
        Ok(compiled) => {
            assert!(compiled.plan.target_count() <= LIMITS.max_rules, "more targets than allowed");
            if let Ok(text) = std::str::from_utf8(data)
                && text.trim_start().starts_with('{')
            {
                let wrapped = serde_json::to_vec(text).expect("a string serialises");
                let again = compile_json(&wrapped, &LIMITS);
                assert!(again.is_ok(), "the rules compile as an object but not as a string: {again:?}");
            }
            if compiled.plan.target_count() == 0 { Reached::MappedNothing } else { Reached::Mapped }
        }
        Err(problems) => {
            assert!(!problems.is_empty(), "a refusal without a problem");
            for problem in &problems {
                assert!(
                    problem.location.is_empty() || problem.location.starts_with('/'),
                    "not a JSON pointer: {problem:?}"
                );
                assert!(!problem.message.is_empty(), "a problem without a message");
            }
            Reached::RulesRefused
        }
    }
}

/// Plans that cover the executor's ops: renames, nested parents, concatenation, every type,
/// skipping empty values, and `each` lists.
const PLANS: [&str; 4] = [
    r#"{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"ok":{"key":"ok","type":"Boolean"},"price":{"key":"price","type":"Double"},"raw":{"key":"raw","type":"Json"}},"oldBodyFields":{"id":{"keys":["id"]},"name":{"keys":["first, last"],"parents":["person"]},"ok":{"keys":["ok"]},"price":{"keys":["price"],"parents":["a","b"]},"raw":{"keys":["raw"]}}}"#,
    r#"{"ignoreEmptyValues":true,"newBodyFields":{"n":{"key":"n","type":"Long"},"f":{"key":"f","type":"Float"},"s":{"key":"s","type":"String"}},"oldBodyFields":{"n":{"keys":["n","m"]},"f":{"keys":["f"]},"s":{"keys":["a, b, c","d"],"parents":["x"]}}}"#,
    r#"{"each":["items"],"newBodyFields":{"id":{"key":"id","type":"Int"},"tags":{"key":"tags","type":"String"}},"oldBodyFields":{"id":{"keys":["id"]},"tags":{"keys":["t1","t2, t3"]}}}"#,
    r#"{"each":["data","list"],"ignoreEmptyValues":true,"newBodyFields":{"v":{"key":"v","type":"Json"},"b":{"key":"b","type":"Boolean"}},"oldBodyFields":{"v":{"keys":["v"],"parents":["inner"]},"b":{"keys":["b"]}}}"#,
];

fn plans() -> &'static [Compiled] {
    static PLANS_COMPILED: OnceLock<Vec<Compiled>> = OnceLock::new();
    PLANS_COMPILED.get_or_init(|| {
        PLANS
            .iter()
            .map(|rules| compile_json(rules.as_bytes(), &LIMITS).expect("a fixed plan compiles"))
            .collect()
    })
}

/// Arbitrary bytes as the upstream's answer → parse → every fixed plan. Checks: nothing panics,
/// every output is valid JSON of the plan's kind.
pub fn exec_document(data: &[u8]) -> Reached {
    let mut reached = Reached::DocumentRefused;
    for compiled in plans() {
        let mut document = data.to_vec();
        let outcome = json::with_parsed(&mut document, 64, |nodes| {
            let mut out = Vec::new();
            exec::execute(&compiled.plan, nodes, 0, &mut out);
            match serde_json::from_slice::<serde_json::Value>(&out) {
                Ok(value) => assert_eq!(value.is_array(), compiled.plan.is_each(), "output kind"),
                Err(e) => panic!("invalid output JSON ({e}): {}", String::from_utf8_lossy(&out)),
            }
        });
        if outcome.is_ok() {
            reached = Reached::Mapped;
        }
    }
    reached
}

/// Pieces that URL tricks are made of.
const URL_PIECES: [&str; 20] = [
    "http://",
    "https://",
    "api.example.com",
    "a.example:8443",
    "127.0.0.1",
    "[::1]",
    "/",
    "//",
    "\\",
    "..",
    "%2e%2e",
    "%2F",
    "@",
    "?",
    "#",
    ":",
    "v2",
    "evil.example",
    "%00",
    " ",
];

#[derive(Arbitrary, Debug)]
struct UrlCase {
    base: Vec<Piece>,
    path: Vec<Piece>,
    queries: Vec<(String, String)>,
    client_query: String,
}

#[derive(Arbitrary, Debug)]
enum Piece {
    Known(u8),
    Other(String),
}

fn join(pieces: &[Piece]) -> String {
    pieces
        .iter()
        .map(|p| match p {
            Piece::Known(i) => URL_PIECES[*i as usize % URL_PIECES.len()],
            Piece::Other(s) => s,
        })
        .collect()
}

/// Route configuration (base URL, upstream path, queries) and a client's query → the upstream
/// request. Checks: nothing panics, and an accepted route's requests go to the base URL's scheme,
/// host and port, below its path.
pub fn upstream_url(data: &[u8]) -> Reached {
    let Ok(case) = UrlCase::arbitrary_take_rest(Unstructured::new(data)) else { return Reached::Nothing };
    let (base, path) = (join(&case.base), join(&case.path));
    let queries: serde_json::Map<String, serde_json::Value> =
        case.queries.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str()))).collect();
    let registration = serde_json::json!({
        "path": "p",
        "originalRoute": { "originalApi": { "baseUrl": base }, "path": path, "queries": queries },
        "rulesAsString": PLANS[0],
    });
    let registration: Registration = match serde_json::from_value(registration) {
        Ok(registration) => registration,
        Err(e) => panic!("a well-formed registration is refused: {e}"),
    };
    let Ok(config) = registration.validate(false, None) else { return Reached::RulesRefused };
    let route = Route::new(Uuid::nil(), 0, 0, config, &LIMITS);
    if let Some(why) = route.broken() {
        panic!("a validated route is broken: {why}");
    }
    let headers = HeaderMap::new();
    let client = FromClient {
        query: Some(&case.client_query),
        headers: Some(&headers),
        body: Bytes::new(),
        caller: None,
    };
    let request = match route.upstream_request(&client) {
        Ok(request) => request,
        Err(e) => panic!("a validated route ({base:?}, {path:?}) cannot build its request: {e:?}"),
    };
    stays_under(base.trim(), &request.uri);
    Reached::Mapped
}

/// Asserts that `uri` goes to `base`'s scheme, host and port, below its path, without
/// credentials or a fragment; returns both, parsed.
pub(super) fn stays_under(base: &str, uri: &http::Uri) -> (url::Url, url::Url) {
    let base = url::Url::parse(base).expect("a validated base URL parses");
    let sent = url::Url::parse(&uri.to_string()).expect("the request URI is a URL");
    assert_eq!(sent.scheme(), base.scheme(), "{sent} leaves {base}");
    assert_eq!(sent.host_str(), base.host_str(), "{sent} leaves {base}");
    assert_eq!(sent.port_or_known_default(), base.port_or_known_default(), "{sent} leaves {base}");
    assert!(sent.path().starts_with(base.path().trim_end_matches('/')), "{sent} leaves {base}");
    assert!(sent.username().is_empty() && sent.password().is_none(), "{sent} has credentials");
    assert!(sent.fragment().is_none(), "{sent} has a fragment");
    (base, sent)
}
