//! Sources and routes that follow an upstream's pages (SPEC §2.3 "Pages"), against real
//! upstreams on 127.0.0.1 that page as five public APIs do: GitHub (`Link: rel="next"`), Stripe
//! (`has_more` and `starting_after`), Slack (`response_metadata.next_cursor`), a page-number API
//! and an offset API; then what ends a paging (`while`, an empty next value, `maxPages`, a loop,
//! another origin, a page that fails), its bounds, its cache, and its joined document against the
//! same document answered whole.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::Method;
use recast::config::Config;
use serde_json::{Value, json};

use crate::binary::Binary;
use crate::composition::rules;
use crate::support::{Received, Reply, Service, Upstream, config, get, send};

/// How an upstream pages.
#[derive(Clone, Copy, Debug)]
enum Style {
    GitHub,
    Stripe,
    Slack,
    PageNumber,
    Offset,
}

const STYLES: [Style; 5] = [Style::GitHub, Style::Stripe, Style::Slack, Style::PageNumber, Style::Offset];

/// Items on a page.
const PER_PAGE: usize = 2;

fn query_of(received: &Received) -> HashMap<String, String> {
    url::form_urlencoded::parse(received.uri.query().unwrap_or_default().as_bytes()).into_owned().collect()
}

/// The item `i` (from 0) of a listing.
fn item(i: usize) -> Value {
    json!({"id": format!("it_{i:03}"), "n": i})
}

/// The ids of a listing of `pages` full pages.
fn ids(pages: usize) -> Vec<String> {
    (0..pages * PER_PAGE).map(|i| format!("it_{i:03}")).collect()
}

/// What an upstream that pages in `style` answers to `received`, for a listing of `pages` pages
/// of [`PER_PAGE`] items each, at `base` (its own URL).
fn page_of(style: Style, pages: usize, base: &str, received: &Received) -> Reply {
    let query = query_of(received);
    let total = pages * PER_PAGE;
    let items = |from: usize| -> Vec<Value> { (from..(from + PER_PAGE).min(total)).map(item).collect() };
    match style {
        Style::GitHub => {
            // `?page=N` (from 1), the list itself, and `Link` to the next and last pages.
            let page: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
            let mut reply = Reply::json(&Value::Array(items((page - 1) * PER_PAGE)).to_string());
            let mut links = Vec::new();
            if page < pages {
                links.push(format!("<{base}/repos/o/r/issues?per_page=2&page={}>; rel=\"next\"", page + 1));
            }
            links.push(format!("<{base}/repos/o/r/issues?per_page=2&page={pages}>; rel=\"last\""));
            reply.headers.push(("link", links.join(", ")));
            reply
        }
        Style::Stripe => {
            // `starting_after` an object's id; `has_more`.
            let from = match query.get("starting_after") {
                Some(id) => id.trim_start_matches("it_").parse::<usize>().unwrap() + 1,
                None => 0,
            };
            let data = items(from);
            Reply::json(
                &json!({"object": "list", "url": "/v1/charges", "has_more": from + PER_PAGE < total, "data": data})
                    .to_string(),
            )
        }
        Style::Slack => {
            // An opaque cursor; `""` on the last page.
            let from = match query.get("cursor") {
                Some(cursor) => cursor.trim_start_matches("dXNlcjpV").parse::<usize>().unwrap(),
                None => 0,
            };
            let next =
                if from + PER_PAGE < total { format!("dXNlcjpV{}", from + PER_PAGE) } else { String::new() };
            Reply::json(
                &json!({"ok": true, "channels": items(from), "response_metadata": {"next_cursor": next}})
                    .to_string(),
            )
        }
        Style::PageNumber => {
            let page: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
            Reply::json(
                &json!({"items": items((page - 1) * PER_PAGE), "page": page, "total_pages": pages})
                    .to_string(),
            )
        }
        Style::Offset => {
            let offset: usize = query.get("offset").and_then(|p| p.parse().ok()).unwrap_or(0);
            Reply::json(&json!({"results": items(offset), "count": total, "limit": PER_PAGE}).to_string())
        }
    }
}

