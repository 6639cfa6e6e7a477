//! A composed route's own work (docs/composition.md), without the network: compiling a
//! three-source composition (the schedule, templates, `when` and `forEach`), rendering a
//! chained source's request over its context (read for what its templates read), and reading
//! three answers as one document and mapping it (each answer indexed as it comes, then read for
//! what the rules read), against mapping one answer alone. Run: `cargo bench --bench compose`.

use std::hint::black_box;

use criterion::Criterion;
use recast::json::ondemand::{Indexed, Part, with_parts};
use recast::route::composition::Composition;
use recast::route::render::CallerParts;
use recast::route::sources;
use recast::route::template::{Context, Scratch};
use recast::rules::{Limits, compile_json};

// Only the load documents are used here.
#[allow(dead_code)]
#[path = "common/documents.rs"]
mod documents;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SOURCES: &str = r#"{
    "a": {"originalApi": {"baseUrl": "https://a.example/"}, "path": "recipes/{{request.query.id}}"},
    "b": {"originalApi": {"baseUrl": "https://b.example/"}, "path": "areas", "queries": {"lang": "{{request.query.lang}}"}},
    "c": {"originalApi": {"baseUrl": "https://c.example/v2/"}, "path": "categories/{{a.meals[0].idMeal}}/x",
          "queries": {"area": "{{a.meals[0].strArea}}", "n": "5"}, "headers": {"X-Name": "{{a.meals[0].strMeal}}"},
          "after": ["a"]}
}"#;

const RULES: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"area":{"key":"area","type":"String"},"category":{"key":"category","type":"String"}},"oldBodyFields":{"id":{"expr":"a.meals[0].idMeal"},"name":{"expr":"a.meals[0].strMeal"},"area":{"expr":"b.meals[0].strArea"},"category":{"expr":"c.meals[0].strCategory"}}}"#;
const SINGLE: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"area":{"key":"area","type":"String"},"category":{"key":"category","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"name":{"keys":["strMeal"],"parents":["meals"]},"area":{"keys":["strArea"],"parents":["meals"]},"category":{"keys":["strCategory"],"parents":["meals"]}}}"#;

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let limits = Limits::default();
    let given: serde_json::Value = serde_json::from_str(SOURCES).unwrap();
    let configs = {
        let mut problems = Vec::new();
        let configs = sources::validate(&given, 64, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        configs
    };
    let recipe = documents::load_recipe();
    let mut group = criterion.benchmark_group("compose");
    group.bench_function("compile three sources", |b| {
        b.iter(|| {
            black_box(Composition::compile(black_box(&configs), &[], uuid::Uuid::nil(), &limits).unwrap())
        })
    });
    let composition = Composition::compile(&configs, &[], uuid::Uuid::nil(), &limits).unwrap();
    let c = &composition.sources[composition.index_of("c").unwrap()];
    let request_text = br#"{"query":{"id":"52772","lang":"en"},"headers":{},"body":null}"#.to_vec();
    group.bench_function("render the chained source's request (context of request and a)", |b| {
        b.iter(|| {
            let request = Indexed::new(request_text.clone(), 63).unwrap();
            let a = Indexed::new(recipe.clone().into_bytes(), 62).unwrap();
            with_parts(
                &["request", "a"],
                &[Part::One(&request), Part::One(&a)],
                Some(&c.context),
                64,
                |doc| {
                    let scratch = Scratch::new(1 << 20, 1 << 20);
                    let arena = scratch.arena();
                    let context = Context {
                        doc,
                        item: None,
                        caller: recast::expr::Val::Null,
                        arena: &arena,
                        explain: false,
                    };
                    black_box(c.request(&context, &CallerParts::default()).unwrap())
                },
            )
            .unwrap()
        })
    });
    let plan = compile_json(RULES.as_bytes(), &limits).unwrap().plan;
    group.bench_function("three answers in one document, mapped", |b| {
        b.iter(|| {
            let [a, bb, cc] = [(); 3].map(|()| Indexed::new(recipe.clone().into_bytes(), 62).unwrap());
            let mut out = Vec::new();
            let parts = [Part::One(&a), Part::One(&bb), Part::One(&cc)];
            with_parts(&["a", "b", "c"], &parts, plan.wants(), 64, |doc| {
                recast::exec::execute(&plan, doc, 0, &mut out)
            })
            .unwrap();
            black_box(out)
        })
    });
    let single = compile_json(SINGLE.as_bytes(), &limits).unwrap().plan;
    group.bench_function("one answer mapped by a single route (three of them)", |b| {
        b.iter(|| {
            for _ in 0..3 {
                let mut text = recipe.clone().into_bytes();
                let mut out = Vec::new();
                recast::exec::map_text(&single, &mut text, 64, &mut out).unwrap();
                black_box(out);
            }
        })
    });
    group.finish();
    criterion.final_summary();
}
