//! The conformance cases of the behaviour contract (copied to `tests/data/conformance.json`), run
//! through the engine directly and through the real `POST /v1/preview` endpoint.

use recast::rules::{Limits, compile_json};

use crate::support::{Json, Service, post_json};

struct Case {
    name: String,
    rules: Json,
    rules_as_string: bool,
    input: Json,
    /// The expected output, or the expected error status.
    expect: Result<Json, u16>,
    /// Whether member order is part of the expectation.
    ordered: bool,
}

impl Case {
    /// The rules as the client sends them: the object, or a JSON string holding it.
    fn rules_json(&self) -> String {
        let text = self.rules.to_string();
        if self.rules_as_string { serde_json::Value::String(text).to_string() } else { text }
    }

    fn check(&self, actual: &Json) {
        let Ok(expect) = &self.expect else { panic!("{}: expected an error, got {actual}", self.name) };
        if self.ordered {
            assert_eq!(actual.to_string(), expect.to_string(), "case {}", self.name);
        } else {
            assert_eq!(actual.sorted(), expect.sorted(), "case {}", self.name);
        }
    }
}

fn cases() -> Vec<Case> {
    let file = Json::parse(include_bytes!("../data/conformance.json"));
    let cases: Vec<Case> = file
        .as_array()
        .iter()
        .map(|case| {
            let name = case.get("name").and_then(Json::as_str).expect("name").to_owned();
            let flag = |member| case.get(member) == Some(&Json::Bool(true));
            let expect = match (case.get("expect"), case.get("expectStatus")) {
                (Some(expect), None) => Ok(expect.clone()),
                (None, Some(Json::Number(status))) => Err(status.as_u64().expect("status") as u16),
                other => panic!("case {name}: needs `expect` or `expectStatus`, has {other:?}"),
            };
            Case {
                rules: case.get("rules").expect("rules").clone(),
                input: case.get("input").expect("input").clone(),
                rules_as_string: flag("rules_as_string"),
                ordered: flag("ordered"),
                expect,
                name,
            }
        })
        .collect();
    assert!(cases.len() >= 20, "the conformance file holds {} cases", cases.len());
    cases
}

#[test]
fn every_case_through_the_engine() {
    for case in cases() {
        let compiled = compile_json(case.rules_json().as_bytes(), &Limits::default());
        let compiled = match (compiled, &case.expect) {
            (Ok(compiled), Ok(_)) => compiled,
            (Err(problems), Err(400)) => {
                assert!(!problems.is_empty(), "case {}", case.name);
                continue;
            }
            (result, expect) => panic!("case {}: compiled to {result:?}, expected {expect:?}", case.name),
        };
        let mut input = case.input.to_string().into_bytes();
        let mut out = Vec::new();
        recast::json::with_parsed(&mut input, 64, |nodes| {
            recast::exec::execute(&compiled.plan, nodes, 0, &mut out)
        })
        .expect("input is JSON");
        case.check(&Json::parse(&out));
    }
}

#[tokio::test]
async fn every_case_through_http() {
    let service = Service::start(Default::default()).await;
    for case in cases() {
        let body = format!(r#"{{"originalResponse":{},"mappingRules":{}}}"#, case.input, case.rules_json());
        let answer = post_json(&service.url("/v1/preview"), body).await;
        match case.expect {
            Ok(_) => {
                assert_eq!(answer.status, 200, "case {}: {:?}", case.name, answer.body);
                assert_eq!(answer.header("content-type"), Some("application/json"));
                case.check(&answer.json());
            }
            Err(status) => {
                let problem = answer.assert_problem(status, "invalid-rules");
                let errors = problem.get("errors").expect("errors").as_array();
                assert!(!errors.is_empty(), "case {}", case.name);
            }
        }
    }
    service.stop().await;
}
