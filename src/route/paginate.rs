//! `paginate` (SPEC §2.3 "Pages") of a source or of `originalRoute`: as stored
//! ([`PaginateConfig`], checked by hand so that each problem has its location), compiled
//! ([`Paging`]: `items`, `next` and `while` as expressions over one page's answer, `@`, with
//! `$page` and `$headers` bound), and the reading of one page: its items' elements written onto
//! the joined list, and the request that comes next. Pure: the server sends the pages.

use std::collections::BTreeMap;

use bumpalo::Bump;
use http::Uri;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::expr::{self, Arena, Budget, Const, Doc as View, Kind, PathStep, Patterns, Program, Val};
use crate::json::ondemand::{self, Wants};
use crate::json::{self, push_pointer};
use crate::rules::Problem;
use crate::upstream::UpstreamRequest;

/// `maxPages`' bound and default.
pub const MAX_PAGES: u32 = 100;
pub const DEFAULT_MAX_PAGES: u32 = 10;

/// The variables a paging expression reads beside the page (`@`), in their slots' order.
const BOUND: [&str; 2] = ["page", "headers"];

/// The members `paginate` takes.
const MEMBERS: [&str; 5] = ["items", "next", "while", "maxPages", "onMaxPages"];

/// `paginate` as stored, in the shape it is given and shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaginateConfig {
    pub items: String,
    pub next: NextConfig,
    #[serde(rename = "while", default, skip_serializing_if = "Option::is_none")]
    pub while_: Option<String>,
    pub max_pages: u32,
    #[serde(default, skip_serializing_if = "OnMaxPages::is_fail")]
    pub on_max_pages: OnMaxPages,
}

/// How the next page's request is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NextConfig {
    /// Query parameters set on the source's own request, each an expression.
    Query { query: BTreeMap<String, String> },
    /// A URL, absolute or relative to the page's own.
    Url { url: String },
    /// RFC 8288's `rel="next"` of the answer's `Link` header.
    Link(LinkWord),
}

/// The word `"link"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkWord {
    Link,
}

/// What more than `maxPages` pages does: fail the source, or keep the pages fetched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnMaxPages {
    #[default]
    Fail,
    Stop,
}

impl OnMaxPages {
    fn is_fail(&self) -> bool {
        *self == OnMaxPages::Fail
    }
}

/// Reads `paginate` at `at` (`/sources/orders/paginate`, `/originalRoute/paginate`); `None`
/// when it is absent or `null`, or has problems (added to `problems`).
pub fn validate(given: Option<&Value>, at: &str, problems: &mut Vec<Problem>) -> Option<PaginateConfig> {
    let members = match given {
        None | Some(Value::Null) => return None,
        Some(Value::Object(members)) => members,
        Some(_) => {
            problems.push(Problem::new(
                at,
                "must be an object such as {\"items\": \"data\", \"next\": {\"query\": {\"cursor\": \"meta.next_cursor\"}}}",
            ));
            return None;
        }
    };
    let before = problems.len();
    let here = |member: &str| format!("{at}/{member}");
    for member in members.keys().filter(|m| !MEMBERS.contains(&m.as_str())) {
        let mut location = at.to_owned();
        push_pointer(&mut location, member);
        problems.push(Problem::new(location, crate::suggest::unknown("member", member, &MEMBERS)));
    }
    let items = match members.get("items") {
        Some(Value::String(items)) => items.clone(),
        Some(_) => {
            problems.push(Problem::new(here("items"), "must be an expression (a string), such as \"data\""));
            String::new()
        }
        None => {
            problems.push(Problem::new(
                here("items"),
                "missing required member: an expression selecting each page's list, such as \"data\" (or \"@\" for an answer that is the list)",
            ));
            String::new()
        }
    };
    let next = match members.get("next") {
        Some(Value::String(word)) if word == "link" => Some(NextConfig::Link(LinkWord::Link)),
        Some(Value::Object(how)) if how.len() == 1 && how.contains_key("url") => match &how["url"] {
            Value::String(url) => Some(NextConfig::Url { url: url.clone() }),
            _ => {
                problems.push(Problem::new(format!("{at}/next/url"), "must be an expression (a string)"));
                None
            }
        },
        Some(Value::Object(how)) if how.len() == 1 && how.contains_key("query") => match &how["query"] {
            Value::Object(pairs) if !pairs.is_empty() => {
                let mut query = BTreeMap::new();
                for (name, value) in pairs {
                    let mut location = format!("{at}/next/query");
                    push_pointer(&mut location, name);
                    match value {
                        Value::String(text) if !name.is_empty() => {
                            query.insert(name.clone(), text.clone());
                        }
                        Value::String(_) => {
                            problems.push(Problem::new(location, "a query parameter needs a name"))
                        }
                        _ => problems.push(Problem::new(location, "must be an expression (a string)")),
                    }
                }
                Some(NextConfig::Query { query })
            }
            _ => {
                problems.push(Problem::new(
                    format!("{at}/next/query"),
                    "must be an object of query parameters, each an expression, such as {\"cursor\": \"meta.next_cursor\"}",
                ));
                None
            }
        },
        _ => {
            problems.push(Problem::new(
                here("next"),
                "must be {\"query\": {\"<name>\": \"<expr>\", ...}}, {\"url\": \"<expr>\"} or \"link\"",
            ));
            None
        }
    };
    let while_ = match members.get("while") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => {
            problems.push(Problem::new(here("while"), "must be an expression (a string)"));
            None
        }
    };
    let max_pages = match members.get("maxPages") {
        None | Some(Value::Null) => DEFAULT_MAX_PAGES,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=u64::from(MAX_PAGES)).contains(&n) => n as u32,
            _ => {
                problems.push(Problem::new(
                    here("maxPages"),
                    format!("must be a whole number from 1 to {MAX_PAGES}"),
                ));
                DEFAULT_MAX_PAGES
            }
        },
    };
    let on_max_pages = match members.get("onMaxPages") {
        None | Some(Value::Null) => OnMaxPages::Fail,
        Some(Value::String(word)) if word == "fail" => OnMaxPages::Fail,
        Some(Value::String(word)) if word == "stop" => OnMaxPages::Stop,
        Some(_) => {
            problems.push(Problem::new(
                here("onMaxPages"),
                "must be \"fail\" (the default: more pages fail the source) or \"stop\" (keep the pages fetched)",
            ));
            OnMaxPages::Fail
        }
    };
    if problems.len() != before {
        return None;
    }
    Some(PaginateConfig { items, next: next?, while_, max_pages, on_max_pages })
}

