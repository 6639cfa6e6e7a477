//! A composed route compiled (SPEC §2.3): its sources in an order where each comes after those
//! it waits for ([`super::graph`]), their `when` and `forEach` compiled, each one's request
//! compiled by the one request builder ([`super::render`]) and checked to read only `request`
//! and the sources it waits for, and the settings of its calls. Pure: the server runs the
//! schedule.

use std::time::Duration;

use http::header::HeaderName;
use uuid::Uuid;

use super::config::SourceConfig;
use super::graph::{Graph, location_of};
use super::paginate::Paging;
use super::render::{CallerParts, Compiler, Expression, Members, RequestError, RequestTemplate};
use super::settings::{CallSettings, Given};
use super::sources::MAX_SOURCES;
use super::template::{Context, RenderError};
use crate::expr::{self, Patterns, Program, Val};
use crate::json::ondemand::Wants;
use crate::rules::{Limits, Problem};
use crate::upstream::UpstreamRequest;

/// A composed route's sources, ready to run.
#[derive(Debug)]
pub struct Composition {
    /// The sources, each after every source it waits for.
    pub sources: Vec<Source>,
    /// The caller's headers `request.headers` holds (lower-case names).
    pub forward_headers: Vec<HeaderName>,
    /// Whether a source sends the caller's `X-Mapped-Auth` (a runtime-auth route).
    pub runtime_auth: bool,
    /// The sources' indexes in name order: the order of the document's members.
    pub by_name: Vec<usize>,
    /// Whether a source's templates, `when` or `forEach` read `request`.
    pub reads_request: bool,
}

/// One source, compiled.
#[derive(Debug)]
pub struct Source {
    pub name: String,
    /// The sources it waits for directly (indexes into [`Composition::sources`]).
    pub after: Vec<usize>,
    /// The sources its expressions read (in its `after` closure).
    pub reads: Vec<usize>,
    pub when: Option<Expression>,
    pub for_each: Option<Expression>,
    /// What its expressions read of its context (`request` and the sources in `reads`): the
    /// context is read for this, not whole.
    pub context: Wants,
    /// Its request, rendered per call.
    pub request: RequestTemplate,
    /// What its calls add to its request.
    pub calls: CallSettings,
    pub max_calls: usize,
    pub concurrency: usize,
    pub optional: bool,
    pub timeout: Option<Duration>,
    /// `paginate`: each of its requests follows the upstream's pages.
    pub paging: Option<Paging>,
}

