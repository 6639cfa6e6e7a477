//! What the worst mappings one request can carry cost, under the default bounds
//! (`RECAST_MAX_EXPR_BYTES`, `RECAST_MAX_RESPONSE_BYTES`, `RECAST_MAX_MAPPING_STEPS`): each case
//! is a preview body of about 1 MiB (the largest a client may send by default) whose mapping
//! would build or work without end; the bench times the mapping until a bound stops it, and
//! says which bound, the steps taken and the time per step. The baseline, in the same run, is a
//! plain mapping of a 1 MiB list of objects by `each` and `keys`, the largest ordinary preview.
//! `docs/behaviour.md` gives the numbers and how the step budget was chosen from them.
//!
//! Run: `cargo bench --bench bounds`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use recast::exec::Outcome;
use recast::plan::Plan;
use recast::rules::{Limits, compile_json};

/// One mapping: its name, its document, and its rules.
struct Case {
    name: &'static str,
    document: Vec<u8>,
    plan: Plan,
}

fn rules(expr: &str, ty: &str) -> String {
    let expr = serde_json::to_string(expr).expect("a string");
    format!(
        r#"{{"newBodyFields":{{"v":{{"key":"v","type":"{ty}"}}}},"oldBodyFields":{{"v":{{"expr":{expr}}}}}}}"#
    )
}

fn case(name: &'static str, document: String, rules: &str) -> Case {
    let plan = compile_json(rules.as_bytes(), &Limits::default()).expect("the rules compile").plan;
    Case { name, document: document.into_bytes(), plan }
}

