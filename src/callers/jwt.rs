//! A bearer token checked against a route's issuers (SPEC §2.4; RFC 7519, RFC 7515): the compact
//! form, at most 8 KiB; `alg` one the issuer takes (never `none` or `HS*`: the algorithm set has
//! neither); the key its `kid` names in the issuer's key set, of the type and curve `alg` needs;
//! the signature (checked by `jsonwebtoken` over ring); `iss`, `aud`, `exp`, `nbf` and `iat`
//! within the issuer's leeway; and the issuer's `claims` conditions. A token verified once is
//! remembered by its digest ([`super::verified`]), so a caller repeating it pays the claim
//! checks, not the signature.

use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value};

use super::caller::{Caller, CallerKind, Refusal};
use super::config::{Algorithm, IssuerConfig};
use super::key_sets::{Held, Key, KeySets, Source};
use super::memo::Memo;
use super::verified::{Times, Token, Verified};

/// The longest token taken.
pub const MAX_TOKEN: usize = 8 * 1024;

/// One issuer of a route's `callers`, compiled.
#[derive(Debug)]
pub struct Issuer {
    pub config: IssuerConfig,
    /// Where its key set comes from.
    pub source: Source,
    /// That set's place among the key sets, found once.
    held: OnceLock<Held>,
}

impl Issuer {
    pub fn new(config: &IssuerConfig) -> Issuer {
        let source = match &config.jwks_uri {
            Some(uri) => Source::Jwks(uri.clone()),
            None => Source::Discovery(config.issuer.clone()),
        };
        Issuer { config: config.clone(), source, held: OnceLock::new() }
    }

    /// Its key set's place in `key_sets` (a place is never removed, so it is looked up once).
    pub fn held(&self, key_sets: &KeySets) -> &Held {
        self.held.get_or_init(|| key_sets.place(&self.source))
    }
}

/// Whether `text` has the form of a compact JWS: three base64url parts, the first a JSON object
/// (`eyJ`).
pub fn looks_like_token(text: &str) -> bool {
    text.starts_with("eyJ")
        && text.bytes().filter(|b| *b == b'.').count() == 2
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn refused(why: impl Into<String>) -> Refusal {
    Refusal::Unauthenticated { given: true, why: why.into() }
}

/// The parts of a compact token, its header and claims read.
pub struct Parsed<'t> {
    pub alg: String,
    pub kid: Option<String>,
    pub claims: Map<String, Value>,
    /// `header.claims`: what the signature signs.
    pub message: &'t str,
    pub signature: &'t str,
}

/// Reads a compact token's parts (nothing checked but their form).
pub fn parse(token: &str) -> Result<Parsed<'_>, Refusal> {
    if token.len() > MAX_TOKEN {
        return Err(refused(format!("the token is longer than {} KiB", MAX_TOKEN / 1024)));
    }
    let mut parts = token.splitn(3, '.');
    let (Some(header), Some(claims_part), Some(signature)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(refused("the token is not a compact JWT (three parts separated by dots)"));
    };
    if signature.contains('.') {
        return Err(refused("the token is not a compact JWT (three parts separated by dots)"));
    }
    let object = |part: &str, what: &str| -> Result<Map<String, Value>, Refusal> {
        let bytes = URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| refused(format!("the token's {what} is not base64url")))?;
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(members)) => Ok(members),
            _ => Err(refused(format!("the token's {what} is not a JSON object"))),
        }
    };
    let header_members = object(header, "header")?;
    if header_members.contains_key("crit") {
        return Err(refused("the token's header has critical extensions (`crit`), which are not understood"));
    }
    match header_members.get("typ").map(|typ| typ.as_str().map(str::to_ascii_lowercase)) {
        None => {}
        Some(Some(typ))
            if matches!(typ.as_str(), "jwt" | "at+jwt" | "application/jwt" | "application/at+jwt") => {}
        Some(_) => return Err(refused("the token's `typ` is not a JWT")),
    }
    let Some(Value::String(alg)) = header_members.get("alg") else {
        return Err(refused("the token's header has no `alg`"));
    };
    let kid = match header_members.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(refused("the token's `kid` is not a string")),
    };
    let claims = object(claims_part, "claims")?;
    let message = &token[..header.len() + 1 + claims_part.len()];
    Ok(Parsed { alg: alg.clone(), kid, claims, message, signature })
}

