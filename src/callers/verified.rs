//! Tokens already verified, remembered by their SHA-256 until their `exp` or a change of the key
//! set that verified them, within a bounded memory (SPEC §2.4): a caller repeating a token pays
//! one signature check. What a route checks of the claims (`aud`, times, conditions) is checked
//! again on every call, since routes differ in what they ask.

use std::sync::Arc;

use quick_cache::Weighter;
use quick_cache::sync::Cache;
use serde_json::Value;

use super::caller::{Caller, Refusal, now_ms};
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
    /// Its `aud` claim (`null` when it has none), read when it was verified.
    pub aud: Value,
    /// Its `exp`, `nbf` and `iat`, read when it was verified.
    pub times: Times,
}

#[derive(Clone)]
struct TokenBytes;

/// What a token's entry holds about: its claims' text (twice: the claims and the caller's
/// `$caller`; and its `aud` again) and the entry itself.
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
        if token.times.exp <= now_ms() / 1000 {
            self.tokens.remove(digest);
            return None;
        }
        Some(token)
    }

    pub fn insert(&self, digest: [u8; 32], token: Token) -> Arc<Token> {
        let token = Arc::new(token);
        self.tokens.insert(digest, token.clone());
        token
    }

    /// How many are remembered (`/metrics`).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// A token's `exp`, `nbf` and `iat` (seconds since the epoch; a time with a fraction counts by
/// its whole seconds, RFC 7519 NumericDate).
#[derive(Debug, Clone, Copy)]
pub struct Times {
    pub exp: u64,
    pub nbf: Option<u64>,
    pub iat: Option<u64>,
}

impl Times {
    pub(super) fn read(claims: &Value) -> Result<Times, Refusal> {
        let time = |name: &str| -> Result<Option<u64>, Refusal> {
            match claims.get(name) {
                None => Ok(None),
                Some(Value::Number(n)) => match n
                    .as_u64()
                    .or_else(|| n.as_f64().filter(|f| *f >= 0.0 && f.is_finite()).map(|f| f as u64))
                {
                    Some(t) => Ok(Some(t)),
                    None => Err(refused(format!("the token's `{name}` is not a time"))),
                },
                Some(_) => Err(refused(format!("the token's `{name}` is not a time"))),
            }
        };
        let Some(exp) = time("exp")? else { return Err(refused("the token has no `exp`")) };
        Ok(Times { exp, nbf: time("nbf")?, iat: time("iat")? })
    }

    pub(super) fn check(&self, leeway: u64, now: u64) -> Result<(), Refusal> {
        if self.exp.saturating_add(leeway) <= now {
            return Err(refused("the token has expired"));
        }
        if self.nbf.is_some_and(|nbf| nbf > now.saturating_add(leeway)) {
            return Err(refused("the token is not valid yet (`nbf`)"));
        }
        if self.iat.is_some_and(|iat| iat > now.saturating_add(leeway)) {
            return Err(refused("the token was issued in the future (`iat`)"));
        }
        Ok(())
    }
}

fn refused(why: impl Into<String>) -> Refusal {
    Refusal::Unauthenticated { given: true, why: why.into() }
}
