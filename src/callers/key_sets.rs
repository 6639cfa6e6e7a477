//! The issuers' key sets (SPEC §2.4): one copy per URI, whichever routes read it; fetched under
//! the outbound policy through the upstream client, at most 64 KiB and 64 keys; kept for the
//! answer's `Cache-Control` max-age clamped to 1 minute … 24 hours (15 minutes when it says
//! none) and fetched again in the background before that ends. A token whose `kid` the set
//! lacks fetches it again, at most once per 30 s per set, one fetch for every call waiting on it;
//! a failed fetch keeps the last good set (logged, counted), so an outage of the issuer leaves
//! tokens of known keys working.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use dashmap::DashMap;
use http::{HeaderMap, HeaderValue, Method, Uri};
use jsonwebtoken::DecodingKey;
use serde_json::Value;
use tokio::time::Instant;

use super::caller::Refusal;
use super::config::Algorithm;
use crate::metrics::PanicSite;
use crate::tasks::Tasks;
use crate::upstream::{UpstreamClient, UpstreamRequest};

/// The largest key set (and discovery document) read.
pub const MAX_SET_BYTES: usize = 64 * 1024;
/// Most keys of one set.
pub const MAX_KEYS: usize = 64;
/// How long a set is kept when its answer does not say, and the bounds of what it says.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(15 * 60);
const MIN_LIFETIME: Duration = Duration::from_secs(60);
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest time between two fetches of one set for unknown `kid`s.
pub const UNKNOWN_KID_INTERVAL: Duration = Duration::from_secs(30);
/// After a failed fetch, how long before another is tried (a background refresh, or, while no
/// set was ever fetched, a call's).
const FAILURE_HOLD: Duration = Duration::from_secs(5);

/// Where a key set comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A `jwksUri`.
    Jwks(String),
    /// The issuer's OpenID discovery document (`{issuer}/.well-known/openid-configuration`),
    /// whose `issuer` must be the issuer and whose `jwks_uri` names the set.
    Discovery(String),
}

/// The type and curve of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    Rsa,
    P256,
    P384,
    Ed25519,
}

/// A public key of a set, ready to check signatures.
pub struct Key {
    pub kid: Option<String>,
    pub kind: KeyType,
    /// The key's own `alg`, when it names one it may be used with.
    pub alg: Option<Algorithm>,
    pub decoding: DecodingKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("kind", &self.kind)
            .field("alg", &self.alg)
            .finish()
    }
}

/// A set as fetched.
#[derive(Debug)]
pub struct KeySet {
    pub keys: Vec<Arc<Key>>,
    /// Changes whenever a fetch brings keys other than the set held: tokens verified with an
    /// older generation are verified again.
    pub generation: u64,
    /// SHA-256 of the keys' text, to tell whether a fetch changed them.
    digest: [u8; 32],
}

impl KeySet {
    fn find(&self, kid: Option<&str>) -> Option<&Arc<Key>> {
        choose(&self.keys, kid)
    }
}

/// The key of `keys` that `kid` names; without a `kid`, the only key when there is one.
pub fn choose<'k>(keys: &'k [Arc<Key>], kid: Option<&str>) -> Option<&'k Arc<Key>> {
    match kid {
        Some(kid) => keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
        None if keys.len() == 1 => keys.first(),
        None => None,
    }
}

/// Why a fetch was made (the `reason` label of `recast_key_set_fetches_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Reason {
    /// No set held yet.
    New,
    /// The set held is near its end.
    Refresh,
    /// A token named a `kid` the set lacks.
    UnknownKid,
}

impl Reason {
    pub const ALL: [Reason; 3] = [Reason::New, Reason::Refresh, Reason::UnknownKid];

    pub fn label(self) -> &'static str {
        match self {
            Reason::New => "new",
            Reason::Refresh => "refresh",
            Reason::UnknownKid => "unknown_kid",
        }
    }
}

/// Fetches made, by reason, and how many of them failed.
#[derive(Default)]
pub struct Counts {
    pub fetched: [AtomicU64; 3],
    pub failed: [AtomicU64; 3],
}