/// What the memory of verified tokens says of `token` on a route that takes tokens of
/// `issuers` at `now` (seconds): `None` when it must be verified (never seen, or seen under
/// another key set, algorithm or issuer than this route's); else the route's claim checks'
/// outcome, or the refusal of a token too long to have been remembered. The connection's `memo`
/// answers for the token it presented last, without its digest.
pub fn remembered(
    key_sets: &KeySets,
    verified: &Verified,
    issuers: &[Arc<Issuer>],
    token: &[u8],
    now: u64,
    memo: Option<&Memo>,
) -> Option<Result<Arc<Caller>, Refusal>> {
    if token.len() > MAX_TOKEN {
        return Some(Err(refused(format!("the token is longer than {} KiB", MAX_TOKEN / 1024))));
    }
    let known = match memo.and_then(|memo| memo.token(token, now)) {
        Some(known) => known,
        None => {
            let known = verified.get(&super::consumers::digest(token))?;
            if let Some(memo) = memo {
                memo.keep_token(token, &known);
            }
            known
        }
    };
    // Verified before, against a key of the set `known.source` held then: still that set's, and
    // this route's issuer takes its issuer, algorithm and set.
    let issuer = issuers.iter().find(|i| i.config.issuer == known.issuer)?;
    let same = issuer.source == known.source
        && issuer.config.algorithms.contains(&known.alg)
        && issuer.held(key_sets).generation() == Some(known.generation);
    same.then(|| check_known(&issuer.config, &known, now).map(|()| known.caller.clone()))
}

/// The caller `token` makes on a route that takes tokens of `issuers`, checked at `now` (seconds):
/// a token the memory of verified tokens does not answer for ([`remembered`]), verified, then
/// remembered (and kept in the connection's `memo`).
pub async fn admit(
    key_sets: &Arc<KeySets>,
    verified: &Verified,
    issuers: &[Arc<Issuer>],
    token: &str,
    now: u64,
    memo: Option<&Memo>,
) -> Result<Arc<Caller>, Refusal> {
    let parsed = parse(token)?;
    let Some(Value::String(iss)) = parsed.claims.get("iss") else {
        return Err(refused("the token has no `iss`"));
    };
    let Some(issuer) = issuers.iter().find(|i| i.config.issuer == *iss) else {
        return Err(refused("the token's issuer is not one this route takes"));
    };
    let Some(alg) = Algorithm::from_name(&parsed.alg).filter(|alg| issuer.config.algorithms.contains(alg))
    else {
        return Err(refused("the token is signed with an algorithm this route does not take"));
    };
    let (key, generation) = key_sets.key_for(&issuer.source, parsed.kid.as_deref()).await?;
    if !key.fits(alg) {
        return Err(refused("the key the token names is not of the type or curve its algorithm needs"));
    }
    if !verify(&parsed, &key, alg) {
        return Err(refused("the token's signature is not valid"));
    }
    let claims = Value::Object(parsed.claims);
    // Checked before it is remembered: a token that fails is not kept.
    let times = check_claims(&issuer.config, &claims, now)?;
    let Some(sub) = claims.get("sub").and_then(Value::as_str) else {
        return Err(refused("the token has no `sub`"));
    };
    let digest = super::consumers::digest(token.as_bytes());
    let caller = Arc::new(Caller::new(
        CallerKind::Jwt,
        sub.to_owned(),
        Some(issuer.config.issuer.clone()),
        None,
        None,
        Some(claims.clone()),
    ));
    let aud = claims.get("aud").cloned().unwrap_or(Value::Null);
    let known = verified.insert(
        digest,
        Token {
            issuer: issuer.config.issuer.clone(),
            source: issuer.source.clone(),
            alg,
            generation,
            claims,
            caller: caller.clone(),
            aud,
            times,
        },
    );
    if let Some(memo) = memo {
        memo.keep_token(token.as_bytes(), &known);
    }
    Ok(caller)
}