impl Composition {
    /// Compiles stored sources, or every problem with its location (`/sources/<name>/...`).
    pub fn compile(
        configs: &[SourceConfig],
        forward_headers: &[String],
        route: Uuid,
        limits: &Limits,
    ) -> Result<Composition, Vec<Problem>> {
        let mut problems = Vec::new();
        let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
        let Some(graph) = Graph::of(&names, configs.iter().map(|c| c.after.as_slice()), &mut problems) else {
            return Err(problems);
        };
        if configs.len() > MAX_SOURCES {
            problems
                .push(Problem::new("/sources", format!("a composition has at most {MAX_SOURCES} sources")));
        }
        let mut worst: u64 = 0;
        let mut patterns = Patterns::default();
        let mut compiled: Vec<Option<Source>> = (0..configs.len()).map(|_| None).collect();
        for &i in &graph.order {
            let config = &configs[i];
            let calls = if config.for_each.is_some() { u64::from(config.max_calls) } else { 1 };
            let attempts = 1 + config.retry.as_ref().map_or(0, |r| u64::from(r.attempts));
            let pages = config.paginate.as_ref().map_or(1, |p| u64::from(p.max_pages));
            worst += calls * pages * attempts;
            let mut compiler = Compiler {
                names: &names,
                closure: &graph.closure[i],
                reads: Vec::new(),
                at: location_of(&config.name),
                item: config.for_each.is_some(),
                item_only_request: true,
                max_depth: limits.max_depth,
                patterns: &mut patterns,
                problems: &mut problems,
            };
            if let Some(source) = source(&mut compiler, config, graph.waits[i].clone(), route) {
                compiled[i] = Some(source);
            }
        }
        if worst > limits.max_source_calls as u64 {
            problems.push(Problem::new(
                "/sources",
                format!(
                    "at worst one call of this composition sends {worst} requests (one per source, `maxCalls` per `forEach` source, `maxPages` per paged request, each with its retries), more than {} (RECAST_MAX_SOURCE_CALLS)",
                    limits.max_source_calls
                ),
            ));
        }
        let mut forward = Vec::new();
        for name in forward_headers {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(header) => forward.push(header),
                Err(_) => {
                    problems.push(Problem::new("/forwardHeaders", format!("`{name}` is not a header name")))
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        // Indexes move to the schedule's order.
        let mut position = vec![0; configs.len()];
        for (at, &i) in graph.order.iter().enumerate() {
            position[i] = at;
        }
        let mut sources: Vec<Source> = Vec::with_capacity(configs.len());
        for &i in &graph.order {
            let Some(mut source) = compiled[i].take() else { continue };
            for index in source.after.iter_mut().chain(source.reads.iter_mut()) {
                *index = position[*index];
            }
            sources.push(source);
        }
        let runtime_auth = sources.iter().any(|s| s.request.runtime_auth());
        let mut by_name: Vec<usize> = (0..sources.len()).collect();
        by_name.sort_by(|&a, &b| sources[a].name.cmp(&sources[b].name));
        let reads_request = sources.iter().any(|s| s.context.reads_member("request"));
        Ok(Composition { sources, forward_headers: forward, runtime_auth, by_name, reads_request })
    }

    /// The index of the source named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.sources.iter().position(|s| s.name == name)
    }
}

/// Compiles one source: its `when`, `forEach` and request, and the settings of its calls.
fn source(
    compiler: &mut Compiler<'_>,
    config: &SourceConfig,
    after: Vec<usize>,
    route: Uuid,
) -> Option<Source> {
    let at = compiler.at.clone();
    let before = compiler.problems.len();
    let when = config.when.as_ref().and_then(|text| compiler.expression(text, format!("{at}/when"), false));
    let for_each =
        config.for_each.as_ref().and_then(|text| compiler.expression(text, format!("{at}/forEach"), false));
    compiler.item_only_request = for_each.as_ref().is_none_or(|e| e.only_request);
    let located = |member: &str, name: &str| {
        let mut location = format!("{at}/{member}");
        crate::json::push_pointer(&mut location, name);
        location
    };
    let members = Members {
        base_url: &config.base_url,
        base_url_at: format!("{at}/originalApi/baseUrl"),
        method: &config.method,
        method_at: format!("{at}/method"),
        path: &config.path,
        path_at: format!("{at}/path"),
        queries: config
            .queries
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str(), located("queries", n)))
            .collect(),
        headers: config
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str(), located("headers", n)))
            .collect(),
        bodies: config.body.iter().map(|b| (b.as_str(), format!("{at}/body"))).collect(),
        auth: &config.auth,
        auth_at: format!("{at}/authHeader"),
        templates: true,
        caller_passes: false,
    };
    let request = compiler.request(&members);
    let paging = config.paginate.as_ref().and_then(|paginate| {
        Paging::compile(
            paginate,
            &format!("{at}/paginate"),
            compiler.max_depth,
            compiler.patterns,
            compiler.problems,
        )
    });
    let calls = CallSettings::read(
        Given {
            auth: &config.auth,
            token_url_at: format!("{at}/authHeader/tokenUrl"),
            tls: config.tls.as_ref(),
            tls_at: format!("{at}/tls"),
            retry: config.retry.as_ref(),
            rate_limit: config.rate_limit.as_ref(),
            h2c: config.http2_prior_knowledge,
            key: source_key(route, &config.name),
            breaker: None,
        },
        compiler.problems,
    );
    if compiler.problems.len() != before {
        return None;
    }
    let (request, calls) = (request?, calls?);
    let mut reads = std::mem::take(&mut compiler.reads);
    reads.sort_unstable();
    reads.dedup();
    let mut programs: Vec<&Program> = Vec::new();
    programs.extend(when.iter().chain(&for_each).map(|e| &e.program));
    programs.extend(request.programs());
    let context = crate::plan::wants_of(programs);
    Some(Source {
        name: config.name.clone(),
        after,
        reads,
        when,
        for_each,
        context,
        request,
        calls,
        max_calls: config.max_calls as usize,
        concurrency: config.concurrency.max(1) as usize,
        optional: config.optional,
        timeout: config.timeout_ms.map(Duration::from_millis),
        paging,
    })
}

