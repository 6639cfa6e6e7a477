//! Composed routes (SPEC §2.3) under fuzzing: templates rendered with arbitrary values
//! ([`compose_render`]) and arbitrary compositions compiled ([`compose_compile`]).

use arbitrary::{Arbitrary, Unstructured};
use uuid::Uuid;

use super::{LIMITS, Reached};
use crate::expr::Patterns;
use crate::json;
use crate::route::render::CallerParts;
use crate::route::template::{Context, Scratch, Template};
use crate::route::{Registration, Route, shape};

/// Pieces of URLs and templates' text, tricks included.
const PIECES: [&str; 22] = [
    "/", "//", "..", ".", "%2e%2e", "%2F", "@", "?", "#", ":", "v2", "users", "a b", "%", "{{", "}}", "{",
    "}", "x=1&y=2", "é", "\\", "%00",
];

/// Values a template may be given: every byte that could leave a segment or a header line.
const VALUES: [&str; 16] = [
    "../admin",
    "%2e%2e",
    "@evil.example/",
    "http://10.0.0.1/",
    "?x=1#",
    " ",
    "\n",
    "\r\nHost: evil",
    "..",
    ".",
    "",
    "a/b",
    "\u{0}",
    "é",
    "//evil.example",
    "\\..\\",
];

const BASES: [&str; 5] = [
    "https://api.example/",
    "http://a.example:8080/v2/",
    "https://[::1]/",
    "http://127.0.0.1/base",
    "https://b.example",
];

#[derive(Arbitrary, Debug)]
enum Text {
    Known(u8),
    Other(String),
    /// A template reading the value `vN`.
    Value(u8),
}

#[derive(Arbitrary, Debug)]
enum Given {
    Known(u8),
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Null,
    List(Vec<String>),
    Object,
}

#[derive(Arbitrary, Debug)]
struct RenderCase {
    base: u8,
    path: Vec<Text>,
    queries: Vec<(String, Vec<Text>)>,
    header: Vec<Text>,
    values: [Given; 4],
}

fn text(pieces: &[Text]) -> String {
    pieces
        .iter()
        .map(|p| match p {
            Text::Known(i) => PIECES[*i as usize % PIECES.len()].to_owned(),
            Text::Other(s) => s.clone(),
            Text::Value(i) => format!("{{{{request.query.v{}}}}}", i % 4),
        })
        .collect()
}

fn value(given: &Given) -> serde_json::Value {
    match given {
        Given::Known(i) => VALUES[*i as usize % VALUES.len()].into(),
        Given::Text(s) => s.as_str().into(),
        Given::Int(n) => (*n).into(),
        Given::Float(f) => {
            serde_json::Number::from_f64(*f).map_or(serde_json::Value::Null, serde_json::Value::Number)
        }
        Given::Bool(b) => (*b).into(),
        Given::Null => serde_json::Value::Null,
        Given::List(items) => items.iter().map(|s| serde_json::Value::from(s.as_str())).collect(),
        Given::Object => serde_json::json!({"a": 1}),
    }
}

/// A composed route's source with templates in its path, query and a header, rendered over
/// arbitrary values. Checks: nothing panics; a request rendered goes to the base URL's scheme,
/// host and port, below its path, with as many path segments as its template has (no value
/// made one more or one less), and every header value is one line of visible ASCII.
pub fn compose_render(data: &[u8]) -> Reached {
    let Ok(case) = RenderCase::arbitrary_take_rest(Unstructured::new(data)) else { return Reached::Nothing };
    let base = BASES[case.base as usize % BASES.len()];
    let path = text(&case.path);
    let queries: serde_json::Map<String, serde_json::Value> =
        case.queries.iter().map(|(name, value)| (name.clone(), text(value).into())).collect();
    let registration = serde_json::json!({
        "path": "p",
        "sources": {"s": {
            "originalApi": {"baseUrl": base},
            "path": path,
            "queries": queries,
            "headers": {"X-T": text(&case.header)},
        }},
        "rulesAsString": {"newBodyFields": {}, "oldBodyFields": {}},
    });
    if !shape::check(&registration).is_empty() {
        return Reached::RulesRefused;
    }
    let registration: Registration = match serde_json::from_value(registration) {
        Ok(registration) => registration,
        Err(e) => panic!("a registration of a sound shape is refused: {e}"),
    };
    let Ok(config) = registration.validate_with(false, None, &LIMITS) else { return Reached::RulesRefused };
    let route = Route::new(Uuid::nil(), 0, 0, config, &LIMITS);
    if let Some(why) = route.broken() {
        panic!("a validated composition is broken: {why}");
    }
    let composition = route.composition().expect("a composed route has its composition");
    let source = &composition.sources[0];
    let mut query = serde_json::Map::new();
    for (i, given) in case.values.iter().enumerate() {
        query.insert(format!("v{i}"), value(given));
    }
    let mut context = serde_json::json!({"request": {"query": query, "headers": {}, "body": null}})
        .to_string()
        .into_bytes();
    let rendered = json::with_parsed(&mut context, 64, |doc| {
        let scratch = Scratch::new(1 << 20, 1 << 20);
        let arena = scratch.arena();
        let context =
            Context { doc, item: None, caller: crate::expr::Val::Null, arena: &arena, explain: false };
        source.request(&context, &CallerParts::default())
    })
    .expect("the context is JSON");
    let Ok(request) = rendered else { return Reached::DocumentRefused };
    let (base, _) = super::stages::stays_under(base, &request.uri);
    // The path's segments are the template's: each value stayed in the one it was written in.
    // (The template as the engine reads it: text of the input may hold templates of its own,
    // and one that is a literal, such as `{{''}}`, is text.)
    let template = Template::compile(&path, false, LIMITS.max_depth, &mut Patterns::default())
        .expect("a validated path compiles");
    let (skeleton, _) = template.skeleton();
    let skeleton = skeleton.split('?').next().unwrap_or_default().trim_start_matches('/');
    // An empty path goes to the base URL as given; any other below its path.
    let expected = match skeleton.is_empty() {
        true => base.path().matches('/').count(),
        false => base.path().trim_end_matches('/').matches('/').count() + 1 + skeleton.matches('/').count(),
    };
    assert_eq!(request.uri.path().matches('/').count(), expected, "{} from {skeleton:?}", request.uri);
    for value in request.headers.values() {
        assert!(
            value.as_bytes().iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b)),
            "a header value of more than one line of visible ASCII: {value:?}"
        );
    }
    Reached::Mapped
}