/// `paginate`, compiled.
#[derive(Debug)]
pub struct Paging {
    pub items: PageExpression,
    pub next: Next,
    pub while_: Option<PageExpression>,
    pub max_pages: usize,
    /// `"onMaxPages": "stop"`.
    pub stop_at_max: bool,
    /// Whether a page's answer headers are read (`$headers`, or `"link"`).
    pub headers: bool,
    /// Where it is in the registration (`/sources/orders/paginate`).
    pub at: String,
    /// `items` as member names from the page's root (`@`: none), when it is such a plain path:
    /// the list is then found by its tokens and its text taken as it is, never read into a tape
    /// and written again.
    items_path: Option<Vec<String>>,
    /// What `while` and `next` read of a page (all it is read for on that path).
    reads: Wants,
}

/// One expression over a page, with where it is.
#[derive(Debug)]
pub struct PageExpression {
    program: Program,
    pub location: String,
}

/// How the next page's request is made, compiled.
#[derive(Debug)]
pub enum Next {
    Query(Vec<(String, PageExpression)>),
    Url(PageExpression),
    Link,
}

impl Paging {
    /// Compiles `config` (at `at`), or `None` with its problems added.
    pub fn compile(
        config: &PaginateConfig,
        at: &str,
        max_depth: usize,
        patterns: &mut Patterns,
        problems: &mut Vec<Problem>,
    ) -> Option<Paging> {
        let before = problems.len();
        let mut reads_headers = false;
        let mut compile = |text: &str, location: String, problems: &mut Vec<Problem>| {
            reads_headers |= text.contains("$headers");
            match expr::compile_bound(text, max_depth, patterns, &BOUND) {
                Ok(program) => Some(PageExpression { program, location }),
                Err(errors) => {
                    for error in errors {
                        problems.push(Problem::new(
                            &location,
                            format!("at character {}: {}", error.char_offset(text) + 1, error.message),
                        ));
                    }
                    None
                }
            }
        };
        let items = compile(&config.items, format!("{at}/items"), problems);
        let while_ = config.while_.as_ref().map(|text| compile(text, format!("{at}/while"), problems));
        let next = match &config.next {
            NextConfig::Link(_) => Some(Next::Link),
            NextConfig::Url { url } => compile(url, format!("{at}/next/url"), problems).map(Next::Url),
            NextConfig::Query { query } => {
                let mut compiled = Vec::new();
                for (name, text) in query {
                    let mut location = format!("{at}/next/query");
                    push_pointer(&mut location, name);
                    if let Some(expression) = compile(text, location, problems) {
                        compiled.push((name.clone(), expression));
                    }
                }
                Some(Next::Query(compiled))
            }
        };
        if problems.len() != before {
            return None;
        }
        let headers = reads_headers || matches!(next, Some(Next::Link));
        let (items, next, while_) = (items?, next?, while_.flatten());
        let items_path = if config.items.trim() == "@" {
            Some(Vec::new())
        } else {
            items.program.plain_path().and_then(|steps| {
                steps
                    .iter()
                    .map(|step| match step {
                        PathStep::Field(name) => Some((*name).to_owned()),
                        PathStep::Index(_) => None,
                    })
                    .collect()
            })
        };
        let mut reads: Vec<&Program> = while_.iter().map(|e| &e.program).collect();
        match &next {
            Next::Query(pairs) => reads.extend(pairs.iter().map(|(_, e)| &e.program)),
            Next::Url(e) => reads.push(&e.program),
            Next::Link => {}
        }
        // A page may be a list: an expression that indexes it reads it whole.
        let reads = crate::plan::wants_of_value(reads);
        Some(Paging {
            items,
            next,
            while_,
            max_pages: config.max_pages as usize,
            stop_at_max: config.on_max_pages == OnMaxPages::Stop,
            headers,
            at: at.to_owned(),
            items_path,
            reads,
        })
    }

