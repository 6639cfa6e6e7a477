//! Expression benchmark (SPEC §1.8), on the engine bench's recipe (one ~3 KB recipe) and on a
//! list of 200 compact recipes (~100 KB):
//!
//! - `oracle/...`: each of five typical expressions run by recast (copy the body, parse it, run
//!   the compiled expression, write the value as JSON) against the `jmespath` crate, an
//!   independent implementation used only as a reference (parse the body into its value tree,
//!   run the expression, write the value). The original language has no arithmetic, so for the
//!   arithmetic expression the oracle runs the same projection without the multiplication.
//! - `oracle/.../recast-call`: the same expressions as a call runs them: a route whose one
//!   target is the expression, the body read for the places it reads (`exec::map_text`, on
//!   demand), against the same oracle.
//! - `route/...`: a whole mapping whose 18 targets are written as expressions against the same
//!   targets written with `keys`/`parents` (copy, parse, map, write), with `each` on the list.
//!
//! Before timing, recast's and the oracle's values are checked equal. After the runs the bench
//! prints the ratios measured in pairs: the two variants timed back to back in each of 31
//! rounds, the median.
//!
//! Run: `cargo bench --bench expressions`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bumpalo::Bump;
use criterion::Criterion;
use recast::expr::{self, Arena, Budget, Doc, Program, Val};
use recast::plan::Plan;
use recast::rules::{Limits, compile_json};

// Shared with the engine and index benches, which use more of it.
#[allow(dead_code)]
#[path = "common/documents.rs"]
mod documents;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `(name, recast's expression, the oracle's)` for the recipe (`{"meals": [recipe]}`).
const RECIPE: [(&str, &str, &str); 5] = [
    ("path", "meals[0].strMeal", "meals[0].strMeal"),
    ("filter", "meals[?strArea != 'x'].strIngredient1", "meals[?strArea != 'x'].strIngredient1"),
    ("sort_by", "sort_by(meals, &strMeal)[*].idMeal", "sort_by(meals, &strMeal)[*].idMeal"),
    (
        "multi-select",
        "meals[*].{id: idMeal, name: strMeal, area: strArea, tags: strTags}",
        "meals[*].{id: idMeal, name: strMeal, area: strArea, tags: strTags}",
    ),
    ("arithmetic", "meals[*].[to_number(idMeal) * `2`]", "meals[*].[to_number(idMeal)]"),
];

/// The same for the list (`{"meals": [200 recipes]}`).
const LIST: [(&str, &str, &str); 5] = [
    ("path", "meals[100].strMeal", "meals[100].strMeal"),
    ("filter", "meals[?strArea == 'onion'].strMeal", "meals[?strArea == 'onion'].strMeal"),
    ("sort_by", "sort_by(meals, &strMeal)[*].idMeal", "sort_by(meals, &strMeal)[*].idMeal"),
    (
        "multi-select",
        "meals[*].{id: idMeal, name: strMeal, area: strArea, tags: strTags}",
        "meals[*].{id: idMeal, name: strMeal, area: strArea, tags: strTags}",
    ),
    ("arithmetic", "meals[*].[to_number(idMeal) * `2`]", "meals[*].[to_number(idMeal)]"),
];

/// The single-field targets of the engine bench: output name and input member.
const FIELDS: [(&str, &str); 18] = [
    ("id", "idMeal"),
    ("name", "strMeal"),
    ("drinkAlternate", "strDrinkAlternate"),
    ("category", "strCategory"),
    ("area", "strArea"),
    ("instructions", "strInstructions"),
    ("thumbnail", "strMealThumb"),
    ("tags", "strTags"),
    ("youtube", "strYoutube"),
    ("source", "strSource"),
    ("imageSource", "strImageSource"),
    ("license", "strCreativeCommonsConfirmed"),
    ("modified", "dateModified"),
    ("extra8", "strIngredient8"),
    ("extra9", "strIngredient9"),
    ("extra10", "strIngredient10"),
    ("extra11", "strIngredient11"),
    ("extra12", "strIngredient12"),
];