/// The identity a source's rate limit and breaker are kept under: the route's uuid mixed with
/// the source's name (FNV-1a), the same on every node and after every restart.
fn source_key(route: Uuid, name: &str) -> Uuid {
    let mut hash: u128 = 0x6c62272e07bb014262b821756295c58d;
    for &b in name.as_bytes() {
        hash ^= u128::from(b);
        hash = hash.wrapping_mul(0x0000000001000000000000000000013B);
    }
    Uuid::from_u128(route.as_u128() ^ hash)
}

/// What [`Source::elements`] found: the `forEach` value's elements, or that it was neither a
/// list nor an object (its type).
pub enum Elements<'d> {
    Of(Vec<Val<'d>>),
    NotAList(&'static str),
}

impl Source {
    /// Whether `when` lets the source be called (true without a `when`).
    pub fn wanted<'d>(&'d self, context: &Context<'d, '_>) -> Result<bool, RequestError> {
        let Some(when) = &self.when else { return Ok(true) };
        let value = context.eval(&when.program).map_err(|e| failure(when, e))?;
        Ok(value.truthy(context.doc))
    }

    /// The elements a `forEach` source is called for, as `each` takes a value (SPEC §1.6): a
    /// list's elements, an object alone; anything else is not a list.
    pub fn elements<'d>(&'d self, context: &Context<'d, '_>) -> Result<Elements<'d>, RequestError> {
        let Some(for_each) = &self.for_each else { return Ok(Elements::Of(Vec::new())) };
        let value = context.eval(&for_each.program).map_err(|e| failure(for_each, e))?;
        let view = context.view();
        Ok(match value.kind() {
            expr::Kind::Array => Elements::Of(view.items(value).into_iter().flatten().collect()),
            expr::Kind::Object => Elements::Of(vec![value]),
            kind => Elements::NotAList(kind.name()),
        })
    }

    /// Where `forEach` is, for the problem of a list longer than `maxCalls`.
    pub fn for_each_location(&self) -> &str {
        self.for_each.as_ref().map_or("", |e| e.location.as_str())
    }

    /// The request of one call of the source over `context` (with its `$item` set for a
    /// `forEach` source).
    pub fn request<'d>(
        &'d self,
        context: &Context<'d, '_>,
        caller: &CallerParts<'_>,
    ) -> Result<UpstreamRequest, RequestError> {
        self.request.render(Some(context), caller)
    }
}

