//! recast's expressions against an independent JMESPath implementation (the `jmespath` crate,
//! used here only as a test oracle), on expressions of the original language only
//! (`recast::fuzzing::original_language_only`). Both give a value: the values are equal (objects
//! whatever their member order; numbers by value). recast fails
//! where the oracle gives a value: a finding too. The oracle failing where recast gives a value
//! is not (the oracle has its own failures, such as `avg([])`, which the suites make null).
#![no_main]

use recast::fuzzing::{ExprOutcome, expr_run_original, expr_split, expref_outside_a_call, original_language_only};
use serde_json::Value;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (text, document) = expr_split(data);
    let (Ok(text), Ok(document)) = (std::str::from_utf8(text), std::str::from_utf8(document)) else { return };
    if !original_language_only(text) {
        return;
    }
    // Both read the document with its members sorted and repeated names gone, as the oracle
    // keeps objects: then lists made from objects' members (`*`, `keys`, `values`) compare in
    // order too.
    let Ok(document) = serde_json::from_str::<Value>(document).map(|v| v.to_string()) else { return };
    // recast evaluates as the original language does where the Community Edition differs (a
    // multi-select of null is null there), so the two languages' difference is no finding.
    let ours = expr_run_original(format!("{text}\n{document}").as_bytes());
    let (Ok(expression), Ok(given)) = (jmespath::compile(text), jmespath::Variable::from_json(&document)) else {
        return;
    };
    let theirs = expression.search(given);
    match (&ours, theirs) {
        (ExprOutcome::Value(ours), Ok(theirs)) => {
            let ours: Value = serde_json::from_str(ours).expect("recast writes JSON");
            let theirs = serde_json::to_value(&*theirs).expect("the oracle's value");
            assert!(same(&ours, &theirs), "{text:?} on {document}: recast {ours}, oracle {theirs}");
        }
        // The oracle fails where the suites expect a value (`avg([])` is null there; the oracle
        // fails writing NaN): not a finding of recast's.
        (ExprOutcome::Value(_), Err(_)) => {}
        // An expression reference other than as a function's argument (`&a`, `[&a]`,
        // `a == &b`): the oracle takes it as a value, recast refuses it (invalid-type); no suite
        // has one.
        (ExprOutcome::Failed("invalid-type"), Ok(_)) if expref_outside_a_call(text) => {}
        (ExprOutcome::Failed(kind), Ok(theirs)) => {
            panic!("{text:?} on {document}: recast {kind}, oracle {}", serde_json::to_value(&*theirs).unwrap())
        }
        _ => {}
    }
});

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
