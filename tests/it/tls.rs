//! TLS to upstreams beyond the public roots (`docs/upstreams.md`), against nginx (Debian's, which
//! `scripts/test.sh` installs) serving HTTPS on 127.0.0.1 with certificates of authorities the test
//! makes with `openssl`: a private CA trusted by one route (`tls.ca`) or by every route
//! (`RECAST_UPSTREAM_CA_FILE`), and client certificates (`tls.clientCert`, `tls.clientKey`) that
//! an upstream with `ssl_verify_client on` asks for, or that `openssl s_server -Verify` demands in
//! the handshake.

use std::path::PathBuf;
use std::process::Command;

use tempfile::TempDir;

use crate::nginx::{Nginx, set_mode};
use crate::routes::{MEALS, registration};
use crate::secrets::files_holding;
use crate::support::{Json, Service, config, error_locations, free_port, get, post_json};

/// Certificate authorities and the certificates they sign, made by `openssl` in a directory
/// nginx's workers can read.
pub struct Pki {
    dir: TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = TempDir::new().unwrap();
        set_mode(dir.path(), 0o755);
        Pki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn pem(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap()
    }

    /// nginx's directives for the server certificate of `server-ca`.
    pub fn nginx_certificate(&self) -> String {
        format!(
            "ssl_certificate {};\n    ssl_certificate_key {};",
            self.path("server.pem").display(),
            self.path("server.key").display()
        )
    }

    fn openssl(&self, args: &[&str]) {
        let output =
            Command::new("openssl").current_dir(self.dir.path()).args(args).output().expect("openssl runs");
        assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// A CA: `{name}.pem` and `{name}.key`.
    pub fn authority(&self, name: &str) {
        let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            &key,
            "-out",
            &cert,
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
    }

    /// A certificate `{name}.pem` (and key `{name}.key`) signed by `ca`, for a server on
    /// 127.0.0.1 or for a client.
    pub fn issue(&self, ca: &str, name: &str, server: bool) {
        let usage = if server {
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"
        } else {
            "extendedKeyUsage=clientAuth"
        };
        self.issue_with(ca, name, usage);
    }

    /// A certificate `{name}.pem` (and key `{name}.key`) whose subject's CN is `name`, signed by
    /// `ca`, with the extension lines `usage` (openssl's `-extfile` form).
    pub fn issue_with(&self, ca: &str, name: &str, usage: &str) {
        let (cert, key, request) = (format!("{name}.pem"), format!("{name}.key"), format!("{name}.csr"));
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &request,
            "-subj",
            &format!("/CN={name}"),
        ]);
        let extensions = format!("{name}.ext");
        std::fs::write(
            self.path(&extensions),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{usage}\n"),
        )
        .unwrap();
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &request,
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &cert,
            "-extfile",
            &extensions,
        ]);
        for file in [&cert, &key] {
            set_mode(&self.path(file), 0o644);
        }
    }
}

/// The authorities and certificates of these tests: `server-ca` signs nginx's certificate,
/// `client-ca` the client certificate nginx accepts, `other-ca` one it does not.
pub fn pki() -> Pki {
    let pki = Pki::new();
    for ca in ["server-ca", "client-ca", "other-ca"] {
        pki.authority(ca);
    }
    pki.issue("server-ca", "server", true);
    pki.issue("client-ca", "client", false);
    pki.issue("other-ca", "stranger", false);
    pki
}

/// nginx with two HTTPS servers answering `MEALS`: one open to any client (HTTP/1.1), one that
/// asks for a client certificate of `client-ca` (`ssl_verify_client on`; HTTP/2 offered, so the
/// client certificate and the keeping apart of connections are tested over both). Their ports.
fn nginx(pki: &Pki) -> (Nginx, u16, u16) {
    let (open, verifying) = (free_port(), free_port());
    let tls = pki.nginx_certificate();
    let answer = format!(
        "default_type application/json;\n    location / {{ return 200 '{MEALS}'; }}\n    location /refused/ {{ return 403; }}"
    );
    let site = format!(
        "server {{\n    listen 127.0.0.1:{open} ssl;\n    {tls}\n    {answer}\n}}\n\
         server {{\n    listen 127.0.0.1:{verifying} ssl http2;\n    {tls}\n    ssl_client_certificate {};\n    ssl_verify_client on;\n    {answer}\n}}\n",
        pki.path("client-ca.pem").display()
    );
    let nginx = Nginx::serve(&site, verifying, TempDir::new().unwrap());
    (nginx, open, verifying)
}