/// One source's set and its fetches.
struct Slot {
    source: Source,
    set: RwLock<Option<Arc<KeySet>>>,
    /// The generation of the set held (0: none yet), read without the lock.
    generation: AtomicU64,
    /// When the set held should be fetched again.
    refresh_at: Mutex<Option<Instant>>,
    /// Held by the one fetch under way; calls that need its outcome wait on it.
    fetching: tokio::sync::Mutex<()>,
    /// Fetches ended, failed or not: a call that waited for the lock sees whether one ended
    /// meanwhile, and then takes its outcome instead of fetching again.
    ended: AtomicU64,
    last_unknown_kid: Mutex<Option<Instant>>,
    last_failure: Mutex<Option<Instant>>,
    /// Whether a background refresh is under way.
    refreshing: std::sync::atomic::AtomicBool,
}

impl Slot {
    fn current(&self) -> Option<Arc<KeySet>> {
        self.set.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One source's place among the key sets, kept by an issuer (places are never removed).
pub struct Held(Arc<Slot>);

impl Held {
    /// The generation of the set held now, if one is.
    pub fn generation(&self) -> Option<u64> {
        Some(self.0.generation.load(Ordering::Acquire)).filter(|g| *g != 0)
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Held").field(&self.0.source).finish()
    }
}

/// Every key set the routes read.
pub struct KeySets {
    slots: DashMap<Source, Arc<Slot>>,
    client: UpstreamClient,
    tasks: Tasks,
    pub counts: Arc<Counts>,
    generations: AtomicU64,
}

impl KeySets {
    pub fn new(client: UpstreamClient, tasks: Tasks) -> KeySets {
        KeySets {
            slots: DashMap::new(),
            client,
            tasks,
            counts: Arc::default(),
            generations: AtomicU64::new(0),
        }
    }

    fn slot(&self, source: &Source) -> Arc<Slot> {
        if let Some(slot) = self.slots.get(source) {
            return slot.clone();
        }
        self.slots
            .entry(source.clone())
            .or_insert_with(|| {
                Arc::new(Slot {
                    source: source.clone(),
                    set: RwLock::new(None),
                    generation: AtomicU64::new(0),
                    refresh_at: Mutex::new(None),
                    fetching: tokio::sync::Mutex::new(()),
                    ended: AtomicU64::new(0),
                    last_unknown_kid: Mutex::new(None),
                    last_failure: Mutex::new(None),
                    refreshing: Default::default(),
                })
            })
            .clone()
    }

    /// The generation of the set held for `source`, if one is.
    pub fn generation(&self, source: &Source) -> Option<u64> {
        Held(self.slots.get(source)?.clone()).generation()
    }

    /// `source`'s place, whose generation a remembered token is checked against on every call.
    pub fn place(&self, source: &Source) -> Held {
        Held(self.slot(source))
    }

    /// How many sets are held.
    pub fn held(&self) -> usize {
        self.slots.iter().filter(|slot| slot.current().is_some()).count()
    }

    /// The key of `source`'s set that `kid` names (the set's only key without one), and the
    /// set's generation; the set is fetched when none is held, and again (at most once per 30 s)
    /// when it lacks `kid`.
    pub async fn key_for(
        self: &Arc<Self>,
        source: &Source,
        kid: Option<&str>,
    ) -> Result<(Arc<Key>, u64), Refusal> {
        let slot = self.slot(source);
        let set = match slot.current() {
            Some(set) => {
                let due = locked(&slot.refresh_at).is_some_and(|at| Instant::now() >= at);
                if due {
                    self.refresh_in_background(&slot);
                }
                set
            }
            None => {
                self.fetch(&slot, Reason::New).await;
                slot.current().ok_or_else(|| Refusal::Unauthenticated {
                    given: true,
                    why: "the issuer's key set could not be fetched".into(),
                })?
            }
        };
        if let Some(key) = set.find(kid) {
            return Ok((key.clone(), set.generation));
        }
        let Some(kid) = kid else {
            return Err(Refusal::Unauthenticated {
                given: true,
                why: "the token names no key (`kid`) and the issuer's key set holds several".into(),
            });
        };
        self.fetch(&slot, Reason::UnknownKid).await;
        match slot.current() {
            Some(set) => match set.find(Some(kid)) {
                Some(key) => Ok((key.clone(), set.generation)),
                None => Err(Refusal::Unauthenticated {
                    given: true,
                    why: "the token is signed by a key the issuer's key set does not hold".into(),
                }),
            },
            None => Err(Refusal::Unauthenticated {
                given: true,
                why: "the issuer's key set could not be fetched".into(),
            }),
        }
    }

    /// Fetches the set again ahead of the first call (at registration and start): its outcome
    /// is only kept.
    pub fn prefetch(self: &Arc<Self>, source: &Source) {
        let slot = self.slot(source);
        if slot.current().is_none() {
            self.refresh_in_background(&slot);
        }
    }

    fn refresh_in_background(self: &Arc<Self>, slot: &Arc<Slot>) {
        if slot.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (sets, slot) = (self.clone(), slot.clone());
        drop(self.tasks.spawn(PanicSite::Background, async move {
            let reason = if slot.current().is_some() { Reason::Refresh } else { Reason::New };
            sets.fetch(&slot, reason).await;
            slot.refreshing.store(false, Ordering::Release);
        }));
    }

    /// One fetch of `slot`'s set, unless one ended while this call waited for the lock, or the
    /// reason's interval has not passed.
    async fn fetch(&self, slot: &Slot, reason: Reason) {
        let seen = slot.ended.load(Ordering::Acquire);
        let _held = slot.fetching.lock().await;
        if slot.ended.load(Ordering::Acquire) != seen {
            return;
        }
        let now = Instant::now();
        match reason {
            Reason::UnknownKid => {
                let mut last = locked(&slot.last_unknown_kid);
                if last.is_some_and(|at| now.duration_since(at) < UNKNOWN_KID_INTERVAL) {
                    return;
                }
                *last = Some(now);
            }
            Reason::New | Reason::Refresh => {
                if locked(&slot.last_failure).is_some_and(|at| now.duration_since(at) < FAILURE_HOLD) {
                    return;
                }
            }
        }
        self.counts.fetched[reason as usize].fetch_add(1, Ordering::Relaxed);
        match self.fetch_set(&slot.source).await {
            Ok((keys, digest, lifetime)) => {
                let mut held = slot.set.write().unwrap_or_else(PoisonError::into_inner);
                let generation = match held.as_ref() {
                    Some(old) if old.digest == digest => old.generation,
                    _ => self.generations.fetch_add(1, Ordering::Relaxed) + 1,
                };
                *held = Some(Arc::new(KeySet { keys, generation, digest }));
                slot.generation.store(generation, Ordering::Release);
                drop(held);
                // Fetched again when a tenth of its life is left.
                *locked(&slot.refresh_at) = Some(Instant::now() + lifetime - lifetime / 10);
                *locked(&slot.last_failure) = None;
                tracing::debug!(source = ?slot.source, reason = reason.label(), "fetched a key set");
            }
            Err(why) => {
                self.counts.failed[reason as usize].fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                *locked(&slot.last_failure) = Some(now);
                if slot.current().is_some() {
                    *locked(&slot.refresh_at) = Some(now + UNKNOWN_KID_INTERVAL);
                }
                tracing::warn!(source = ?slot.source, reason = reason.label(), %why, "a key set could not be fetched; the last good one is kept");
            }
        }
        slot.ended.fetch_add(1, Ordering::Release);
    }

    async fn fetch_set(&self, source: &Source) -> Result<(Vec<Arc<Key>>, [u8; 32], Duration), String> {
        let uri = match source {
            Source::Jwks(uri) => uri.clone(),
            Source::Discovery(issuer) => {
                let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
                let (body, _) = self.get(&url).await?;
                let document: Value = serde_json::from_slice(&body)
                    .map_err(|_| "the discovery document is not JSON".to_owned())?;
                if document.get("issuer").and_then(Value::as_str) != Some(issuer.as_str()) {
                    return Err("the discovery document's `issuer` is not the issuer".to_owned());
                }
                match document.get("jwks_uri").and_then(Value::as_str) {
                    Some(uri) if uri.starts_with("https://") || uri.starts_with("http://") => uri.to_owned(),
                    _ => return Err("the discovery document has no `jwks_uri`".to_owned()),
                }
            }
        };
        let (body, max_age) = self.get(&uri).await?;
        let keys = read_set(&body)?;
        let digest = super::consumers::digest(&body);
        let lifetime = max_age
            .map_or(DEFAULT_LIFETIME, |age| Duration::from_secs(age).clamp(MIN_LIFETIME, MAX_LIFETIME));
        Ok((keys, digest, lifetime))
    }

    /// A GET under the outbound policy: the body (at most [`MAX_SET_BYTES`]) and the seconds
    /// its `Cache-Control` lets it be kept.
    async fn get(&self, url: &str) -> Result<(Vec<u8>, Option<u64>), String> {
        let uri: Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
        let mut headers = HeaderMap::new();
        headers.insert(http::header::ACCEPT, HeaderValue::from_static("application/json"));
        let request = UpstreamRequest { method: Method::GET, uri, headers, body: bytes::Bytes::new() };
        let answer = self.client.call(request).await.map_err(|e| e.to_string())?;
        if !answer.status.is_success() {
            return Err(format!("it answered {}", answer.status.as_u16()));
        }
        if answer.body.len() > MAX_SET_BYTES {
            return Err(format!("it is larger than {} KiB", MAX_SET_BYTES / 1024));
        }
        Ok((answer.body, answer.freshness.fresh_for()))
    }
}

/// The keys of a JWK Set (RFC 7517) that may check signatures: `use` absent or `sig`, of a type
/// and curve recast verifies; at most [`MAX_KEYS`] in all. Others are passed over.
pub fn read_set(body: &[u8]) -> Result<Vec<Arc<Key>>, String> {
    if body.len() > MAX_SET_BYTES {
        return Err(format!("the key set is larger than {} KiB", MAX_SET_BYTES / 1024));
    }
    let set: Value = serde_json::from_slice(body).map_err(|_| "the key set is not JSON".to_owned())?;
    let Some(Value::Array(given)) = set.get("keys") else {
        return Err("the key set has no `keys` list".to_owned());
    };
    if given.len() > MAX_KEYS {
        return Err(format!("the key set holds more than {MAX_KEYS} keys"));
    }
    let mut keys = Vec::new();
    for jwk in given {
        if let Some(key) = read_key(jwk) {
            keys.push(Arc::new(key));
        }
    }
    Ok(keys)
}

fn read_key(jwk: &Value) -> Option<Key> {
    let text = |name: &str| jwk.get(name).and_then(Value::as_str);
    if text("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let alg = match text("alg") {
        None => None,
        Some(name) => Some(Algorithm::from_name(name)?),
    };
    let (kind, decoding) = match (text("kty")?, text("crv")) {
        ("RSA", _) => (KeyType::Rsa, DecodingKey::from_rsa_components(text("n")?, text("e")?).ok()?),
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (x, y) = (text("x")?, text("y")?);
            let size = if crv == "P-256" { 32 } else { 48 };
            // Coordinates of the curve's size, so a point is never read on another curve.
            if base64_len(x) != Some(size) || base64_len(y) != Some(size) {
                return None;
            }
            let kind = if crv == "P-256" { KeyType::P256 } else { KeyType::P384 };
            (kind, DecodingKey::from_ec_components(x, y).ok()?)
        }
        ("OKP", Some("Ed25519")) => {
            let x = text("x")?;
            if base64_len(x) != Some(32) {
                return None;
            }
            (KeyType::Ed25519, DecodingKey::from_ed_components(x).ok()?)
        }
        _ => return None,
    };
    Some(Key { kid: text("kid").map(str::to_owned), kind, alg, decoding })
}

fn base64_len(text: &str) -> Option<usize> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).ok().map(|bytes| bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_keeps_the_signing_keys_it_can_use_and_is_bounded() {
        let set = serde_json::json!({"keys": [
            {"kty": "EC", "crv": "P-256", "kid": "e", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "EC", "crv": "P-256", "kid": "short", "x": "AAAA", "y": "AAAA"},
            {"kty": "EC", "crv": "P-256", "kid": "enc", "use": "enc", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty": "EC", "crv": "P-256", "kid": "alg", "alg": "HS256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}
        ]});
        let keys = read_set(set.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref().unwrap()).collect();
        assert_eq!(kids, ["e", "ed"]);
        assert!(
            keys[0].fits(Algorithm::ES256)
                && !keys[0].fits(Algorithm::ES384)
                && !keys[0].fits(Algorithm::RS256)
        );
        assert!(keys[1].fits(Algorithm::EdDSA) && !keys[1].fits(Algorithm::ES256));
        let many = serde_json::json!({"keys": vec![serde_json::json!({"kty": "oct"}); MAX_KEYS + 1]});
        assert!(read_set(many.to_string().as_bytes()).unwrap_err().contains("more than 64 keys"));
        assert!(read_set(&vec![b' '; MAX_SET_BYTES + 1]).unwrap_err().contains("larger than 64 KiB"));
        assert!(read_set(b"{}").is_err());
    }
}
