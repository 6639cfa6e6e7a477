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

/// Expressions a paging member may be: cursors, page numbers, offsets, URLs, and mistakes.
const PAGE_EXPRESSIONS: [&str; 16] = [
    "@",
    "data",
    "data[-1].id",
    "meta.next_cursor",
    "$page + `1`",
    "$page * `100`",
    "has_more",
    "next",
    "$headers.link",
    "$headers.\"x-next\"",
    "items[?id]",
    "`null`",
    "''",
    "`[]`",
    "`{\"a\": 1}`",
    "data[",
];

/// Next URLs and `Link` values a page may give: relative, absolute, other origins, tricks.
const PAGE_URLS: [&str; 12] = [
    "/v2/items?page=2",
    "?page=3",
    "items?cursor=a%20b",
    "https://api.example/items?page=2",
    "http://api.example/items",
    "https://api.example:444/items",
    "https://evil.example/items",
    "//evil.example/x",
    "https://api.example@evil.example/",
    "javascript:alert(1)",
    "",
    "https://api.example/items#frag",
];

#[derive(Arbitrary, Debug)]
enum PageText {
    Known(u8),
    Other(String),
}

impl PageText {
    fn text<'a>(&'a self, known: &[&'a str]) -> &'a str {
        match self {
            PageText::Known(i) => known[*i as usize % known.len()],
            PageText::Other(s) => s,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum NextCase {
    Query(Vec<(String, PageText)>),
    Url(PageText),
    Link,
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct PagesCase {
    items: PageText,
    next: NextCase,
    while_: Option<PageText>,
    max_pages: u8,
    stop: bool,
    base: u8,
    page: u8,
    /// The page's answer: built around a URL, or as given.
    body: Result<(PageText, Vec<Given>), String>,
    link: Option<(PageText, String)>,
}

/// `paginate` compiled from arbitrary members and one page read with it: arbitrary expressions,
/// answers, `Link` headers and next URLs. Checks: nothing panics; the items written onto the
/// joined list keep it one JSON list; a next request goes to the source's own origin (scheme,
/// host and port), with its method, headers and body.
pub fn compose_pages(data: &[u8]) -> Reached {
    use crate::route::paginate::{After, Paging, validate};
    let Ok(case) = PagesCase::arbitrary_take_rest(Unstructured::new(data)) else { return Reached::Nothing };
    let next = match &case.next {
        NextCase::Query(pairs) => serde_json::json!({"query": pairs
            .iter()
            .map(|(n, e)| (n.clone(), serde_json::Value::from(e.text(&PAGE_EXPRESSIONS))))
            .collect::<serde_json::Map<_, _>>()}),
        NextCase::Url(e) => serde_json::json!({"url": e.text(&PAGE_EXPRESSIONS)}),
        NextCase::Link => "link".into(),
        NextCase::Raw(text) => serde_json::from_str(text).unwrap_or(serde_json::Value::Null),
    };
    let mut given = serde_json::json!({
        "items": case.items.text(&PAGE_EXPRESSIONS),
        "next": next,
        "maxPages": case.max_pages,
        "onMaxPages": if case.stop { "stop" } else { "fail" },
    });
    if let Some(w) = &case.while_ {
        given["while"] = w.text(&PAGE_EXPRESSIONS).into();
    }
    let mut problems = Vec::new();
    let Some(config) = validate(Some(&given), "/p", &mut problems) else {
        assert!(!problems.is_empty(), "a refused paginate says why");
        return Reached::RulesRefused;
    };
    let mut patterns = Patterns::default();
    let Some(paging) = Paging::compile(&config, "/p", LIMITS.max_depth, &mut patterns, &mut problems) else {
        assert!(!problems.is_empty(), "a paginate that does not compile says why");
        return Reached::RulesRefused;
    };
    let base = BASES[case.base as usize % BASES.len()];
    let Ok(uri) = format!("{base}items?limit=2").parse::<http::Uri>() else { return Reached::Nothing };
    let first = crate::upstream::UpstreamRequest {
        method: http::Method::POST,
        uri,
        headers: Default::default(),
        body: bytes::Bytes::from_static(b"{\"q\":1}"),
    };
    let mut body = match &case.body {
        Ok((url, values)) => serde_json::json!({
            "data": values.iter().map(value).collect::<Vec<_>>(),
            "items": values.iter().map(|v| serde_json::json!({"id": value(v)})).collect::<Vec<_>>(),
            "next": url.text(&PAGE_URLS),
            "has_more": values.len() % 2 == 0,
            "meta": {"next_cursor": values.first().map(value)},
        })
        .to_string()
        .into_bytes(),
        Err(text) => text.clone().into_bytes(),
    };
    let headers: Vec<(String, String)> = case
        .link
        .iter()
        .flat_map(|(url, rest)| {
            [
                ("link".to_owned(), format!("<{}>; rel=\"next\"{rest}", url.text(&PAGE_URLS))),
                ("x-next".to_owned(), url.text(&PAGE_URLS).to_owned()),
            ]
        })
        .collect();
    let budget = crate::expr::Budget::new(1 << 20, 1 << 16);
    let (mut joined, mut count) = (b"[".to_vec(), 0);
    let read = paging.read(
        &mut body,
        usize::from(case.page) + 1,
        &headers,
        &first.uri,
        &first,
        LIMITS.max_depth,
        &budget,
        &mut joined,
        &mut count,
    );
    joined.push(b']');
    let list: serde_json::Value = serde_json::from_slice(&joined).unwrap_or_else(|e| {
        panic!("the joined items are not JSON ({e}): {}", String::from_utf8_lossy(&joined))
    });
    assert_eq!(list.as_array().map(Vec::len), Some(count), "{list}");
    match read {
        Ok(After::Next(next)) => {
            let (a, b) = (&next.uri, &first.uri);
            assert_eq!(
                (a.scheme(), a.host(), a.port_u16()),
                (b.scheme(), b.host(), b.port_u16()),
                "{a} left {b}'s origin"
            );
            assert_eq!((&next.method, &next.body), (&first.method, &first.body));
            Reached::Mapped
        }
        Ok(After::Last) => Reached::MappedNothing,
        Err(_) => Reached::DocumentRefused,
    }
}
