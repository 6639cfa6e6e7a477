//! Engine benchmark: parse + map throughput of recast against two references measured in the same
//! run, on four documents the bench generates:
//!
//! - `recipe-3KB`: one recipe (about 3 KB) mapped by 25 targets (renames, an Int coercion, seven
//!   concatenations), the shape of a single-object API answer;
//! - `list-1MB`: 2,000 smaller recipes (about 1 MB) mapped element by element with `each`;
//! - `load-recipe-3KB` and `load-list-97KB`: the load benchmark's documents and rules
//!   (`benches/load/run.sh`), whose rules leave most of each document unread.
//!
//! For each document: `recast` (copy the body, read it as a call does, which turns only what the
//! plan reads into a tape, execute the plan, write the output), `recast-whole-parse` (the same with
//! simd-json's parse of the whole body into a tape, the path of rules whose expressions may read
//! anything), `simd-json-parse` (the copy and that parse call alone: the floor), and
//! `serde-tree` (the straightforward mapper of `benches/common/baseline.rs`: serde_json parses
//! into an order-keeping tree, which is walked, mapped and written out). Before timing, recast's
//! output is checked equal to the baseline's, member order included. After the runs the bench
//! prints a table of MB/s and ratios read back from criterion's estimates, and the same ratios
//! measured in pairs (the variants timed back to back in each of 41 rounds; the median), which a
//! slow spell of a shared machine during one criterion group does not skew.
//!
//! Run: `cargo bench --bench engine`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use recast::plan::Plan;
use recast::rules::{Limits, compile_json};

#[path = "common/baseline.rs"]
mod baseline;
#[path = "common/documents.rs"]
mod documents;
// Shared with the tests, which use more of it.
#[allow(dead_code)]
#[path = "common/ordered_json.rs"]
mod ordered_json;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The variants, in table order.
const VARIANTS: [&str; 5] =
    ["recast", "simd-json-parse", "serde-tree", "recast-execute", "recast-whole-parse"];

/// One benchmarked document and the rules that map it.
struct Input {
    name: &'static str,
    json: Vec<u8>,
    rules: baseline::Rules,
    plan: Plan,
}

fn main() {
    let inputs = [recipe_input(), list_input(), load_recipe_input(), load_list_input()];
    // `--repeat "load-list-97KB recast 2000"`: only that many calls of one variant, for profiling
    // it or counting its instructions (`valgrind --tool=callgrind`), which a busy machine does not
    // move as it moves time. `--repeat` also knows `read-nothing`: the document mapped by rules
    // that read nothing of it (the cost of checking it whole).
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--repeat") {
        repeat(&inputs, args.get(at + 1).map_or("", String::as_str));
        return;
    }
    for input in &inputs {
        check_same_output(input);
        println!("{}: {} bytes", input.name, input.json.len());
    }
    let mut criterion = Criterion::default().output_directory(&output_dir()).configure_from_args();
    for input in &inputs {
        let mut group = criterion.benchmark_group(input.name);
        group.throughput(Throughput::Bytes(input.json.len() as u64));
        group.bench_function(BenchmarkId::from_parameter(VARIANTS[0]), |b| {
            b.iter(|| recast_map(&input.plan, black_box(&input.json)))
        });
        group.bench_function(BenchmarkId::from_parameter(VARIANTS[1]), |b| {
            b.iter(|| parse_only(black_box(&input.json)))
        });
        group.bench_function(BenchmarkId::from_parameter(VARIANTS[2]), |b| {
            b.iter(|| baseline::map_bytes(&input.rules, black_box(&input.json)))
        });
        group.bench_function(BenchmarkId::from_parameter(VARIANTS[4]), |b| {
            b.iter(|| recast_map_whole(&input.plan, black_box(&input.json)))
        });
        // For diagnosis: executing on an already parsed tape (no copy, no parse).
        group.bench_function(BenchmarkId::from_parameter(VARIANTS[3]), |b| {
            let mut buf = input.json.clone();
            recast::json::with_parsed(&mut buf, 64, |nodes| {
                b.iter(|| {
                    let mut out = Vec::with_capacity(input.json.len());
                    recast::exec::execute(&input.plan, black_box(nodes), 0, &mut out);
                    out
                })
            })
            .expect("the input is JSON");
        });
        group.finish();
    }
    criterion.final_summary();
    if std::env::args().any(|a| a == "--bench") {
        print_table(&inputs);
    }
}

