//! Callers at scale (SPEC §2.4, `docs/callers.md`).
//!
//! - Keys (measured once): 1,000,000 consumers of one key each written to a store, then the
//!   store opened again and every consumer read and put in the directory, timed (what a start
//!   does); and the resident memory the directory's keys take in this process, per key.
//! - `keys/find/{hit,miss}` (criterion): a call's key found by its digest among 1,000,000;
//!   `keys/find/kept`: the same key repeated on one connection, which kept what it made.
//! - `keys/change_under_calls` (criterion): one change (a consumer's key revoked and issued) while
//!   another thread finds keys without a pause; and that thread's finds per second meanwhile.
//! - `tokens/first/{RS256,ES256}` (criterion): what a call with a token never seen costs: read,
//!   key chosen, signature verified, claims checked, the caller made; against
//!   `tokens/verify_only/{RS256,ES256}`, the verifier crate's signature check alone.
//! - `tokens/repeated` (criterion): a token already verified: its digest, the memory's answer and
//!   the route's claim checks; `tokens/repeated_kept`: the same repeated on one connection (the
//!   connection's memory answers, no digest).
//! - `digest/{ring,sha2}/{key,token}` (criterion): SHA-256 of a key (46 bytes) and of a token
//!   (about 450 bytes) by ring and by `sha2` (the CPU's SHA extensions when it has them), of
//!   which `consumers::digest` takes the faster for the machine.
//!
//! Run: `cargo bench --bench callers`. Under `cargo test` the same code runs with small sizes.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use criterion::Criterion;
use recast::callers::config::{Algorithm, IssuerConfig};
use recast::callers::consumers::{self, StoredConsumer};
use recast::callers::key_sets::{self, Key};
use recast::callers::verified::{Token, Verified};
use recast::callers::{Caller, CallerKind, Directory, Memo, jwt};
use ring::signature::{self, KeyPair as _};

/// The resident memory of this process, in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("the process has a status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS is in the status")
        * 1024
}

/// The service's allocator, counting the bytes held: what the directory holds is the count's
/// growth while it is filled (resident memory also moves with what the allocator keeps of
/// freed pages and the store's caches).
struct Counting;

static HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: every call is passed to mimalloc as it came; the counter only adds and subtracts sizes.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let keys = if bench { 1_000_000 } else { 2_000 };
    let mut criterion = Criterion::default().configure_from_args();
    if !bench {
        criterion =
            criterion.warm_up_time(Duration::from_millis(10)).measurement_time(Duration::from_millis(50));
    }
    let (directory, sample) = load(keys);
    find(&mut criterion, &directory, &sample);
    change_under_calls(&mut criterion, directory, sample);
    tokens(&mut criterion);
    digests(&mut criterion);
    criterion.final_summary();
}