    /// Reads page `page` (from 1; its answer `body`, its headers `headers` with lower-case
    /// names, asked by `asked`, made from the source's own `first` request): appends its items'
    /// elements to `joined` (a list being written, its `[` already there; `count` the elements
    /// so far) and says what comes next. `budget` bounds the expressions' work.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &self,
        body: &mut Vec<u8>,
        page: usize,
        headers: &[(String, String)],
        asked: &Uri,
        first: &UpstreamRequest,
        max_depth: usize,
        budget: &Budget,
        joined: &mut Vec<u8>,
        count: &mut usize,
    ) -> Result<After, PageError> {
        let Some(path) = &self.items_path else {
            return self.read_whole(body, page, headers, asked, first, max_depth, budget, joined, count);
        };
        let header_values = header_values(headers);
        let page_number = Const::Number(expr::Number::UInt(page as u64));
        let names: Vec<&str> = path.iter().map(String::as_str).collect();
        let read = ondemand::with_read_at(body, &self.reads, max_depth, &names, |doc, found| {
            let nodes: &[simd_json::Node<'_>] = doc;
            let bump = Bump::new();
            let arena = Arena::new(&bump, budget);
            let bound = [Val::from_const(&page_number), Val::from_const(&header_values)];
            (found, self.after(nodes, &arena, &bound, headers, asked, first))
        });
        let (found, after) = match read {
            Ok(read) => read,
            Err(e) => return Err(PageError::NotJson(format!("page {page}'s answer is not JSON: {e}"))),
        };
        // The list's elements, as they are written in the page.
        match found {
            Some(ondemand::Found { start, end, elements: Some(elements) }) => {
                if elements > 0 {
                    let inner = body.get(start + 1..end - 1).unwrap_or_default().trim_ascii();
                    if *count > 0 {
                        joined.push(b',');
                    }
                    joined.extend_from_slice(inner);
                    *count += elements;
                }
            }
            found => {
                let kind = match found.and_then(|f| body.get(f.start)) {
                    None | Some(b'n') => Kind::Null,
                    Some(b'{') => Kind::Object,
                    Some(b'"') => Kind::String,
                    Some(b't' | b'f') => Kind::Boolean,
                    Some(_) => Kind::Number,
                };
                return Err(PageError::Expression {
                    location: self.items.location.clone(),
                    why: format!("page {page}'s items are {}, not a list", article(kind)),
                });
            }
        }
        after
    }

    /// What comes after page `page` (its tape `nodes`): `while`, then `next`.
    #[allow(clippy::too_many_arguments)]
    fn after<'v>(
        &'v self,
        nodes: &'v [simd_json::Node<'v>],
        arena: &'v Arena<'v>,
        bound: &[Val<'v>],
        headers: &[(String, String)],
        asked: &Uri,
        first: &UpstreamRequest,
    ) -> Result<After, PageError> {
        let root = Val::from_tape(nodes, 0);
        let view = View { nodes };
        let eval = |expression| evaluate(expression, nodes, root, arena, bound);
        if let Some(while_) = &self.while_
            && !eval(while_)?.truthy(nodes)
        {
            return Ok(After::Last);
        }
        match &self.next {
            Next::Link => match link_next(headers) {
                Some(target) => resolve(asked, &target, first, &format!("{}/next", self.at)),
                None => Ok(After::Last),
            },
            Next::Url(expression) => match text_of(view, eval(expression)?, &expression.location)? {
                Some(target) => resolve(asked, &target, first, &expression.location),
                None => Ok(After::Last),
            },
            Next::Query(pairs) => {
                let mut set = Vec::with_capacity(pairs.len());
                for (name, expression) in pairs {
                    match text_of(view, eval(expression)?, &expression.location)? {
                        Some(value) => set.push((name.as_str(), value)),
                        None => return Ok(After::Last),
                    }
                }
                let location = format!("{}/next/query", self.at);
                with_query(first, &set, &location).map(|r| After::Next(Box::new(r)))
            }
        }
    }

    /// [`Paging::read`] of a page whose `items` is not a plain path: the page parsed whole, the
    /// items' value written onto the list.
    #[allow(clippy::too_many_arguments)]
    fn read_whole(
        &self,
        body: &mut Vec<u8>,
        page: usize,
        headers: &[(String, String)],
        asked: &Uri,
        first: &UpstreamRequest,
        max_depth: usize,
        budget: &Budget,
        joined: &mut Vec<u8>,
        count: &mut usize,
    ) -> Result<After, PageError> {
        let header_values = header_values(headers);
        let page_number = Const::Number(expr::Number::UInt(page as u64));
        let parsed = json::with_parsed(body, max_depth, |doc| {
            let nodes: &[simd_json::Node<'_>] = doc;
            let bump = Bump::new();
            let arena = Arena::new(&bump, budget);
            let root = Val::from_tape(nodes, 0);
            let bound = [Val::from_const(&page_number), Val::from_const(&header_values)];
            let view = View { nodes };
            let eval = |expression| evaluate(expression, nodes, root, &arena, &bound);
            let items = eval(&self.items)?;
            match items.kind() {
                Kind::Array => {
                    for item in view.items(items).into_iter().flatten() {
                        if *count > 0 {
                            joined.push(b',');
                        }
                        view.write(joined, item);
                        *count += 1;
                    }
                }
                kind => {
                    return Err(PageError::Expression {
                        location: self.items.location.clone(),
                        why: format!("page {page}'s items are {}, not a list", article(kind)),
                    });
                }
            }
            self.after(nodes, &arena, &bound, headers, asked, first)
        });
        match parsed {
            Ok(after) => after,
            Err(e) => Err(PageError::NotJson(format!("page {page}'s answer is not JSON: {e}"))),
        }
    }
}