/// The source (or `originalRoute`) members that page `style`: its path and `paginate`.
fn paged(style: Style) -> (&'static str, Value) {
    match style {
        Style::GitHub => ("repos/o/r/issues?per_page=2", json!({"items": "@", "next": "link"})),
        Style::Stripe => (
            "v1/charges?limit=2",
            json!({"items": "data", "next": {"query": {"starting_after": "data[-1].id"}}, "while": "has_more"}),
        ),
        Style::Slack => (
            "api/conversations.list?limit=2",
            json!({"items": "channels", "next": {"query": {"cursor": "response_metadata.next_cursor"}}}),
        ),
        Style::PageNumber => (
            "items",
            json!({"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"}),
        ),
        Style::Offset => (
            "items?limit=2",
            json!({"items": "results", "next": {"query": {"offset": "$page * limit"}}, "while": "$page * limit < count"}),
        ),
    }
}

/// An upstream that pages in `style`, `pages` pages long.
async fn upstream(style: Style, pages: usize) -> Upstream {
    let base = Arc::new(std::sync::OnceLock::<String>::new());
    let seen = base.clone();
    let upstream =
        Upstream::start(move |received| page_of(style, pages, seen.get().unwrap(), received)).await;
    base.set(format!("http://{}", upstream.addr)).unwrap();
    upstream
}

fn source(upstream: &Upstream, style: Style) -> Value {
    let (path, paginate) = paged(style);
    json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": path, "paginate": paginate})
}

async fn register(service: &Service, body: &Value) -> (u16, Value) {
    let headers = [("content-type", "application/json")];
    let answer = send(Method::POST, &service.url("/v1/mapping"), &headers, body.to_string()).await;
    (answer.status.as_u16(), serde_json::from_slice(&answer.body).unwrap_or(Value::Null))
}

async fn registered(service: &Service, body: &Value) -> (String, Value) {
    let (status, answer) = register(service, body).await;
    assert_eq!(status, 201, "{answer}");
    (answer["path"].as_str().unwrap().to_owned(), answer)
}

fn body(answer: &crate::support::Answer) -> Value {
    serde_json::from_slice(&answer.body)
        .unwrap_or_else(|_| panic!("{:?}", String::from_utf8_lossy(&answer.body)))
}

/// A composed route of one paged source `orders`, mapping its ids and its `_sources` entry.
fn orders_route(name: &str, source: Value) -> Value {
    json!({
        "path": name,
        "sources": {"orders": source},
        "rulesAsString": rules(&[("ids", "orders[*].id"), ("pages", "_sources.orders.pages"), ("outcome", "_sources.orders.outcome")]),
    })
}

#[tokio::test]
async fn each_style_joins_one_two_and_seven_pages_in_order() {
    let service = Service::start(config()).await;
    for style in STYLES {
        for pages in [1, 2, 7] {
            let upstream = upstream(style, pages).await;
            let (path, registered) =
                registered(&service, &orders_route(&format!("{style:?}-{pages}"), source(&upstream, style)))
                    .await;
            // The registration's live call followed the pages, and says how many.
            assert_eq!(
                registered["sources"]["orders"]["pages"],
                json!(pages),
                "{style:?} {pages}: {registered}"
            );
            assert_eq!(upstream.received().len(), pages, "{style:?} {pages}");
            let answer = get(&service.url(&path)).await;
            assert_eq!(answer.status, 200, "{style:?} {pages}: {:?}", answer.body);
            assert_eq!(
                body(&answer),
                json!({"ids": ids(pages), "pages": pages, "outcome": "ok"}),
                "{style:?} with {pages} pages"
            );
            // One request per page, none more: the last page's next value ended it.
            assert_eq!(upstream.received().len(), 2 * pages, "{style:?} {pages}");
            let timing = answer.header("server-timing").unwrap();
            assert!(timing.contains(&format!("src.orders;desc=\"pages={pages}\";dur=")), "{timing}");
        }
    }
}