/// Names, expressions and members that compositions are made of.
const NAMES: [&str; 8] = ["a", "b", "c", "request", "A", "a_1", "", "_sources"];
const EXPRESSIONS: [&str; 12] = [
    "a.id",
    "b.ids",
    "request.query.id",
    "@",
    "$",
    "keys(@)",
    "$item",
    "c[?x > `1`]",
    "a.",
    "`true`",
    "sum(b.ids)",
    "let $x = a in $x.id",
];

#[derive(Arbitrary, Debug)]
enum CompileCase {
    Raw(String),
    Built(Vec<SourceCase>),
}

#[derive(Arbitrary, Debug)]
struct SourceCase {
    name: u8,
    path: Vec<Text>,
    after: Vec<u8>,
    when: Option<u8>,
    for_each: Option<u8>,
    max_calls: Option<i16>,
    concurrency: Option<i16>,
    optional: bool,
    runtime: bool,
    body: Option<Vec<Text>>,
}

/// An arbitrary composition registered. Checks: nothing panics; an accepted one compiles into a
/// route that serves, whose sources each come after every source they wait for.
pub fn compose_compile(data: &[u8]) -> Reached {
    let Ok(case) = CompileCase::arbitrary_take_rest(Unstructured::new(data)) else { return Reached::Nothing };
    let registration: serde_json::Value = match case {
        CompileCase::Raw(text) => {
            let Ok(sources) = serde_json::from_str::<serde_json::Value>(&text) else {
                return Reached::Nothing;
            };
            serde_json::json!({"path": "p", "sources": sources, "rulesAsString": {"newBodyFields": {}, "oldBodyFields": {}}})
        }
        CompileCase::Built(sources) => {
            let mut all = serde_json::Map::new();
            for source in sources {
                let pick = |i: u8| EXPRESSIONS[i as usize % EXPRESSIONS.len()];
                let mut member = serde_json::json!({
                    "originalApi": {"baseUrl": "https://api.example/"},
                    "path": text(&source.path).replace("request.query.v", "a.v"),
                    "after": source.after.iter().map(|i| NAMES[*i as usize % NAMES.len()]).collect::<Vec<_>>(),
                    "optional": source.optional,
                });
                if let Some(i) = source.when {
                    member["when"] = pick(i).into();
                }
                if let Some(i) = source.for_each {
                    member["forEach"] = pick(i).into();
                }
                if let Some(n) = source.max_calls {
                    member["maxCalls"] = n.into();
                }
                if let Some(n) = source.concurrency {
                    member["concurrency"] = n.into();
                }
                if source.runtime {
                    member["authHeader"] = serde_json::json!({"type": "Runtime"});
                }
                if let Some(body) = source.body {
                    member["body"] = serde_json::json!({"v": text(&body)});
                }
                all.insert(NAMES[source.name as usize % NAMES.len()].to_owned(), member);
            }
            serde_json::json!({"path": "p", "sources": all, "rulesAsString": {"newBodyFields": {}, "oldBodyFields": {}}})
        }
    };
    if !shape::check(&registration).is_empty() {
        return Reached::RulesRefused;
    }
    let Ok(registration) = serde_json::from_value::<Registration>(registration) else {
        return Reached::Nothing;
    };
    let Ok(config) = registration.validate_with(false, None, &LIMITS) else { return Reached::RulesRefused };
    let route = Route::new(Uuid::nil(), 0, 0, config, &LIMITS);
    if let Some(why) = route.broken() {
        panic!("a validated composition is broken: {why}");
    }
    let composition = route.composition().expect("a composed route has its composition");
    for (i, source) in composition.sources.iter().enumerate() {
        assert!(source.after.iter().all(|&j| j < i), "{} runs before what it waits for", source.name);
        assert!(source.reads.iter().all(|&j| j < i), "{} reads a source not done before it", source.name);
    }
    Reached::Mapped
}