/// `$headers`: the page's answer's headers, by lower-case name.
fn header_values(headers: &[(String, String)]) -> Const {
    Const::Object(
        headers.iter().map(|(n, v)| (Box::from(n.as_str()), Const::String(Box::from(v.as_str())))).collect(),
    )
}

/// Runs `expression` over a page (`root`).
fn evaluate<'v>(
    expression: &'v PageExpression,
    nodes: &'v [simd_json::Node<'v>],
    root: Val<'v>,
    arena: &'v Arena<'v>,
    bound: &[Val<'v>],
) -> Result<Val<'v>, PageError> {
    expr::evaluate_bound(&expression.program, nodes, root, arena, bound)
        .map_err(|e| PageError::Expression { location: expression.location.clone(), why: e.to_string() })
}

/// What comes after a page.
#[derive(Debug)]
pub enum After {
    /// This page was the last.
    Last,
    /// The next page's request.
    Next(Box<UpstreamRequest>),
}

/// Why a page cannot be read, or its next request made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageError {
    NotJson(String),
    /// An expression failed, gave what cannot be used, or a next URL leaves the source's origin
    /// (where, and why: a type, never a value).
    Expression {
        location: String,
        why: String,
    },
    /// The next URL is on another origin: nothing is sent there.
    OffOrigin {
        location: String,
    },
}

fn article(kind: Kind) -> String {
    match kind {
        Kind::Null => "null".to_owned(),
        Kind::Array | Kind::Object => format!("an {}", kind.name()),
        kind => format!("a {}", kind.name()),
    }
}

