//! Validating registrations, building upstream requests, and the stored form of routes.

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method};
use uuid::Uuid;

use super::fields::{BaseUrl, UpstreamPath};
use super::*;
use crate::upstream::UpstreamRequest;

fn registration(json: &str) -> Registration {
    serde_json::from_str(json).expect("a registration")
}

const RULES: &str =
    r#"{"newBodyFields":{"a":{"key":"a","type":"String"}},"oldBodyFields":{"a":{"keys":["a"]}}}"#;

fn config(original: &str, extra: &str) -> RouteConfig {
    let json = format!(r#"{{"path":"p","originalRoute":{original},"rulesAsString":{RULES}{extra}}}"#);
    registration(&json).validate(false, None).expect("valid")
}

fn request(config: RouteConfig, client: &FromClient<'_>) -> UpstreamRequest {
    let route = Route::new(Uuid::nil(), 0, 0, config, &Limits::default());
    route.upstream_request(client).expect("a request")
}

#[test]
fn base_path_is_kept_and_queries_follow_their_precedence() {
    let c = config(
        r#"{"originalApi":{"baseUrl":"https://api.example.org/v2/"},"path":"/items?a=path&b=path","queries":{"b":"route","c":"route"}}"#,
        r#","preConfiguredQueries":{"c":"pre"}"#,
    );
    let r =
        request(c.clone(), &FromClient { query: Some("a=client&d=client&c=client"), ..Default::default() });
    assert_eq!(r.uri.to_string(), "https://api.example.org/v2/items?d=client&a=path&b=route&c=pre");
    assert_eq!(r.method, Method::GET);
    // Without a query of its own (none, or empty), a call gets the URL built at compile time.
    for query in [None, Some("")] {
        let r = request(c.clone(), &FromClient { query, ..Default::default() });
        assert_eq!(r.uri.to_string(), "https://api.example.org/v2/items?a=path&b=route&c=pre");
    }
}

#[test]
fn a_route_is_read_back_from_its_stored_form_and_an_unreadable_one_is_named() {
    let c = config(r#"{"originalApi":{"baseUrl":"https://api.example.org/"},"path":"/x"}"#, "");
    let route = Route::new(Uuid::new_v4(), 1, 2, c.clone(), &Limits::default());
    let again = Route::from_stored(route.to_stored(), &Limits::default()).expect("readable");
    assert_eq!((again.uuid, again.created_at, again.updated_at, &again.config), (route.uuid, 1, 2, &c));
    let mut stored = route.to_stored();
    stored.config = "not json".into();
    let Err(why) = Route::from_stored(stored, &Limits::default()) else { panic!("read as a configuration") };
    assert!(why.contains(&route.uuid.to_string()) && why.contains("unreadable"), "{why}");
}

#[test]
fn empty_path_calls_the_base_url() {
    let c = config(r#"{"originalApi":{"baseUrl":"http://127.0.0.1:9/random.php"},"path":""}"#, "");
    assert_eq!(request(c, &FromClient::default()).uri.to_string(), "http://127.0.0.1:9/random.php");
    let c = config(r#"{"originalApi":{"baseUrl":"http://h.example"},"path":""}"#, "");
    assert_eq!(request(c, &FromClient::default()).uri.to_string(), "http://h.example/");
}

#[test]
fn only_accept_headers_pass_and_configured_headers_win() {
    let c = config(
        r#"{"originalApi":{"baseUrl":"https://a.example"},"path":"x","headers":{"Accept-Language":"en","X-Key":"route"}}"#,
        r#","preConfiguredHeaders":{"X-Key":"pre"}"#,
    );
    let mut client = HeaderMap::new();
    for (name, value) in [
        ("accept", "application/json"),
        ("accept-language", "fr"),
        ("cookie", "s=1"),
        ("authorization", "Bearer leak"),
        ("x-other", "1"),
    ] {
        client.insert(HeaderName::from_static(name), HeaderValue::from_static(value));
    }
    let r = request(c, &FromClient { headers: Some(&client), ..Default::default() });
    let names: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
    assert_eq!(r.headers["accept-language"], "en");
    assert_eq!(r.headers["x-key"], "pre");
    assert_eq!(r.headers["accept"], "application/json");
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn stored_auth_wins_and_runtime_auth_is_required() {
    let bearer = config(
        r#"{"originalApi":{"baseUrl":"https://a.example"},"path":""}"#,
        r#","authHeader":{"type":"bearer","token":"s3"}"#,
    );
    let mut client = HeaderMap::new();
    client.insert(MAPPED_AUTH, HeaderValue::from_static("Bearer caller"));
    let with_caller = FromClient { headers: Some(&client), ..Default::default() };
    let sent = request(bearer.clone(), &with_caller);
    assert_eq!(sent.headers["authorization"], "Bearer s3");
    // The value is marked sensitive, and neither it nor the stored token is ever printed.
    assert!(sent.headers["authorization"].is_sensitive());
    let printed = format!("{:?} {:?} {sent:?}", bearer.auth, bearer);
    assert!(!printed.contains("s3"), "{printed}");
    assert!(printed.contains("***"), "{printed}");

    let raw = config(
        r#"{"originalApi":{"baseUrl":"https://a.example"},"path":"","authHeader":{"type":"None","token":"k=1"}}"#,
        "",
    );
    assert_eq!(request(raw, &with_caller).headers["authorization"], "k=1");

    let json = format!(
        r#"{{"path":"p","originalRoute":{{"originalApi":{{"baseUrl":"https://a.example"}},"path":""}},"rulesAsString":{RULES}}}"#
    );
    let runtime = registration(&json).validate(true, None).unwrap();
    assert_eq!(runtime.auth, Auth::Runtime);
    let route = Route::new(Uuid::nil(), 0, 0, runtime, &Limits::default());
    assert_eq!(route.upstream_request(&FromClient::default()).unwrap_err(), CallError::AuthRequired);
    let sent = route.upstream_request(&with_caller).unwrap();
    assert_eq!(sent.headers["authorization"], "Bearer caller");
    assert!(sent.headers["authorization"].is_sensitive());
    assert!(!format!("{sent:?}").contains("caller"));
}

#[test]
fn bodies_follow_their_precedence_on_methods_that_carry_one() {
    let post = |extra: &str| {
        config(
            &format!(
                r#"{{"originalApi":{{"baseUrl":"https://a.example"}},"path":"","method":"post"{extra}}}"#
            ),
            "",
        )
    };
    let client = FromClient { body: Bytes::from_static(b"{\"from\":\"client\"}"), ..Default::default() };
    assert_eq!(request(post(""), &client).body, client.body);
    assert_eq!(&request(post(r#","body":{"from":"route"}"#), &client).body[..], br#"{"from":"route"}"#);
    let get = config(r#"{"originalApi":{"baseUrl":"https://a.example"},"path":"","body":{"x":1}}"#, "");
    assert!(request(get, &client).body.is_empty(), "GET sends no body");
    let typed = post(r#","body":{"x":1},"headers":{"Content-Type":"application/vnd.api+json"}"#);
    assert_eq!(request(typed, &client).headers["content-type"], "application/vnd.api+json");
}

#[test]
fn every_problem_of_a_registration_is_reported() {
    let json = r#"{"path":"a/../b","method":"FETCH","originalRoute":{"originalApi":{"baseUrl":"ftp://u:p@x"},"path":"//evil.example/x","method":"get","headers":{"Host":"x","X-Ok":"a\nb"},"authHeader":{"type":"Bearer"}},"authHeader":{"type":"Basic","token":"t"},"rulesAsString":{}}"#;
    let problems = registration(json).validate(false, None).unwrap_err();
    let locations: Vec<&str> = problems.iter().map(|p| p.location.as_str()).collect();
    assert_eq!(
        locations,
        [
            "/path",
            "/method",
            "/authHeader",
            "/originalRoute/originalApi/baseUrl",
            "/originalRoute/path",
            "/originalRoute/headers/Host",
            "/originalRoute/headers/X-Ok"
        ],
        "{problems:?}"
    );
}

#[test]
fn upstream_paths_cannot_leave_the_base() {
    for path in
        ["../x", "a/%2e%2e/b", "a/%2E%2E", "http://evil.example/", "//evil.example", "a\\b", "a#b", "a b"]
    {
        assert!(UpstreamPath::parse(path).is_err(), "{path}");
    }
    for path in ["", "x", "/x/y.json", "a%20b", "api/json/v1/1/random.php?c=Seafood"] {
        assert!(UpstreamPath::parse(path).is_ok(), "{path}");
    }
}

#[test]
fn base_urls_need_a_valid_host_name() {
    for base in ["https://}", "http://a{b}.example/", "http://a|b/", "http://a%7Bb/"] {
        assert!(BaseUrl::parse(base).is_err(), "{base}");
    }
    for base in [
        "https://api.example.com/v2/",
        "http://127.0.0.1:9/",
        "http://[::1]/",
        "https://bücher.example/",
        "http://a_b.example/",
    ] {
        assert!(BaseUrl::parse(base).is_ok(), "{base}");
    }
}

#[test]
fn accept_encoding_cannot_be_configured() {
    let json = format!(
        r#"{{"path":"p","originalRoute":{{"originalApi":{{"baseUrl":"https://a.example"}},"path":"","headers":{{"Accept-Encoding":"gzip"}}}},"preConfiguredHeaders":{{"accept-encoding":"br"}},"rulesAsString":{RULES}}}"#
    );
    let problems = registration(&json).validate(false, None).unwrap_err();
    let locations: Vec<&str> = problems.iter().map(|p| p.location.as_str()).collect();
    assert_eq!(
        locations,
        ["/originalRoute/headers/Accept-Encoding", "/preConfiguredHeaders/accept-encoding"]
    );
    assert!(problems[0].message.contains("the codings it decodes"), "{}", problems[0].message);
}

/// The cache's key of a call is the digest of the request it sends: requests that differ in any
/// part a caller supplies differ in their digests, and what a caller sends that does not go
/// upstream changes nothing.
#[test]
fn the_digest_of_a_request_tells_apart_every_part_a_caller_supplies() {
    // A route called with GET whose upstream takes the caller's body, with no stored token, so
    // the caller's `X-Mapped-Auth` goes upstream too.
    let c = config(r#"{"originalApi":{"baseUrl":"https://a.example"},"path":"search","method":"post"}"#, "");
    let route = Route::new(Uuid::nil(), 0, 0, c, &Limits::default());
    let base = [
        ("accept", "application/json"),
        ("accept-language", "en"),
        ("x-mapped-auth", "Bearer alice"),
        ("content-type", "application/json"),
    ];
    let digest = |query: &str, headers: &[(&str, &str)], body: &'static str| {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let client = FromClient {
            query: Some(query),
            headers: Some(&map),
            body: Bytes::from_static(body.as_bytes()),
            caller: None,
        };
        route.upstream_request(&client).expect("a request").digest()
    };
    let reference = digest("q=1", &base, r#"{"user":"alice"}"#);
    assert_eq!(reference, digest("q=1", &base, r#"{"user":"alice"}"#), "the same request, the same digest");
    let mut all: Vec<(&str, [u8; 32])> = vec![
        ("query", digest("q=2", &base, r#"{"user":"alice"}"#)),
        ("body", digest("q=1", &base, r#"{"user":"bob"}"#)),
        ("no body", digest("q=1", &base, "")),
    ];
    for (name, other) in [
        ("accept", "application/xml"),
        ("accept-language", "fr"),
        ("x-mapped-auth", "Bearer bob"),
        ("content-type", "application/x-www-form-urlencoded"),
    ] {
        let pairs: Vec<(&str, &str)> =
            base.iter().map(|&(n, v)| (n, if n == name { other } else { v })).collect();
        all.push((name, digest("q=1", &pairs, r#"{"user":"alice"}"#)));
    }
    // Each header left out differs too.
    for left_out in ["accept", "accept-language", "x-mapped-auth", "content-type"] {
        let pairs: Vec<(&str, &str)> = base.iter().copied().filter(|(n, _)| *n != left_out).collect();
        all.push((left_out, digest("q=1", &pairs, r#"{"user":"alice"}"#)));
    }
    for (part, other) in &all {
        assert_ne!(*other, reference, "a request differing in its {part} has the same digest");
    }
    let distinct: std::collections::HashSet<_> = all.iter().map(|(_, d)| *d).collect();
    assert_eq!(distinct.len(), all.len(), "every variation has its own digest");
    // What never goes upstream changes nothing: the caller's own Authorization, cookies, other
    // headers, and the order the forwarded ones came in.
    let mut noisy: Vec<(&str, &str)> = base.iter().rev().copied().collect();
    noisy.extend([("authorization", "Bearer other"), ("cookie", "s=1"), ("x-forwarded-for", "10.0.0.1")]);
    assert_eq!(digest("q=1", &noisy, r#"{"user":"alice"}"#), reference);
}

#[test]
fn a_stored_token_is_the_same_for_every_caller_so_their_requests_share_a_digest() {
    let c = config(
        r#"{"originalApi":{"baseUrl":"https://a.example"},"path":""}"#,
        r#","authHeader":{"type":"bearer","token":"s3"}"#,
    );
    let route = Route::new(Uuid::nil(), 0, 0, c, &Limits::default());
    let digest = |token: &'static str| {
        let mut headers = HeaderMap::new();
        headers.insert(MAPPED_AUTH, HeaderValue::from_static(token));
        route
            .upstream_request(&FromClient { headers: Some(&headers), ..Default::default() })
            .unwrap()
            .digest()
    };
    assert_eq!(digest("Bearer alice"), digest("Bearer bob"));
}

#[test]
fn templates_of_a_single_route_render_over_the_request_and_an_older_route_keeps_its_text() {
    let c = config(
        r#"{"originalApi":{"baseUrl":"https://api.example.org/v2/"},"path":"users/{{request.query.id}}","method":"POST","queries":{"lang":"{{request.headers.\"x-lang\" || 'en'}}"},"headers":{"X-Name":"n={{request.body.name}}"},"body":{"who":"{{request.body.name}}","all":"{{request.body}}"}}"#,
        r#","forwardHeaders":["X-Lang"]"#,
    );
    assert!(c.templates);
    let mut headers = HeaderMap::new();
    headers.insert("x-lang", HeaderValue::from_static("fr"));
    let client = FromClient {
        query: Some("id=a/b%20c"),
        headers: Some(&headers),
        body: Bytes::from_static(br#"{"name":"Ada"}"#),
        caller: None,
    };
    let r = request(c.clone(), &client);
    // The value stays in its segment; the caller's query passes on as SPEC §2.2 says.
    assert_eq!(r.uri.to_string(), "https://api.example.org/v2/users/a%2Fb%20c?id=a%2Fb+c&lang=fr");
    assert_eq!(r.headers["x-name"], "n=Ada");
    assert_eq!(&r.body[..], br#"{"who":"Ada","all":{"name":"Ada"}}"#);
    // What a template reads is missing: the caller's mistake, at the template's place.
    let route = Route::new(Uuid::nil(), 0, 0, c.clone(), &Limits::default());
    let missing = FromClient { body: Bytes::from_static(br#"{"name":"Ada"}"#), ..Default::default() };
    match route.upstream_request(&missing) {
        Err(CallError::Template { location, why }) => {
            assert_eq!(location, "/originalRoute/path");
            assert!(why.contains("null"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // A route stored before templates existed sends its text as written.
    let mut older = config(
        r#"{"originalApi":{"baseUrl":"https://api.example.org/"},"path":"x","queries":{"q":"{{request.query.id}}"}}"#,
        "",
    );
    older.templates = false;
    let stored: RouteConfig = serde_json::from_str(&serde_json::to_string(&older).unwrap()).unwrap();
    assert!(!stored.templates);
    let r = request(stored, &FromClient::default());
    assert_eq!(r.uri.to_string(), "https://api.example.org/x?q=%7B%7Brequest.query.id%7D%7D");
    // Templates read only `request`.
    let json = format!(
        r#"{{"path":"p","originalRoute":{{"originalApi":{{"baseUrl":"https://a.example/"}},"path":"x/{{{{user.id}}}}"}},"rulesAsString":{RULES}}}"#
    );
    let problems = registration(&json).validate(false, None).unwrap_err();
    assert_eq!(problems[0].location, "/originalRoute/path");
    assert!(problems[0].message.contains("`user`"), "{problems:?}");
}

#[test]
fn a_single_route_calls_with_its_own_upstream_s_settings() {
    let c = config(
        r#"{"originalApi":{"baseUrl":"http://127.0.0.1:9/"},"path":"/x"}"#,
        r#","rateLimit":{"requestsPerSecond":5,"burst":2},"retry":{"attempts":2,"on":[503]},"breaker":{"scope":"route"},"http2":"prior-knowledge""#,
    );
    let uuid = Uuid::new_v4();
    let route = Route::new(uuid, 0, 0, c.clone(), &Limits::default());
    assert!(route.composition().is_none(), "not a composed route");
    let own = route.single().expect("a route that serves has its own upstream");
    // Its rate limit, breaker and retries are the route's, kept for the route.
    let calls = &own.calls;
    assert_eq!((calls.key, calls.breaker), (uuid, Some(uuid)));
    assert_eq!((&calls.rate_limit, &calls.retry, calls.h2c), (&c.rate_limit, &c.retry, true));
    let upstreams = route.upstreams();
    let [upstream] = upstreams.as_slice() else { panic!("one upstream") };
    assert!(upstream.source.is_none());
    assert_eq!(upstream.request.origin().to_string(), "http://127.0.0.1:9/");
    // By default, its origin's breaker counts its calls.
    let plain = config(r#"{"originalApi":{"baseUrl":"http://127.0.0.1:9/"},"path":"/x"}"#, "");
    let route = Route::new(uuid, 0, 0, plain, &Limits::default());
    assert_eq!(route.single().map(|own| own.calls.breaker), Some(None));

    // A composed route's upstreams are its sources, each counted by its origin's breaker.
    let json = format!(
        r#"{{"path":"p","sources":{{"a":{{"originalApi":{{"baseUrl":"http://127.0.0.1:9/"}},"path":"/a"}},"b":{{"originalApi":{{"baseUrl":"http://127.0.0.1:8/"}},"path":"/b"}}}},"rulesAsString":{RULES}}}"#
    );
    let composed = registration(&json).validate(false, None).expect("valid");
    let route = Route::new(uuid, 0, 0, composed, &Limits::default());
    assert!(route.single().is_none());
    let upstreams = route.upstreams();
    let named: Vec<(Option<&str>, String)> =
        upstreams.iter().map(|u| (u.source, u.request.origin().to_string())).collect();
    assert_eq!(
        named,
        [(Some("a"), "http://127.0.0.1:9/".to_owned()), (Some("b"), "http://127.0.0.1:8/".to_owned())]
    );
    assert!(upstreams.iter().all(|u| u.calls.breaker.is_none()));
}

#[test]
fn requests_are_the_same_when_every_part_is_and_then_share_a_fingerprint() {
    let request = |headers: &[(&str, &str)], uri: &str, body: &'static str| {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        UpstreamRequest {
            method: Method::POST,
            uri: uri.parse().unwrap(),
            headers: map,
            body: Bytes::from_static(body.as_bytes()),
        }
    };
    let base = [("a", "1"), ("b", "2"), ("b", "3")];
    let reference = request(&base, "http://up.example/x?q=1", "{}");
    // The names in another order (each name's values in theirs).
    let same = request(&[("b", "2"), ("a", "1"), ("b", "3")], "http://up.example/x?q=1", "{}");
    assert!(same.same_as(&reference) && reference.same_as(&same));
    assert_eq!(same.fingerprint(), reference.fingerprint());
    assert_eq!(same.digest(), reference.digest());
    // A host is the same in capitals (the digest, a cache key, keeps them apart: stricter).
    let capitals = request(&base, "http://UP.example/x?q=1", "{}");
    assert!(capitals.same_as(&reference));
    assert_eq!(capitals.fingerprint(), reference.fingerprint());
    let others = [
        (
            "method",
            UpstreamRequest { method: Method::PUT, ..request(&base, "http://up.example/x?q=1", "{}") },
        ),
        ("path", request(&base, "http://up.example/y?q=1", "{}")),
        ("query", request(&base, "http://up.example/x?q=2", "{}")),
        ("host", request(&base, "http://other.example/x?q=1", "{}")),
        ("port", request(&base, "http://up.example:81/x?q=1", "{}")),
        ("scheme", request(&base, "https://up.example/x?q=1", "{}")),
        ("body", request(&base, "http://up.example/x?q=1", "[]")),
        ("a value", request(&[("a", "9"), ("b", "2"), ("b", "3")], "http://up.example/x?q=1", "{}")),
        (
            "the order of a name's values",
            request(&[("a", "1"), ("b", "3"), ("b", "2")], "http://up.example/x?q=1", "{}"),
        ),
        ("a header less", request(&[("a", "1"), ("b", "2")], "http://up.example/x?q=1", "{}")),
        (
            "a header more",
            request(&[("a", "1"), ("b", "2"), ("b", "3"), ("c", "")], "http://up.example/x?q=1", "{}"),
        ),
    ];
    for (part, other) in &others {
        assert!(
            !other.same_as(&reference) && !reference.same_as(other),
            "a request differing in its {part} is the same"
        );
        assert_ne!(other.digest(), reference.digest(), "{part}");
    }
    // Fingerprints tell these apart too (a shared one would cost only the comparison).
    let fingerprints: std::collections::HashSet<u64> =
        others.iter().map(|(_, r)| r.fingerprint()).chain([reference.fingerprint()]).collect();
    assert_eq!(fingerprints.len(), others.len() + 1);
}

/// A member `GET /v1/routes/{uuid}` could not show back is a problem at its place; what a
/// registration body can carry (at most 127 levels) always can be.
#[test]
fn what_cannot_be_shown_back_is_located() {
    let json = r#"{"path":"p","originalRoute":{"originalApi":{"baseUrl":"https://a.example"},"path":"","method":"POST"},
        "rulesAsString":{"newBodyFields":{"a":{"key":"a","type":"String"}},"oldBodyFields":{"a":{"keys":["a"]}}}}"#;
    let registration: Registration = serde_json::from_str(json).expect("a registration");
    let mut config = registration.validate(false, None).expect("valid");
    let nested = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
    config.body = Some(nested(crate::route::SHOWN_DEPTH));
    assert!(config.unshowable().is_empty());
    config.body = Some(nested(crate::route::SHOWN_DEPTH + 1));
    config.pre_body = Some(nested(200));
    let problems = config.unshowable();
    let at: Vec<&str> = problems.iter().map(|p| p.location.as_str()).collect();
    assert_eq!(at, ["/originalRoute/body", "/preConfiguredBody"]);
    assert!(problems[0].message.contains("could not be shown back"), "{problems:?}");
}

/// The one request builder: a route's own upstream and a source refuse the same headers, repeat
/// a query parameter for a list alike, send a body only with the methods that carry one, and
/// mark every configured header value sensitive (kept out of HTTP/2's header tables).
#[test]
fn a_route_s_own_upstream_and_a_source_build_requests_one_way() {
    use crate::route::render::CallerParts;
    use crate::route::template::{Context, Scratch};
    let base = r#"{"baseUrl":"http://127.0.0.1:9/"}"#;
    let own = |headers: &str, auth: &str| {
        format!(
            r#"{{"path":"p","originalRoute":{{"originalApi":{base},"path":"x","headers":{headers}}}{auth},"rulesAsString":{RULES}}}"#
        )
    };
    let source = |headers: &str, auth: &str| {
        format!(
            r#"{{"path":"p","sources":{{"a":{{"originalApi":{base},"path":"x","headers":{headers}{auth}}}}},"rulesAsString":{RULES}}}"#
        )
    };
    let located = |json: &str| -> Vec<String> {
        match registration(json).validate(false, None) {
            Ok(_) => Vec::new(),
            Err(problems) => problems.iter().map(|p| p.message.clone()).collect(),
        }
    };
    let bearer = r#","authHeader":{"type":"Bearer","token":"t"}"#;
    for (header, refused_alone, refused_beside_auth) in [
        ("Host", true, true),
        ("Content-Length", true, true),
        ("Connection", true, true),
        ("Transfer-Encoding", true, true),
        ("Proxy-Anything", true, true),
        ("Accept-Encoding", true, true),
        ("X-Mapped-Auth", true, true),
        ("Authorization", false, true),
        ("X-Api-Key", false, false),
    ] {
        let headers = format!(r#"{{"{header}":"v"}}"#);
        for (build, kind) in [(&own as &dyn Fn(&str, &str) -> String, "own"), (&source, "source")] {
            let alone = located(&build(&headers, ""));
            let beside = located(&build(&headers, bearer));
            assert_eq!(!alone.is_empty(), refused_alone, "{header} alone, {kind}: {alone:?}");
            assert_eq!(
                !beside.is_empty(),
                refused_beside_auth,
                "{header} beside authHeader, {kind}: {beside:?}"
            );
        }
    }

    // A query template whose value is a list repeats the parameter, for a route's own upstream
    // as for a source; a configured header value is sensitive.
    let templated = config(
        r#"{"originalApi":{"baseUrl":"http://127.0.0.1:9/"},"path":"x","queries":{"id":"{{request.query.id}}"},"headers":{"X-Api-Key":"k3y"}}"#,
        "",
    );
    let sent = request(templated, &FromClient { query: Some("id=1&id=2"), ..Default::default() });
    assert_eq!(sent.uri.query(), Some("id=1&id=2"));
    assert!(sent.headers["x-api-key"].is_sensitive());
    assert!(!format!("{sent:?}").contains("k3y"), "configured values are not printed");
    let route = Route::new(
        Uuid::nil(),
        0,
        0,
        registration(&format!(
            r#"{{"path":"p","sources":{{"a":{{"originalApi":{base},"path":"x","queries":{{"id":"{{{{request.query.id}}}}"}},"headers":{{"X-Api-Key":"k3y"}},"body":{{"b":1}}}}}},"rulesAsString":{RULES}}}"#
        ))
        .validate(false, None)
        .expect("valid"),
        &Limits::default(),
    );
    let composition = route.composition().expect("composed");
    let mut context = br#"{"request":{"query":{"id":["1","2"]},"headers":{},"body":null}}"#.to_vec();
    let sent = crate::json::with_parsed(&mut context, 64, |doc| {
        let scratch = Scratch::new(1 << 20, 1 << 20);
        let arena = scratch.arena();
        let context =
            Context { doc, item: None, caller: crate::expr::Val::Null, arena: &arena, explain: false };
        composition.sources[0].request(&context, &CallerParts::default()).expect("a request")
    })
    .unwrap();
    assert_eq!(sent.uri.query(), Some("id=1&id=2"));
    assert!(sent.headers["x-api-key"].is_sensitive());
    // A `GET` source sends no body, as a route's own `GET` upstream does not.
    assert!(sent.body.is_empty() && sent.headers.get("content-type").is_none(), "{sent:?}");
}
