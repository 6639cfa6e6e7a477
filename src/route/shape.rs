//! The shape of a registration (`POST /v1/mapping`, `PUT /v1/routes/{uuid}`): which members each
//! of its objects has and of what kind, checked before the body is read into a
//! [`Registration`](super::Registration) so that every unknown, missing or mistyped member is
//! reported at once, at its location, with the name that was probably meant.

use serde_json::Value;

use crate::json::push_pointer;
use crate::rules::{MAX_LISTED, Problem};
use crate::suggest;

/// What a value must be.
#[derive(Clone, Copy)]
enum Shape {
    /// An object with these members: name, shape, required.
    Object(&'static [(&'static str, Shape, bool)]),
    /// A string.
    Text,
    /// An object whose members are strings (headers, queries).
    TextMap,
    /// Anything: read by the registration's own checks (which locate their problems) or taken
    /// as given (a body).
    Any,
}

const AUTH_HEADER: Shape = Shape::Object(&[
    ("type", Shape::Text, true),
    ("token", Shape::Text, false),
    ("tokenUrl", Shape::Text, false),
    ("clientId", Shape::Text, false),
    ("clientSecret", Shape::Text, false),
    ("scope", Shape::Text, false),
    ("audience", Shape::Text, false),
    ("clientAuth", Shape::Text, false),
]);

const ORIGINAL_ROUTE: Shape = Shape::Object(&[
    ("originalApi", Shape::Object(&[("baseUrl", Shape::Text, true)]), true),
    ("path", Shape::Text, true),
    ("method", Shape::Text, false),
    ("headers", Shape::TextMap, false),
    ("queries", Shape::TextMap, false),
    ("body", Shape::Any, false),
    ("authHeader", AUTH_HEADER, false),
    ("paginate", Shape::Any, false),
]);

/// `sampleRequest` (SPEC §2.1): the caller's request the live call is made as.
const SAMPLE_REQUEST: Shape = Shape::Object(&[("query", Shape::TextMap, false), ("body", Shape::Any, false)]);

const REGISTRATION: Shape = Shape::Object(&[
    // Required of a registration, not of an update: `validate` says so.
    ("path", Shape::Text, false),
    ("method", Shape::Text, false),
    // Required unless `sources` are given: `validate` says so.
    ("originalRoute", ORIGINAL_ROUTE, false),
    ("sources", Shape::Any, false),
    ("forwardHeaders", Shape::Any, false),
    ("preConfiguredQueries", Shape::TextMap, false),
    ("preConfiguredHeaders", Shape::TextMap, false),
    ("preConfiguredBody", Shape::Any, false),
    ("authHeader", AUTH_HEADER, false),
    ("rulesAsString", Shape::Any, true),
    ("cache", Shape::Any, false),
    ("retry", Shape::Any, false),
    ("rateLimit", Shape::Any, false),
    ("tls", Shape::Any, false),
    ("http2", Shape::Any, false),
    ("breaker", Shape::Any, false),
    ("sampleRequest", SAMPLE_REQUEST, false),
    ("callers", Shape::Any, false),
    ("caller", Shape::Any, false),
    // SPEC §2.5: checked by `validate`.
    ("name", Shape::Text, false),
    ("owner", Shape::Text, false),
    ("uuid", Shape::Text, false),
]);

/// The body of a *Try it* (`POST /v1/routes/{uuid}/try`): a `sampleRequest` used once.
const TRY: Shape = Shape::Object(&[("sampleRequest", SAMPLE_REQUEST, false)]);

/// Every problem with the shape of a *Try it*'s `body`, as [`check`] tells a registration's.
pub fn check_try(body: &Value) -> Vec<Problem> {
    checked(body, TRY)
}

/// Every problem with the shape of the registration `body`: as many as an answer lists, the last
/// place counting the rest.
pub fn check(body: &Value) -> Vec<Problem> {
    checked(body, REGISTRATION)
}

fn checked(body: &Value, shape: Shape) -> Vec<Problem> {
    let mut problems = Problems { listed: Vec::new(), unlisted: 0 };
    let mut at = String::new();
    walk(body, shape, &mut at, &mut problems);
    let Problems { mut listed, unlisted } = problems;
    if unlisted > 0 {
        listed.push(Problem::new("", format!("{unlisted} more problems of the body's shape are not listed")));
    }
    listed
}

/// Problems found so far: listed while an answer has room, then counted.
struct Problems {
    listed: Vec<Problem>,
    unlisted: usize,
}