/// A next value as text: a string as it is, a number or a boolean as written; `None` for `null`
/// or an empty string or list (paging stops); a list or an object fails.
fn text_of(view: View<'_>, value: Val<'_>, location: &str) -> Result<Option<String>, PageError> {
    match value {
        Val::Null => Ok(None),
        Val::String("") => Ok(None),
        Val::String(s) => Ok(Some(s.to_owned())),
        Val::Bool(b) => Ok(Some(b.to_string())),
        Val::Number(n) => {
            let mut out = Vec::new();
            n.write(&mut out);
            Ok(Some(String::from_utf8_lossy(&out).into_owned()))
        }
        other if other.kind() == Kind::Array && view.len(other) == Some(0) => Ok(None),
        other => Err(PageError::Expression {
            location: location.to_owned(),
            why: format!("the next value is {}, which cannot be written as text", article(other.kind())),
        }),
    }
}

/// The source's own request with `set` query parameters: each replaces every parameter of its
/// name, or is added (encoded); the other parameters stay byte for byte as they were.
fn with_query(
    first: &UpstreamRequest,
    set: &[(&str, String)],
    location: &str,
) -> Result<UpstreamRequest, PageError> {
    let query = first.uri.query().unwrap_or_default();
    let mut text = first.uri.path().to_owned();
    text.push('?');
    let mut kept = 0;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        let decoded: String = url::form_urlencoded::parse(name.as_bytes()).map(|(n, _)| n).collect();
        if set.iter().any(|(n, _)| *n == decoded) {
            continue;
        }
        if kept > 0 {
            text.push('&');
        }
        text.push_str(pair);
        kept += 1;
    }
    let added = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(set).finish();
    if kept > 0 && !added.is_empty() {
        text.push('&');
    }
    text.push_str(&added);
    let bad = || PageError::Expression {
        location: location.to_owned(),
        why: "the next page's query does not make a URL".to_owned(),
    };
    let mut parts = first.uri.clone().into_parts();
    parts.path_and_query = Some(text.parse().map_err(|_| bad())?);
    let uri = Uri::from_parts(parts).map_err(|_| bad())?;
    Ok(UpstreamRequest { uri, ..first.clone() })
}

/// `target` read relative to the page's URL (`asked`): the source's own request sent there, or
/// a failure when it leaves the source's origin (scheme, host and port).
fn resolve(asked: &Uri, target: &str, first: &UpstreamRequest, location: &str) -> Result<After, PageError> {
    let bad = |why: &str| PageError::Expression { location: location.to_owned(), why: why.to_owned() };
    // An empty target (`<>`, a URL of spaces) is no next page.
    let target = target.trim();
    if target.is_empty() {
        return Ok(After::Last);
    }
    let base = url::Url::parse(&asked.to_string()).map_err(|_| bad("the page's own URL cannot be read"))?;
    let next = base.join(target).map_err(|_| bad("the next value is not a URL"))?;
    let origin =
        url::Url::parse(&first.uri.to_string()).map_err(|_| bad("the source's URL cannot be read"))?;
    // Credentials in the URL (`user:pass@`) make another authority, whatever the host.
    if next.scheme() != origin.scheme()
        || next.host_str() != origin.host_str()
        || next.port_or_known_default() != origin.port_or_known_default()
        || !next.username().is_empty()
        || next.password().is_some()
    {
        return Err(PageError::OffOrigin { location: location.to_owned() });
    }
    let mut next = next;
    next.set_fragment(None);
    let uri: Uri = next.as_str().parse().map_err(|_| bad("the next value is not a URL"))?;
    Ok(After::Next(Box::new(UpstreamRequest { uri, ..first.clone() })))
}

