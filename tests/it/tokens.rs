//! Callers with bearer tokens (SPEC §2.4): every check of a token, each refusing what it must
//! (tokens signed here with ring, their key set served by a plain upstream on 127.0.0.1); key
//! sets shared, fetched again at most once per 30 s for unknown `kid`s and kept through an
//! outage; and a real identity provider (oidc-provider on Node.js, `tests/oauth/issuer.mjs`)
//! whose tokens pass, whose key rotation is followed without a restart, and whose outage leaves
//! tokens of known keys working.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::Method;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _};
use serde_json::{Value, json};

use crate::oauth::{Node, oauth_parts};
use crate::support::{Answer, Connection, Json, Reply, Service, Upstream, config, free_port, get, send};

const MEALS: &str = r#"{"meals":[{"idMeal":"7","strMeal":"Soup"}]}"#;
/// Rules that write who called: `$caller`'s id and a claim.
const RULES: &str = r#"{"newBodyFields":{"id":{"key":"id","type":"Int"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]}}}"#;
pub(crate) const ISSUER: &str = "https://id.test/";

/// A signing key and its public JWK.
enum Signer {
    Ecdsa(EcdsaKeyPair, &'static str),
    Ed(Ed25519KeyPair),
}

pub(crate) struct Key {
    kid: String,
    signer: Signer,
}

impl Key {
    pub(crate) fn ecdsa(kid: &str, p384: bool) -> Key {
        let rng = SystemRandom::new();
        let alg = if p384 {
            &signature::ECDSA_P384_SHA384_FIXED_SIGNING
        } else {
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING
        };
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        Key { kid: kid.into(), signer: Signer::Ecdsa(pair, if p384 { "P-384" } else { "P-256" }) }
    }

    fn ed(kid: &str) -> Key {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        Key { kid: kid.into(), signer: Signer::Ed(Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()) }
    }

    pub(crate) fn jwk(&self) -> Value {
        match &self.signer {
            Signer::Ecdsa(pair, crv) => {
                let point = pair.public_key().as_ref();
                let half = (point.len() - 1) / 2;
                json!({"kty": "EC", "crv": crv, "kid": self.kid, "use": "sig",
                       "x": URL_SAFE_NO_PAD.encode(&point[1..1 + half]), "y": URL_SAFE_NO_PAD.encode(&point[1 + half..])})
            }
            Signer::Ed(pair) => {
                json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid, "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())})
            }
        }
    }

    fn alg(&self) -> &'static str {
        match &self.signer {
            Signer::Ecdsa(_, "P-384") => "ES384",
            Signer::Ecdsa(..) => "ES256",
            Signer::Ed(_) => "EdDSA",
        }
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        match &self.signer {
            Signer::Ecdsa(pair, _) => pair.sign(&SystemRandom::new(), message).unwrap().as_ref().to_vec(),
            Signer::Ed(pair) => pair.sign(message).as_ref().to_vec(),
        }
    }

    /// A token signed by this key, with the header `header` (its `alg` and `kid` added when it
    /// has none) and the claims `claims`.
    pub(crate) fn token(&self, header: Value, claims: &Value) -> String {
        let mut header = header;
        let members = header.as_object_mut().unwrap();
        members.entry("alg").or_insert(json!(self.alg()));
        members.entry("kid").or_insert(json!(self.kid));
        let message = format!("{}.{}", b64(&header), b64(claims));
        let signature = URL_SAFE_NO_PAD.encode(self.sign(message.as_bytes()));
        format!("{message}.{signature}")
    }
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(value.to_string())
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Claims every check takes, with `changes` over them (`null` removes one).
pub(crate) fn claims(changes: Value) -> Value {
    let mut claims = json!({"iss": ISSUER, "aud": "orders", "sub": "u-42", "scope": "openid orders:read",
                            "exp": now() + 600, "iat": now(), "jti": rand_text()});
    for (name, value) in changes.as_object().unwrap() {
        if value.is_null() {
            claims.as_object_mut().unwrap().remove(name);
        } else {
            claims[name] = value.clone();
        }
    }
    claims
}

fn rand_text() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 12];
    SystemRandom::new().fill(&mut bytes).unwrap();
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A key set upstream: serves `set` at `/keys` (503 while `down`), counts its fetches.
struct KeySet {
    upstream: Upstream,
    set: Arc<Mutex<Value>>,
    down: Arc<AtomicBool>,
}