/// `{"xs": [0, ..., n - 1]}`.
fn numbers(n: usize) -> String {
    let xs: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!(r#"{{"xs":[{}]}}"#, xs.join(","))
}

fn cases() -> Vec<Case> {
    let xs = numbers(150_000);
    let listed: Vec<String> = (0..150_000).map(|i| i.to_string()).collect();
    let xs_ys = format!(r#"{{"xs":[{}],"ys":[{},-1]}}"#, listed.join(","), listed[..149_999].join(","));
    let small = numbers(20_000);
    let doubled = format!("xs{}", " | [@, @]".repeat(30));
    let pairs: Vec<String> = (0..40_000).map(|i| format!(r#"["k{i}",{i}]"#)).collect();
    let pairs = format!(r#"{{"p":[{}]}}"#, pairs.join(","));
    let text = format!(r#"{{"s":"{}","xs":[{}]}}"#, "ab".repeat(250_000), vec!["1"; 100_000].join(","));
    let objects: Vec<String> = (0..9_000)
        .map(|i| {
            format!(r#"{{"id":"{i}","name":"item {i}","price":"{}.5","tags":["a","b"],"stock":{i}}}"#, i % 97)
        })
        .collect();
    let objects = format!(r#"{{"items":[{}]}}"#, objects.join(","));
    let keys = r#"{"each":["items"],"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"price":{"key":"price","type":"Double"},"stock":{"key":"stock","type":"Int"}},"oldBodyFields":{"id":{"keys":["id"]},"name":{"keys":["name"]},"price":{"keys":["price"]},"stock":{"keys":["stock"]}}}"#;
    let letters = format!(r#"{{"s":"{}"}}"#, "A".repeat(500_000));
    let blank = format!(r#"{{"b":"{}","blank":"{}"}}"#, "y".repeat(500_000), " ".repeat(500_000));
    let entries = |name: &str, times: usize, ignore: bool| {
        let keys = vec![format!(r#""{name}""#); times].join(",");
        format!(
            r#"{{"ignoreEmptyValues":{ignore},"newBodyFields":{{"t":{{"key":"t","type":"String"}}}},"oldBodyFields":{{"t":{{"keys":[{keys}]}}}}}}"#
        )
    };
    let targets: Vec<String> = (0..300).map(|i| format!(r#""t{i}":{{"key":"t{i}","type":"Int"}}"#)).collect();
    let sources: Vec<String> =
        (0..300).map(|i| format!(r#""t{i}":{{"expr":"xs[{}]"}}"#, 149_999 - i)).collect();
    let indexes =
        format!(r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#, targets.join(","), sources.join(","));
    let xs_again = xs.clone();
    vec![
        case("baseline: each over 9,000 objects by keys", objects.clone(), keys),
        case("doubling a list, written", small.clone(), &rules(&doubled, "Json")),
        case("doubling a list, compared", small.clone(), &rules(&format!("{doubled} | @ == @"), "Boolean")),
        case("filter by contains over the list", xs.clone(), &rules("length(xs[?contains($.xs, @)])", "Int")),
        case("a sort per element", small.clone(), &rules("length(map(&sort_by($.xs, &@), xs))", "Int")),
        case("the last element per element", xs.clone(), &rules("length(map(&$.xs[-1], xs))", "Int")),
        case("equality of lists per element", xs_ys, &rules("length(xs[?$.xs == $.ys])", "Int")),
        case("a list of the list, written", xs.clone(), &rules("[xs, xs, xs, xs, xs, xs, xs, xs]", "Json")),
        case("from_items of 40,000 pairs", pairs.clone(), &rules("length(keys(from_items(p)))", "Int")),
        case("group_by of 40,000 pairs", pairs.clone(), &rules("length(keys(group_by(p, &[0])))", "Int")),
        case(
            "merge of objects of 40,000 members",
            pairs.clone(),
            &rules("length(keys(merge(from_items(p), from_items(reverse(p)))))", "Int"),
        ),
        case(
            "equality of objects of 40,000 members",
            pairs,
            &rules("from_items(p) == from_items(reverse(p))", "Boolean"),
        ),
        case(
            "a search of 500 KB per element",
            text.clone(),
            &rules("length(xs[?contains($.s, 'zz')])", "Int"),
        ),
        case(
            "a split of 500 KB per element",
            text.clone(),
            &rules("length(map(&split($.s, ''), xs))", "Int"),
        ),
        case("to_string of the list per element", xs, &rules("length(map(&to_string($.xs), xs))", "Int")),
        case(
            "each over its own doubled list",
            small,
            &format!(
                r#"{{"each":{},"newBodyFields":{{"v":{{"key":"v","type":"Json"}}}},"oldBodyFields":{{"v":{{"expr":"@"}}}}}}"#,
                serde_json::to_string(&"xs | [@, @] | [@, @] | [@, @] | [@, @] | [@, @] | [@, @]").unwrap()
            ),
        ),
        case(
            "a pattern that matches any length, replaced in 500 KB",
            letters.clone(),
            &rules("length(regex_replace(s, '.*[^A-Z]|[A-Z]', ''))", "Int"),
        ),
        case(
            "a bounded pattern replaced in 500 KB",
            letters.clone(),
            &rules("length(regex_replace(s, 'A{1,3}', 'b'))", "Int"),
        ),
        case(
            "a needle of 500 KB per element",
            text.clone(),
            &rules("length(xs[?replace('ab', $.s, '') == 'ab'])", "Int"),
        ),
        case(
            "a trim of 500 KB per element",
            text.clone(),
            &rules("length(xs[?trim($.s, 'ba') == ''])", "Int"),
        ),
        case("a 500 KB text named by 10,000 keys entries", blank.clone(), &entries("b", 10_000, false)),
        case("a blank 500 KB text left out 10,000 times", blank, &entries("blank", 10_000, true)),
        case("300 indexes near the end of 150,000", xs_again, &indexes),
        case(
            "the objects by expressions",
            objects,
            &rules("items[*].{id: to_number(id), name: upper(name), tags: join(',', tags)}", "Json"),
        ),
    ]
}

/// Parses the document and maps it, as a preview does.
fn map(plan: &Plan, document: &[u8]) -> (Outcome, usize) {
    let mut buf = Vec::with_capacity(document.len() + recast::json::PADDING);
    buf.extend_from_slice(document);
    let mut out = Vec::new();
    let outcome =
        recast::json::with_parsed(&mut buf, 64, |nodes| recast::exec::execute(plan, nodes, 0, &mut out))
            .expect("the document is JSON");
    (outcome, out.len())
}

fn main() {
    let cases = cases();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .configure_from_args();
    // Under `cargo test` (one pass each, debug build) the table is left out.
    let measuring = std::env::args().any(|a| a == "--bench");
    let mut rows = Vec::new();
    for case in &cases {
        let (outcome, written) = map(&case.plan, &case.document);
        let mut group = criterion.benchmark_group("bounds");
        group.bench_function(case.name, |b| b.iter(|| map(&case.plan, black_box(&case.document))));
        group.finish();
        if measuring {
            let mut times: Vec<Duration> = (0..11)
                .map(|_| {
                    let started = Instant::now();
                    black_box(map(&case.plan, &case.document));
                    started.elapsed()
                })
                .collect();
            times.sort();
            let median = times[times.len() / 2];
            let ns_per_step = median.as_nanos() as f64 / outcome.steps.max(1) as f64;
            let stopped = outcome.limit.map_or("none (mapped)".to_owned(), |l| l.setting().to_owned());
            rows.push(format!(
                "| {} | {} KiB | {stopped} | {} | {:.1} ms | {ns_per_step:.2} | {} KiB |",
                case.name,
                case.document.len() / 1024,
                outcome.steps,
                median.as_secs_f64() * 1e3,
                written / 1024
            ));
        }
    }
    criterion.final_summary();
    if !measuring {
        return;
    }
    println!("\n| mapping | body | stopped by | steps | time (median of 11) | ns per step | written |");
    println!("|---|---:|---|---:|---:|---:|---:|");
    for row in rows {
        println!("{row}");
    }
}