/// A registration of a route `path` to `https://127.0.0.1:{port}/` with `tls` (JSON, or none).
fn body(port: u16, path: &str, tls: Option<serde_json::Value>) -> String {
    let extra = tls.map(|tls| format!(r#","tls":{tls}"#)).unwrap_or_default();
    registration(&format!("https://127.0.0.1:{port}/"), "", &extra).replacen(
        r#""path":"meals/random""#,
        &format!(r#""path":"{path}""#),
        1,
    )
}

async fn register(service: &Service, body: String) -> crate::support::Answer {
    post_json(&service.url("/v1/mapping"), body).await
}

fn problem_detail(problem: &Json) -> &str {
    problem.get("detail").and_then(Json::as_str).unwrap_or_default()
}

#[tokio::test]
async fn a_private_ca_is_trusted_by_its_route_or_by_every_route_from_the_ca_file() {
    let pki = pki();
    let (_nginx, open, _) = nginx(&pki);
    let service = Service::start(config()).await;
    // Mozilla's roots do not know the test's CA: the handshake fails, and nothing is stored.
    let answer = register(&service, body(open, "public", None)).await;
    let problem = answer.assert_problem(502, "upstream-tls-failed");
    assert!(problem_detail(&problem).contains("certificate"), "{}", problem_detail(&problem));
    // The route that trusts it is served, and its calls are.
    let ca = serde_json::json!({ "ca": pki.pem("server-ca.pem") });
    let created = register(&service, body(open, "private", Some(ca))).await;
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    let path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, r#"{"id":52772,"name":"Teriyaki Chicken"}"#.as_bytes());
    // Only that route: another one to the same upstream still fails.
    register(&service, body(open, "other", None)).await.assert_problem(502, "upstream-tls-failed");
    service.stop().await;

    // RECAST_UPSTREAM_CA_FILE: every route trusts it.
    let trusting = Service::start(recast::config::Config {
        upstream_ca_file: Some(pki.path("server-ca.pem")),
        ..config()
    })
    .await;
    assert_eq!(register(&trusting, body(open, "public", None)).await.status, 201);
    trusting.stop().await;

    // A CA file that holds no certificate stops the start, saying which file.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let data = TempDir::new().unwrap();
    let bad = recast::config::Config {
        upstream_ca_file: Some(pki.path("server.key")),
        data_dir: data.path().to_owned(),
        ..config()
    };
    let refused = recast::server::run(listener, bad, std::future::pending()).await.expect_err("refused");
    assert!(refused.to_string().contains("RECAST_UPSTREAM_CA_FILE"), "{refused}");
}

/// Each source of a composed route (SPEC §2.3) has its own `tls`: one trusts the private CA,
/// another presents a client certificate as well, and a third without it is refused by the
/// upstream that asks for one, which fails the registration naming that source. The client key
/// is not in the listing.
#[tokio::test]
async fn each_source_of_a_composition_has_its_own_tls() {
    let pki = pki();
    let (_nginx, open, verifying) = nginx(&pki);
    let service = Service::start(config()).await;
    let ca = serde_json::json!({ "ca": pki.pem("server-ca.pem") });
    let with_cert = serde_json::json!({
        "ca": pki.pem("server-ca.pem"),
        "clientCert": pki.pem("client.pem"),
        "clientKey": pki.pem("client.key"),
    });
    let source = |port: u16, tls: &serde_json::Value| serde_json::json!({"originalApi": {"baseUrl": format!("https://127.0.0.1:{port}/")}, "path": "m", "tls": tls});
    let rules = serde_json::json!({
        "newBodyFields": {"id": {"key": "id", "type": "Int"}, "name": {"key": "name", "type": "String"}},
        "oldBodyFields": {"id": {"expr": "open.meals[0].idMeal"}, "name": {"expr": "mtls.meals[0].strMeal"}},
    });
    let registration = |mtls: &serde_json::Value| {
        serde_json::json!({"path": "both", "sources": {"open": source(open, &ca), "mtls": source(verifying, mtls)},
                           "rulesAsString": rules})
        .to_string()
    };
    let created = register(&service, registration(&with_cert)).await;
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    let path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    for _ in 0..2 {
        let answer = get(&service.url(&path)).await;
        assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.body, r#"{"id":52772,"name":"Teriyaki Chicken"}"#.as_bytes());
    }
    // Without its certificate the source that needs one fails, and the problem names it.
    let problem =
        register(&service, registration(&ca)).await.assert_problem(502, "upstream-validation-failed");
    assert_eq!(problem.get("source").and_then(Json::as_str), Some("mtls"), "{problem:?}");
    assert_eq!(problem.get("upstreamStatus"), Some(&Json::Number(400.into())), "{problem:?}");
    let listing = get(&service.url("/v1/routes")).await;
    let text = String::from_utf8_lossy(&listing.body);
    let key = pki.pem("client.key");
    let key_body = key.lines().nth(1).expect("a line of the key");
    assert!(!text.contains(key_body), "the client key is in the listing");
    service.stop().await;
}

#[tokio::test]
async fn a_client_certificate_is_presented_and_its_connections_carry_no_other_route_s_calls() {
    let pki = pki();
    let (_nginx, open, verifying) = nginx(&pki);
    let dir = TempDir::new().unwrap();
    let service = Service::start_in(config(), dir.path()).await;
    let key = pki.pem("client.key");
    let with_cert = serde_json::json!({
        "ca": pki.pem("server-ca.pem"),
        "clientCert": pki.pem("client.pem"),
        "clientKey": key,
    });
    let created = register(&service, body(verifying, "mtls", Some(with_cert))).await;
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    let path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    for _ in 0..3 {
        assert_eq!(get(&service.url(&path)).await.status, 200);
    }
    // A route to the same upstream without a certificate gets nginx's refusal (an HTTP 400, which
    // nginx sends once the handshake is over), not the first route's pooled connection.
    let without = serde_json::json!({ "ca": pki.pem("server-ca.pem") });
    let problem = register(&service, body(verifying, "anonymous", Some(without)))
        .await
        .assert_problem(502, "upstream-validation-failed");
    assert_eq!(problem.get("upstreamStatus"), Some(&Json::Number(400.into())), "{problem:?}");
    // Its detail says that nginx had asked for a certificate and got none.
    let detail = problem_detail(&problem);
    assert!(
        detail.contains("asked for a client certificate") && detail.contains("presents none"),
        "{detail}"
    );
    // So does one with a certificate of another CA.
    let stranger = serde_json::json!({
        "ca": pki.pem("server-ca.pem"),
        "clientCert": pki.pem("stranger.pem"),
        "clientKey": pki.pem("stranger.key"),
    });
    let problem = register(&service, body(verifying, "stranger", Some(stranger)))
        .await
        .assert_problem(502, "upstream-validation-failed");
    let detail = problem_detail(&problem);
    assert!(detail.contains("was given the route's"), "{detail}");
    // A 403 of an upstream that asked for no certificate says nothing of certificates.
    let refused = |port: u16, tls: serde_json::Value| {
        registration(&format!("https://127.0.0.1:{port}/refused/"), "", &format!(r#","tls":{tls}"#))
    };
    let server_ca = serde_json::json!({ "ca": pki.pem("server-ca.pem") });
    let problem =
        register(&service, refused(open, server_ca)).await.assert_problem(502, "upstream-validation-failed");
    assert_eq!(problem_detail(&problem), "the upstream answered 403 Forbidden", "{problem:?}");
    assert_eq!(get(&service.url(&path)).await.status, 200, "the first route still presents its own");

    // The key is masked in the listing and sealed at rest.
    let listing = String::from_utf8(get(&service.url("/v1/routes")).await.body.to_vec()).unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listing).unwrap();
    let tls = &listed["routes"][0]["tls"];
    assert_eq!(tls["clientKey"], "***", "{listing}");
    assert!(tls["clientCert"].as_str().is_some_and(|c| c.contains("BEGIN CERTIFICATE")), "{listing}");
    let key_line = key.lines().nth(1).expect("the key's first base64 line");
    assert!(!listing.contains(key_line));
    // Sent back as shown, `"***"` keeps the stored key: the live call presents it again.
    let uuid = &path[4..40];
    let shown = crate::routes::shown_as_update(&service, uuid, |_| {}).await;
    let answer = crate::routes::update(&service, uuid, shown).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(get(&service.url(&path)).await.status, 200);
    // Not for another upstream: told once, at the key (not also as a key that is no PEM).
    let moved = crate::routes::shown_as_update(&service, uuid, |body| {
        body["originalRoute"]["originalApi"]["baseUrl"] = format!("https://127.0.0.1:{open}/").into();
    })
    .await;
    let problem = crate::routes::update(&service, uuid, moved).await.assert_problem(400, "invalid-request");
    assert_eq!(error_locations(&problem), ["/tls/clientKey"], "{problem:?}");
    service.stop().await;
    let mut read = 0;
    assert_eq!(files_holding(dir.path(), key_line, &mut read), Vec::<String>::new());
    assert!(read > 0);
}

/// `openssl s_server` serving `MEALS` from a file (`-WWW`, HTTP/1.0) to clients with a
/// certificate of `client-ca` only (`-Verify`, `-verify_return_error`): it refuses the others in the TLS handshake, with
/// an alert, where nginx answers them in HTTP. Its process and port.
fn s_server(pki: &Pki) -> (crate::process::Group, u16) {
    let port = free_port();
    let www = pki.path("www");
    std::fs::create_dir_all(www.join("api")).unwrap();
    std::fs::write(www.join("api/random.php"), MEALS).unwrap();
    let group = crate::process::Group::spawn_logged(
        Command::new("openssl")
            .current_dir(&www)
            .args([
                "s_server",
                "-quiet",
                "-WWW",
                "-Verify",
                "1",
                "-verify_return_error",
                "-accept",
                &format!("127.0.0.1:{port}"),
            ])
            .arg("-cert")
            .arg(pki.path("server.pem"))
            .arg("-key")
            .arg(pki.path("server.key"))
            .arg("-CAfile")
            .arg(pki.path("client-ca.pem")),
        "openssl s_server",
        crate::process::Kept::Both,
    )
    .expect("openssl s_server starts");
    let deadline = std::time::Instant::now() + crate::support::PATIENCE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "openssl s_server does not listen");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    (group, port)
}

#[tokio::test]
async fn an_upstream_that_refuses_a_client_certificate_in_the_handshake_is_a_tls_failure() {
    let pki = pki();
    let (_server, port) = s_server(&pki);
    let service = Service::start(config()).await;
    let server_ca = pki.pem("server-ca.pem");
    let with = |cert: &str, key: &str| serde_json::json!({ "ca": server_ca, "clientCert": pki.pem(cert), "clientKey": pki.pem(key) });
    // The right certificate: the route is stored and served.
    let created = register(&service, body(port, "mtls", Some(with("client.pem", "client.key")))).await;
    assert_eq!(created.status, 201, "{}", String::from_utf8_lossy(&created.body));
    let path = created.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    let answer = get(&service.url(&path)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, r#"{"id":52772,"name":"Teriyaki Chicken"}"#.as_bytes());
    // None, or one of another CA: the server's alert, 502 `upstream-tls-failed`, nothing stored.
    for (name, tls, alert) in [
        ("none", serde_json::json!({ "ca": server_ca }), "CertificateRequired"),
        ("stranger", with("stranger.pem", "stranger.key"), "UnknownCA"),
    ] {
        let problem =
            register(&service, body(port, name, Some(tls))).await.assert_problem(502, "upstream-tls-failed");
        assert!(problem_detail(&problem).contains(alert), "{name}: {problem:?}");
    }
    let listing: serde_json::Value =
        serde_json::from_slice(&get(&service.url("/v1/routes")).await.body).unwrap();
    assert_eq!(listing["routes"].as_array().map(Vec::len), Some(1), "{listing}");
    service.stop().await;
}

#[tokio::test]
async fn tls_members_are_checked_with_locations() {
    let pki = pki();
    let service = Service::start(config()).await;
    let server_ca = pki.pem("server-ca.pem");
    let cases: Vec<(String, serde_json::Value, Vec<&str>)> = vec![
        ("https://127.0.0.1:9/".into(), serde_json::json!({ "ca": "not a certificate" }), vec!["/tls/ca"]),
        (
            "https://127.0.0.1:9/".into(),
            serde_json::json!({ "clientCert": pki.pem("client.pem") }),
            vec!["/tls/clientKey"],
        ),
        (
            "https://127.0.0.1:9/".into(),
            serde_json::json!({ "clientKey": pki.pem("client.key") }),
            vec!["/tls/clientCert"],
        ),
        (
            "https://127.0.0.1:9/".into(),
            // Another certificate's key.
            serde_json::json!({ "clientCert": pki.pem("client.pem"), "clientKey": pki.pem("stranger.key") }),
            vec!["/tls/clientKey"],
        ),
        ("https://127.0.0.1:9/".into(), serde_json::json!({ "ca": server_ca, "pin": "x" }), vec!["/tls/pin"]),
        ("https://127.0.0.1:9/".into(), serde_json::json!({}), vec!["/tls"]),
        ("https://127.0.0.1:9/".into(), serde_json::json!({ "ca": 7 }), vec!["/tls/ca"]),
        (
            // A key pasted in with the certificates would be stored and shown as they are.
            "https://127.0.0.1:9/".into(),
            serde_json::json!({ "ca": format!("{}{}", pki.pem("server-ca.pem"), pki.pem("client.key")) }),
            vec!["/tls/ca"],
        ),
        ("http://127.0.0.1:9/".into(), serde_json::json!({ "ca": pki.pem("server-ca.pem") }), vec!["/tls"]),
    ];
    for (base, tls, locations) in cases {
        let body = registration(&base, "", &format!(r#","tls":{tls}"#));
        let problem =
            post_json(&service.url("/v1/mapping"), body).await.assert_problem(400, "invalid-request");
        assert_eq!(error_locations(&problem), locations, "{tls}");
    }
    service.stop().await;
}