#[tokio::test]
async fn a_route_s_own_upstream_and_a_for_each_source_page_too() {
    let service = Service::start(config()).await;
    let github = upstream(Style::GitHub, 3).await;
    let (path, paginate) = paged(Style::GitHub);
    let (route, _) = registered(
        &service,
        &json!({
            "path": "own",
            "originalRoute": {"originalApi": {"baseUrl": github.url("/")}, "path": path, "paginate": paginate},
            "rulesAsString": rules(&[("ids", "[*].id"), ("count", "length(@)")]),
        }),
    )
    .await;
    let answer = get(&service.url(&route)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"ids": ids(3), "count": 6}));
    let timing = answer.header("server-timing").unwrap();
    assert!(
        timing.starts_with("upstream;desc=\"pages=3\";dur=") && timing.contains(", map;dur="),
        "{timing}"
    );
    // Shown as given.
    let uuid = route.split('/').nth(2).unwrap();
    let shown = get(&service.url(&format!("/v1/routes/{uuid}"))).await;
    assert_eq!(
        body(&shown)["originalRoute"]["paginate"],
        json!({"items": "@", "next": "link", "maxPages": 10})
    );
    // *Try it* says how many pages it fetched.
    let tried = send(Method::POST, &service.url(&format!("/v1/routes/{uuid}/try")), &[], "").await;
    assert_eq!(tried.status, 200, "{:?}", tried.body);
    assert_eq!(body(&tried)["pages"], json!({"originalRoute": 3}));
    assert_eq!(body(&tried)["upstream"].as_array().map(Vec::len), Some(6), "the joined document");

    // `forEach`: each element pages on its own (page numbers, per customer).
    let per_customer = Upstream::start(|received| {
        let query = query_of(received);
        let page: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
        let customer = received.uri.path().rsplit('/').next().unwrap().to_owned();
        let pages = if customer == "a" { 3 } else { 1 };
        Reply::json(
            &json!({"items": [format!("{customer}{page}")], "page": page, "total_pages": pages}).to_string(),
        )
    })
    .await;
    let (route, registered) = registered(
        &service,
        &json!({
            "path": "each",
            "sources": {"orders": {
                "originalApi": {"baseUrl": per_customer.url("/")}, "path": "customers/{{$item}}",
                "forEach": "[request.query.c][]", "maxCalls": 4,
                "paginate": {"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"},
            }},
            "sampleRequest": {"query": {"c": "a"}},
            "rulesAsString": rules(&[("orders", "orders"), ("pages", "_sources.orders.pages")]),
        }),
    )
    .await;
    assert_eq!(registered["sources"]["orders"]["pages"], json!(3), "{registered}");
    let answer = get(&service.url(&format!("{route}?c=a&c=b"))).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"orders": [["a1", "a2", "a3"], ["b1"]], "pages": [3, 1]}));
    // Two elements that make the same request share its pages: fetched once, counted once.
    let before = per_customer.received().len();
    let answer = get(&service.url(&format!("{route}?c=a&c=a"))).await;
    assert_eq!(body(&answer), json!({"orders": [["a1", "a2", "a3"], ["a1", "a2", "a3"]], "pages": [3, 3]}));
    assert_eq!(per_customer.received().len() - before, 3);
    let timing = answer.header("server-timing").unwrap();
    assert!(timing.contains("src.orders;desc=\"pages=3\""), "{timing}");
}