fn failure(expression: &Expression, error: RenderError) -> RequestError {
    RequestError::Template {
        location: expression.location.clone(),
        why: error.to_string(),
        only_request: expression.only_request,
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::*;
    use crate::expr::Doc as View;
    use crate::json;
    use crate::route::sources;
    use crate::route::template::Scratch;

    fn configs(given: serde_json::Value) -> Vec<SourceConfig> {
        let mut problems = Vec::new();
        let configs = sources::validate(&given, 64, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        configs
    }

    fn compiled(given: serde_json::Value) -> Result<Composition, Vec<Problem>> {
        Composition::compile(&configs(given), &[], Uuid::nil(), &Limits::default())
    }

    #[test]
    fn a_composition_knows_whether_a_source_reads_the_caller_s_request() {
        let base = json!({"baseUrl": "http://h/"});
        let reads = |b: serde_json::Value| {
            let mut sources = json!({"a": {"originalApi": base, "path": "a"}});
            sources["b"] = b;
            compiled(sources).expect("compiles").reads_request
        };
        assert!(!reads(json!({"originalApi": base, "path": "b/{{a.id}}", "after": ["a"]})));
        assert!(reads(json!({"originalApi": base, "path": "b/{{request.query.id}}"})));
        assert!(reads(json!({"originalApi": base, "path": "b", "headers": {"X": "{{request.headers.x}}"}})));
        assert!(reads(json!({"originalApi": base, "path": "b", "when": "request.body"})));
        assert!(reads(json!({"originalApi": base, "path": "b/{{length(request.query)}}"})));
        assert!(reads(json!({"originalApi": base, "path": "b/{{$item}}", "forEach": "request.query.id"})));
        assert!(!reads(json!({"originalApi": base, "path": "b", "body": {"k": "v"}})));
        assert!(reads(
            json!({"originalApi": base, "path": "b", "method": "POST", "body": {"k": "{{request.body.k}}"}})
        ));
    }

    fn located(problems: &[Problem]) -> Vec<String> {
        problems.iter().map(|p| format!("{}: {}", p.location, p.message)).collect()
    }

    /// The request `source` makes over `context` (a JSON object), with `$item` its `__item`.
    fn request(
        composition: &Composition,
        source: &str,
        context: serde_json::Value,
    ) -> Result<UpstreamRequest, RequestError> {
        let source = &composition.sources[composition.index_of(source).unwrap()];
        let mut text = context.to_string().into_bytes();
        json::with_parsed(&mut text, 64, |doc| {
            let scratch = Scratch::new(1 << 20, 1 << 20);
            let arena = scratch.arena();
            let item = View { nodes: doc }.field(Val::from_tape(doc, 0), "__item");
            let context = Context { doc, item: Some(item), caller: Val::Null, arena: &arena, explain: false };
            source.request(&context, &CallerParts::default())
        })
        .unwrap()
    }

    /// A source's context read for what its expressions read (`Source::context`) renders the
    /// same request as the context read whole, and holds less of it.
    #[test]
    fn a_context_read_for_what_its_expressions_read_renders_as_the_whole_one() {
        use crate::json::ondemand::{Indexed, Part, with_parts};
        let composition = compiled(json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "method": "POST", "path": "b/{{a.items[1].id}}/{{a.items[-1].id}}",
                  "queries": {"q": "{{request.query.q}}", "t": "{{a.tags[0]}}"},
                  "headers": {"X-N": "n{{a.n}}", "X-O": "{{a.\"odd name\"}}"},
                  "body": {"whole": "{{a.obj}}", "text": "x {{a.n}}"},
                  "when": "a.ok", "after": ["a"]},
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c/{{join(',', a.tags)}}", "when": "a.ok", "after": ["a"]},
        }))
        .unwrap();
        let request =
            Indexed::new(br#"{"query":{"q":"s p","other":"1"},"headers":{},"body":null}"#.to_vec(), 63)
                .unwrap();
        let a = Indexed::new(
            br#"{"skip":{"deep":[1,2,3]},"items":[{"id":"x"},{"id":"y\u00e9","more":[1]},{"id":7}],"tags":["t","u"],"n":1.5,
                "obj":{"k":[true,null]},"odd name":"\"q\"","ok":true,"tail":"z"}"#
                .to_vec(),
            62,
        )
        .unwrap();
        let parts = [Part::One(&request), Part::One(&a)];
        let render = |b: &Source, wants| {
            with_parts(&["request", "a"], &parts, wants, 64, |doc| {
                let scratch = Scratch::new(1 << 20, 1 << 20);
                let arena = scratch.arena();
                let context = Context { doc, item: None, caller: Val::Null, arena: &arena, explain: false };
                assert_eq!(b.wanted(&context), Ok(true));
                let request = b.request(&context, &CallerParts::default()).unwrap();
                (
                    format!("{} {} {:?} {:?}", request.method, request.uri, request.headers, request.body),
                    doc.len(),
                )
            })
            .unwrap()
        };
        let b = &composition.sources[composition.index_of("b").unwrap()];
        let (whole, all) = render(b, None);
        let (read, kept) = render(b, Some(&b.context));
        assert_eq!(read, whole);
        assert!(whole.contains("/b/y%C3%A9/7?q=s+p&t=t"), "{whole}");
        // Not read: `skip` (7 nodes), `items[1].more` (3), `tail` (2), and of `request` the
        // query's `other`, `headers` and `body` (2 each).
        assert_eq!(all - kept, 18, "{kept} of {all} nodes");
        // An expression that is not a plain path reads the members it names whole.
        let c = &composition.sources[composition.index_of("c").unwrap()];
        let (whole, _) = render(c, None);
        let (read, kept) = render(c, Some(&c.context));
        assert_eq!(read, whole);
        assert!(whole.contains("/c/t%2Cu"), "{whole}");
        assert!(kept < all && kept > all / 2, "{kept} of {all} nodes");
    }

    #[test]
    fn sources_are_ordered_after_what_they_wait_for() {
        let composition = compiled(json!({
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c", "after": ["b"]},
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b/{{a.id}}", "after": ["a"]},
        }))
        .unwrap();
        let names: Vec<&str> = composition.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(composition.sources[2].after, [1]);
        assert_eq!(composition.sources[1].reads, [0]);
        assert_eq!(composition.by_name, [0, 1, 2]);
    }

    #[test]
    fn cycles_unknown_names_and_reads_outside_the_closure_are_located() {
        let cycle = compiled(json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a", "after": ["c"]},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b", "after": ["a"]},
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c", "after": ["b"]},
        }))
        .unwrap_err();
        assert_eq!(
            located(&cycle),
            ["/sources/a/after: the sources wait for each other in a cycle: a → c → b → a"]
        );
        let problems = compiled(json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b/{{a.id}}", "when": "b.x", "after": ["a", "x"]},
            "e": {"originalApi": {"baseUrl": "http://h/"}, "path": "e/{{a.id}}"},
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c", "after": ["b"], "queries": {"q": "{{a.id}}"}},
            "d": {"originalApi": {"baseUrl": "http://h/"}, "path": "d", "forEach": "keys(@)"},
        }))
        .unwrap_err();
        let found = located(&problems).join("\n");
        for expected in [
            "/sources/b/after/1: unknown source `x`",
            "/sources/b/when: reads `b`, this source's own value",
            "/sources/e/path: reads `a`, which this source does not wait for: add \"a\" to its `after`",
            "/sources/d/forEach: the expression reads the whole context",
        ] {
            assert!(found.contains(expected), "{expected}\n in\n{found}");
        }
        // `c` waits for `a` through `b`: it may read it.
        assert!(!found.contains("/sources/c/"), "{found}");
    }

    #[test]
    fn the_worst_case_of_calls_is_bounded_at_registration() {
        let given = json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b/{{$item}}", "after": ["a"], "forEach": "a.ids", "maxCalls": 20,
                  "retry": {"attempts": 2, "on": [503]}},
        });
        let limits = Limits { max_source_calls: 60, ..Limits::default() };
        let problems = Composition::compile(&configs(given.clone()), &[], Uuid::nil(), &limits).unwrap_err();
        assert!(located(&problems)[0].contains("sends 61 requests"), "{problems:?}");
        let limits = Limits { max_source_calls: 61, ..Limits::default() };
        assert!(Composition::compile(&configs(given), &[], Uuid::nil(), &limits).is_ok());
    }

    #[test]
    fn a_request_is_rendered_inside_its_base_url() {
        let composition = compiled(json!({
            "a": {"originalApi": {"baseUrl": "https://api.example/v2/"}, "path": "/users/{{request.query.id}}/x?fixed=1",
                  "queries": {"n": "{{request.query.n}}", "fixed": "2"},
                  "headers": {"X-Id": "id {{request.query.id}}"},
                  "method": "PUT",
                  "body": {"whole": "{{request.body}}", "text": "id={{request.query.id}}"},
                  "authHeader": {"type": "Bearer", "token": "t"}},
        }))
        .unwrap();
        let context = json!({"request": {"query": {"id": "7/a b", "n": ["1", "2"]}, "body": {"k": [1, null]}}, "__item": null});
        let rendered = request(&composition, "a", context).unwrap();
        assert_eq!(rendered.uri.to_string(), "https://api.example/v2/users/7%2Fa%20b/x?fixed=2&n=1&n=2");
        assert_eq!(rendered.method, Method::PUT);
        assert_eq!(rendered.headers["x-id"], "id 7/a b");
        assert_eq!(rendered.headers["authorization"], "Bearer t");
        // (The body's members in name order: registration reads it so.)
        assert_eq!(&rendered.body[..], br#"{"text":"id=7/a b","whole":{"k":[1,null]}}"#);
        assert_eq!(rendered.headers["content-type"], "application/json");
        // What cannot stay where it is written fails the source, naming the place and the type.
        let fails = |query: serde_json::Value| {
            let context = json!({"request": {"query": query, "body": null}, "__item": null});
            match request(&composition, "a", context) {
                Err(RequestError::Template { location, why, only_request }) => {
                    assert!(only_request);
                    format!("{location}: {why}")
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            fails(json!({"id": "..", "n": "1"})),
            "/sources/a/path: a path segment with a template renders as `.` or `..`, which would not stay one segment"
        );
        assert_eq!(
            fails(json!({"id": "", "n": "1"})),
            "/sources/a/path: a path segment with a template renders empty, which would not stay one segment"
        );
        assert_eq!(
            fails(json!({"n": "1"})),
            "/sources/a/path: its value is null, which cannot be written as text here"
        );
        assert_eq!(
            fails(json!({"id": {"a": 1}, "n": "1"})),
            "/sources/a/path: its value is an object, which cannot be written as text here"
        );
        assert_eq!(
            fails(json!({"id": "a\nHost: evil", "n": "1"})),
            "/sources/a/headers/X-Id: the rendered header value holds a character other than visible ASCII, space or tab"
        );
        assert!(!fails(json!({"id": "1", "n": [[1]]})).contains("1]"), "a value is never shown");
    }
}