/// Whether `parsed`'s signature is `key`'s over its header and claims, by `alg`.
pub fn verify(parsed: &Parsed<'_>, key: &Key, alg: Algorithm) -> bool {
    jsonwebtoken::crypto::verify(parsed.signature, parsed.message.as_bytes(), &key.decoding, to_jwt(alg))
        .unwrap_or(false)
}

fn to_jwt(alg: Algorithm) -> jsonwebtoken::Algorithm {
    match alg {
        Algorithm::RS256 => jsonwebtoken::Algorithm::RS256,
        Algorithm::RS384 => jsonwebtoken::Algorithm::RS384,
        Algorithm::RS512 => jsonwebtoken::Algorithm::RS512,
        Algorithm::PS256 => jsonwebtoken::Algorithm::PS256,
        Algorithm::PS384 => jsonwebtoken::Algorithm::PS384,
        Algorithm::PS512 => jsonwebtoken::Algorithm::PS512,
        Algorithm::ES256 => jsonwebtoken::Algorithm::ES256,
        Algorithm::ES384 => jsonwebtoken::Algorithm::ES384,
        Algorithm::EdDSA => jsonwebtoken::Algorithm::EdDSA,
    }
}

impl Key {
    /// Whether this key may check a signature of `alg`: its type, its curve, and its own `alg`
    /// and `use` when it names them.
    pub fn fits(&self, alg: Algorithm) -> bool {
        use super::key_sets::KeyType;
        let family = matches!(
            (self.kind, alg),
            (
                KeyType::Rsa,
                Algorithm::RS256
                    | Algorithm::RS384
                    | Algorithm::RS512
                    | Algorithm::PS256
                    | Algorithm::PS384
                    | Algorithm::PS512
            ) | (KeyType::P256, Algorithm::ES256)
                | (KeyType::P384, Algorithm::ES384)
                | (KeyType::Ed25519, Algorithm::EdDSA)
        );
        family && self.alg.is_none_or(|own| own == alg)
    }
}

/// The checks of a verified token's claims against one issuer: `iss`, `aud`, the times within
/// the leeway, and the `claims` conditions (a failed condition is 403: the caller is known).
/// Gives the times it read, which a remembered token keeps ([`check_known`]).
pub fn check_claims(issuer: &IssuerConfig, claims: &Value, now: u64) -> Result<Times, Refusal> {
    if claims.get("iss").and_then(Value::as_str) != Some(issuer.issuer.as_str()) {
        return Err(refused("the token's issuer is not one this route takes"));
    }
    check_audience(issuer, claims.get("aud"))?;
    let times = Times::read(claims)?;
    times.check(issuer.leeway_seconds, now)?;
    check_conditions(issuer, claims)?;
    Ok(times)
}

/// [`check_claims`] of a token verified and remembered before, whose issuer is `issuer` and whose
/// times were read then: what differs from route to route (audiences, leeway, conditions) and
/// from call to call (the clock) is checked again; what does not is not read again.
pub fn check_known(issuer: &IssuerConfig, known: &Token, now: u64) -> Result<(), Refusal> {
    check_audience(issuer, Some(&known.aud))?;
    known.times.check(issuer.leeway_seconds, now)?;
    check_conditions(issuer, &known.claims)
}

/// `aud`: the token's audience claim.
fn check_audience(issuer: &IssuerConfig, aud: Option<&Value>) -> Result<(), Refusal> {
    let audience_ok = match aud {
        Some(Value::String(aud)) => issuer.audiences.iter().any(|a| a == aud),
        Some(Value::Array(auds)) => {
            auds.iter().any(|aud| aud.as_str().is_some_and(|aud| issuer.audiences.iter().any(|a| a == aud)))
        }
        _ => false,
    };
    if audience_ok { Ok(()) } else { Err(refused("the token is meant for another audience")) }
}

fn check_conditions(issuer: &IssuerConfig, claims: &Value) -> Result<(), Refusal> {
    if issuer.claims.is_empty() {
        return Ok(());
    }
    for (name, wanted) in &issuer.claims {
        if !claim_holds(claims.get(name.as_str()), name, wanted) {
            return Err(Refusal::Forbidden(format!("the token's `{name}` claim does not allow this route")));
        }
    }
    Ok(())
}

