//! Tokens already verified, remembered by their SHA-256 until their `exp` or a change of the key
//! set that verified them, within a bounded memory (SPEC §2.4): a caller repeating a token pays
//! one signature check. What a route checks of the claims (`aud`, times, conditions) is checked
//! again on every call, since routes differ in what they ask.

use std::sync::Arc;

use quick_cache::Weighter;
use quick_cache::sync::Cache;
use serde_json::Value;

use super::caller::{Caller, now_ms};
use super::config::Algorithm;
use super::key_sets::Source;

/// The bytes the remembered tokens may take, claims included.
pub const DEFAULT_BYTES: u64 = 32 * 1024 * 1024;

/// A verified token: who it makes, what verified it, its claims.
pub struct Token {
    pub issuer: String,
    pub source: Source,
    pub alg: Algorithm,
    /// The generation of the key set that verified it.
    pub generation: u64,
    pub claims: Value,
    pub caller: Arc<Caller>,
    /// Its `exp` (seconds since the epoch).
    pub exp: u64,
}

#[derive(Clone)]
struct TokenBytes;

/// What a token's entry holds about: its claims' text (twice: the claims and the caller's
/// `$caller`) and the entry itself.
impl Weighter<[u8; 32], Arc<Token>> for TokenBytes {
    fn weight(&self, _: &[u8; 32], token: &Arc<Token>) -> u64 {
        let claims = token.caller.claims.as_ref().map_or(0, |c| c.to_string().len() as u64);
        512 + 4 * claims
    }
}

/// The tokens remembered.
pub struct Verified {
    tokens: Cache<[u8; 32], Arc<Token>, TokenBytes>,
}

impl Verified {
    pub fn new(bytes: u64) -> Verified {
        Verified {
            tokens: Cache::with_weighter((bytes / 2048).max(16) as usize, bytes.max(4096), TokenBytes),
        }
    }

    /// The token whose digest is `digest`, while its `exp` has not passed.
    pub fn get(&self, digest: &[u8; 32]) -> Option<Arc<Token>> {
        let token = self.tokens.get(digest)?;
        if token.exp <= now_ms() / 1000 {
            self.tokens.remove(digest);
            return None;
        }
        Some(token)
    }

    pub fn insert(&self, digest: [u8; 32], token: Token) {
        self.tokens.insert(digest, Arc::new(token));
    }

    /// How many are remembered (`/metrics`).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}