struct Document {
    name: &'static str,
    json: Vec<u8>,
    expressions: [(&'static str, &'static str, &'static str); 5],
    /// The 18 targets by `keys`/`parents`, and by expressions.
    keys: Plan,
    exprs: Plan,
}

fn documents() -> [Document; 2] {
    let mut words = documents::Words(7);
    let recipe = documents::recipe(&mut words, 0, 20, 230, true);
    let mut words = documents::Words(11);
    let items: Vec<String> = (0..200).map(|i| documents::recipe(&mut words, i, 7, 3, false)).collect();
    [
        Document {
            name: "recipe-3KB",
            json: format!(r#"{{"meals":[{recipe}]}}"#).into_bytes(),
            expressions: RECIPE,
            keys: plan(false, |field| format!(r#""keys":["{field}"],"parents":["meals"]"#)),
            exprs: plan(false, |field| format!(r#""expr":"meals[0].{field}""#)),
        },
        Document {
            name: "list-100KB",
            json: format!(r#"{{"meals":[{}]}}"#, items.join(",")).into_bytes(),
            expressions: LIST,
            keys: plan(true, |field| format!(r#""keys":["{field}"]"#)),
            exprs: plan(true, |field| format!(r#""expr":"{field}""#)),
        },
    ]
}

/// Rules with the 18 [`FIELDS`] targets, each source written by `source`.
fn plan(each: bool, source: impl Fn(&str) -> String) -> Plan {
    let new: Vec<String> =
        FIELDS.iter().map(|(key, _)| format!(r#""{key}":{{"key":"{key}","type":"String"}}"#)).collect();
    let old: Vec<String> =
        FIELDS.iter().map(|(key, field)| format!(r#""{key}":{{{}}}"#, source(field))).collect();
    let each = if each { r#""each":["meals"],"# } else { "" };
    let rules = format!(
        r#"{{"ignoreEmptyValues":true,{each}"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
        new.join(","),
        old.join(",")
    );
    compile_json(rules.as_bytes(), &Limits::default()).expect("bench rules compile").plan
}

/// recast: copy the body, parse it, run the expression, write its value.
fn recast_expr(program: &Program, body: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
    buf.extend_from_slice(body);
    let mut out = Vec::new();
    recast::json::with_parsed(&mut buf, 64, |doc| {
        let nodes: &recast::json::Nodes<'_> = doc;
        let bump = Bump::new();
        let budget = Budget::new(64 << 20, u64::MAX);
        let arena = Arena::new(&bump, &budget);
        let root = Val::from_tape(nodes, 0);
        let value = expr::evaluate(program, nodes, root, root, &arena).expect("the expression runs");
        Doc { nodes }.write(&mut out, value);
    })
    .expect("the body is JSON");
    out
}

/// Rules whose one target, `v`, is `expression`.
fn call_plan(expression: &str) -> Plan {
    let rules = format!(
        r#"{{"newBodyFields":{{"v":{{"key":"v","type":"Json"}}}},"oldBodyFields":{{"v":{{"expr":{}}}}}}}"#,
        serde_json::to_string(expression).expect("a string")
    );
    compile_json(rules.as_bytes(), &Limits::default()).expect("bench rules compile").plan
}

/// recast as a call runs a route: copy the body, read it for what the plan reads, map it.
fn recast_call(plan: &Plan, body: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
    buf.extend_from_slice(body);
    let mut out = Vec::new();
    recast::exec::map_text(plan, &mut buf, 64, &mut out).expect("the body is JSON");
    out
}

/// The oracle: parse the body into its value tree, run the expression, write its value.
fn oracle(expression: &jmespath::Expression<'_>, body: &str) -> String {
    let data = jmespath::Variable::from_json(body).expect("the body is JSON");
    let value = expression.search(data).expect("the expression runs");
    serde_json::to_string(&*value).expect("a value")
}

/// A mapping: copy, parse, map, write.
fn map(plan: &Plan, body: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
    buf.extend_from_slice(body);
    let mut out = Vec::with_capacity(body.len());
    recast::json::with_parsed(&mut buf, 64, |nodes| recast::exec::execute(plan, nodes, 0, &mut out))
        .expect("the body is JSON");
    out
}

fn main() {
    let documents = documents();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    // Under `cargo test` (one pass each, debug build) the paired rounds and the table are left out.
    let measuring = std::env::args().any(|a| a == "--bench");
    let mut rows = Vec::new();
    for document in &documents {
        let text = std::str::from_utf8(&document.json).expect("UTF-8");
        for (name, ours, theirs) in document.expressions {
            let program = expr::compile(ours, 64).expect("the expression compiles");
            let call = call_plan(ours);
            let expression = jmespath::compile(theirs).expect("the oracle compiles it");
            if name != "arithmetic" {
                let a: serde_json::Value =
                    serde_json::from_slice(&recast_expr(&program, &document.json)).unwrap();
                let b: serde_json::Value = serde_json::from_str(&oracle(&expression, text)).unwrap();
                assert_eq!(a, b, "{}: {ours}", document.name);
                let mapped: serde_json::Value =
                    serde_json::from_slice(&recast_call(&call, &document.json)).unwrap();
                assert_eq!(mapped["v"], b, "{}: {ours} as a call", document.name);
            }
            let mut group = criterion.benchmark_group(format!("oracle/{}/{name}", document.name));
            group.bench_function("recast", |b| b.iter(|| recast_expr(&program, black_box(&document.json))));
            group.bench_function("recast-call", |b| b.iter(|| recast_call(&call, black_box(&document.json))));
            group.bench_function("jmespath-crate", |b| b.iter(|| oracle(&expression, black_box(text))));
            group.finish();
            if measuring {
                let ratio = paired(
                    || recast_expr(&program, &document.json).len(),
                    || oracle(&expression, text).len(),
                );
                let by_call =
                    paired(|| recast_call(&call, &document.json).len(), || oracle(&expression, text).len());
                let read = if call.wants().is_some() { "on demand" } else { "whole" };
                rows.push(format!(
                    "| {} | {name} | `{ours}` | {ratio:.1}× | {by_call:.1}× ({read}) |",
                    document.name
                ));
            }
        }
        assert_eq!(
            map(&document.keys, &document.json),
            map(&document.exprs, &document.json),
            "{}",
            document.name
        );
        let mut group = criterion.benchmark_group(format!("route/{}", document.name));
        group.bench_function("keys", |b| b.iter(|| map(&document.keys, black_box(&document.json))));
        group.bench_function("expressions", |b| b.iter(|| map(&document.exprs, black_box(&document.json))));
        group.finish();
        if measuring {
            let ratio = paired(
                || map(&document.keys, &document.json).len(),
                || map(&document.exprs, &document.json).len(),
            );
            rows.push(format!(
                "| {} | route: 18 targets by expressions / by `keys` | | {ratio:.2}× time | |",
                document.name
            ));
        }
    }
    criterion.final_summary();
    if !measuring {
        return;
    }
    println!(
        "\n| document | what | expression | oracle time / recast time (paired median) | oracle / recast as a call (its reading) |"
    );
    println!("|---|---|---|---:|---:|");
    for row in rows {
        println!("{row}");
    }
}

/// The median over 31 rounds of `slow`'s time over `fast`'s, each round timing both back to back
/// for about 20 ms each.
fn paired(mut fast: impl FnMut() -> usize, mut slow: impl FnMut() -> usize) -> f64 {
    let time = |f: &mut dyn FnMut() -> usize| {
        let started = Instant::now();
        let mut runs = 0u32;
        while started.elapsed() < Duration::from_millis(20) {
            black_box(f());
            runs += 1;
        }
        started.elapsed().as_secs_f64() / f64::from(runs)
    };
    let mut ratios: Vec<f64> = (0..31).map(|_| time(&mut slow) / time(&mut fast)).collect();
    ratios.sort_by(f64::total_cmp);
    ratios[ratios.len() / 2]
}