impl KeySet {
    async fn start(keys: &[&Key]) -> KeySet {
        let set = Arc::new(Mutex::new(json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()})));
        let down = Arc::new(AtomicBool::new(false));
        let (served, off) = (set.clone(), down.clone());
        let upstream = Upstream::start(move |request| {
            if request.uri.path() != "/keys" {
                return Reply::json(MEALS);
            }
            if off.load(Ordering::Relaxed) {
                return Reply::with(503, "{}");
            }
            Reply::json(&served.lock().unwrap().to_string())
        })
        .await;
        KeySet { upstream, set, down }
    }

    fn add(&self, key: &Key) {
        self.set.lock().unwrap()["keys"].as_array_mut().unwrap().push(key.jwk());
    }

    fn fetches(&self) -> usize {
        self.upstream.received().iter().filter(|r| r.uri.path() == "/keys").count()
    }

    fn calls(&self) -> Vec<crate::support::Received> {
        self.upstream.received().into_iter().filter(|r| r.uri.path() != "/keys").collect()
    }
}

async fn register(service: &Service, base: &str, path: &str, issuer: Value) -> String {
    let body = json!({
        "path": path,
        "originalRoute": {"originalApi": {"baseUrl": base}, "path": "meal"},
        "callers": {"jwt": [issuer]},
        "rulesAsString": serde_json::from_str::<Value>(RULES).unwrap(),
    });
    let answer = send(Method::POST, &service.url("/v1/mapping"), &[], body.to_string()).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    answer.json().get("path").and_then(Json::as_str).unwrap().to_owned()
}

async fn call(service: &Service, path: &str, token: &str) -> Answer {
    let bearer = format!("Bearer {token}");
    send(Method::GET, &service.url(path), &[("authorization", &bearer)], "").await
}

/// The status and detail of a refused call, checked not to echo the token.
async fn refused(service: &Service, path: &str, token: &str) -> (u16, String) {
    let answer = call(service, path, token).await;
    let status = answer.status.as_u16();
    let body = String::from_utf8_lossy(&answer.body).into_owned();
    let signature = token.rsplit('.').next().unwrap_or(token);
    assert!(signature.len() < 8 || !body.contains(signature), "the answer echoes the token: {body}");
    let detail = answer.json().get("detail").and_then(Json::as_str).unwrap_or_default().to_owned();
    if status == 401 {
        assert_eq!(
            answer.header("www-authenticate"),
            Some(r#"Bearer realm="recast", error="invalid_token""#)
        );
    }
    (status, detail)
}

#[tokio::test]
async fn every_check_of_a_token_refuses_what_it_must() {
    let (es, ed, p384) = (Key::ecdsa("es", false), Key::ed("ed"), Key::ecdsa("p384", true));
    let keys = KeySet::start(&[&es, &ed, &p384]).await;
    let service = Service::start(config()).await;
    let issuer = json!({"issuer": ISSUER, "audiences": ["orders"], "jwksUri": keys.upstream.url("/keys"),
                        "algorithms": ["ES256", "ES384", "EdDSA"], "claims": {"scope": "orders:read"}});
    let path = register(&service, &keys.upstream.url("/"), "meal", issuer).await;

    // Good tokens, of either key.
    for key in [&es, &ed] {
        let answer = call(&service, &path, &key.token(json!({}), &claims(json!({})))).await;
        assert_eq!(answer.status, 200, "{}: {}", key.kid, String::from_utf8_lossy(&answer.body));
    }
    let good = es.token(json!({}), &claims(json!({})));
    let (header, payload) = (good.split('.').next().unwrap(), good.split('.').nth(1).unwrap());
    let other = es.token(json!({}), &claims(json!({"sub": "someone-else"})));
    let public_key = keys.set.lock().unwrap()["keys"][0].to_string();
    let hs256 = {
        let header = b64(&json!({"alg": "HS256", "kid": "es"}));
        let message = format!("{header}.{payload}");
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, public_key.as_bytes());
        format!("{message}.{}", URL_SAFE_NO_PAD.encode(ring::hmac::sign(&key, message.as_bytes())))
    };
    let huge = es.token(json!({}), &claims(json!({"pad": "x".repeat(8 * 1024)})));
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("alg none", format!("{}.{payload}.", b64(&json!({"alg": "none"}))), 401, "algorithm"),
        ("HS256 keyed by the public key", hs256, 401, "algorithm"),
        (
            "an Ed25519 key for ES256",
            ed.token(json!({"alg": "ES256"}), &claims(json!({}))),
            401,
            "type or curve",
        ),
        (
            "a P-384 key for ES256",
            p384.token(json!({"alg": "ES256"}), &claims(json!({}))),
            401,
            "type or curve",
        ),
        ("another issuer", es.token(json!({}), &claims(json!({"iss": "https://evil.test/"}))), 401, "issuer"),
        (
            "an audience not listed",
            es.token(json!({}), &claims(json!({"aud": ["payments"]}))),
            401,
            "audience",
        ),
        ("expired", es.token(json!({}), &claims(json!({"exp": now() - 60}))), 401, "expired"),
        ("no exp", es.token(json!({}), &claims(json!({"exp": null}))), 401, "no `exp`"),
        ("not yet valid", es.token(json!({}), &claims(json!({"nbf": now() + 120}))), 401, "not valid yet"),
        (
            "issued in the future",
            es.token(json!({}), &claims(json!({"iat": now() + 120}))),
            401,
            "issued in the future",
        ),
        ("a scope not held", es.token(json!({}), &claims(json!({"scope": "orders:write"}))), 403, "`scope`"),
        ("8 KiB + 1", format!("{}{}", good, "A".repeat(8 * 1024 + 1 - good.len())), 401, "longer than 8 KiB"),
        ("longer still", huge, 401, "longer than 8 KiB"),
        (
            "a signature over other bytes",
            format!("{header}.{payload}.{}", other.rsplit('.').next().unwrap()),
            401,
            "signature",
        ),
        ("a kid the set lacks", es.token(json!({"kid": "gone"}), &claims(json!({}))), 401, "does not hold"),
        ("crit", es.token(json!({"crit": ["exp"]}), &claims(json!({}))), 401, "crit"),
    ];
    for (what, token, status, words) in &cases {
        let (got, detail) = refused(&service, &path, token).await;
        assert_eq!((got, detail.contains(words)), (*status, true), "{what}: {got} {detail}");
    }
    // A token is never read from the URL, even a good one.
    let answer = send(Method::GET, &service.url(&format!("{path}?access_token={good}")), &[], "").await;
    answer.assert_problem(401, "caller-unauthenticated");
    // Only the registration's live call and the two good calls went upstream, none with a token.
    let calls = keys.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c.headers.get("authorization").is_none()));
    service.stop().await;
}

