//! JSONTestSuite's parsing cases (`tests/data/json-test-suite`) through the route path: a real
//! upstream on 127.0.0.1:0 answers each case's text, and two routes of a real service map it,
//! one whose rules are read on demand (only what they read becomes tape) and one with an
//! expression, which parses the whole text. Every `y_` text is mapped (200), every `n_` text is
//! refused (502 `upstream-not-json`) by both; an `i_` text is taken or refused by both alike.

use std::sync::Arc;

use crate::routes::registered;
use crate::support::{Json, Reply, Service, Upstream, config, get};

/// The cases whose bytes were not UTF-8, transcribed with U+FFFD (see the data's README).
const TRANSCRIBED: usize = 25;

/// Texts of our own whose bytes are not UTF-8: a byte that starts nothing, an overlong `/`, a
/// surrogate, a sequence cut short, and one inside a member name.
const NOT_UTF8: [&[u8]; 5] =
    [b"[\"\xff\"]", b"[\"\xc0\xaf\"]", b"[\"\xed\xa0\x80\"]", b"[\"\xe6\x97\"]", b"{\"\xb9\":1}"];

fn cases() -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/json-test-suite/parsing.json"))
        .expect("the suite's cases");
    let cases: Vec<(String, Vec<u8>)> = Json::parse(&text)
        .as_array()
        .iter()
        .map(|case| {
            let name = case.get("name").and_then(Json::as_str).expect("a name").to_owned();
            let input = case.get("input").and_then(Json::as_str).expect("a text").as_bytes().to_vec();
            (name, input)
        })
        .collect();
    assert_eq!(cases.len(), 318, "the suite's cases, all of them");
    let transcribed =
        cases.iter().filter(|(_, input)| String::from_utf8_lossy(input).contains('\u{fffd}')).count();
    assert_eq!(transcribed, TRANSCRIBED);
    let own =
        NOT_UTF8.iter().enumerate().map(|(i, text)| (format!("n_recast_not_utf8_{i}.json"), text.to_vec()));
    cases.into_iter().chain(own).collect()
}

#[tokio::test]
async fn every_y_case_is_mapped_and_every_n_case_refused_on_both_paths() {
    let cases = Arc::new(cases());
    let served = Arc::clone(&cases);
    // The registration's live call brings no query; each call names its case by index.
    let upstream = Upstream::start(move |received| {
        let case =
            received.uri.query().and_then(|q| q.strip_prefix("case=")).and_then(|i| i.parse::<usize>().ok());
        match case.and_then(|i| served.get(i)) {
            Some((_, input)) => Reply { body: input.clone(), ..Reply::json("") },
            None => Reply::json(r#"{"a":{"b":1}}"#),
        }
    })
    .await;
    let service = Service::start(config()).await;
    let route = |rules: &str| {
        format!(
            r#"{{"path":"suite","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"case"}},"rulesAsString":{rules}}}"#,
            upstream.url("/")
        )
    };
    let by_keys = r#"{"newBodyFields":{"a":{"key":"a","type":"Json"},"b":{"key":"b","type":"Json"}},"oldBodyFields":{"a":{"keys":["a"]},"b":{"keys":["b"],"parents":["a"]}}}"#;
    let by_expression =
        r#"{"newBodyFields":{"n":{"key":"n","type":"Json"}},"oldBodyFields":{"n":{"expr":"type(@)"}}}"#;
    let on_demand = registered(&service, &route(by_keys), &[]).await;
    let whole = registered(&service, &route(by_expression), &[]).await;
    let mut counts = [0; 3];
    for (i, (name, _)) in cases.iter().enumerate() {
        let a = get(&service.url(&format!("{on_demand}?case={i}"))).await;
        let b = get(&service.url(&format!("{whole}?case={i}"))).await;
        match name.as_bytes().first() {
            Some(b'y') => {
                assert_eq!(a.status, 200, "{name} read on demand: {}", String::from_utf8_lossy(&a.body));
                assert_eq!(b.status, 200, "{name} parsed whole: {}", String::from_utf8_lossy(&b.body));
                counts[0] += 1;
            }
            Some(b'n') => {
                a.assert_problem(502, "upstream-not-json");
                b.assert_problem(502, "upstream-not-json");
                counts[1] += 1;
            }
            _ => {
                assert_eq!(a.status, b.status, "{name}: read on demand and parsed whole differ");
                assert!(matches!(a.status.as_u16(), 200 | 502), "{name}: {}", a.status);
                if a.status == 502 {
                    a.assert_problem(502, "upstream-not-json");
                }
                counts[2] += 1;
            }
        }
    }
    assert_eq!(counts, [95, 188 + NOT_UTF8.len(), 35]);
    service.stop().await;
}

/// The same cases straight through the engine: reading on demand takes and refuses what the
/// whole parse takes and refuses, for the same reason, and maps alike what both take.
#[test]
fn reading_on_demand_and_the_whole_parse_agree_on_every_case() {
    let limits = recast::rules::Limits::default();
    let rules = br#"{"newBodyFields":{"a":{"key":"a","type":"Json"},"b":{"key":"b","type":"String"}},"oldBodyFields":{"a":{"keys":["a"]},"b":{"keys":["b"],"parents":["a"]}}}"#;
    let plan = recast::rules::compile_json(rules, &limits).expect("rules").plan;
    for (name, input) in cases() {
        let mut read = Vec::new();
        let on_demand = recast::exec::map_text(&plan, &mut input.clone(), 64, &mut read);
        let whole = recast::json::with_parsed(&mut input.clone(), 64, |doc| {
            let mut out = Vec::new();
            recast::exec::execute(&plan, doc, 0, &mut out);
            out
        });
        match (&on_demand, &whole) {
            (Ok(_), Ok(out)) => assert_eq!(&read, out, "{name}"),
            (Err(a), Err(b)) => {
                assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b), "{name}: {a} / {b}")
            }
            _ => panic!("{name}: on demand {on_demand:?}, whole {:?}", whole.map(|_| ())),
        }
        if name.starts_with("y_") {
            assert!(on_demand.is_ok(), "{name}");
        }
        if name.starts_with("n_") {
            assert!(on_demand.is_err(), "{name}");
        }
    }
}