#[tokio::test]
async fn while_a_null_or_an_empty_next_value_end_the_paging() {
    let service = Service::start(config()).await;
    // A cursor API whose next cursor is always there, unless `end` (a kind of nothing) at page
    // `at` (both in the source's own query, which every page keeps).
    let cursors = Upstream::start(|received| {
        let query = query_of(received);
        let page: usize = query.get("cursor").map_or(1, |c| c.parse().unwrap());
        let at: usize = query.get("at").and_then(|a| a.parse().ok()).unwrap_or(usize::MAX);
        let next = match query.get("end").map(String::as_str) {
            Some("null") if page == at => Value::Null,
            Some("empty") if page == at => json!(""),
            Some("list") if page == at => json!([]),
            Some("missing") if page == at => {
                return Reply::json(&json!({"data": [page], "page": page}).to_string());
            }
            _ => json!((page + 1).to_string()),
        };
        Reply::json(&json!({"data": [page], "next": next, "page": page}).to_string())
    })
    .await;
    let route = |name: &str, path: &str, paginate: Value| {
        json!({
            "path": name,
            "sources": {"orders": {"originalApi": {"baseUrl": cursors.url("/")}, "path": path, "paginate": paginate}},
            "rulesAsString": rules(&[("orders", "orders"), ("pages", "_sources.orders.pages")]),
        })
    };
    let cursor = json!({"items": "data", "next": {"query": {"cursor": "next"}}});
    // `while` stops it at page 3, though a next cursor is there.
    let mut stopping = cursor.clone();
    stopping["while"] = json!("page < `3`");
    let (path, _) = registered(&service, &route("while", "list", stopping)).await;
    assert_eq!(body(&get(&service.url(&path)).await), json!({"orders": [1, 2, 3], "pages": 3}));
    // A next value that is null, an empty string, an empty list, or missing ends it.
    for (end, at) in [("null", 2), ("empty", 4), ("list", 1), ("missing", 3)] {
        let (path, _) =
            registered(&service, &route(end, &format!("list?end={end}&at={at}"), cursor.clone())).await;
        let answer = get(&service.url(&path)).await;
        assert_eq!(answer.status, 200, "{end}: {:?}", answer.body);
        let pages: Vec<usize> = (1..=at).collect();
        assert_eq!(body(&answer), json!({"orders": pages, "pages": at}), "{end}");
    }
}

#[tokio::test]
async fn more_than_max_pages_fails_the_source_or_stops_with_recast_partial() {
    let service = Service::start(config()).await;
    let seven = upstream(Style::Slack, 7).await;
    let mut source = source(&seven, Style::Slack);
    source["paginate"]["maxPages"] = json!(3);
    let (status, problem) = register(&service, &orders_route("fails", source.clone())).await;
    assert_eq!(status, 502, "{problem}");
    assert_eq!(problem["type"].as_str().unwrap().rsplit('/').next(), Some("template-failed"), "{problem}");
    assert_eq!(problem["source"], json!("orders"), "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("/sources/orders/paginate/maxPages") && detail.contains("more than 3 pages"),
        "{detail}"
    );
    // The fourth page was never asked for.
    assert_eq!(seven.received().len(), 3);

    source["paginate"]["onMaxPages"] = json!("stop");
    let mut route = orders_route("stops", source);
    route["cache"] = json!({"ttlSeconds": 60});
    let (path, _) = registered(&service, &route).await;
    for _ in 0..2 {
        let answer = get(&service.url(&path)).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        assert_eq!(body(&answer), json!({"ids": ids(3), "pages": 3, "outcome": "ok"}));
        assert_eq!(answer.header("recast-partial"), Some("orders;status=max-pages;pages=3"));
    }
    // A partial answer is never cached: each call fetched its three pages.
    assert_eq!(seven.received().len(), 3 + 3 + 6);
}