impl Problems {
    fn push(&mut self, problem: impl FnOnce() -> Problem) {
        if self.listed.len() < MAX_LISTED - 1 {
            self.listed.push(problem());
        } else {
            self.unlisted += 1;
        }
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn walk(value: &Value, shape: Shape, at: &mut String, problems: &mut Problems) {
    match (shape, value) {
        (Shape::Any, _) | (Shape::Text, Value::String(_)) => {}
        (Shape::Text, other) => {
            problems.push(|| Problem::new(at.clone(), format!("must be a string, found {}", kind(other))))
        }
        (Shape::TextMap, Value::Object(members)) => {
            for (name, value) in members {
                if !value.is_string() {
                    let len = at.len();
                    push_pointer(at, name);
                    problems.push(|| {
                        Problem::new(at.clone(), format!("must be a string, found {}", kind(value)))
                    });
                    at.truncate(len);
                }
            }
        }
        (Shape::TextMap, other) => problems.push(|| {
            Problem::new(
                at.clone(),
                format!("must be an object of names and string values, found {}", kind(other)),
            )
        }),
        (Shape::Object(known), Value::Object(members)) => {
            let names = || known.iter().map(|(name, _, _)| *name);
            for (name, value) in members {
                let len = at.len();
                push_pointer(at, name);
                match known.iter().find(|(k, _, _)| k == name) {
                    // `null` is a member left out (a required one is missing).
                    Some(_) if value.is_null() => {}
                    Some((_, shape, _)) => walk(value, *shape, at, problems),
                    None => {
                        let expected: Vec<&str> = names().collect();
                        problems
                            .push(|| Problem::new(at.clone(), suggest::unknown("member", name, &expected)));
                    }
                }
                at.truncate(len);
            }
            for (name, _, required) in known {
                // A misspelt member is reported as such, not also as missing.
                let misspelt = || {
                    members.keys().any(|given| {
                        !names().any(|k| k == given) && suggest::closest(given, [*name]).is_some()
                    })
                };
                if *required && members.get(*name).is_none_or(Value::is_null) && !misspelt() {
                    problems.push(|| Problem::new(at.clone(), format!("missing required member `{name}`")));
                }
            }
        }
        (Shape::Object(known), other) => {
            let listed: Vec<&str> = known.iter().map(|(name, _, _)| *name).collect();
            problems.push(|| {
                Problem::new(
                    at.clone(),
                    format!("must be an object (with {}), found {}", listed.join(", "), kind(other)),
                )
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn problems(body: Value) -> Vec<String> {
        check(&body).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_problem_of_a_registration_is_listed_at_its_location() {
        let found = problems(json!({
            "path": "p",
            "originalRoute": {"originalAPI": {"baseUrl": "http://x/"}, "path": 1, "headers": {"a": 2}},
            "authHeader": {"type": "Bearer", "tokn": "t"},
            "rulesAsString": {},
            "sampleRequest": {"body": {}, "qurey": {}},
            "extra": true
        }));
        // (Members in the order of their names: the reader keeps objects so.)
        assert_eq!(
            found,
            [
                "/authHeader/tokn: unknown member `tokn`; did you mean `token`? The known members are type, token, tokenUrl, clientId, clientSecret, scope, audience, clientAuth",
                "/extra: unknown member `extra`; the known members are path, method, originalRoute, sources, forwardHeaders, preConfiguredQueries, preConfiguredHeaders, preConfiguredBody, authHeader, rulesAsString, cache, retry, rateLimit, tls, http2, breaker, sampleRequest, callers, caller, name, owner, uuid",
                "/originalRoute/headers/a: must be a string, found a number",
                "/originalRoute/originalAPI: unknown member `originalAPI`; did you mean `originalApi`? The known members are originalApi, path, method, headers, queries, body, authHeader, paginate",
                "/originalRoute/path: must be a string, found a number",
                "/sampleRequest/qurey: unknown member `qurey`; did you mean `query`? The known members are query, body",
            ]
        );
    }

    #[test]
    fn missing_and_mistyped_members_are_problems_and_null_is_left_out() {
        assert_eq!(
            problems(json!({"originalRoute": {"originalApi": {}, "path": ""}, "method": null})),
            [
                "/originalRoute/originalApi: missing required member `baseUrl`",
                "(document): missing required member `rulesAsString`"
            ]
        );
        assert_eq!(
            problems(json!([])),
            [
                "(document): must be an object (with path, method, originalRoute, sources, forwardHeaders, preConfiguredQueries, preConfiguredHeaders, preConfiguredBody, authHeader, rulesAsString, cache, retry, rateLimit, tls, http2, breaker, sampleRequest, callers, caller, name, owner, uuid), found a list"
            ]
        );
        assert_eq!(
            problems(json!({"originalRoute": null, "rulesAsString": {}, "preConfiguredQueries": [1]})),
            [
                // `originalRoute` or `sources`: the registration's own check says which is missing.
                "/preConfiguredQueries: must be an object of names and string values, found a list",
            ]
        );
    }

    /// Every member the shape knows is one the registration reads: a body with all of them
    /// passes the check and is read (an unknown one would be refused by the reader).
    #[test]
    fn the_shape_names_the_members_the_registration_reads() {
        fn full(shape: Shape) -> Value {
            match shape {
                Shape::Text => json!("x"),
                Shape::TextMap => json!({"a": "b"}),
                Shape::Any => Value::Null,
                Shape::Object(members) => Value::Object(
                    members.iter().map(|(name, shape, _)| ((*name).to_owned(), full(*shape))).collect(),
                ),
            }
        }
        let mut body = full(REGISTRATION);
        body["rulesAsString"] = json!({"newBodyFields": {}, "oldBodyFields": {}});
        assert!(check(&body).is_empty());
        let text = serde_json::to_vec(&body).unwrap();
        serde_json::from_slice::<super::super::Registration>(&text).expect("every member known");
    }
}