#[tokio::test]
async fn key_sets_are_shared_fetched_again_sparingly_and_kept_through_an_outage() {
    let es = Key::ecdsa("es", false);
    let keys = KeySet::start(&[&es]).await;
    let service = Service::start(config()).await;
    let issuer = json!({"issuer": ISSUER, "audiences": ["orders"], "jwksUri": keys.upstream.url("/keys"), "algorithms": ["ES256"]});
    let first = register(&service, &keys.upstream.url("/"), "one", issuer.clone()).await;
    let second = register(&service, &keys.upstream.url("/"), "two", issuer).await;
    for path in [&first, &second] {
        assert_eq!(call(&service, path, &es.token(json!({}), &claims(json!({})))).await.status, 200);
    }
    assert_eq!(keys.fetches(), 1, "one copy of the set serves both routes");
    // A token repeated is verified once: the memory answers.
    let repeated = es.token(json!({}), &claims(json!({})));
    for _ in 0..3 {
        assert_eq!(call(&service, &first, &repeated).await.status, 200);
    }
    // The issuer rotates: a token of the new key passes after one fetch.
    let rotated = Key::ecdsa("es-2", false);
    keys.add(&rotated);
    assert_eq!(call(&service, &first, &rotated.token(json!({}), &claims(json!({})))).await.status, 200);
    assert_eq!(keys.fetches(), 2);
    // A thousand unknown kids within 30 s fetch nothing more.
    for _ in 0..1000 {
        let (status, _) =
            refused(&service, &first, &es.token(json!({"kid": rand_text()}), &claims(json!({})))).await;
        assert_eq!(status, 401);
    }
    assert_eq!(keys.fetches(), 2, "unknown kids fetch the set at most once per 30 s");
    // The issuer's key set goes away: tokens of known keys, never seen before, still pass.
    keys.down.store(true, Ordering::Relaxed);
    for key in [&es, &rotated] {
        assert_eq!(call(&service, &second, &key.token(json!({}), &claims(json!({})))).await.status, 200);
    }
    let metrics = String::from_utf8_lossy(&get(&service.url("/metrics")).await.body).into_owned();
    for line in [
        r#"recast_key_set_fetches_total{reason="new",outcome="ok"} 1"#,
        r#"recast_key_set_fetches_total{reason="unknown_kid",outcome="ok"} 1"#,
        r#"recast_callers_refused_total{reason="invalid"} 1000"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    service.stop().await;
}

/// A token repeated on one kept-alive connection, which keeps what it made
/// (`src/callers/memo.rs`), is judged as on any other: once its issuer's key set no longer holds
/// the key that signed it, the connection that presented it is refused too.
#[tokio::test]
async fn a_connection_repeating_a_token_is_refused_once_its_key_leaves_the_set() {
    let (es, rotated) = (Key::ecdsa("es", false), Key::ecdsa("es-2", false));
    let keys = KeySet::start(&[&es]).await;
    let service = Service::start(config()).await;
    let issuer = json!({"issuer": ISSUER, "audiences": ["orders"], "jwksUri": keys.upstream.url("/keys"), "algorithms": ["ES256"]});
    let path = register(&service, &keys.upstream.url("/"), "one", issuer).await;
    let bearer = format!("Bearer {}", es.token(json!({}), &claims(json!({}))));
    let mut connection = Connection::open(&service).await;
    for _ in 0..3 {
        assert_eq!(connection.get(&path, &[("authorization", &bearer)]).await.status, 200);
    }
    // Another token on the connection, then the first again.
    let other = format!("Bearer {}", es.token(json!({}), &claims(json!({"sub": "u-7"}))));
    assert_eq!(connection.get(&path, &[("authorization", &other)]).await.status, 200);
    assert_eq!(connection.get(&path, &[("authorization", &bearer)]).await.status, 200);
    // The issuer replaces its key; a token of the new one makes recast fetch the new set.
    *keys.set.lock().unwrap() = json!({"keys": [rotated.jwk()]});
    assert_eq!(call(&service, &path, &rotated.token(json!({}), &claims(json!({})))).await.status, 200);
    assert_eq!(keys.fetches(), 2);
    let answer = connection.get(&path, &[("authorization", &bearer)]).await;
    answer.assert_problem(401, "caller-unauthenticated");
    service.stop().await;
}

#[tokio::test]
async fn a_real_identity_provider_s_tokens_pass_its_rotation_is_followed_and_its_outage_survived() {
    let Some(dir) = oauth_parts() else { return };
    let state = tempfile::TempDir::new().unwrap();
    let keys_file = state.path().join("keys.json").display().to_string();
    let port = free_port();
    let provider = Node::run(&dir, "issuer.mjs", vec![port.to_string(), keys_file.clone()]).await;
    let upstream = Upstream::json(MEALS).await;
    let service = Service::start(config()).await;
    // By discovery: no `jwksUri`.
    let issuer = provider.url("");
    let path = register(
        &service,
        &upstream.url("/"),
        "orders",
        json!({"issuer": issuer, "audiences": ["orders-api"], "claims": {"scope": "orders:read"}}),
    )
    .await;
    let token = issue(&provider).await;
    assert_eq!(call(&service, &path, &token).await.status, 200);
    let (status, detail) = refused(&service, &path, &format!("{token}x")).await;
    assert_eq!(status, 401, "{detail}");
    assert_eq!((provider.count("discovery").await, provider.count("jwks").await), (1, 1));

    // The provider rotates its signing key (a restart with a new key first): recast follows
    // without a restart, with one fetch of the discovery document and one of the set.
    drop(provider);
    let provider =
        Node::run(&dir, "issuer.mjs", vec![port.to_string(), keys_file.clone(), "rotate".into()]).await;
    let new = issue(&provider).await;
    assert_ne!(kid(&new), kid(&token));
    assert_eq!(call(&service, &path, &new).await.status, 200);
    assert_eq!((provider.count("discovery").await, provider.count("jwks").await), (1, 1));
    // A thousand tokens with unknown kids within the next 30 s fetch nothing.
    let (header, rest) = new.split_once('.').unwrap();
    let mut header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap();
    for _ in 0..1000 {
        header["kid"] = json!(rand_text());
        let (status, _) = refused(&service, &path, &format!("{}.{rest}", b64(&header))).await;
        assert_eq!(status, 401);
    }
    assert_eq!((provider.count("discovery").await, provider.count("jwks").await), (1, 1));

    // The provider goes down: a token it issued before, never shown to recast, still passes.
    let unseen = issue(&provider).await;
    drop(provider);
    assert_eq!(call(&service, &path, &unseen).await.status, 200);
    service.stop().await;
}

/// A token from the provider's token endpoint (client credentials, the orders API's resource).
async fn issue(provider: &Node) -> String {
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("mobile:mobile-secret"));
    let answer = send(
        Method::POST,
        &provider.url("/token"),
        &[("authorization", &basic), ("content-type", "application/x-www-form-urlencoded")],
        "grant_type=client_credentials&scope=orders:read",
    )
    .await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let body: Value = serde_json::from_slice(&answer.body).unwrap();
    body["access_token"].as_str().unwrap().to_owned()
}