/// Writes `n` consumers to a store, reads them back into a directory as a start does, and says
/// how long that took and what the keys take in memory. The directory, and one key's text.
fn load(n: usize) -> (Arc<Directory>, Vec<u8>) {
    let dir = std::env::temp_dir().join(format!("recast-bench-callers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the temporary directory is created");
    let store = recast::storage::Store::open(&dir, None).expect("a store");
    let mut sample = Vec::new();
    let filled = Instant::now();
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        let issued = consumers::issue(1, None);
        if i == n / 2 {
            sample = issued.key.clone().into_bytes();
        }
        batch.push(StoredConsumer {
            name: format!("consumer-{i:07}"),
            metadata: serde_json::Value::Null,
            created_at: 1,
            updated_at: 1,
            keys: vec![issued.stored],
        });
        if batch.len() == batch.capacity() || i + 1 == n {
            store.put_consumers(&batch).expect("stored");
            batch.clear();
        }
    }
    let filled = filled.elapsed();
    drop(store);
    let store = recast::storage::Store::open(&dir, None).expect("the store opens again");
    let before = resident_bytes();
    let held_before = HELD.load(Ordering::Relaxed);
    let started = Instant::now();
    let directory = Directory::default();
    let count = store.each_consumer(|consumer| directory.put(consumer)).expect("read");
    let took = started.elapsed();
    let after = resident_bytes();
    let held = HELD.load(Ordering::Relaxed).saturating_sub(held_before);
    assert_eq!(directory.key_count(), n);
    println!(
        "keys: {n} consumers of one key written in {:.1} s; read back and put in the directory in {:.2} s ({:.2} µs each); the directory holds {} keys in {:.1} MiB allocated, {} bytes per key ({} bytes per key of resident memory)",
        filled.as_secs_f64(),
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / count as f64,
        directory.key_count(),
        held as f64 / (1 << 20) as f64,
        held / n,
        after.saturating_sub(before) / n as u64,
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    (Arc::new(directory), sample)
}

fn find(criterion: &mut Criterion, directory: &Directory, sample: &[u8]) {
    let mut group = criterion.benchmark_group("keys/find");
    group.bench_function("hit", |b| b.iter(|| directory.find(black_box(sample)).expect("found")));
    let mut other = sample.to_vec();
    other[10] ^= 1;
    group.bench_function("miss", |b| b.iter(|| assert!(directory.find(black_box(&other)).is_none())));
    // Repeated on one connection: what the connection kept answers, the same bytes compared.
    let memo = Memo::default();
    memo.keep_key(sample, &directory.find(sample).expect("found"));
    group.bench_function("kept", |b| b.iter(|| memo.key(black_box(sample)).expect("kept")));
    group.finish();
}

fn change_under_calls(criterion: &mut Criterion, directory: Arc<Directory>, sample: Vec<u8>) {
    let stop = Arc::new(AtomicBool::new(false));
    let finds = Arc::new(AtomicU64::new(0));
    let caller = {
        let (directory, stop, finds) = (directory.clone(), stop.clone(), finds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                black_box(directory.find(&sample));
                finds.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    while finds.load(Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    let consumer = directory.get("consumer-0000000").expect("the first consumer");
    let started = Instant::now();
    let counted = finds.load(Ordering::Relaxed);
    criterion.bench_function("keys/change_under_calls", |b| {
        b.iter(|| {
            let mut changed = (*consumer).clone();
            changed.keys = vec![consumers::issue(2, None).stored];
            directory.put(changed);
        })
    });
    let rate = (finds.load(Ordering::Relaxed) - counted) as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    caller.join().expect("the calling thread");
    println!("keys: a thread finding keys meanwhile made {rate:.0} finds per second");
}

fn issuer() -> IssuerConfig {
    IssuerConfig {
        issuer: "https://id.bench/".into(),
        audiences: vec!["bench".into()],
        jwks_uri: None,
        algorithms: vec![Algorithm::RS256, Algorithm::ES256],
        claims: Default::default(),
        leeway_seconds: 30,
    }
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token of `alg` signed by `sign`, with kid `kid`.
fn token(alg: &str, kid: &str, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let header = b64(format!(r#"{{"alg":"{alg}","kid":"{kid}","typ":"JWT"}}"#).as_bytes());
    let claims = format!(
        r#"{{"iss":"https://id.bench/","aud":"bench","sub":"user-7","scope":"openid orders:read","exp":{},"iat":{now}}}"#,
        now + 3600
    );
    let message = format!("{header}.{}", b64(claims.as_bytes()));
    let signature = b64(&sign(message.as_bytes()));
    format!("{message}.{signature}")
}

/// An RSA key (made by openssl, 2048 bits) and an ES256 key, their set, and a token of each.
fn signers() -> (Vec<Arc<Key>>, String, String) {
    let rng = ring::rand::SystemRandom::new();
    // PKCS#1 (RSAPrivateKey), which ring reads.
    let der = std::process::Command::new("sh")
        .args(["-c", "openssl genrsa 2048 2>/dev/null | openssl rsa -outform DER -traditional 2>/dev/null"])
        .output()
        .expect("openssl makes an RSA key")
        .stdout;
    let rsa = signature::RsaKeyPair::from_der(&der).expect("a PKCS#1 RSA key");
    let components = signature::RsaPublicKeyComponents::<Vec<u8>>::from(rsa.public());
    let (modulus, exponent) = (components.n, components.e);
    let pkcs8 =
        signature::EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let ec = signature::EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .unwrap();
    let point = ec.public_key().as_ref().to_vec();
    let set = format!(
        r#"{{"keys":[{{"kty":"RSA","kid":"r","n":"{}","e":"{}"}},{{"kty":"EC","crv":"P-256","kid":"e","x":"{}","y":"{}"}}]}}"#,
        b64(&modulus),
        b64(&exponent),
        b64(&point[1..33]),
        b64(&point[33..])
    );
    let keys = key_sets::read_set(set.as_bytes()).expect("the set reads");
    let rs256 = token("RS256", "r", |message| {
        let mut signature = vec![0; rsa.public().modulus_len()];
        rsa.sign(&signature::RSA_PKCS1_SHA256, &rng, message, &mut signature).unwrap();
        signature
    });
    let es256 = token("ES256", "e", |message| ec.sign(&rng, message).unwrap().as_ref().to_vec());
    (keys, rs256, es256)
}

/// What a call with a token never seen does once its key set is held.
fn first_call(keys: &[Arc<Key>], issuer: &IssuerConfig, token: &str, now: u64) -> Arc<Caller> {
    let parsed = jwt::parse(token).expect("a token");
    let alg = Algorithm::from_name(&parsed.alg).expect("an algorithm");
    let key = key_sets::choose(keys, parsed.kid.as_deref()).expect("its key");
    assert!(key.fits(alg) && jwt::verify(&parsed, key, alg));
    let claims = serde_json::Value::Object(parsed.claims);
    jwt::check_claims(issuer, &claims, now).expect("claims pass");
    let sub = claims["sub"].as_str().unwrap().to_owned();
    Arc::new(Caller::new(CallerKind::Jwt, sub, Some(issuer.issuer.clone()), None, None, Some(claims)))
}

fn tokens(criterion: &mut Criterion) {
    let (keys, rs256, es256) = signers();
    let issuer = issuer();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let mut group = criterion.benchmark_group("tokens");
    for (name, token) in [("RS256", &rs256), ("ES256", &es256)] {
        group.bench_function(format!("first/{name}"), |b| {
            b.iter(|| first_call(&keys, &issuer, black_box(token), now))
        });
        let parsed = jwt::parse(token).unwrap();
        let alg = Algorithm::from_name(name).unwrap();
        let key = key_sets::choose(&keys, parsed.kid.as_deref()).unwrap().clone();
        group.bench_function(format!("verify_only/{name}"), |b| {
            b.iter(|| {
                assert!(
                    jsonwebtoken::crypto::verify(
                        parsed.signature,
                        parsed.message.as_bytes(),
                        &key.decoding,
                        if alg == Algorithm::RS256 {
                            jsonwebtoken::Algorithm::RS256
                        } else {
                            jsonwebtoken::Algorithm::ES256
                        },
                    )
                    .unwrap()
                )
            })
        });
    }
    // A token verified before: the memory answers, the route's checks run.
    let verified = Verified::new(recast::callers::verified::DEFAULT_BYTES);
    let caller = first_call(&keys, &issuer, &rs256, now);
    let digest = consumers::digest(rs256.as_bytes());
    let known = verified.insert(
        digest,
        Token {
            issuer: issuer.issuer.clone(),
            source: key_sets::Source::Jwks("https://id.bench/keys".into()),
            alg: Algorithm::RS256,
            generation: 1,
            claims: caller.claims.clone().unwrap(),
            caller: caller.clone(),
            aud: caller.claims.as_ref().and_then(|c| c.get("aud")).cloned().unwrap_or_default(),
            times: recast::callers::verified::Times { exp: now + 3600, nbf: None, iat: None },
        },
    );
    group.bench_function("repeated", |b| {
        b.iter(|| {
            let digest = consumers::digest(black_box(rs256.as_bytes()));
            let known = verified.get(&digest).expect("remembered");
            jwt::check_known(&issuer, &known, now).expect("claims pass");
            known.caller.clone()
        })
    });
    // Repeated on one connection: what the connection kept answers, without the digest.
    let memo = Memo::default();
    memo.keep_token(rs256.as_bytes(), &known);
    group.bench_function("repeated_kept", |b| {
        b.iter(|| {
            let known = memo.token(black_box(rs256.as_bytes()), now).expect("kept");
            jwt::check_known(&issuer, &known, now).expect("claims pass");
            known.caller.clone()
        })
    });
    group.finish();
}

fn digests(criterion: &mut Criterion) {
    use sha2::Digest as _;
    let key = consumers::issue(1, None).key.into_bytes();
    let token = vec![b'a'; 450];
    let mut group = criterion.benchmark_group("digest");
    for (what, bytes) in [("key", &key), ("token", &token)] {
        group.bench_function(format!("ring/{what}"), |b| {
            b.iter(|| ring::digest::digest(&ring::digest::SHA256, black_box(bytes)))
        });
        group.bench_function(format!("sha2/{what}"), |b| b.iter(|| sha2::Sha256::digest(black_box(bytes))));
    }
    group.finish();
}
