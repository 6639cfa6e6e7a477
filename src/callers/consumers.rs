//! Consumers and their API keys (SPEC §2.4): the record the store keeps of each consumer, and the
//! [`Directory`] the request path reads, in memory. A key is 256 random bits shown once
//! (`rk_` and its base64url text); only its SHA-256 digest is kept, and a call's key is found by
//! its digest in one map. A change touches the entries of the one consumer it changes, never
//! the whole map.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use super::caller::{Caller, CallerKind};
use crate::hex;

/// What a key's text starts with.
pub const KEY_PREFIX: &str = "rk_";
/// The characters of a key shown in listings after it was issued (`rk_` and the first eight of
/// its 43): enough to tell keys apart, 48 of its 256 bits.
const SHOWN: usize = KEY_PREFIX.len() + 8;
/// The length of a key's text.
pub const KEY_LEN: usize = KEY_PREFIX.len() + 43;
/// Most keys one consumer holds at once.
pub const MAX_KEYS: usize = 16;
/// The largest metadata of a consumer, as JSON text.
pub const MAX_METADATA: usize = 4096;

/// A consumer as stored: its name, metadata and keys (their digests).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredConsumer {
    pub name: String,
    #[serde(default)]
    pub metadata: serde_json::Value,
    pub created_at: u64,
    pub updated_at: u64,
    #[serde(default)]
    pub keys: Vec<StoredKey>,
}

/// A key as stored: never the key, only its digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredKey {
    pub id: String,
    /// The first characters of the key, to tell it apart in a listing.
    pub prefix: String,
    /// SHA-256 of the key's text, as hex.
    pub digest: String,
    pub created_at: u64,
    /// Milliseconds since the epoch after which the key is refused; `None`: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

/// A key just made: its text, shown once, and what is stored of it.
pub struct IssuedKey {
    pub key: String,
    pub stored: StoredKey,
}

/// Makes a new key: 256 bits from the system's random source.
pub fn issue(now_ms: u64, expires_at: Option<u64>) -> IssuedKey {
    use ring::rand::SecureRandom as _;
    let random = ring::rand::SystemRandom::new();
    let mut bits = [0u8; 32];
    let mut id = [0u8; 8];
    random.fill(&mut bits).expect("the system's random source failed");
    random.fill(&mut id).expect("the system's random source failed");
    let key = format!("{KEY_PREFIX}{}", URL_SAFE_NO_PAD.encode(bits));
    let stored = StoredKey {
        id: hex::encode(&id),
        prefix: key[..SHOWN].to_owned(),
        digest: hex::encode(&digest(key.as_bytes())),
        created_at: now_ms,
        expires_at,
    };
    IssuedKey { key, stored }
}

/// SHA-256 of a key's (or a token's) text, which a call with a key or a token pays once: by the
/// CPU's SHA extensions when it has them (`sha2`), else by ring's vector code, which is faster
/// than `sha2`'s without them.
pub fn digest(key: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    if sha_extensions() {
        use sha2::Digest as _;
        out.copy_from_slice(sha2::Sha256::digest(key).as_slice());
    } else {
        out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, key).as_ref());
    }
    out
}

/// Whether the CPU computes SHA-256 itself (detected once).
fn sha_extensions() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sha") && std::arch::is_x86_feature_detected!("sse4.1")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The hasher of maps keyed by a digest: its first eight bytes, which are as good as random, so
/// no lookup hashes the digest again. Nobody chooses the digests a map holds (they are of keys
/// recast made), so none can crowd one bucket.
#[derive(Default, Clone)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        if let Some(first) = bytes.first_chunk::<8>() {
            self.0 = u64::from_le_bytes(*first);
        } else {
            // Not a digest (a length, say): folded in all the same.
            for &b in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(b);
            }
        }
    }

    fn write_usize(&mut self, _: usize) {
        // A slice's length before its bytes: the same for every digest.
    }
}

type ByDigest<V> = DashMap<[u8; 32], V, std::hash::BuildHasherDefault<DigestHasher>>;