/// Whether a claim meets a condition: a list must contain the value, a space-separated `scope`
/// must hold it as one of its words, anything else must equal it.
fn claim_holds(claim: Option<&Value>, name: &str, wanted: &Value) -> bool {
    match claim {
        None => false,
        Some(Value::Array(items)) => items.contains(wanted),
        Some(Value::String(text)) if name == "scope" || name == "scp" => {
            wanted.as_str().is_some_and(|wanted| text.split(' ').any(|word| word == wanted))
        }
        Some(value) => value == wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer(claims: Value) -> IssuerConfig {
        IssuerConfig {
            issuer: "https://id.example.com/".into(),
            audiences: vec!["orders".into()],
            jwks_uri: None,
            algorithms: Algorithm::DEFAULT.to_vec(),
            claims: serde_json::from_value(claims).unwrap(),
            leeway_seconds: 30,
        }
    }

    fn token_claims(extra: Value) -> Value {
        let mut claims =
            serde_json::json!({"iss": "https://id.example.com/", "aud": "orders", "sub": "u1", "exp": 2000});
        claims.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        claims
    }

    fn why<T: std::fmt::Debug>(result: Result<T, Refusal>) -> String {
        match result {
            Err(Refusal::Unauthenticated { why, .. }) => format!("401 {why}"),
            Err(Refusal::Forbidden(why)) => format!("403 {why}"),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn each_claim_check_refuses_what_it_must() {
        let plain = issuer(serde_json::json!({}));
        assert!(check_claims(&plain, &token_claims(serde_json::json!({})), 1000).is_ok());
        assert_eq!(
            why(check_claims(&plain, &token_claims(serde_json::json!({"iss": "https://other/"})), 1000)),
            "401 the token's issuer is not one this route takes"
        );
        assert_eq!(
            why(check_claims(&plain, &token_claims(serde_json::json!({"aud": ["x", "y"]})), 1000)),
            "401 the token is meant for another audience"
        );
        assert!(
            check_claims(&plain, &token_claims(serde_json::json!({"aud": ["x", "orders"]})), 1000).is_ok()
        );
        // Expired: past `exp` by more than the leeway; within it, taken.
        assert_eq!(
            why(check_claims(&plain, &token_claims(serde_json::json!({})), 2030)),
            "401 the token has expired"
        );
        assert!(check_claims(&plain, &token_claims(serde_json::json!({})), 2029).is_ok());
        let mut no_exp = token_claims(serde_json::json!({}));
        no_exp.as_object_mut().unwrap().remove("exp");
        assert_eq!(why(check_claims(&plain, &no_exp, 1000)), "401 the token has no `exp`");
        assert_eq!(
            why(check_claims(&plain, &token_claims(serde_json::json!({"nbf": 1031})), 1000)),
            "401 the token is not valid yet (`nbf`)"
        );
        assert!(check_claims(&plain, &token_claims(serde_json::json!({"nbf": 1030})), 1000).is_ok());
        assert_eq!(
            why(check_claims(&plain, &token_claims(serde_json::json!({"iat": 1031})), 1000)),
            "401 the token was issued in the future (`iat`)"
        );
        assert_eq!(
            why(check_claims(&plain, &token_claims(serde_json::json!({"exp": "2000"})), 1000)),
            "401 the token's `exp` is not a time"
        );
    }

    /// A token remembered is checked by [`check_known`] from what was read when it was verified;
    /// on any route and at any time, that says what [`check_claims`] says of its claims.
    #[test]
    fn a_remembered_token_is_judged_as_its_claims_are() {
        let routes = [
            issuer(serde_json::json!({})),
            issuer(serde_json::json!({"scope": "orders:read"})),
            IssuerConfig {
                audiences: vec!["billing".into()],
                leeway_seconds: 0,
                ..issuer(serde_json::json!({}))
            },
            IssuerConfig { leeway_seconds: 600, ..issuer(serde_json::json!({"tenant": "acme"})) },
        ];
        let tokens = [
            token_claims(serde_json::json!({})),
            token_claims(serde_json::json!({"nbf": 1500, "iat": 1400.7, "exp": 2000.9})),
            token_claims(serde_json::json!({"aud": ["billing", "orders"], "scope": "a orders:read"})),
            token_claims(serde_json::json!({"tenant": "acme", "iat": 1990})),
        ];
        let mut compared = 0;
        for claims in &tokens {
            // Verified by the first route whose checks it passes at 1600, as `admit` does.
            let Some(times) = routes.iter().find_map(|route| check_claims(route, claims, 1600).ok()) else {
                continue;
            };
            let sub = claims["sub"].as_str().unwrap().to_owned();
            let known = Token {
                issuer: "https://id.example.com/".into(),
                source: Source::Discovery("https://id.example.com/".into()),
                alg: Algorithm::RS256,
                generation: 1,
                claims: claims.clone(),
                caller: Arc::new(Caller::new(CallerKind::Jwt, sub, None, None, None, Some(claims.clone()))),
                aud: claims["aud"].clone(),
                times,
            };
            for route in &routes {
                for now in [0, 1000, 1450, 1480, 1600, 1999, 2000, 2029, 2030, 2700] {
                    assert_eq!(
                        why(check_known(route, &known, now)),
                        why(check_claims(route, claims, now).map(|_| ())),
                        "{claims} at {now}"
                    );
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, tokens.len() * routes.len() * 10);
    }

    #[test]
    fn claim_conditions_hold_for_lists_scopes_and_equal_values() {
        let scoped = issuer(serde_json::json!({"scope": "orders:read", "tenant": "acme", "roles": "admin"}));
        let ok = token_claims(
            serde_json::json!({"scope": "openid orders:read", "tenant": "acme", "roles": ["user", "admin"]}),
        );
        assert!(check_claims(&scoped, &ok, 1000).is_ok());
        let no_scope =
            token_claims(serde_json::json!({"scope": "orders:readx", "tenant": "acme", "roles": ["admin"]}));
        assert_eq!(
            why(check_claims(&scoped, &no_scope, 1000)),
            "403 the token's `scope` claim does not allow this route"
        );
        let other_tenant =
            token_claims(serde_json::json!({"scope": "orders:read", "tenant": "acme2", "roles": ["admin"]}));
        assert!(why(check_claims(&scoped, &other_tenant, 1000)).starts_with("403"));
        let missing = token_claims(serde_json::json!({"scope": "orders:read", "tenant": "acme"}));
        assert!(why(check_claims(&scoped, &missing, 1000)).starts_with("403"));
    }

    #[test]
    fn a_token_s_form_is_read_strictly() {
        let header = |h: &str| URL_SAFE_NO_PAD.encode(h);
        let claims = URL_SAFE_NO_PAD.encode(r#"{"iss":"x"}"#);
        let token = format!("{}.{claims}.c2ln", header(r#"{"alg":"RS256","kid":"k1"}"#));
        let parsed = parse(&token).ok().unwrap();
        assert_eq!(
            (parsed.alg.as_str(), parsed.kid.as_deref(), parsed.signature),
            ("RS256", Some("k1"), "c2ln")
        );
        assert_eq!(parsed.message, &token[..token.rfind('.').unwrap()]);
        let refused_why = |token: &str| match parse(token) {
            Err(Refusal::Unauthenticated { why, .. }) => why,
            _ => "taken".into(),
        };
        assert!(
            refused_why(&format!("{}.{claims}.c2ln", header(r#"{"alg":"RS256","crit":["b64"]}"#)))
                .contains("crit")
        );
        assert!(
            refused_why(&format!("{}.{claims}.c2ln", header(r#"{"alg":"RS256","typ":"JWE"}"#)))
                .contains("typ")
        );
        assert!(refused_why(&format!("{}.{claims}.c2ln", header(r#"{"kid":"k"}"#))).contains("no `alg`"));
        assert!(refused_why(&format!("{}.{claims}", header(r#"{"alg":"RS256"}"#))).contains("three parts"));
        assert!(
            refused_why(&format!("{}.{claims}.a.b", header(r#"{"alg":"RS256"}"#))).contains("three parts")
        );
        assert!(refused_why(&"a".repeat(MAX_TOKEN + 1)).contains("longer than 8 KiB"));
        assert!(looks_like_token(&token));
        assert!(!looks_like_token("eyJ.only-one-dot"));
    }
}
