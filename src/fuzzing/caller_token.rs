//! The `caller_token` target: a key set and a bearer token, read and checked as a route's door
//! reads them (`crate::callers`): the key set's reader, the token's reader, the choice of key,
//! the signature and the claims, without a network.

use serde_json::Value;

use crate::callers::config::{Algorithm, IssuerConfig};
use crate::callers::jwt::{self, MAX_TOKEN};
use crate::callers::key_sets::{self, MAX_KEYS};
use crate::callers::{Refusal, consumers};

/// What one input reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenReached {
    /// The token was refused by its form (or the key set by its).
    Refused,
    /// Read, but no key of the set may check it, or its algorithm is not taken.
    NoKey,
    /// Its signature does not verify.
    BadSignature,
    /// Verified; its claims refused.
    ClaimsRefused,
    /// Verified, and its claims pass.
    Admitted,
}

/// The issuer every input is checked against: `iss` `https://id.test/`, `aud` `orders`, the
/// default algorithms and ES384, a scope condition, at 2026-12-07T00:00:00Z.
fn issuer() -> IssuerConfig {
    IssuerConfig {
        issuer: "https://id.test/".into(),
        audiences: vec!["orders".into()],
        jwks_uri: None,
        algorithms: vec![Algorithm::RS256, Algorithm::ES256, Algorithm::ES384, Algorithm::EdDSA],
        claims: [("scope".to_owned(), Value::from("orders:read"))].into(),
        leeway_seconds: 30,
    }
}

const NOW: u64 = 1_796_601_600;

/// The input is a key set's text, a 0 byte, then a token's text. Checks that nothing panics;
/// that the key set holds at most 64 keys; that a token over 8 KiB, or with an algorithm not
/// taken (`none`, `HS*`), never passes; that a key is used only for an algorithm its type and
/// curve fit; and that a token admitted has the issuer's `iss`, an `aud` it lists, and an `exp`
/// not past (within the leeway), and is not a key's form.
pub fn caller_token(data: &[u8]) -> TokenReached {
    let (set, token) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b""[..], data),
    };
    let keys = key_sets::read_set(set).unwrap_or_default();
    assert!(keys.len() <= MAX_KEYS);
    let Ok(token) = std::str::from_utf8(token) else { return TokenReached::Refused };
    let parsed = match jwt::parse(token) {
        Ok(parsed) => parsed,
        Err(Refusal::Unauthenticated { given: true, .. }) => return TokenReached::Refused,
        Err(other) => panic!("a token's form is refused as unauthenticated only: {other:?}"),
    };
    assert!(token.len() <= MAX_TOKEN);
    let issuer = issuer();
    // `none` and `HS*` are no algorithm at all: nothing can check them.
    let Some(alg) = Algorithm::from_name(&parsed.alg).filter(|alg| issuer.algorithms.contains(alg)) else {
        return TokenReached::NoKey;
    };
    assert!(parsed.alg != "none" && !parsed.alg.starts_with("HS"));
    let Some(key) = key_sets::choose(&keys, parsed.kid.as_deref()).filter(|key| key.fits(alg)) else {
        return TokenReached::NoKey;
    };
    if !jwt::verify(&parsed, key, alg) {
        return TokenReached::BadSignature;
    }
    let claims = Value::Object(parsed.claims.clone());
    match jwt::check_claims(&issuer, &claims, NOW) {
        Ok(times) => {
            assert_eq!(claims["iss"], "https://id.test/");
            assert!(
                times.exp + 30 > NOW
                    && claims["exp"].as_f64().is_some_and(|exp| exp.floor() == times.exp as f64)
            );
            let aud_ok = match &claims["aud"] {
                Value::String(aud) => aud == "orders",
                Value::Array(auds) => auds.iter().any(|a| a == "orders"),
                _ => false,
            };
            assert!(aud_ok, "{claims}");
            assert!(claims["exp"].as_f64().is_some_and(|exp| exp + 30.0 > NOW as f64), "{claims}");
            assert!(!consumers::looks_like_key(token.as_bytes()));
            TokenReached::Admitted
        }
        Err(_) => TokenReached::ClaimsRefused,
    }
}