/// Whether `text` has a key's form: `rk_` and 43 base64url characters.
pub fn looks_like_key(text: &[u8]) -> bool {
    text.len() == KEY_LEN
        && text.starts_with(KEY_PREFIX.as_bytes())
        && text[KEY_PREFIX.len()..].iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// A key the directory knows: whose it is, until when, and when it was last used.
pub struct KeyEntry {
    pub id: String,
    pub caller: Arc<Caller>,
    pub expires_at: Option<u64>,
    /// Milliseconds since the epoch of its last use on this node (0: never); written at most
    /// once a second, so calls with one key do not all write one cache line.
    pub last_used: AtomicU64,
    /// Replaced or dropped from the directory: a connection that kept it ([`super::memo`])
    /// looks the key up again.
    retired: AtomicBool,
}

impl KeyEntry {
    pub fn retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    pub fn used(&self, now_ms: u64) {
        if now_ms.saturating_sub(self.last_used.load(Ordering::Relaxed)) >= 1000 {
            self.last_used.store(now_ms, Ordering::Relaxed);
        }
    }
}

/// Every consumer and key, in memory: what a call's key is checked against.
#[derive(Default)]
pub struct Directory {
    /// Keys by the digest of their text.
    keys: ByDigest<Arc<KeyEntry>>,
    /// Consumers by name, as stored.
    consumers: DashMap<String, Arc<StoredConsumer>>,
}

impl Directory {
    /// The key whose text is `key`, if a consumer holds it (expired or not: the caller decides).
    pub fn find(&self, key: &[u8]) -> Option<Arc<KeyEntry>> {
        self.keys.get(&digest(key)).map(|entry| entry.value().clone())
    }

    /// Puts `consumer` in place of what the directory held of it: its keys' entries are added,
    /// replaced or removed, and no other consumer's are touched. A key's last use is kept.
    pub fn put(&self, consumer: StoredConsumer) {
        let caller = Arc::new(Caller::of_consumer(&consumer.name, &consumer.metadata));
        let consumer = Arc::new(consumer);
        let old = self.consumers.insert(consumer.name.clone(), consumer.clone());
        for key in &consumer.keys {
            let Some(digest) = parse_digest(&key.digest) else { continue };
            let last_used = self.keys.get(&digest).map_or(0, |entry| entry.last_used.load(Ordering::Relaxed));
            let entry = Arc::new(KeyEntry {
                id: key.id.clone(),
                caller: caller.clone(),
                expires_at: key.expires_at,
                last_used: AtomicU64::new(last_used),
                retired: AtomicBool::new(false),
            });
            if let Some(old) = self.keys.insert(digest, entry) {
                old.retire();
            }
        }
        if let Some(old) = old {
            for key in old.keys.iter().filter(|k| !consumer.keys.iter().any(|new| new.digest == k.digest)) {
                self.forget_key(&key.digest, &consumer.name);
            }
        }
    }

    /// Forgets a consumer and every key it held.
    pub fn remove(&self, name: &str) {
        if let Some((_, old)) = self.consumers.remove(name) {
            for key in &old.keys {
                self.forget_key(&key.digest, name);
            }
        }
    }

    /// Forgets the key of digest `digest` if it is still consumer `name`'s: a key another
    /// consumer took meanwhile (a routes file that moved it) stays that consumer's.
    fn forget_key(&self, digest: &str, name: &str) {
        if let Some(digest) = parse_digest(digest)
            && let Some((_, old)) = self.keys.remove_if(&digest, |_, entry| entry.caller.id == name)
        {
            old.retire();
        }
    }

    pub fn get(&self, name: &str) -> Option<Arc<StoredConsumer>> {
        self.consumers.get(name).map(|c| c.value().clone())
    }

    /// The last use on this node of the key with the digest `digest` (hex), if it was used.
    pub fn last_used(&self, digest: &str) -> Option<u64> {
        let digest = parse_digest(digest)?;
        let used = self.keys.get(&digest)?.last_used.load(Ordering::Relaxed);
        (used > 0).then_some(used)
    }

    /// Every consumer, by name.
    pub fn all(&self) -> Vec<Arc<StoredConsumer>> {
        let mut all: Vec<_> = self.consumers.iter().map(|c| c.value().clone()).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// How many keys it holds.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

fn parse_digest(text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(text)?;
    bytes.try_into().ok()
}

impl Caller {
    /// The caller a consumer's key makes.
    pub fn of_consumer(name: &str, metadata: &serde_json::Value) -> Caller {
        Caller::new(
            CallerKind::Key,
            name.to_owned(),
            None,
            Some(name.to_owned()),
            Some(metadata.clone()).filter(|m| !m.is_null()),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(name: &str, keys: Vec<StoredKey>) -> StoredConsumer {
        StoredConsumer {
            name: name.into(),
            metadata: serde_json::json!({"tier": "gold"}),
            created_at: 1,
            updated_at: 1,
            keys,
        }
    }

    #[test]
    fn a_key_is_found_by_its_digest_and_only_its_digest_is_kept() {
        let issued = issue(5, None);
        assert!(looks_like_key(issued.key.as_bytes()), "{}", issued.key);
        assert_eq!(issued.stored.prefix, issued.key[..11]);
        let stored = serde_json::to_string(&issued.stored).unwrap();
        assert!(!stored.contains(&issued.key[3..]), "{stored}");
        let directory = Directory::default();
        directory.put(consumer("app", vec![issued.stored.clone()]));
        let found = directory.find(issued.key.as_bytes()).expect("found");
        assert_eq!(found.caller.consumer.as_deref(), Some("app"));
        assert_eq!(found.id, issued.stored.id);
        let mut other = issued.key.clone().into_bytes();
        other[20] ^= 1;
        assert!(directory.find(&other).is_none());
    }

    #[test]
    fn a_key_moved_to_another_consumer_stays_that_consumer_s() {
        let key = issue(1, None);
        let directory = Directory::default();
        directory.put(consumer("one", vec![key.stored.clone()]));
        // A routes file moved the key from `one` to `two`, `two` put first.
        directory.put(consumer("two", vec![key.stored.clone()]));
        directory.put(consumer("one", Vec::new()));
        let found = directory.find(key.key.as_bytes()).expect("the key is `two`'s");
        assert_eq!(found.caller.consumer.as_deref(), Some("two"));
        directory.remove("one");
        assert!(directory.find(key.key.as_bytes()).is_some());
        directory.remove("two");
        assert!(directory.find(key.key.as_bytes()).is_none());
    }

    #[test]
    fn a_change_replaces_one_consumer_s_keys_and_keeps_their_last_use() {
        let (a, b, c) = (issue(1, None), issue(1, None), issue(1, None));
        let directory = Directory::default();
        directory.put(consumer("one", vec![a.stored.clone(), b.stored.clone()]));
        directory.put(consumer("two", vec![c.stored.clone()]));
        directory.find(a.key.as_bytes()).unwrap().used(5000);
        // What a connection may have kept of each ([`super::super::memo`]).
        let (kept_a, kept_b, kept_c) = (
            directory.find(a.key.as_bytes()).unwrap(),
            directory.find(b.key.as_bytes()).unwrap(),
            directory.find(c.key.as_bytes()).unwrap(),
        );
        // `b` revoked.
        directory.put(consumer("one", vec![a.stored.clone()]));
        assert!(directory.find(b.key.as_bytes()).is_none());
        assert_eq!(directory.find(a.key.as_bytes()).unwrap().last_used.load(Ordering::Relaxed), 5000);
        assert!(directory.find(c.key.as_bytes()).is_some());
        // Both of `one`'s entries left the directory (`a`'s was replaced); `two`'s did not.
        assert!(kept_a.retired() && kept_b.retired() && !kept_c.retired());
        let kept_a = directory.find(a.key.as_bytes()).unwrap();
        assert!(!kept_a.retired());
        directory.remove("one");
        assert!(directory.find(a.key.as_bytes()).is_none());
        assert!(kept_a.retired() && !kept_c.retired());
        assert!(directory.find(c.key.as_bytes()).is_some());
        assert_eq!(directory.key_count(), 1);
    }
}