/// What recast does per call once the upstream body is in: copy it into a padded buffer, read
/// what the plan reads, execute, return the output bytes.
fn recast_map(plan: &Plan, body: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
    buf.extend_from_slice(body);
    let mut out = Vec::with_capacity(body.len());
    recast::exec::map_text(plan, &mut buf, 64, &mut out).expect("the input is JSON");
    out
}

/// [`recast_map`] with the whole body parsed into a tape.
fn recast_map_whole(plan: &Plan, body: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
    buf.extend_from_slice(body);
    let mut out = Vec::with_capacity(body.len());
    recast::json::with_parsed(&mut buf, 64, |nodes| recast::exec::execute(plan, nodes, 0, &mut out))
        .expect("the input is JSON");
    out
}

/// [`recast_map`] with the structural index's fallback kernel (SSE2) where the processor has AVX2.
fn recast_map_fallback(plan: &Plan, body: &[u8]) -> Vec<u8> {
    recast::json::simd::prefer_fallback(true);
    let out = recast_map(plan, body);
    recast::json::simd::prefer_fallback(false);
    out
}

/// Runs one variant on one document a given number of times (`--repeat`).
fn repeat(inputs: &[Input], spec: &str) {
    let [name, variant, times] = spec.split_whitespace().collect::<Vec<_>>()[..] else {
        panic!("--repeat takes \"<document> <variant> <times>\", not {spec:?}");
    };
    let input = inputs.iter().find(|i| i.name == name).expect("a document of the bench");
    let times: usize = times.parse().expect("a number of calls");
    // Rules that read nothing: what checking the whole text costs (the index, and the walk that
    // checks every token and writes no node).
    let nothing = compile_json(br#"{"newBodyFields":{},"oldBodyFields":{}}"#, &Limits::default())
        .expect("empty rules compile")
        .plan;
    for _ in 0..times {
        match variant {
            "recast" => drop(black_box(recast_map(&input.plan, black_box(&input.json)))),
            "recast-fallback" => drop(black_box(recast_map_fallback(&input.plan, black_box(&input.json)))),
            "recast-whole-parse" => drop(black_box(recast_map_whole(&input.plan, black_box(&input.json)))),
            "simd-json-parse" => drop(black_box(parse_only(black_box(&input.json)))),
            "read-nothing" => drop(black_box(recast_map(&nothing, black_box(&input.json)))),
            other => panic!("no variant {other}"),
        }
    }
}

/// The floor: the same copy and the same parse call, nothing else.
fn parse_only(body: &[u8]) -> usize {
    let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
    buf.extend_from_slice(body);
    recast::json::with_parsed(&mut buf, 64, |nodes| nodes.len()).expect("the input is JSON")
}

fn check_same_output(input: &Input) {
    let ours = recast_map(&input.plan, &input.json);
    assert_eq!(
        ours,
        recast_map_whole(&input.plan, &input.json),
        "{}: reading what is read differs",
        input.name
    );
    let theirs = baseline::map_bytes(&input.rules, &input.json);
    assert_eq!(
        ordered_json::Json::parse(&ours),
        ordered_json::Json::parse(&theirs),
        "{}: recast and the baseline disagree",
        input.name
    );
    let ours: serde_json::Value = serde_json::from_slice(&ours).unwrap();
    let targets = ours.as_object().map_or_else(|| ours[0].as_object().unwrap().len(), |o| o.len());
    assert!(targets >= 5, "{}: only {targets} members mapped", input.name);
}

// ---------------------------------------------------------------------------------------------
// Inputs.

/// 25 targets over one recipe: 12 renames, an Int coercion, 7 concatenations of a measure and an
/// ingredient, and 5 single ingredients. `parents` is `["meals"]` for the single document and
/// empty for the list, whose elements are the recipes.
fn rules_json(parents: &str, each: bool) -> String {
    let mut new = Vec::new();
    let mut old = Vec::new();
    let mut target = |id: &str, ty: &str, keys: &str| {
        new.push(format!(r#""{id}":{{"key":"{id}","type":"{ty}"}}"#));
        old.push(format!(r#""{id}":{{"keys":[{keys}],"parents":[{parents}]}}"#));
    };
    target("id", "Int", r#""idMeal""#);
    for (id, field) in [
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
    ] {
        target(id, "String", &format!(r#""{field}""#));
    }
    for i in 1..=7 {
        target(&format!("ingredient{i}"), "String", &format!(r#""strMeasure{i}, strIngredient{i}""#));
    }
    for i in 8..=12 {
        target(&format!("extra{i}"), "String", &format!(r#""strIngredient{i}""#));
    }
    let each = if each { r#""each":["meals"],"# } else { "" };
    format!(
        r#"{{"ignoreEmptyValues":true,{each}"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
        new.join(","),
        old.join(",")
    )
}

fn input(name: &'static str, json: String, rules: String) -> Input {
    let limits = Limits::default();
    Input {
        name,
        json: json.into_bytes(),
        rules: baseline::Rules::read(rules.as_bytes()).expect("the reference reads the bench rules"),
        plan: compile_json(rules.as_bytes(), &limits).expect("bench rules compile").plan,
    }
}

use documents::{Words, recipe};

fn recipe_input() -> Input {
    let mut words = Words(7);
    let recipe = recipe(&mut words, 0, 20, 230, true);
    input("recipe-3KB", format!(r#"{{"meals":[{recipe}]}}"#), rules_json(r#""meals""#, false))
}

fn list_input() -> Input {
    let mut words = Words(11);
    let items: Vec<String> = (0..2000).map(|i| recipe(&mut words, i, 7, 3, false)).collect();
    input("list-1MB", format!(r#"{{"meals":[{}]}}"#, items.join(",")), rules_json("", true))
}

/// The load benchmark's recipe and rules (`benches/load/run.sh`): five targets, most of the
/// document not read.
fn load_recipe_input() -> Input {
    let ingredients: Vec<String> = (1..=7).map(|i| format!(r#""strMeasure{i}, strIngredient{i}""#)).collect();
    let rules = format!(
        r#"{{"newBodyFields":{{"id":{{"key":"id","type":"Int"}},"name":{{"key":"name","type":"String"}},"category":{{"key":"category","type":"String"}},"area":{{"key":"area","type":"String"}},"ingredients":{{"key":"ingredients","type":"String"}}}},"oldBodyFields":{{"id":{{"keys":["idMeal"],"parents":["meals"]}},"name":{{"keys":["strMeal"],"parents":["meals"]}},"category":{{"keys":["strCategory"],"parents":["meals"]}},"area":{{"keys":["strArea"],"parents":["meals"]}},"ingredients":{{"keys":[{}],"parents":["meals"]}}}}}}"#,
        ingredients.join(",")
    );
    input("load-recipe-3KB", documents::load_recipe(), rules)
}

/// The load benchmark's list and rules (`benches/load/run.sh`): five fields of each of 300 items.
fn load_list_input() -> Input {
    let rules = r#"{"each":["items"],"newBodyFields":{"id":{"key":"id","type":"Int"},"title":{"key":"title","type":"String"},"price":{"key":"price","type":"Double"},"owner":{"key":"owner","type":"String"},"email":{"key":"email","type":"String"}},"oldBodyFields":{"id":{"keys":["id"]},"title":{"keys":["title"]},"price":{"keys":["price"]},"owner":{"keys":["name"],"parents":["owner"]},"email":{"keys":["email"],"parents":["owner"]}}}"#;
    input("load-list-97KB", documents::load_list(), rules.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Report.

/// Criterion's output directory: `criterion/` in the target directory this bench was built in.
fn output_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench knows its path");
    // <target>/release/deps/engine-<hash>
    exe.ancestors().nth(3).unwrap_or(Path::new(".")).join("criterion")
}

/// Mean time per iteration in nanoseconds, from criterion's estimates of the last run.
fn mean_ns(group: &str, variant: &str) -> Option<f64> {
    let path = output_dir().join(group).join(variant).join("new").join("estimates.json");
    let estimates: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    estimates["mean"]["point_estimate"].as_f64()
}

fn print_table(inputs: &[Input]) {
    println!();
    println!(
        "| document | bytes | recast MB/s | simd-json parse MB/s | serde tree MB/s | recast / parse (time) | baseline / recast (time) | recast / parse, paired | baseline / recast, paired | recast / parse, best rounds | whole parse path / parse, paired | whole parse path / parse, best rounds | recast with the fallback kernel / parse, paired | recast / recast with the fallback kernel, paired |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for input in inputs {
        let times: Option<Vec<f64>> = VARIANTS[..3].iter().map(|v| mean_ns(input.name, v)).collect();
        let Some(times) = times else {
            println!("| {} | estimates missing |", input.name);
            continue;
        };
        let mbps = |ns: f64| input.json.len() as f64 / ns * 1e9 / 1e6;
        let [
            over_parse,
            baseline_over,
            best,
            whole_over_parse,
            whole_best,
            fallback_over_parse,
            over_fallback,
        ] = paired(input);
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.2}× | {over_parse} | {baseline_over} | {best} | {whole_over_parse} | {whole_best} | {fallback_over_parse} | {over_fallback} |",
            input.name,
            input.json.len(),
            mbps(times[0]),
            mbps(times[1]),
            mbps(times[2]),
            times[0] / times[1],
            times[2] / times[0],
        );
    }
    println!(
        "\npaired: {PAIRED_ROUNDS} rounds, each timing the five variants back to back for about \
         {PAIRED_SPELL:?} apiece; the median of the rounds' ratios (quartiles in brackets). \
         best rounds: each variant's fastest round against the other's."
    );
}

/// Rounds of the paired measurement.
const PAIRED_ROUNDS: usize = 41;

/// Time each variant runs per round.
const PAIRED_SPELL: Duration = Duration::from_millis(5);

/// The ratios recast / parse and baseline / recast measured in pairs: each round times the three
/// variants one right after the other (each after one untimed call), so a slow spell of this
/// shared machine falls on all of them alike rather than on one criterion group. Returns the
/// median of the rounds' ratios with the quartiles, written out, and recast's fastest round over
/// the parse's fastest (noise on this machine only ever adds time, so the fastest rounds are the
/// closest to the work itself). The order within a round is fixed; the untimed call before each
/// variant is what keeps the one before from leaving it cold caches.
fn paired(input: &Input) -> [String; 7] {
    let variants: [&dyn Fn(); 5] = [
        &|| {
            black_box(recast_map(&input.plan, black_box(&input.json)));
        },
        &|| {
            black_box(parse_only(black_box(&input.json)));
        },
        &|| {
            black_box(baseline::map_bytes(&input.rules, black_box(&input.json)));
        },
        &|| {
            black_box(recast_map_whole(&input.plan, black_box(&input.json)));
        },
        &|| {
            black_box(recast_map_fallback(&input.plan, black_box(&input.json)));
        },
    ];
    let repeats: Vec<u32> = variants
        .iter()
        .map(|run| {
            run();
            let started = Instant::now();
            run();
            (PAIRED_SPELL.as_secs_f64() / started.elapsed().as_secs_f64().max(1e-9)).clamp(1.0, 1e6) as u32
        })
        .collect();
    let mut ratios = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut best = [f64::INFINITY; 5];
    for _ in 0..PAIRED_ROUNDS {
        let times: Vec<f64> = variants
            .iter()
            .zip(&repeats)
            .map(|(run, &n)| {
                // One call untimed first: the variant before may have left the caches to itself.
                run();
                let started = Instant::now();
                for _ in 0..n {
                    run();
                }
                started.elapsed().as_secs_f64() / f64::from(n)
            })
            .collect();
        ratios[0].push(times[0] / times[1]);
        ratios[1].push(times[2] / times[0]);
        ratios[2].push(times[3] / times[1]);
        ratios[3].push(times[4] / times[1]);
        ratios[4].push(times[0] / times[4]);
        for (best, time) in best.iter_mut().zip(&times) {
            *best = best.min(*time);
        }
    }
    let [over_parse, baseline_over, whole_over_parse, fallback_over_parse, over_fallback] =
        ratios.map(|mut r| {
            r.sort_by(f64::total_cmp);
            let at = |q: usize| r[(r.len() - 1) * q / 4];
            format!("{:.2}× ({:.2}–{:.2})", at(2), at(1), at(3))
        });
    [
        over_parse,
        baseline_over,
        format!("{:.2}×", best[0] / best[1]),
        whole_over_parse,
        format!("{:.2}×", best[3] / best[1]),
        fallback_over_parse,
        over_fallback,
    ]
}
