use http::StatusCode;

use super::fetch::{MAX_ERROR_CODE, read_token};
use super::*;

fn credentials(client_auth: ClientAuth) -> ClientCredentials {
    ClientCredentials {
        token_url: "https://auth.example/oauth/token?tenant=a".to_owned(),
        client_id: "app one".to_owned(),
        client_secret: "s3cr:t&=".to_owned(),
        scope: Some("read write".to_owned()),
        audience: Some("https://api.example/".to_owned()),
        client_auth,
    }
}

fn form(request: &TokenRequest) -> Vec<(String, String)> {
    url::form_urlencoded::parse(&request.request.body).into_owned().collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn basic_auth_encodes_each_part_then_the_pair() {
    let request = TokenRequest::new(&credentials(ClientAuth::Basic)).unwrap();
    assert_eq!(request.request.method, Method::POST);
    assert_eq!(request.uri().to_string(), "https://auth.example/oauth/token?tenant=a");
    assert_eq!(request.origin, "https://auth.example:443");
    // RFC 6749 §2.3.1: "app one" -> "app+one", "s3cr:t&=" -> "s3cr%3At%26%3D", then base64.
    let expected = base64::engine::general_purpose::STANDARD.encode("app+one:s3cr%3At%26%3D");
    let headers = &request.request.headers;
    assert_eq!(headers[header::AUTHORIZATION], format!("Basic {expected}").as_str());
    assert!(headers[header::AUTHORIZATION].is_sensitive());
    assert_eq!(headers[header::CONTENT_TYPE], "application/x-www-form-urlencoded");
    assert_eq!(
        form(&request),
        pairs(&[
            ("grant_type", "client_credentials"),
            ("scope", "read write"),
            ("audience", "https://api.example/")
        ])
    );
}

#[test]
fn body_auth_sends_the_credentials_in_the_form() {
    let request = TokenRequest::new(&credentials(ClientAuth::Body)).unwrap();
    assert!(!request.request.headers.contains_key(header::AUTHORIZATION));
    assert_eq!(
        form(&request),
        pairs(&[
            ("grant_type", "client_credentials"),
            ("scope", "read write"),
            ("audience", "https://api.example/"),
            ("client_id", "app one"),
            ("client_secret", "s3cr:t&="),
        ])
    );
    let bare = ClientCredentials { scope: None, audience: None, ..credentials(ClientAuth::Body) };
    let request = TokenRequest::new(&bare).unwrap();
    assert_eq!(form(&request)[..1], pairs(&[("grant_type", "client_credentials")])[..]);
    assert_eq!(form(&request).len(), 3);
}

#[test]
fn one_key_per_credential_set_and_no_secret_printed() {
    let key = |c: &ClientCredentials| TokenRequest::new(c).unwrap().key;
    let base = credentials(ClientAuth::Basic);
    assert_eq!(key(&base), key(&base.clone()));
    for other in [
        ClientCredentials { client_secret: "other".to_owned(), ..base.clone() },
        ClientCredentials { client_id: "other".to_owned(), ..base.clone() },
        ClientCredentials { scope: None, ..base.clone() },
        ClientCredentials { audience: Some("x".to_owned()), ..base.clone() },
        ClientCredentials { token_url: "https://auth.example/oauth/token".to_owned(), ..base.clone() },
        ClientCredentials { client_auth: ClientAuth::Body, ..base.clone() },
    ] {
        assert_ne!(key(&base), key(&other), "{other:?}");
    }
    for printed in
        [format!("{base:?}"), format!("{:?}", TokenRequest::new(&credentials(ClientAuth::Body)).unwrap())]
    {
        assert!(!printed.contains("s3cr"), "{printed}");
    }
    assert!(TokenRequest::new(&ClientCredentials { token_url: "/token".to_owned(), ..base }).is_err());
}

#[test]
fn a_token_answer_gives_a_bearer_value_and_its_lifetime() {
    let ok = |body: &str| read_token(StatusCode::OK, body.as_bytes());
    let (value, expires_in) =
        ok(r#"{"access_token":"abc.DEF-_~+/=","token_type":"bearer","expires_in":300}"#).unwrap();
    assert_eq!(value, "Bearer abc.DEF-_~+/=");
    assert!(value.is_sensitive());
    assert_eq!(expires_in, Some(Duration::from_secs(300)));
    // A string lifetime, no token_type, extra members.
    let (_, expires_in) = ok(r#"{"access_token":"t","expires_in":"60","scope":"read","x":[1]}"#).unwrap();
    assert_eq!(expires_in, Some(Duration::from_secs(60)));
    assert_eq!(ok(r#"{"access_token":"t","expires_in":-5}"#).unwrap().1, None);
    assert_eq!(ok(r#"{"access_token":"t","expires_in":1e300}"#).unwrap().1, Some(MAX_LIFETIME));
    for body in [
        "not json",
        "[]",
        r#"{"token_type":"Bearer"}"#,
        r#"{"access_token":""}"#,
        r#"{"access_token":7}"#,
        r#"{"access_token":"a b"}"#,
        "{\"access_token\":\"a\\r\\nX-Evil: 1\"}",
        r#"{"access_token":"t","token_type":"mac"}"#,
    ] {
        assert!(matches!(ok(body), Err(AuthFailure::Unusable(_))), "{body}");
    }
}

#[test]
fn a_refusal_keeps_the_error_code_and_nothing_else_of_the_body() {
    let refused =
        |status: u16, body: &str| read_token(StatusCode::from_u16(status).unwrap(), body.as_bytes());
    let failure =
        refused(401, r#"{"error":"invalid_client","error_description":"secret SECRET-XYZ is wrong"}"#)
            .unwrap_err();
    assert_eq!(failure.error_code(), Some("invalid_client"));
    let text = failure.to_string();
    assert!(
        text.contains("invalid_client") && text.contains("401") && !text.contains("SECRET-XYZ"),
        "{text}"
    );
    for body in [
        "<html>down</html>",
        r#"{"error":"bad\"quote"}"#,
        r#"{"error":""}"#,
        r#"{"error":5}"#,
        "{\"error\":\"caf\u{e9}\"}",
    ] {
        assert_eq!(
            refused(400, body).unwrap_err(),
            AuthFailure::Refused { status: StatusCode::BAD_REQUEST, error: None },
            "{body}"
        );
    }
    let long = format!(r#"{{"error":"{}"}}"#, "x".repeat(MAX_ERROR_CODE + 1));
    assert_eq!(refused(400, &long).unwrap_err().error_code(), None);
    // A 5xx with a token in it is still a refusal.
    assert!(matches!(refused(503, r#"{"access_token":"t"}"#), Err(AuthFailure::Refused { .. })));
}

#[test]
fn a_token_is_renewed_before_it_is_last_sent() {
    let sent = Instant::now();
    let value = HeaderValue::from_static("Bearer t");
    let held = HeldToken::new(value.clone(), 1, sent, Some(Duration::from_secs(3600)));
    // A second off for the server's rounding, then a minute (renewal) or 5 seconds (last send).
    assert_eq!(held.renew_at - sent, Duration::from_secs(3539));
    assert_eq!(held.use_until - sent, Duration::from_secs(3594));
    // 3 seconds of life: renewed after 2.25, sent until 2.7.
    let short = HeldToken::new(value.clone(), 1, sent, Some(Duration::from_secs(4)));
    assert_eq!(short.renew_at - sent, Duration::from_millis(2250));
    assert_eq!(short.use_until - sent, Duration::from_millis(2700));
    let unknown = HeldToken::new(value.clone(), 1, sent, None);
    assert_eq!(unknown.use_until - sent, DEFAULT_LIFETIME - Duration::from_secs(6));
    for expires_in in [Duration::ZERO, Duration::from_millis(900)] {
        let none = HeldToken::new(value.clone(), 1, sent, Some(expires_in));
        assert_eq!((none.renew_at, none.use_until), (sent, sent));
    }
}

#[test]
fn a_token_of_more_than_16_kib_is_refused_and_a_5xx_is_not_called_a_refusal() {
    let long = format!(r#"{{"access_token":"{}"}}"#, "a".repeat(MAX_TOKEN + 1));
    assert!(matches!(read_token(StatusCode::OK, long.as_bytes()), Err(AuthFailure::Unusable(_))));
    let at_most = format!(r#"{{"access_token":"{}"}}"#, "a".repeat(MAX_TOKEN));
    assert!(read_token(StatusCode::OK, at_most.as_bytes()).is_ok());
    let failed = read_token(StatusCode::SERVICE_UNAVAILABLE, b"{}").unwrap_err().to_string();
    assert!(failed.starts_with("the token endpoint failed: it answered 503"), "{failed}");
    let refused = read_token(StatusCode::UNAUTHORIZED, b"{}").unwrap_err().to_string();
    assert!(refused.starts_with("the token endpoint refused the client credentials"), "{refused}");
}

#[test]
fn a_token_long_run_out_is_forgotten_and_its_counts_are_kept() {
    let tokens = Tokens::default();
    let request = TokenRequest::new(&credentials(ClientAuth::Basic)).unwrap();
    let slot = tokens.slot(&request);
    let sent = Instant::now();
    let held = HeldToken::new(HeaderValue::from_static("Bearer t"), 1, sent, Some(Duration::from_secs(11)));
    let use_until = held.use_until;
    *slot.held.write().unwrap() = Some(held);
    slot.fetched[0][0].fetch_add(2, Ordering::Relaxed);
    let every = Duration::from_secs(30);
    let unused_long =
        |now| (0..=crate::upstream::per_key::UNUSED_SWEEPS).for_each(|_| tokens.sweep(every, now));
    // A slot a call still holds is kept, whatever its age.
    unused_long(use_until + FORGET_AFTER);
    assert_eq!(tokens.len(), 1);
    drop(slot);
    unused_long(use_until + FORGET_AFTER - Duration::from_secs(1));
    assert_eq!(tokens.len(), 1, "ran out, but not long ago");
    // Used again: kept, until it goes unused for long.
    drop(tokens.slot(&request));
    tokens.sweep(every, use_until + FORGET_AFTER);
    assert_eq!(tokens.len(), 1, "used a sweep ago");
    unused_long(use_until + FORGET_AFTER);
    assert_eq!(tokens.len(), 0, "forgotten");
    let counts =
        TokenCounts { origin: "https://auth.example:443".to_owned(), fetched: [[2, 0], [0, 0], [0, 0]] };
    assert_eq!(tokens.snapshot(), [counts]);
    // The same credentials again: a new slot, and the counts add up.
    tokens.slot(&request).fetched[0][1].fetch_add(1, Ordering::Relaxed);
    assert_eq!(tokens.snapshot()[0].fetched, [[2, 1], [0, 0], [0, 0]]);
}