#[tokio::test]
async fn a_next_url_on_another_origin_fails_without_a_request_there() {
    let service = Service::start(config()).await;
    let elsewhere = Upstream::json(r#"[{"id": "stolen"}]"#).await;
    let target = elsewhere.url("/list?page=2");
    let first =
        Upstream::start(move |_| Reply::json(&json!({"items": [1], "next": target}).to_string())).await;
    let source = json!({"originalApi": {"baseUrl": first.url("/")}, "path": "list",
        "paginate": {"items": "items", "next": {"url": "next"}}});
    let (status, problem) = register(&service, &orders_route("off", source)).await;
    assert_eq!(status, 502, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("/sources/orders/paginate/next/url") && detail.contains("leaves the source's origin"),
        "{detail}"
    );
    assert!(!detail.contains(&elsewhere.addr.port().to_string()), "the URL is not told: {detail}");
    assert_eq!(elsewhere.received().len(), 0);
    assert_eq!(first.received().len(), 1);

    // The same through `Link`, as a route's own upstream.
    let target = elsewhere.url("/list?page=2");
    let linked = Upstream::start(move |_| {
        let mut reply = Reply::json("[1]");
        reply.headers.push(("link", format!("<{target}>; rel=\"next\"")));
        reply
    })
    .await;
    let (status, problem) = register(
        &service,
        &json!({"path": "own-off", "originalRoute": {"originalApi": {"baseUrl": linked.url("/")}, "path": "x",
            "paginate": {"items": "@", "next": "link"}}, "rulesAsString": rules(&[("all", "@")])}),
    )
    .await;
    assert_eq!(status, 502, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("/originalRoute/paginate/next"), "{problem}");
    assert_eq!(elsewhere.received().len(), 0);
}

#[tokio::test]
async fn a_loop_fails_after_one_repeat_at_most() {
    let service = Service::start(config()).await;
    // Its cursor never moves.
    let stuck = Upstream::json(r#"{"data": [1, 2], "next_cursor": "same"}"#).await;
    let source = json!({"originalApi": {"baseUrl": stuck.url("/")}, "path": "list",
        "paginate": {"items": "data", "next": {"query": {"cursor": "next_cursor"}}, "maxPages": 50}});
    let (status, problem) = register(&service, &orders_route("loop", source)).await;
    assert_eq!(status, 502, "{problem}");
    assert!(problem["detail"].as_str().unwrap().contains("loop"), "{problem}");
    // Page 1, page 2 (`cursor=same`); page 3 would have been page 2 again.
    assert_eq!(stuck.received().len(), 2);
    // A relative next URL that points back at the first page.
    let back = Upstream::json(r#"{"data": [1], "next": "/list"}"#).await;
    let source = json!({"originalApi": {"baseUrl": back.url("/")}, "path": "list",
        "paginate": {"items": "data", "next": {"url": "next"}}});
    let (status, _) = register(&service, &orders_route("loop-url", source)).await;
    assert_eq!(status, 502);
    assert_eq!(back.received().len(), 1);
}

#[tokio::test]
async fn a_page_whose_items_are_not_a_list_fails() {
    let service = Service::start(config()).await;
    let odd = Upstream::start(|received| {
        if query_of(received).contains_key("page") {
            Reply::json(r#"{"items": {"id": "x"}, "more": true}"#)
        } else {
            Reply::json(r#"{"items": [{"id": "a"}], "more": true}"#)
        }
    })
    .await;
    let source = json!({"originalApi": {"baseUrl": odd.url("/")}, "path": "list",
        "paginate": {"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "more"}});
    let (status, problem) = register(&service, &orders_route("odd", source)).await;
    assert_eq!(status, 502, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("/sources/orders/paginate/items") && detail.contains("page 2's items are an object"),
        "{detail}"
    );
}

#[tokio::test]
async fn a_page_that_fails_midway_fails_a_required_source_and_nulls_an_optional_one() {
    let service = Service::start(config()).await;
    let failing = Arc::new(AtomicUsize::new(1));
    let fails = failing.clone();
    let broken = Upstream::start(move |received| {
        let page: usize = query_of(received).get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
        if page == 3 && fails.load(Ordering::SeqCst) == 1 {
            return Reply::with(500, r#"{"error": "boom"}"#);
        }
        Reply::json(&json!({"items": [page], "page": page, "total_pages": 5}).to_string())
    })
    .await;
    let paging =
        json!({"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"});
    // Registered while the upstream is healthy.
    failing.store(0, Ordering::SeqCst);
    let required = json!({"originalApi": {"baseUrl": broken.url("/")}, "path": "list", "paginate": paging});
    let (path, _) = registered(&service, &orders_route("required", required.clone())).await;
    let mut optional = required;
    optional["optional"] = json!(true);
    let (optional_path, _) = registered(&service, &orders_route("optional", optional)).await;
    failing.store(1, Ordering::SeqCst);

    let answer = get(&service.url(&path)).await;
    let problem = answer.assert_problem(502, "upstream-error");
    assert_eq!(problem.get("source").and_then(|s| s.as_str()), Some("orders"), "{problem}");
    let answer = get(&service.url(&optional_path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"ids": null, "pages": 2, "outcome": "failed"}));
    assert_eq!(answer.header("recast-partial"), Some("orders;status=500"));
}

#[tokio::test]
async fn a_retry_of_one_page_sends_that_page_again_not_the_first() {
    let service = Service::start(config()).await;
    let tries = Arc::new(AtomicUsize::new(0));
    let seen = tries.clone();
    let flaky = Upstream::start(move |received| {
        let page: usize = query_of(received).get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
        // Page 2 fails the first time it is asked for.
        if page == 2 && seen.fetch_add(1, Ordering::SeqCst) == 0 {
            return Reply::with(503, "{}");
        }
        Reply::json(&json!({"items": [page], "page": page, "total_pages": 3}).to_string())
    })
    .await;
    let source = json!({"originalApi": {"baseUrl": flaky.url("/")}, "path": "list",
        "retry": {"attempts": 1, "on": [503]},
        "paginate": {"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"}});
    let (_, registered) = registered(&service, &orders_route("retry", source)).await;
    assert_eq!(registered["sources"]["orders"]["pages"], json!(3), "{registered}");
    let asked: Vec<String> = flaky.received().iter().map(|r| r.uri.to_string()).collect();
    assert_eq!(asked, ["/list", "/list?page=2", "/list?page=2", "/list?page=3"]);
}

#[tokio::test]
async fn a_paged_call_s_requests_count_against_max_source_calls_at_registration() {
    let service = Service::start(Config { max_source_calls: 20, ..config() }).await;
    let upstream = upstream(Style::Slack, 2).await;
    let mut source = source(&upstream, Style::Slack);
    source["paginate"]["maxPages"] = json!(11);
    source["retry"] = json!({"attempts": 1, "on": [503]});
    let (status, problem) = register(&service, &orders_route("many", source.clone())).await;
    assert_eq!(status, 400, "{problem}");
    assert!(problem.to_string().contains("22 requests"), "{problem}");
    source["paginate"]["maxPages"] = json!(10);
    assert_eq!(register(&service, &orders_route("enough", source)).await.0, 201);
}

#[tokio::test]
async fn the_deadline_ends_a_slow_paging() {
    let service = Service::start(Config { upstream_timeout_ms: 600, ..config() }).await;
    let slow = Upstream::start(|received| {
        let page: usize = query_of(received).get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
        Reply {
            delay: Duration::from_millis(if page == 1 { 0 } else { 250 }),
            ..Reply::json(&json!({"items": [page], "page": page, "total_pages": 7}).to_string())
        }
    })
    .await;
    let source = json!({"originalApi": {"baseUrl": slow.url("/")}, "path": "list",
        "paginate": {"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"}});
    let (path, _) = {
        // Registered with a first page only (7 pages take longer than the deadline).
        let mut quick = source.clone();
        quick["paginate"]["maxPages"] = json!(1);
        quick["paginate"]["onMaxPages"] = json!("stop");
        registered(&service, &orders_route("slow", quick)).await
    };
    let uuid = path.split('/').nth(2).unwrap().to_owned();
    let update =
        json!({"path": "slow", "sources": {"orders": source}, "rulesAsString": rules(&[("ids", "orders")])});
    // The update's live call pages too, and meets the deadline.
    let answer = send(
        Method::PUT,
        &service.url(&format!("/v1/routes/{uuid}")),
        &[("content-type", "application/json")],
        update.to_string(),
    )
    .await;
    assert_eq!(answer.status, 504, "{:?}", String::from_utf8_lossy(&answer.body));
    let started = Instant::now();
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "the stored route still stops at one page");
    assert!(started.elapsed() < Duration::from_millis(600));
    // An optional source's own bound ends its paging: `null`, `timeout`, and the pages it had.
    let mut bounded = source;
    bounded["optional"] = json!(true);
    bounded["timeoutMs"] = json!(400);
    let (path, _) = {
        let mut quick = bounded.clone();
        quick["paginate"]["maxPages"] = json!(1);
        quick["paginate"]["onMaxPages"] = json!("stop");
        registered(&service, &orders_route("bounded", quick)).await
    };
    let uuid = path.split('/').nth(2).unwrap().to_owned();
    let mut stored = orders_route("bounded", bounded);
    stored["sources"]["orders"]["paginate"]["maxPages"] = json!(7);
    let answer = send(
        Method::PUT,
        &service.url(&format!("/v1/routes/{uuid}")),
        &[("content-type", "application/json")],
        stored.to_string(),
    )
    .await;
    assert_eq!(
        answer.status,
        200,
        "an optional source's timeout is a warning: {:?}",
        String::from_utf8_lossy(&answer.body)
    );
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(body(&answer), json!({"ids": null, "pages": 2, "outcome": "timeout"}));
    assert_eq!(answer.header("recast-partial"), Some("orders;status=timeout"));
}

#[tokio::test]
async fn the_cache_of_a_paged_route_holds_the_joined_answer() {
    let service = Service::start(config()).await;
    let github = upstream(Style::GitHub, 4).await;
    let mut route = orders_route("cached", source(&github, Style::GitHub));
    route["cache"] = json!({"ttlSeconds": 60});
    let (path, _) = registered(&service, &route).await;
    let first = get(&service.url(&path)).await;
    let again = get(&service.url(&path)).await;
    assert_eq!(body(&first), json!({"ids": ids(4), "pages": 4, "outcome": "ok"}));
    assert_eq!(first.body, again.body);
    assert!(again.header("cache-status").unwrap().contains("hit"), "{:?}", again.header("cache-status"));
    // The registration's four pages and the first call's: the hit sent nothing.
    assert_eq!(github.received().len(), 8);

    // A route's own paged upstream whose third page may not be kept (`private`) is never kept.
    let private = Upstream::start(|received| {
        let page: usize = query_of(received).get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
        let mut reply = Reply::json(&json!({"items": [page], "page": page, "total_pages": 3}).to_string());
        reply.headers.push(("cache-control", if page == 3 { "private" } else { "max-age=600" }.to_owned()));
        reply
    })
    .await;
    let (path, _) = registered(
        &service,
        &json!({
            "path": "private",
            "originalRoute": {"originalApi": {"baseUrl": private.url("/")}, "path": "list",
                "paginate": {"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"}},
            "cache": {"ttlSeconds": 60},
            "rulesAsString": rules(&[("all", "@")]),
        }),
    )
    .await;
    for _ in 0..2 {
        let answer = get(&service.url(&path)).await;
        assert_eq!(body(&answer), json!({"all": [1, 2, 3]}));
        assert!(!answer.header("cache-status").unwrap_or_default().contains("hit"));
    }
    assert_eq!(private.received().len(), 3 * 3, "the registration's pages and each call's");
}

/// The joined document of a paged route maps as the same document answered whole: rules of
/// every kind (`each`, paths, expressions, types) over seven pages and over one.
#[tokio::test]
async fn a_joined_document_maps_as_the_whole_document_does() {
    let service = Service::start(config()).await;
    let whole: Vec<Value> = (0..14)
        .map(|i| json!({"id": format!("o{i}"), "total": i * 10 + 5, "customer": {"name": format!("c{}", i % 3)}, "tags": ["a", i.to_string()], "note": if i % 4 == 0 { Value::Null } else { json!("n") }}))
        .collect();
    let text = Value::Array(whole.clone()).to_string();
    let whole_upstream = Upstream::start(move |_| Reply::json(&text)).await;
    let pages = whole.clone();
    let paged_upstream = Upstream::start(move |received| {
        let page: usize = query_of(received).get("page").and_then(|p| p.parse().ok()).unwrap_or(1);
        let slice: Vec<Value> = pages.iter().skip((page - 1) * 2).take(2).cloned().collect();
        Reply::json(&json!({"items": slice, "page": page, "total_pages": 7}).to_string())
    })
    .await;
    let paginate =
        json!({"items": "items", "next": {"query": {"page": "$page + `1`"}}, "while": "page < total_pages"});
    let rule_sets = [
        json!({"each": "@", "newBodyFields": {"id": {"key": "id", "type": "String"}, "total": {"key": "total", "type": "Int"}, "who": {"key": "who", "type": "String"}},
               "oldBodyFields": {"id": {"keys": ["id"]}, "total": {"keys": ["total"]}, "who": {"keys": ["name"], "parents": ["customer"]}}}),
        rules(&[
            ("sum", "sum([*].total)"),
            ("names", "[*].customer.name | sort(@)"),
            ("first", "[0]"),
            ("with_notes", "length([?note])"),
            ("by", "max_by(@, &total).id"),
        ]),
        json!({"newBodyFields": {"tag": {"key": "tag", "type": "String"}, "empty": {"key": "empty", "type": "String"}},
               "oldBodyFields": {"tag": {"expr": "join(',', [*].tags[1])"}, "empty": {"expr": "[?total > `1000`].id | [0]"}}}),
    ];
    for (n, rules) in rule_sets.iter().enumerate() {
        let (whole_path, _) = registered(
            &service,
            &json!({"path": format!("whole{n}"), "originalRoute": {"originalApi": {"baseUrl": whole_upstream.url("/")}, "path": "all"}, "rulesAsString": rules}),
        )
        .await;
        let (paged_path, _) = registered(
            &service,
            &json!({"path": format!("paged{n}"), "originalRoute": {"originalApi": {"baseUrl": paged_upstream.url("/")}, "path": "all", "paginate": paginate}, "rulesAsString": rules}),
        )
        .await;
        let (whole, paged) = (get(&service.url(&whole_path)).await, get(&service.url(&paged_path)).await);
        assert_eq!(whole.status, 200, "{:?}", whole.body);
        assert_eq!(paged.status, whole.status);
        assert_eq!(String::from_utf8_lossy(&paged.body), String::from_utf8_lossy(&whole.body), "rules {n}");
    }
}

/// A hundred pages of 1 MB against `RECAST_MAX_COMPOSED_BYTES` of 16 MB: the call ends with
/// `mapping-limit` at the seventeenth page, and the process never held many pages at once.
#[tokio::test]
async fn a_hundred_pages_of_a_megabyte_end_at_the_composed_bound() {
    let page = {
        let items: Vec<String> =
            (0..10_000).map(|i| format!(r#"{{"id":{i},"pad":"{}"}}"#, "x".repeat(80))).collect();
        Arc::new(format!(r#"{{"items":[{}]}}"#, items.join(",")))
    };
    assert!(page.len() > 900_000 && page.len() < 1_100_000, "{}", page.len());
    let served = page.clone();
    let big = Upstream::start(move |_| Reply::json(&served)).await;
    let dir = tempfile::TempDir::new().unwrap();
    let binary = Binary::start_with(
        dir.path(),
        &[
            ("RECAST_MAX_COMPOSED_BYTES", "16777216"),
            ("RECAST_MAX_SOURCE_CALLS", "100"),
            ("RECAST_MAX_UPSTREAM_BYTES", "2097152"),
        ],
    )
    .await;
    let route = json!({
        "path": "big",
        "sources": {"orders": {"originalApi": {"baseUrl": big.url("/")}, "path": "list",
            "paginate": {"items": "items", "next": {"query": {"page": "$page + `1`"}}, "maxPages": 100}}},
        "rulesAsString": rules(&[("n", "length(orders)")]),
    });
    let before = binary.peak_memory();
    let answer = send(
        Method::POST,
        &binary.url("/v1/mapping"),
        &[("content-type", "application/json")],
        route.to_string(),
    )
    .await;
    let problem = answer.assert_problem(502, "mapping-limit");
    assert!(problem.to_string().contains("RECAST_MAX_COMPOSED_BYTES"), "{problem}");
    let passing = 16_777_216 / page.len() + 1;
    assert_eq!(big.received().len(), passing, "the page that passed the bound was the last asked for");
    let grown = binary.peak_memory().saturating_sub(before);
    // The items kept (at most 16 MB, in a list grown by doubling, whose move holds it twice for
    // a moment), a page and its parse: a few times the bound, not a hundred pages.
    assert!(grown < 64 << 20, "the peak grew by {grown} bytes");
}