/// RFC 8288: the target of the first link whose (first) `rel` parameter holds `next`, in the
/// `Link` header values (`headers`' `link`, its lines joined by `, `). Quoted strings (with
/// `\` escapes) may hold `,` and `;`.
pub fn link_next(headers: &[(String, String)]) -> Option<String> {
    let value = &headers.iter().find(|(n, _)| n == "link")?.1;
    let mut rest = value.as_str();
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_ascii_whitespace());
        let open = rest.strip_prefix('<')?;
        let close = open.find('>')?;
        let target = &open[..close];
        rest = &open[close + 1..];
        // Its parameters, each up to a `;` outside a quoted string, up to the `,` that ends the
        // link.
        let mut params: Vec<&str> = Vec::new();
        let (mut in_quotes, mut escaped, mut start, mut end) = (false, false, 0, rest.len());
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if in_quotes => escaped = true,
                '"' => in_quotes = !in_quotes,
                ';' if !in_quotes => {
                    params.push(&rest[start..i]);
                    start = i + 1;
                }
                ',' if !in_quotes => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        params.push(&rest[start..end]);
        rest = &rest[end..];
        let rel = params.iter().find_map(|param| {
            let (name, value) = param.split_once('=')?;
            name.trim().eq_ignore_ascii_case("rel").then(|| value.trim().trim_matches('"'))
        });
        if rel.is_some_and(|rel| rel.split_ascii_whitespace().any(|r| r.eq_ignore_ascii_case("next"))) {
            return Some(target.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn headers(link: &str) -> Vec<(String, String)> {
        vec![("link".to_owned(), link.to_owned())]
    }

    #[test]
    fn the_next_link_is_found_among_others() {
        let github = r#"<https://api.github.com/repositories/1/issues?page=2>; rel="next", <https://api.github.com/repositories/1/issues?page=5>; rel="last""#;
        assert_eq!(
            link_next(&headers(github)).as_deref(),
            Some("https://api.github.com/repositories/1/issues?page=2")
        );
        let later = r#"<https://h/a?page=1>; rel="prev", <https://h/a?x=1,2>; title="a, b"; rel="next""#;
        assert_eq!(link_next(&headers(later)).as_deref(), Some("https://h/a?x=1,2"));
        assert_eq!(link_next(&headers(r#"</p/3>; rel="prev next""#)).as_deref(), Some("/p/3"));
        assert_eq!(link_next(&headers(r#"<https://h/a?page=5>; rel="last""#)), None);
        assert_eq!(link_next(&headers("garbage")), None);
        // A `;` or `,` inside a quoted string is part of it; only the first `rel` counts.
        let quoted =
            r#"<https://h/p>; rel="prev"; title="x;rel=next, y", <https://h/n>; rel="next"; rel="prev""#;
        assert_eq!(link_next(&headers(quoted)).as_deref(), Some("https://h/n"));
        let escaped = r#"<https://h/p>; title="a \"b\"; rel=next"; rel="prev""#;
        assert_eq!(link_next(&headers(escaped)), None);
        assert_eq!(link_next(&headers(r#"<>; rel="next""#)).as_deref(), Some(""));
        assert_eq!(link_next(&[]), None);
    }

    fn paging(given: serde_json::Value) -> Result<Paging, Vec<String>> {
        let mut problems = Vec::new();
        let config = validate(Some(&given), "/p", &mut problems);
        let paging =
            config.and_then(|c| Paging::compile(&c, "/p", 64, &mut Patterns::default(), &mut problems));
        paging.ok_or_else(|| problems.iter().map(|p| format!("{}: {}", p.location, p.message)).collect())
    }

    #[test]
    fn each_member_s_problem_is_told_at_its_place() {
        assert_eq!(
            paging(json!({"items": "data", "next": "links", "maxPages": 0, "onMaxPages": "go", "extra": 1}))
                .unwrap_err(),
            vec![
                "/p/extra: unknown member `extra`; the known members are items, next, while, maxPages, onMaxPages".to_owned(),
                "/p/next: must be {\"query\": {\"<name>\": \"<expr>\", ...}}, {\"url\": \"<expr>\"} or \"link\"".to_owned(),
                "/p/maxPages: must be a whole number from 1 to 100".to_owned(),
                "/p/onMaxPages: must be \"fail\" (the default: more pages fail the source) or \"stop\" (keep the pages fetched)".to_owned(),
            ]
        );
        let wrong = paging(json!({"items": "data[", "next": {"query": {"c": "a.b.", "": "x"}}})).unwrap_err();
        assert!(
            wrong.iter().any(|p| p.starts_with("/p/next/query/: a query parameter needs a name")),
            "{wrong:?}"
        );
        let wrong = paging(json!({"items": "data[", "next": {"url": "$nope"}})).unwrap_err();
        assert!(wrong[0].starts_with("/p/items: at character"), "{wrong:?}");
        assert!(wrong[1].starts_with("/p/next/url: at character 1:"), "{wrong:?}");
        assert!(paging(json!({"items": "@", "next": "link", "while": "length(@) > `0`"})).is_ok());
    }

    fn first() -> UpstreamRequest {
        UpstreamRequest {
            method: http::Method::GET,
            uri: "http://h:8080/v1/items?limit=2&cursor=old&x=a%20b".parse().unwrap(),
            headers: Default::default(),
            body: Default::default(),
        }
    }

    /// Reads `page` as page `n` with `headers`: the items written so far, and what comes next.
    fn read(
        p: &Paging,
        page: serde_json::Value,
        n: usize,
        headers: &[(String, String)],
    ) -> (String, Result<Option<String>, PageError>) {
        let mut body = page.to_string().into_bytes();
        let mut joined = b"[".to_vec();
        let mut count = 0;
        let budget = Budget::new(1 << 20, 1 << 20);
        let first = first();
        let after = p.read(&mut body, n, headers, &first.uri, &first, 64, &budget, &mut joined, &mut count);
        let after = after.map(|a| match a {
            After::Last => None,
            After::Next(request) => Some(request.uri.to_string()),
        });
        (String::from_utf8(joined).unwrap(), after)
    }

    #[test]
    fn a_cursor_sets_its_parameter_on_the_source_s_own_request() {
        let p = paging(json!({"items": "data", "next": {"query": {"cursor": "meta.next_cursor"}}})).unwrap();
        let (items, next) = read(&p, json!({"data": [1, {"a": 2}], "meta": {"next_cursor": "c 2"}}), 1, &[]);
        assert_eq!(items, "[1,{\"a\":2}");
        // The other parameters stay byte for byte; the one set replaces its every occurrence.
        assert_eq!(next.unwrap().as_deref(), Some("http://h:8080/v1/items?limit=2&x=a%20b&cursor=c+2"));
        assert_eq!(read(&p, json!({"data": [], "meta": {"next_cursor": ""}}), 2, &[]).1, Ok(None));
        assert_eq!(read(&p, json!({"data": [], "meta": {"next_cursor": null}}), 2, &[]).1, Ok(None));
        assert_eq!(read(&p, json!({"data": [], "meta": {}}), 2, &[]).1, Ok(None));
        let (_, next) = read(&p, json!({"data": [], "meta": {"next_cursor": {"a": 1}}}), 2, &[]);
        assert_eq!(
            next,
            Err(PageError::Expression {
                location: "/p/next/query/cursor".to_owned(),
                why: "the next value is an object, which cannot be written as text".to_owned()
            })
        );
    }

    #[test]
    fn page_numbers_offsets_and_while() {
        let p = paging(
            json!({"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "has_more"}),
        )
        .unwrap();
        let (_, next) = read(&p, json!({"items": [1], "has_more": true}), 3, &[]);
        assert_eq!(
            next.unwrap().as_deref(),
            Some("http://h:8080/v1/items?limit=2&cursor=old&x=a%20b&page=4")
        );
        assert_eq!(read(&p, json!({"items": [1], "has_more": false}), 3, &[]).1, Ok(None));
        let (items, next) = read(&p, json!({"items": {"a": 1}, "has_more": true}), 3, &[]);
        assert_eq!(items, "[");
        assert_eq!(
            next,
            Err(PageError::Expression {
                location: "/p/items".to_owned(),
                why: "page 3's items are an object, not a list".to_owned()
            })
        );
    }

    #[test]
    fn a_next_url_stays_on_the_source_s_origin() {
        let p = paging(json!({"items": "@", "next": "link"})).unwrap();
        let (items, next) = read(&p, json!([1, 2]), 1, &headers("</v1/items?page=2>; rel=\"next\""));
        assert_eq!(items, "[1,2");
        assert_eq!(next.unwrap().as_deref(), Some("http://h:8080/v1/items?page=2"));
        // An empty target ends the paging.
        assert_eq!(read(&p, json!([]), 1, &headers("<>; rel=\"next\"")).1, Ok(None));
        for elsewhere in [
            "https://h:8080/x",
            "http://h:8081/x",
            "http://other:8080/x",
            "//other/x",
            "http://u:p@h:8080/x",
            "http://u@h:8080/x",
        ] {
            let link = format!("<{elsewhere}>; rel=\"next\"");
            assert_eq!(
                read(&p, json!([]), 1, &headers(&link)).1,
                Err(PageError::OffOrigin { location: "/p/next".to_owned() }),
                "{elsewhere}"
            );
        }
        let p = paging(json!({"items": "results", "next": {"url": "next"}})).unwrap();
        let (_, next) =
            read(&p, json!({"results": [], "next": "http://h:8080/v1/items?offset=20#f"}), 1, &[]);
        assert_eq!(next.unwrap().as_deref(), Some("http://h:8080/v1/items?offset=20"));
        assert_eq!(read(&p, json!({"results": [], "next": null}), 1, &[]).1, Ok(None));
        assert_eq!(read(&p, json!({"results": [], "next": "  "}), 1, &[]).1, Ok(None));
        let p = paging(json!({"items": "@", "next": {"url": "$headers.\"x-next\""}})).unwrap();
        assert!(p.headers);
        let page = [("x-next".to_owned(), "?page=9".to_owned())];
        assert_eq!(
            read(&p, json!([]), 1, &page).1.unwrap().as_deref(),
            Some("http://h:8080/v1/items?page=9")
        );
    }

    /// A plain path's list is taken as its text (`data`), any other `items` through the page's
    /// tape (`data | @`): both read the same pages the same.
    #[test]
    fn a_list_taken_as_its_text_is_the_list_read_through_the_tape() {
        let fast =
            paging(json!({"items": "data", "next": {"query": {"c": "meta.next"}}, "while": "more"})).unwrap();
        let slow =
            paging(json!({"items": "data | @", "next": {"query": {"c": "meta.next"}}, "while": "more"}))
                .unwrap();
        assert!(fast.items_path.is_some() && slow.items_path.is_none());
        let pages = [
            r#"{"more": true, "data": [1, "two", {"x": [3, {"y": null}]}, [], "\u00e9\"q\"", -1.5e3], "meta": {"next": "n"}}"#,
            r#"{"data":[],"more":false}"#,
            r#"{ "meta" : {"next": null}, "more": true, "data" : [ {"a":1} , {"a":2} ] }"#,
            r#"{"data": {"not": "a list"}, "more": true}"#,
            r#"{"data": "text"}"#,
            r#"{"other": 1}"#,
            r#"{"da\u0074a": [7], "more": false}"#,
            r#"[1, 2]"#,
            r#"{"data": [1, 2"#,
        ];
        for page in pages {
            let read_with = |p: &Paging| {
                let mut body = page.as_bytes().to_vec();
                let (mut joined, mut count) = (b"[".to_vec(), 0);
                let budget = Budget::new(1 << 20, 1 << 20);
                let first = first();
                let after =
                    p.read(&mut body, 1, &[], &first.uri, &first, 64, &budget, &mut joined, &mut count);
                joined.push(b']');
                let after = after.map(|a| match a {
                    After::Last => None,
                    After::Next(request) => Some(request.uri.to_string()),
                });
                (
                    serde_json::from_slice::<serde_json::Value>(&joined).ok(),
                    count,
                    after.map_err(|e| format!("{e:?}")),
                )
            };
            let (fast, slow) = (read_with(&fast), read_with(&slow));
            assert_eq!(fast.0, slow.0, "{page}");
            assert_eq!(fast.1, slow.1, "{page}");
            match (&fast.2, &slow.2) {
                (Err(a), Err(b)) if a.contains("NotJson") => assert!(b.contains("NotJson"), "{page}"),
                (Err(a), Err(b)) => {
                    assert_eq!(a.replace("/p/items", ""), b.replace("/p/items", ""), "{page}")
                }
                (a, b) => assert_eq!(a, b, "{page}"),
            }
        }
    }

    /// A page that is a list, taken as its text (`@`), is read for `while` and `next` as much as
    /// they need: an index or a slice of it reads it whole, as through the tape (`@ | @`).
    #[test]
    fn a_page_that_is_a_list_is_read_whole_by_what_indexes_it() {
        let page = r#"[{"id": 1, "last": false}, {"id": 2, "last": false}]"#;
        for next in [
            "$[-1].id",
            "to_string([-1].id)",
            "[-1].id || 'none'",
            "join(',', [0:2].to_string(id))",
            "let $l = [-1] in $l.id",
            "[-1].id",
            "length(@)",
        ] {
            let read_with = |items: &str| {
                let p =
                    paging(json!({"items": items, "next": {"query": {"c": next}}, "while": "!([-1].last)"}))
                        .unwrap();
                let mut body = page.as_bytes().to_vec();
                let (mut joined, mut count) = (b"[".to_vec(), 0);
                let budget = Budget::new(1 << 20, 1 << 20);
                let first = first();
                let after =
                    p.read(&mut body, 1, &[], &first.uri, &first, 64, &budget, &mut joined, &mut count);
                (
                    p.items_path.is_some(),
                    after.map(|a| match a {
                        After::Last => None,
                        After::Next(request) => Some(request.uri.to_string()),
                    }),
                )
            };
            let (fast, slow) = (read_with("@"), read_with("@ | @"));
            assert!(fast.0 && !slow.0);
            assert!(matches!(&slow.1, Ok(Some(_))), "{next}: {:?}", slow.1);
            assert_eq!(fast.1, slow.1, "{next}");
        }
    }
}
