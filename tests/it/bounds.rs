//! The bounds of one mapping (SPEC §1.8, §5; `docs/behaviour.md`), tried as anyone can try them:
//! previews, which need no admin token, and route calls. Values built by expressions are
//! charged what writing them out takes (`RECAST_MAX_EXPR_BYTES`), the answer is bounded
//! (`RECAST_MAX_RESPONSE_BYTES`), and so is the work (`RECAST_MAX_MAPPING_STEPS`); the real
//! binary's memory is watched where memory is the point.

use std::time::{Duration, Instant};

use http::Method;
use recast::config::Config;

use crate::binary::Binary;
use crate::support::{Answer, Json, Reply, Service, Upstream, config, post_json, send};

/// A preview body: `sample` mapped by one target `v` of type `ty` read by `expr`.
fn preview(sample: &str, expr: &str, ty: &str) -> String {
    let expr = serde_json::to_string(expr).expect("a string");
    format!(
        r#"{{"originalResponse":{sample},"mappingRules":{{"newBodyFields":{{"v":{{"key":"v","type":"{ty}"}}}},"oldBodyFields":{{"v":{{"expr":{expr}}}}}}}}}"#
    )
}

/// `{"xs": [0, 1, ..., n - 1]}`.
fn numbers(n: usize) -> String {
    let xs: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!(r#"{{"xs":[{}]}}"#, xs.join(","))
}

/// `xs | [@, @] | [@, @] | ...`, `times` doublings: the review's expression.
fn doubling(times: usize) -> String {
    format!("xs{}", " | [@, @]".repeat(times))
}

/// The problem's `detail`, which names the bound passed.
fn detail(answer: &Answer) -> String {
    answer.json().get("detail").and_then(Json::as_str).unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_preview_that_doubled_a_list_stops_at_once_within_a_few_times_the_budget() {
    let dir = tempfile::TempDir::new().unwrap();
    let binary = Binary::start(dir.path()).await;
    let sample = numbers(20_000);
    // Warm: the first preview grows the worker's scratch.
    let warm = post_json(&binary.url("/v1/preview"), preview(&sample, "length(xs)", "Int")).await;
    assert_eq!(&warm.body[..], br#"{"v":20000}"#);
    let before = binary.peak_memory();
    // Written as a value, in a trace, compared, made text, searched: each walks the whole
    // expanded value, which doubles at every step.
    let doubled = doubling(30);
    let cases = [
        (doubled.clone(), "Json", ""),
        (doubled.clone(), "Json", "?trace=true"),
        (format!("{doubled} | @ == @"), "Boolean", ""),
        (format!("let $a = {doubled} in $a == [$a][0]"), "Boolean", ""),
        (format!("{doubled} | to_string(@)"), "String", ""),
        (format!("{doubled} | contains(@, `-1`)"), "Boolean", ""),
        (format!("{doubled} | length(@)"), "Int", ""),
    ];
    for (expr, ty, query) in cases {
        let started = Instant::now();
        let answer =
            post_json(&binary.url(&format!("/v1/preview{query}")), preview(&sample, &expr, ty)).await;
        let took = started.elapsed();
        answer.assert_problem(422, "mapping-limit");
        assert!(detail(&answer).contains("67108864 bytes (RECAST_MAX_EXPR_BYTES)"), "{}", detail(&answer));
        // Stopped at the first doubling past the budget: no seconds of work (the review saw the
        // process spin until it was killed).
        assert!(took < Duration::from_secs(2), "{expr}: {took:?}");
    }
    let grown = binary.peak_memory().saturating_sub(before);
    // The values are charged in full but held as references: the process grows by a small part
    // of the 64 MiB budget (the review saw 16 GB).
    assert!(grown < 64 << 20, "the peak grew by {grown} bytes");
    // The same expression, stopped before the budget, answers: eight copies of the list.
    let answer = post_json(&binary.url("/v1/preview"), preview(&sample, &doubling(3), "Json")).await;
    assert_eq!(answer.status, 200);
    let json = answer.json();
    let value = json.get("v").expect("a value");
    let copies: Vec<&Json> =
        value.as_array().iter().flat_map(Json::as_array).flat_map(Json::as_array).collect();
    assert_eq!(copies.len(), 8);
    assert!(copies.iter().all(|copy| copy.as_array().len() == 20_000));
}

#[tokio::test]
async fn functions_whose_text_is_a_product_of_their_inputs_are_charged_before_they_make_it() {
    let dir = tempfile::TempDir::new().unwrap();
    let binary = Binary::start_with(dir.path(), &[("RECAST_MAX_EXPR_BYTES", "1048576")]).await;
    let long = "x".repeat(20_000);
    let sample = format!(r#"{{"s":"{long}","n":[{}]}}"#, vec!["\"ab\""; 20_000].join(","));
    let warm = post_json(&binary.url("/v1/preview"), preview(&sample, "length(s)", "Int")).await;
    assert_eq!(&warm.body[..], br#"{"v":20000}"#);
    let before = binary.peak_memory();
    for expr in [
        "replace(s, '', s)",
        "replace(s, 'x', s)",
        "regex_replace(s, 'x*?', s)",
        "regex_replace(s, 'x', '$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0$0')",
        "join(s, n)",
        "pad_left(s, `100000000`)",
        "pad_right(s, `9223372036854775807`, 'é')",
        "to_string([s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s])",
    ] {
        let answer = post_json(&binary.url("/v1/preview"), preview(&sample, expr, "String")).await;
        answer.assert_problem(422, "mapping-limit");
        assert!(
            detail(&answer).contains("1048576 bytes (RECAST_MAX_EXPR_BYTES)"),
            "{expr}: {}",
            detail(&answer)
        );
    }
    let grown = binary.peak_memory().saturating_sub(before);
    // The review saw `replace(s, '', t)` of 20 KB take the peak from 28 MB to 195 MB before its
    // 422: each of these would make 400 MB or more. What the process grows by here is its own:
    // each worker's scratch, its allocator's caches, the pattern engine's caches for each
    // pattern (a few MiB per call, about 18 MiB in all with the release binary).
    assert!(grown < 64 << 20, "the peak grew by {grown} bytes");
}

#[tokio::test]
async fn work_past_the_step_budget_stops_the_mapping_with_mapping_limit() {
    let service = Service::start(config()).await;
    // `ys` is `xs` but for its last element.
    let xs: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    let sample = format!(r#"{{"xs":[{}],"ys":[{},-1]}}"#, xs.join(","), xs[..19_999].join(","));
    // Each is a few hundred million comparisons or more: seconds of one core without a budget.
    for (expr, ty) in [
        ("length(xs[?contains($.xs, @)])", "Int"),
        ("length(map(&sort_by($.ys, &@), xs))", "Int"),
        ("length(xs[?$.xs == $.ys])", "Int"),
        ("length(map(&$.xs[-1], xs))", "Int"),
    ] {
        let answer = post_json(&service.url("/v1/preview"), preview(&sample, expr, ty)).await;
        answer.assert_problem(422, "mapping-limit");
        assert!(
            detail(&answer).contains("4000000 steps (RECAST_MAX_MAPPING_STEPS)"),
            "{expr}: {}",
            detail(&answer)
        );
    }
    // Work within the budget answers.
    let answer =
        post_json(&service.url("/v1/preview"), preview(&sample, "length(sort_by(xs, &@))", "Int")).await;
    assert_eq!(&answer.body[..], br#"{"v":20000}"#);
    service.stop().await;
}

#[tokio::test]
async fn an_answer_past_its_bound_is_not_written_with_or_without_expressions() {
    let service = Service::start(Config { max_response_bytes: 1 << 20, ..config() }).await;
    let long = "y".repeat(100_000);
    let sample = format!(r#"{{"s":"{long}"}}"#);
    // Twenty targets that read the same 100 KB string by `keys`: 2 MB of answer.
    let targets: Vec<String> =
        (0..20).map(|i| format!(r#""t{i}":{{"key":"t{i}","type":"String"}}"#)).collect();
    let sources: Vec<String> = (0..20).map(|i| format!(r#""t{i}":{{"keys":["s"]}}"#)).collect();
    let body = format!(
        r#"{{"originalResponse":{sample},"mappingRules":{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}}}"#,
        targets.join(","),
        sources.join(",")
    );
    let answer = post_json(&service.url("/v1/preview"), body.clone()).await;
    answer.assert_problem(422, "mapping-limit");
    assert!(detail(&answer).contains("1048576 bytes (RECAST_MAX_RESPONSE_BYTES)"), "{}", detail(&answer));
    // An expression's value is measured before it is written.
    let answer =
        post_json(&service.url("/v1/preview"), preview(&sample, "[s, s, s, s, s, s, s, s, s, s, s]", "Json"))
            .await;
    answer.assert_problem(422, "mapping-limit");
    assert!(detail(&answer).contains("(RECAST_MAX_RESPONSE_BYTES)"), "{}", detail(&answer));
    // A trace repeats the values it describes: the whole answer is bounded.
    let half = format!(r#"{{"s":"{}"}}"#, "y".repeat(600_000));
    let answer = post_json(&service.url("/v1/preview"), preview(&half, "s", "String")).await;
    assert_eq!(answer.status, 200);
    let answer = post_json(&service.url("/v1/preview?trace=true"), preview(&half, "s", "String")).await;
    answer.assert_problem(422, "mapping-limit");

    service.stop().await;

    // A route: 502 `mapping-limit`. Its live call maps a short text; later calls get 100 KB.
    let service = Service::start(Config { max_response_bytes: 300_000, ..config() }).await;
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let upstream = Upstream::start(move |_| {
        let first = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        Reply::json(&if first {
            r#"{"s":"short"}"#.to_owned()
        } else {
            format!(r#"{{"s":"{}"}}"#, "y".repeat(100_000))
        })
    })
    .await;
    let rules = serde_json::to_string(&format!(
        r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
        targets[..5].join(","),
        sources[..5].join(",")
    ))
    .unwrap();
    let registration = format!(
        r#"{{"path":"big","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"s"}},"rulesAsString":{rules}}}"#,
        upstream.url("/")
    );
    let registered = post_json(&service.url("/v1/mapping"), registration).await;
    assert_eq!(registered.status, 201, "{}", String::from_utf8_lossy(&registered.body));
    let uuid = registered.json().get("uuid").and_then(Json::as_str).unwrap().to_owned();
    let answer = send(Method::GET, &service.url(&format!("/v1/{uuid}/big")), &[], "").await;
    answer.assert_problem(502, "mapping-limit");
    assert!(detail(&answer).contains("300000 bytes (RECAST_MAX_RESPONSE_BYTES)"), "{}", detail(&answer));
    service.stop().await;
}

#[tokio::test]
async fn a_slice_step_far_beyond_the_list_is_no_error() {
    let service = Service::start(config()).await;
    for (expr, want) in [
        ("xs[1::9223372036854775807]", "[1]"),
        ("xs[-1::-9223372036854775807]", "[3]"),
        ("xs[-9223372036854775807:9223372036854775807:4611686018427387904]", "[0]"),
        ("s[1::9223372036854775807]", "\"b\""),
        ("s[::-9223372036854775807]", "\"d\""),
    ] {
        let answer =
            post_json(&service.url("/v1/preview"), preview(r#"{"xs":[0,1,2,3],"s":"abcd"}"#, expr, "Json"))
                .await;
        assert_eq!(String::from_utf8_lossy(&answer.body), format!(r#"{{"v":{want}}}"#), "{expr}");
    }
    service.stop().await;
}

#[tokio::test]
async fn objects_of_many_members_are_built_and_compared_in_linear_work() {
    let service = Service::start(config()).await;
    // 40,000 pairs in one preview (the review saw this take 1.64 s): searched member by member,
    // about 800 million comparisons, each a step, which the step budget would stop; through a
    // hash of the names, 40,000 lookups.
    let pairs = |n: usize| {
        let pairs: Vec<String> = (0..n).map(|i| format!(r#"["k{i}",{i}]"#)).collect();
        format!(r#"{{"p":[{}]}}"#, pairs.join(","))
    };
    let (large, smaller) = (pairs(40_000), pairs(12_000));
    for (sample, expr, want) in [
        (&large, "length(keys(from_items(p)))", "40000"),
        (&large, "length(keys(group_by(p, &[0])))", "40000"),
        // Two objects built, then a third from both, or compared: three times the work.
        (&smaller, "length(keys(merge(from_items(p), from_items(p))))", "12000"),
        (&smaller, "from_items(p) == from_items(reverse(p))", "true"),
    ] {
        let answer = post_json(&service.url("/v1/preview"), preview(sample, expr, "Json")).await;
        assert_eq!(String::from_utf8_lossy(&answer.body), format!(r#"{{"v":{want}}}"#), "{expr}");
    }
    service.stop().await;
}

#[tokio::test]
async fn sigterm_ends_the_process_within_the_grace_period_while_a_mapping_runs() {
    let dir = tempfile::TempDir::new().unwrap();
    // A budget of steps far beyond what the preview below takes: it runs for many seconds.
    let mut binary = Binary::start_with(
        dir.path(),
        &[("RECAST_MAX_MAPPING_STEPS", "1000000000000000"), ("RECAST_SHUTDOWN_GRACE_MS", "500")],
    )
    .await;
    let url = binary.url("/v1/preview");
    let body = preview(&numbers(50_000), "length(xs[?contains($.xs, @)])", "Int");
    let running = tokio::spawn(async move { crate::support::try_send(Method::POST, &url, &[], body).await });
    // The preview is read and mapping by then.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!running.is_finished(), "the preview is still running");
    let started = Instant::now();
    let status = binary.terminate();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2_500), "the process exited {took:?} after SIGTERM");
    assert!(status.success(), "{status}");
    let log = binary.log_text();
    assert!(log.contains("grace period over"), "{log}");
    running.abort();
}

/// A preview of `sample` by the rules `rules` (a JSON object's text).
fn preview_of(sample: &str, rules: &str) -> String {
    format!(r#"{{"originalResponse":{sample},"mappingRules":{rules}}}"#)
}

#[tokio::test]
async fn what_the_rules_themselves_read_and_write_is_bounded_like_expressions() {
    let service = Service::start(Config { max_response_bytes: 1 << 20, ..config() }).await;
    let url = service.url("/v1/preview");
    let long = format!(r#"{{"b":"{}","blank":"{}"}}"#, "y".repeat(100_000), " ".repeat(200_000));
    let one = |keys: &str, ignore: bool| {
        format!(
            r#"{{"ignoreEmptyValues":{ignore},"newBodyFields":{{"t":{{"key":"t","type":"String"}}}},"oldBodyFields":{{"t":{{"keys":[{keys}]}}}}}}"#
        )
    };
    // One target naming the same 100 KB text 1,500 times, as entries or as the parts of one
    // concatenation: 150 MB of answer from a single op, stopped as it passes the bound.
    let entries = vec![r#""b""#; 1500].join(",");
    let parts = format!(r#""{}""#, vec!["b"; 1500].join(", "));
    for keys in [&entries, &parts] {
        let answer = post_json(&url, preview_of(&long, &one(keys, false))).await;
        answer.assert_problem(422, "mapping-limit");
        assert!(detail(&answer).contains("(RECAST_MAX_RESPONSE_BYTES)"), "{}", detail(&answer));
    }
    // Left out when blank, 20,000 times: nothing is written, but each time 200 KB are read.
    let blanks = vec![r#""blank""#; 20_000].join(",");
    let answer = post_json(&url, preview_of(&long, &one(&blanks, true))).await;
    answer.assert_problem(422, "mapping-limit");
    assert!(detail(&answer).contains("(RECAST_MAX_MAPPING_STEPS)"), "{}", detail(&answer));
    // An index of a plain path passes the elements before it: 300 targets each reading one of
    // the last 300 of 20,000.
    let sample = numbers(20_000);
    let targets: Vec<String> = (0..300).map(|i| format!(r#""t{i}":{{"key":"t{i}","type":"Int"}}"#)).collect();
    let sources: Vec<String> =
        (0..300).map(|i| format!(r#""t{i}":{{"expr":"xs[{}]"}}"#, 19_999 - i)).collect();
    let rules =
        format!(r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#, targets.join(","), sources.join(","));
    let answer = post_json(&url, preview_of(&sample, &rules)).await;
    answer.assert_problem(422, "mapping-limit");
    assert!(detail(&answer).contains("(RECAST_MAX_MAPPING_STEPS)"), "{}", detail(&answer));
    // Within the bounds, the same rules answer.
    let answer = post_json(&url, preview_of(&long, &one(r#""b", "b""#, false))).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json().get("t").map(|t| t.as_array().len()), Some(2));
    service.stop().await;
    // Under the default bounds, writing hundreds of times what the document holds stops at the
    // step budget (about 16 MiB past the document), well before the answer's 64 MiB.
    let service = Service::start(config()).await;
    let answer = post_json(&service.url("/v1/preview"), preview_of(&long, &one(&entries, false))).await;
    answer.assert_problem(422, "mapping-limit");
    assert!(detail(&answer).contains("(RECAST_MAX_MAPPING_STEPS)"), "{}", detail(&answer));
    service.stop().await;
}

#[tokio::test]
async fn a_trace_is_bounded_like_the_answer_it_is_part_of() {
    let service = Service::start(config()).await;
    // A 100 KB member name, and a target that names 5,000 members below it: each explained
    // by a walk from the root and a pointer that holds the long name.
    let name = "n".repeat(100_000);
    let sample = format!(r#"{{"{name}":{{"x":1}}}}"#);
    let keys = vec![r#""x""#; 5000].join(",");
    let rules = format!(
        r#"{{"newBodyFields":{{"t":{{"key":"t","type":"Int"}}}},"oldBodyFields":{{"t":{{"parents":["{name}"],"keys":[{keys}]}}}}}}"#
    );
    let answer = post_json(&service.url("/v1/preview"), preview_of(&sample, &rules)).await;
    assert_eq!(answer.status, 200);
    let answer = post_json(&service.url("/v1/preview?trace=true"), preview_of(&sample, &rules)).await;
    answer.assert_problem(422, "mapping-limit");
    assert!(detail(&answer).contains("(RECAST_MAX_MAPPING_STEPS)"), "{}", detail(&answer));
    // A trace within its bounds tells how many were found.
    let few = format!(
        r#"{{"newBodyFields":{{"t":{{"key":"t","type":"Int"}}}},"oldBodyFields":{{"t":{{"parents":["{name}"],"keys":["x","y"]}}}}}}"#
    );
    let answer = post_json(&service.url("/v1/preview?trace=true"), preview_of(&sample, &few)).await;
    assert_eq!(answer.status, 200);
    let traced = answer.json();
    let trace = traced.get("trace").expect("a trace").as_array();
    let note = trace[0].get("note").and_then(Json::as_str).unwrap_or_default().to_owned();
    assert!(note.starts_with("found 1 of 2 fields; first missing:"), "{note}");
    service.stop().await;
}

#[tokio::test]
async fn patterns_are_bounded_in_number_and_paid_for_by_what_a_search_may_read() {
    let service = Service::start(config()).await;
    let url = service.url("/v1/preview");
    // Thirty-three distinct patterns in one document: refused at compile time.
    let targets: Vec<String> =
        (0..33).map(|i| format!(r#""t{i}":{{"key":"t{i}","type":"Boolean"}}"#)).collect();
    let sources: Vec<String> =
        (0..33).map(|i| format!(r#""t{i}":{{"expr":"regex_match(s, 'a{{{i}}}')"}}"#)).collect();
    let rules =
        format!(r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#, targets.join(","), sources.join(","));
    let answer = post_json(&url, preview_of(r#"{"s":"a"}"#, &rules)).await;
    assert_eq!(answer.status, 400, "{}", String::from_utf8_lossy(&answer.body));
    assert!(String::from_utf8_lossy(&answer.body).contains("at most 32 distinct patterns"));
    // The same pattern many times is compiled once and is no problem.
    let sources: Vec<String> =
        (0..33).map(|i| format!(r#""t{i}":{{"expr":"regex_match(s, 'a+')"}}"#)).collect();
    let rules =
        format!(r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#, targets.join(","), sources.join(","));
    let answer = post_json(&url, preview_of(r#"{"s":"a"}"#, &rules)).await;
    assert_eq!(answer.status, 200);
    // Each search of a pattern that can match any length may read to the end of the text: the
    // regex crate's own example of quadratic iteration (200,000 searches of up to 200 KB here,
    // hours of this test's unoptimised build) stops at its budget.
    let sample = format!(r#"{{"s":"{}","xs":[{}]}}"#, "A".repeat(200_000), vec!["\"a\""; 20_000].join(","));
    let answer = post_json(&url, preview(&sample, "regex_replace(s, '.*[^A-Z]|[A-Z]', '')", "String")).await;
    answer.assert_problem(422, "mapping-limit");
    assert!(detail(&answer).contains("(RECAST_MAX_MAPPING_STEPS)"), "{}", detail(&answer));
    // A needle longer than the text is paid for by its length (its searcher is made from it).
    let answer = post_json(&url, preview(&sample, "length(xs[?replace(@, $.s, '') == 'a'])", "Int")).await;
    answer.assert_problem(422, "mapping-limit");
    // A bounded pattern is paid for once per text.
    let answer = post_json(&url, preview(&sample, "length(regex_replace(s, 'A{1,3}', 'b'))", "Int")).await;
    assert_eq!(&answer.body[..], br#"{"v":66667}"#);
    service.stop().await;
}

/// A rules document of `n` sources, each `expr` one of `exprs(i)`, and a target for each.
fn rules_of(n: usize, expr: impl Fn(usize) -> String) -> String {
    let targets: Vec<String> = (0..n).map(|i| format!(r#""t{i}":{{"key":"t{i}","type":"Json"}}"#)).collect();
    let sources: Vec<String> = (0..n)
        .map(|i| format!(r#""t{i}":{{"expr":{}}}"#, serde_json::to_string(&expr(i)).unwrap()))
        .collect();
    format!(r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#, targets.join(","), sources.join(","))
}

/// What a preview's rules cost to compile is bounded whatever they hold, and it is paid off the
/// workers that serve connections: a thousand patterns that fail the size limit are one failed
/// compile (every distinct pattern tried counts, and none is compiled after one fails), four
/// such previews at once leave `/healthz` answering, and the documents that used to grow
/// quadratically (a long rule id with many bad keys, a long expression of lint warnings, deep
/// `parents` over many names, names made to collide in a scan's table) stay small and quick.
#[tokio::test]
async fn compiling_a_preview_costs_a_bounded_share_of_the_process_off_its_workers() {
    let dir = tempfile::TempDir::new().unwrap();
    let binary = std::sync::Arc::new(Binary::start_with(dir.path(), &[("RECAST_WORKERS", "2")]).await);
    let url = binary.url("/v1/preview");
    // Each pattern is distinct and past the size limit of one compiled pattern.
    let failing = rules_of(1000, |i| format!(r"regex_match(s, '(?:\w{{2000}}){{3}}{i}')"));
    let body = preview_of(r#"{"s":"a"}"#, &failing);
    let answer = post_json(&url, body.clone()).await;
    let problem = answer.assert_problem(400, "invalid-rules");
    let text = problem.to_string();
    assert!(text.contains("does not compile") && text.contains("is not compiled"), "{text}");
    // Four at once, and the service's own health the while.
    let before = binary.peak_memory();
    let previews: Vec<_> = (0..4)
        .map(|_| {
            let (url, body) = (url.clone(), body.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let answer = post_json(&url, body).await;
                (answer.status.as_u16(), started.elapsed())
            })
        })
        .collect();
    let mut slowest_health = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let health = crate::support::get(&binary.url("/healthz")).await;
        assert_eq!(health.status, 200);
        slowest_health = slowest_health.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for preview in previews {
        let (status, took) = preview.await.unwrap();
        assert!(status == 400 || status == 503, "{status}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
    assert!(slowest_health < Duration::from_millis(500), "/healthz waited {slowest_health:?}");

    let cases = [
        // A long rule id with thousands of bad keys: each problem used to carry the id.
        format!(
            r#"{{"newBodyFields":{{}},"oldBodyFields":{{"{}":{{"keys":[{}]}}}}}}"#,
            "i".repeat(50_000),
            vec!["0"; 25_000].join(",")
        ),
        // An expression of 200,000 comparisons of quoted names: each lint warning counted the
        // characters before it.
        rules_of(1, |_| format!(r#"a{}"#, r#" == "a""#.repeat(100_000))),
        // `parents` 60 deep over 20,000 names: each level used to copy every name below it.
        format!(
            r#"{{"newBodyFields":{{"t":{{"key":"t","type":"String"}}}},"oldBodyFields":{{"t":{{"keys":[{}],"parents":[{}]}}}}}}"#,
            (0..20_000).map(|i| format!(r#""n{i}""#)).collect::<Vec<_>>().join(","),
            vec![r#""p""#; 60].join(",")
        ),
        // 20,000 names with the same first and last bytes in one scan's table.
        format!(
            r#"{{"newBodyFields":{{"t":{{"key":"t","type":"String"}}}},"oldBodyFields":{{"t":{{"keys":["{}"]}}}}}}"#,
            (0..20_000).map(|i| format!("aaaaaaaa{i:06}zzzzzzzz")).collect::<Vec<_>>().join(", ")
        ),
    ];
    for rules in cases {
        let started = Instant::now();
        let answer = post_json(&url, preview_of(r#"{"p":{}}"#, &rules)).await;
        let took = started.elapsed();
        assert!(answer.status == 200 || answer.status == 400, "{}", String::from_utf8_lossy(&answer.body));
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
    let grown = binary.peak_memory().saturating_sub(before);
    assert!(grown < 256 << 20, "the peak grew by {grown} bytes");
}