fn kid(token: &str) -> String {
    let header: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').next().unwrap()).unwrap()).unwrap();
    header["kid"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_key_set_the_outbound_policy_refuses_is_told_at_registration() {
    let upstream = Upstream::json(MEALS).await;
    // The upstream's address is allowed, 127.0.0.2 (where the key set would be) is not.
    let service = Service::start(recast::config::Config {
        upstream_allow: "127.0.0.1/32".parse().unwrap(),
        ..config()
    })
    .await;
    let body = json!({
        "path": "meal",
        "originalRoute": {"originalApi": {"baseUrl": upstream.url("/")}, "path": "meal"},
        "callers": {"jwt": [{"issuer": ISSUER, "audiences": ["orders"], "jwksUri": "http://127.0.0.2:9/keys"}]},
        "rulesAsString": serde_json::from_str::<Value>(RULES).unwrap(),
    });
    let answer = send(Method::POST, &service.url("/v1/mapping"), &[], body.to_string()).await;
    let problem = answer.assert_problem(400, "upstream-not-allowed");
    assert!(problem.to_string().contains("callers.jwt[0]"), "{problem}");
    assert!(upstream.received().is_empty(), "nothing is called before every address is checked");
    service.stop().await;
}

#[tokio::test]
async fn a_composed_route_picks_a_tenant_s_upstream_by_a_claim_and_a_path_by_the_subject() {
    let es = Key::ecdsa("es", false);
    let keys = KeySet::start(&[&es]).await;
    let echo = |tenant: &'static str| {
        Upstream::start(move |request| {
            Reply::json(&json!({"tenant": tenant, "path": request.uri.path()}).to_string())
        })
    };
    let (acme, globex) = (echo("acme").await, echo("globex").await);
    let service = Service::start(config()).await;
    let source = |upstream: &Upstream, tenant: &str| {
        json!({"originalApi": {"baseUrl": upstream.url("/")}, "path": "users/{{$caller.claims.sub}}",
               "when": format!("$caller.claims.org.tenant == '{tenant}'")})
    };
    let body = json!({
        "path": "me",
        "sources": {"acme": source(&acme, "acme"), "globex": source(&globex, "globex")},
        "callers": {"jwt": [{"issuer": ISSUER, "audiences": ["orders"], "jwksUri": keys.upstream.url("/keys"), "algorithms": ["ES256"]}]},
        "caller": {"kind": "jwt", "id": "u-1", "issuer": ISSUER, "claims": {"sub": "u-1", "org": {"tenant": "acme"}}},
        "rulesAsString": {"newBodyFields": {"tenant": {"key": "tenant", "type": "String"}, "path": {"key": "path", "type": "String"}},
                          "oldBodyFields": {"tenant": {"expr": "acme.tenant || globex.tenant"}, "path": {"expr": "acme.path || globex.path"}}}
    });
    let answer = send(Method::POST, &service.url("/v1/mapping"), &[], body.to_string()).await;
    assert_eq!(answer.status, 201, "{}", String::from_utf8_lossy(&answer.body));
    let path = answer.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    for (sub, tenant) in [("ada", "acme"), ("bob", "globex")] {
        let token = es.token(json!({}), &claims(json!({"sub": sub, "org": {"tenant": tenant}})));
        let answer = call(&service, &path, &token).await;
        assert_eq!(
            String::from_utf8_lossy(&answer.body),
            format!(r#"{{"path":"/users/{sub}","tenant":"{tenant}"}}"#),
            "{sub} of {tenant}"
        );
    }
    // The live call as the sample caller, then ada's call at acme; bob's went to globex alone.
    assert_eq!(
        acme.received().iter().map(|r| r.uri.path().to_owned()).collect::<Vec<_>>(),
        ["/users/u-1", "/users/ada"]
    );
    assert_eq!(globex.received().iter().map(|r| r.uri.path().to_owned()).collect::<Vec<_>>(), ["/users/bob"]);
    service.stop().await;
}
