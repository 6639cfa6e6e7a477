//! The first stage of on-demand reading against the tape: how long finding every token of a
//! document (`json::index::build`) and checking their order (`json::index::validate`) take,
//! against simd-json's parse of the same document into a tape, on the engine bench's documents.
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
    for (name, text) in [("recipe-3KB", recipe), ("list-1MB", list)] {
        let body = text.into_bytes();
        let mut group = criterion.benchmark_group(format!("index/{name}"));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function("index and validate", |b| {
            let mut index = Vec::new();
            b.iter(|| {
                recast::json::index::build(black_box(&body), &mut index).is_ok()
                    && recast::json::index::validate(&body, &index, 64).is_ok()
            })
        });
        group.bench_function("index", |b| {
            let mut index = Vec::new();
            b.iter(|| recast::json::index::build(black_box(&body), &mut index).is_ok())
        });
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
