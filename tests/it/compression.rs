//! Compressed upstream answers through the service: recast asks for gzip or br, maps a coded
//! body exactly as a plain one, and stops a decompression bomb at `RECAST_MAX_UPSTREAM_BYTES`
//! counted on the decoded size, well within the call's deadline.

use std::io::Write as _;
use std::time::{Duration, Instant};

use recast::config::Config;

use crate::routes::{MEALS, registered, registration};
use crate::support::{Reply, Service, Upstream, config, get};

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

pub(crate) fn br(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::BrotliCompress(&mut &bytes[..], &mut out, &brotli::enc::BrotliEncoderParams::default()).unwrap();
    out
}

/// A 200 answer of `body` in content coding `coding`.
fn coded(coding: &str, body: Vec<u8>) -> Reply {
    Reply { body, headers: vec![("content-encoding", coding.to_owned())], ..Reply::json("") }
}

#[tokio::test]
async fn gzip_and_br_answers_map_exactly_as_plain_ones() {
    // The client picks the upstream's coding by the query; the upstream sees recast's request.
    let upstream = Upstream::start(|request| match request.uri.query().unwrap_or_default() {
        "coding=gzip" => coded("gzip", gzip(MEALS.as_bytes())),
        "coding=br" => coded("br", br(MEALS.as_bytes())),
        _ => Reply::json(MEALS),
    })
    .await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let plain = get(&service.url(&path)).await;
    assert_eq!(plain.status, 200);
    assert_eq!(&plain.body[..], br#"{"id":52772,"name":"Teriyaki Chicken"}"#);
    for coding in ["gzip", "br"] {
        let answer = get(&service.url(&format!("{path}?coding={coding}"))).await;
        assert_eq!(answer.status, 200, "{coding}: {}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.body, plain.body, "{coding}");
    }
    for received in upstream.received() {
        assert_eq!(received.headers["accept-encoding"], "gzip, br");
    }
    service.stop().await;
}

#[tokio::test]
async fn an_unknown_coding_is_a_502_that_names_it() {
    let upstream = Upstream::start(|request| match request.uri.query() {
        Some("coding=zstd") => coded("zstd", MEALS.as_bytes().to_vec()),
        _ => Reply::json(MEALS),
    })
    .await;
    let service = Service::start(config()).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let answer = get(&service.url(&format!("{path}?coding=zstd"))).await;
    let problem = answer.assert_problem(502, "upstream-encoding");
    let detail = problem.get("detail").and_then(crate::support::Json::as_str).unwrap().to_owned();
    assert!(detail.contains("`zstd`"), "{detail}");
    service.stop().await;
}

#[tokio::test]
async fn a_1_gb_gzip_bomb_is_cut_at_the_limit_within_the_deadline() {
    // 1024 gzip members of 1 MiB of zeros each: one gzip body (RFC 1952 §2.2) of 1 GiB decoded,
    // about a megabyte on the wire.
    let member = gzip(&vec![0u8; 1 << 20]);
    let bomb: Vec<u8> = member.iter().copied().cycle().take(member.len() * 1024).collect();
    assert!(bomb.len() < 2 << 20, "{} bytes on the wire", bomb.len());
    let upstream = Upstream::start(move |request| match request.uri.query() {
        Some(query) if query.starts_with("bomb") => coded("gzip", bomb.clone()),
        _ => coded("gzip", gzip(MEALS.as_bytes())),
    })
    .await;
    let deadline = Duration::from_secs(10);
    let config = Config { upstream_timeout_ms: deadline.as_millis() as u64, ..config() };
    let limit = config.max_upstream_bytes;
    let service = Service::start(config).await;
    let path = registered(&service, &registration(&upstream.url("/"), "", ""), &[]).await;
    let started = Instant::now();
    let answer = get(&service.url(&format!("{path}?bomb"))).await;
    let took = started.elapsed();
    let problem = answer.assert_problem(502, "upstream-too-large");
    let detail = problem.get("detail").and_then(crate::support::Json::as_str).unwrap().to_owned();
    assert!(detail.contains(&format!("larger than {limit} bytes")), "{detail}");
    assert!(took < deadline, "the bomb took {took:?}, past the {deadline:?} deadline");
    // The service goes on serving.
    assert_eq!(get(&service.url(&path)).await.status, 200);
    service.stop().await;
}

#[tokio::test]
async fn br_and_many_member_gzip_bombs_cost_the_binary_memory_near_its_limit() {
    // 16 MiB of spaces in brotli's largest common window (2^24): the stream tells the decoder a
    // 16 MiB window and 16 MiB metablocks. And 256 gzip members of 1 MiB each.
    let limit: u64 = 1 << 20;
    let spaces = vec![b' '; 16 << 20];
    let mut br_bomb = Vec::new();
    let params = brotli::enc::BrotliEncoderParams { lgwin: 24, quality: 5, ..Default::default() };
    brotli::BrotliCompress(&mut &spaces[..], &mut br_bomb, &params).unwrap();
    let member = gzip(&spaces[..1 << 20]);
    let gzip_bomb: Vec<u8> = member.iter().copied().cycle().take(member.len() * 256).collect();
    let upstream = Upstream::start(move |request| match request.uri.query() {
        Some("bomb=br") => coded("br", br_bomb.clone()),
        Some("bomb=gzip") => coded("gzip", gzip_bomb.clone()),
        _ => Reply::json(MEALS),
    })
    .await;
    let dir = tempfile::TempDir::new().unwrap();
    let binary =
        crate::binary::Binary::start_with(dir.path(), &[("RECAST_MAX_UPSTREAM_BYTES", &limit.to_string())])
            .await;
    let body = registration(&upstream.url("/"), "", "");
    let answer = crate::support::post_json(&binary.url("/v1/mapping"), body).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let path = answer.json().get("path").and_then(crate::support::Json::as_str).unwrap().to_owned();
    // Warm: ordinary calls, then the peak so far.
    for _ in 0..20 {
        assert_eq!(get(&binary.url(&path)).await.status, 200);
    }
    // Four calls at once, as a hostile upstream would have it, three times over.
    let bombs = |coding: &'static str| {
        let url = binary.url(&format!("{path}?bomb={coding}"));
        async move {
            for _ in 0..3 {
                let calls: Vec<_> = (0..4).map(|_| tokio::spawn(get_owned(url.clone()))).collect();
                for call in calls {
                    call.await.unwrap().assert_problem(502, "upstream-too-large");
                }
            }
        }
    };
    // The first round of gzip bombs: four bodies of up to the limit at once, each grown by
    // doubling, and what the allocator keeps of them for its next large allocations.
    let before = binary.peak_memory();
    bombs("gzip").await;
    let mut grown = vec![("gzip, first", binary.peak_memory().saturating_sub(before) >> 10)];
    // From there, each coding's bombs take what the first round's took: the decoders add a
    // fixed amount (gzip) or one bounded by the limit (br).
    for coding in ["gzip", "br"] {
        let before = binary.peak_memory();
        bombs(coding).await;
        grown.push((coding, binary.peak_memory().saturating_sub(before) >> 10));
    }
    assert_eq!(get(&binary.url(&path)).await.status, 200, "the binary goes on serving");
    println!("peak resident memory grown by bombs, in KiB: {grown:?}");
    // Four bodies of at most the limit and their decoders' buffers (for br at most about 1.6
    // times the limit), and what the allocator's per-thread heaps keep of them between the
    // round's three batches, stay within 32 times the limit even the first time (measured from
    // 10 to 24.6 MiB, the most with another process busy on the second core); after that,
    // within 8 times: the four calls of the first round do not always overlap fully, so a later
    // round may take the peak the rest of the way to where they do (measured: 12 MiB, then
    // 4 MiB more; most runs 16 MiB, then nothing). A br decoder that took the 16 MiB window its
    // stream declares grows the peak by about 64 MiB here.
    for (coding, kib) in &grown {
        let most = if coding.ends_with("first") { 32 * limit } else { 8 * limit };
        assert!(*kib <= most >> 10, "{coding}: the peak grew by {kib} KiB: {grown:?}");
    }
    let all: u64 = grown.iter().map(|(_, kib)| kib).sum();
    assert!(all <= (32 * limit) >> 10, "the three rounds grew the peak by {all} KiB: {grown:?}");
}

async fn get_owned(url: String) -> crate::support::Answer {
    get(&url).await
}
