//! The first stage of on-demand reading against the tape: how long finding every token of a
//! document (`json::index::build`) and checking their order (`json::ondemand::validate`) take,
//! against simd-json's parse of the same document into a tape, on the engine bench's documents.
//! The index and the read are also timed with the fallback kernel (SSE2), where the processor
//! has AVX2 (`json::simd`).
//! Run: `cargo bench --bench index`.

use std::hint::black_box;

use criterion::{Criterion, Throughput};

#[path = "common/documents.rs"]
mod documents;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut words = documents::Words(7);
    let recipe = format!(r#"{{"meals":[{}]}}"#, documents::recipe(&mut words, 0, 20, 230, true));
    let mut words = documents::Words(11);
    let items: Vec<String> = (0..2000).map(|i| documents::recipe(&mut words, i, 7, 3, false)).collect();
    let list = format!(r#"{{"meals":[{}]}}"#, items.join(","));
    let mut criterion = Criterion::default().configure_from_args();
    let nothing = recast::rules::compile_json(
        br#"{"newBodyFields":{},"oldBodyFields":{}}"#,
        &recast::rules::Limits::default(),
    )
    .expect("empty rules compile")
    .plan;
    let documents = [
        ("recipe-3KB", recipe),
        ("list-1MB", list),
        ("load-recipe-3KB", documents::load_recipe()),
        ("load-list-97KB", documents::load_list()),
    ];
    for (name, text) in documents {
        let body = text.into_bytes();
        let mut group = criterion.benchmark_group(format!("index/{name}"));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function("index and validate", |b| {
            let mut index = Vec::new();
            b.iter(|| {
                recast::json::index::build(black_box(&body), &mut index).is_ok()
                    && recast::json::ondemand::validate(&body, &index, 64).is_ok()
            })
        });
        // What a call that reads nothing costs: the index, and the walk that checks every token
        // and writes no node.
        let read_nothing = |b: &mut criterion::Bencher<'_>| {
            let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(black_box(&body));
                let mut out = Vec::new();
                recast::exec::map_text(&nothing, &mut buf, 64, &mut out).is_ok()
            })
        };
        let index = |b: &mut criterion::Bencher<'_>| {
            let mut index = Vec::new();
            b.iter(|| recast::json::index::build(black_box(&body), &mut index).is_ok())
        };
        group.bench_function("read for a plan that reads nothing", read_nothing);
        group.bench_function("index", index);
        // The same with the kernel every x86-64 processor has (SSE2), where AVX2 is detected.
        recast::json::simd::prefer_fallback(true);
        group.bench_function("index, fallback kernel", index);
        group.bench_function("read for a plan that reads nothing, fallback kernel", read_nothing);
        recast::json::simd::prefer_fallback(false);
        group.bench_function("simd-json parse", |b| {
            let mut buf = Vec::with_capacity(body.len() + recast::json::PADDING);
            b.iter(|| {
                buf.clear();
                buf.extend_from_slice(black_box(&body));
                recast::json::with_parsed(&mut buf, 64, |nodes| nodes.len()).is_ok()
            })
        });
        group.finish();
    }
    criterion.final_summary();
}
