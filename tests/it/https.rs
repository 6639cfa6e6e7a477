//! HTTPS and HTTP/2 at the listener (SPEC §7), with certificates an authority the test makes with
//! `openssl` signs: the same answers over HTTP/2 and HTTP/1.1 (curl, and a client that keeps its
//! connection), TLS 1.1 and plain HTTP refused at the handshake, the pair read again when its
//! files change and on SIGHUP (connections made before keep theirs; a pair that does not match
//! keeps the old one), a start stopped by files it cannot serve, and h2c behind `RECAST_H2C`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use recast::config::Config;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use x509_cert::der::Decode as _;

use crate::binary::Binary;
use crate::routes::{MEALS, registration};
use crate::support::{Answer, Json, Upstream, config};
use crate::tls::Pki;

/// The authority `server-ca` and two certificates for 127.0.0.1 it signs, `server` and `second`;
/// `other-ca` signs `stranger`.
fn pki() -> Pki {
    let pki = Pki::new();
    pki.authority("server-ca");
    pki.authority("other-ca");
    pki.issue("server-ca", "server", true);
    pki.issue("server-ca", "second", true);
    pki.issue("other-ca", "stranger", true);
    pki
}

/// The serial number of a certificate file (hex, lower case).
fn serial_of_file(path: &Path) -> String {
    serial(&CertificateDer::from_pem_file(path).expect("a PEM certificate"))
}

fn serial(certificate: &CertificateDer<'_>) -> String {
    let parsed = x509_cert::Certificate::from_der(certificate.as_ref()).expect("a certificate");
    parsed.tbs_certificate.serial_number.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

fn https_config(pki: &Pki) -> Config {
    Config { tls_cert: Some(pki.path("server.pem")), tls_key: Some(pki.path("server.key")), ..config() }
}

/// One HTTPS connection, kept alive: HTTP/2 or HTTP/1.1 as ALPN agreed; the serial of the
/// certificate the server showed.
struct Tls {
    sender: Sender,
    serial: String,
    http2: bool,
    /// The handshake resumed a session.
    resumed: bool,
}

/// A client's TLS configuration: trusting `ca`, offering `alpn`, showing the client certificate
/// `{name}.pem` of `pki` when there is one.
fn client_config(ca: &Path, alpn: &[&str], client: Option<(&Pki, &str)>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca).expect("the CA file") {
        roots.add(certificate.expect("a certificate")).expect("a root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        None => config.with_no_client_auth(),
        Some((pki, name)) => {
            let chain = CertificateDer::pem_file_iter(pki.path(&format!("{name}.pem")))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key =
                rustls::pki_types::PrivateKeyDer::from_pem_file(pki.path(&format!("{name}.key"))).unwrap();
            config.with_client_auth_cert(chain, key).expect("a client certificate")
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    Http2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Tls {
    /// Connects to `addr` trusting `ca`, offering `alpn`.
    async fn open(addr: SocketAddr, ca: &Path, alpn: &[&str]) -> Tls {
        Tls::open_as(addr, ca, alpn, None).await.expect("a handshake")
    }

    /// [`Tls::open`] showing the client certificate `{name}.pem` of `pki` when there is one; the
    /// error of a handshake the server refused (TLS 1.3 ends the client's side of it before the
    /// server has looked at the certificate: its refusal comes with the first answer read).
    async fn open_as(
        addr: SocketAddr,
        ca: &Path,
        alpn: &[&str],
        client: Option<(&Pki, &str)>,
    ) -> Result<Tls, String> {
        Tls::connect(addr, client_config(ca, alpn, client)).await
    }

    /// A connection made with `config`, which keeps the sessions it was given to resume them.
    async fn connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Result<Tls, String> {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connects");
        let name = ServerName::IpAddress(addr.ip().into());
        let stream =
            tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.map_err(|e| e.to_string())?;
        let (_, connection) = stream.get_ref();
        let http2 = connection.alpn_protocol() == Some(b"h2");
        let resumed = connection.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let serial = match connection.peer_certificates() {
            Some(chain) => serial(&chain[0]),
            None => String::new(),
        };
        let io = TokioIo::new(stream);
        let sender = if http2 {
            let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            Sender::Http2(sender)
        } else {
            let (sender, connection) =
                hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            Sender::Http1(sender)
        };
        Ok(Tls { sender, serial, http2, resumed })
    }

    async fn send(&mut self, method: Method, path: &str, body: &str) -> Answer {
        self.try_send(method, path, body, &[]).await.expect("an answer on the same connection")
    }

    /// A request with `headers`, or why no answer came.
    async fn try_send(
        &mut self,
        method: Method,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let request = Request::builder()
            .method(method)
            .uri(format!("https://127.0.0.1{path}"))
            .header("content-type", "application/json");
        let mut request = match self.sender {
            Sender::Http1(_) => request.header("host", "127.0.0.1"),
            Sender::Http2(_) => request,
        };
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::from(body.to_owned()))).expect("a request");
        let response = match &mut self.sender {
            Sender::Http1(sender) => sender.send_request(request).await,
            Sender::Http2(sender) => sender.send_request(request).await,
        }
        .map_err(|e| format!("{e:?}"))?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(Answer { status: parts.status, headers: parts.headers, body })
    }

    async fn get(&mut self, path: &str) -> Answer {
        self.send(Method::GET, path, "").await
    }
}

/// Waits until the HTTPS service at `addr` answers `/readyz` with 200.
pub(crate) async fn ready(addr: SocketAddr, ca: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() && {
            Tls::open(addr, ca, &["http/1.1"]).await.get("/readyz").await.status == 200
        } {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the HTTPS service did not become ready");
}

/// curl's answer to a GET of `url` trusting `ca`, with `args`: the body, and the HTTP version
/// it spoke.
async fn curl(ca: &Path, url: &str, args: &[&str]) -> (String, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-S", "-m", "10", "--cacert"]).arg(ca).args(args).args([
        "-w",
        "\n%{http_version}",
        url,
    ]);
    let output = run(command).await;
    assert!(output.status.success(), "curl {args:?} {url}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, version) = text.rsplit_once('\n').expect("the version after the body");
    (body.to_owned(), version.to_owned())
}

/// Runs `command` to its end off the runtime's thread, which also serves the service.
async fn run(mut command: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || command.output().expect("the command runs")).await.unwrap()
}

/// A metric's value in `/metrics`, read over `connection`.
async fn metric(connection: &mut Tls, line: &str) -> u64 {
    let text = String::from_utf8_lossy(&connection.get("/metrics").await.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix(line).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{line} in\n{text}"))
}

#[tokio::test]
async fn https_answers_alike_over_http2_and_http1_and_refuses_old_tls_and_plain_http() {
    let pki = pki();
    let upstream = Upstream::json(MEALS).await;
    let service = crate::support::Service::start_https(https_config(&pki), &pki.path("server-ca.pem")).await;
    let ca = pki.path("server-ca.pem");
    let mut client = Tls::open(service.addr, &ca, &["h2", "http/1.1"]).await;
    assert!(client.http2, "ALPN picks h2 when the client offers it");
    assert_eq!(client.serial, serial_of_file(&pki.path("server.pem")));
    let registered = client.send(Method::POST, "/v1/mapping", &registration(&upstream.url(""), "", "")).await;
    assert_eq!(registered.status, 201, "{}", String::from_utf8_lossy(&registered.body));
    let path = registered.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    let url = format!("https://127.0.0.1:{}{path}", service.addr.port());
    let (over_2, version_2) = curl(&ca, &url, &["--http2"]).await;
    let (over_1, version_1) = curl(&ca, &url, &["--http1.1"]).await;
    assert_eq!((version_2.as_str(), version_1.as_str()), ("2", "1.1"));
    assert_eq!(over_2, over_1);
    assert_eq!(over_2, r#"{"id":52772,"name":"Teriyaki Chicken"}"#);
    // Many calls on the one HTTP/2 connection, and on one HTTP/1.1 connection (the lane).
    let mut http1 = Tls::open(service.addr, &ca, &["http/1.1"]).await;
    assert!(!http1.http2);
    for _ in 0..20 {
        assert_eq!(String::from_utf8_lossy(&client.get(&path).await.body), over_1);
        assert_eq!(String::from_utf8_lossy(&http1.get(&path).await.body), over_1);
    }
    // A client that offers only TLS 1.1 is refused at the handshake, and so is plain HTTP.
    let mut s_client = Command::new("openssl");
    s_client
        .args(["s_client", "-connect", &service.addr.to_string(), "-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"])
        .stdin(std::process::Stdio::null());
    assert!(!run(s_client).await.status.success(), "TLS 1.1 was accepted");
    let mut plain = Command::new("curl");
    plain.args(["-s", "-m", "5", &format!("http://127.0.0.1:{}/healthz", service.addr.port())]);
    let plain = run(plain).await;
    assert!(!plain.status.success() && plain.stdout.is_empty(), "plain HTTP was answered");
    assert_eq!(metric(&mut client, r#"recast_tls_handshake_failures_total{kind="incompatible"}"#).await, 1);
    assert_eq!(metric(&mut client, r#"recast_tls_handshake_failures_total{kind="protocol"}"#).await, 1);
    assert!(metric(&mut client, r#"recast_tls_handshakes_total{protocol="h2"}"#).await >= 2);
    assert!(metric(&mut client, r#"recast_tls_handshakes_total{protocol="http/1.1"}"#).await >= 2);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let ends = metric(&mut client, "recast_tls_certificate_expiry_seconds").await;
    assert!(ends > now && ends <= now + 3 * 86_400, "the certificate ends in two days: {ends}");
    service.stop().await;
}

/// Replaces a file as a certificate manager does: written aside, then moved into place.
fn replace(from: &Path, to: &Path) {
    let aside = to.with_extension("new");
    std::fs::copy(from, &aside).unwrap();
    std::fs::rename(&aside, to).unwrap();
}

/// Waits until `/metrics` says `line` is `value`.
async fn until_metric(connection: &mut Tls, line: &str, value: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(connection, line).await != value {
        assert!(Instant::now() < deadline, "{line} never reached {value}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_changed_pair_serves_new_connections_and_a_bad_one_keeps_the_old() {
    let pki = pki();
    let served: PathBuf = pki.path("served");
    std::fs::create_dir(&served).unwrap();
    let (cert, key) = (served.join("tls.crt"), served.join("tls.key"));
    replace(&pki.path("server.pem"), &cert);
    replace(&pki.path("server.key"), &key);
    let ca = pki.path("server-ca.pem");
    let config = Config { tls_cert: Some(cert.clone()), tls_key: Some(key.clone()), ..config() };
    let service = crate::support::Service::start_https(config, &ca).await;
    let (first, renewed) = (serial_of_file(&pki.path("server.pem")), serial_of_file(&pki.path("second.pem")));
    let mut kept = Tls::open(service.addr, &ca, &["http/1.1"]).await;
    assert_eq!(kept.serial, first);
    assert_eq!(kept.get("/healthz").await.status, 200);
    // Renewed: the key first, then the certificate, as a manager may write them.
    replace(&pki.path("second.key"), &key);
    replace(&pki.path("second.pem"), &cert);
    until_metric(&mut kept, r#"recast_tls_reloads_total{outcome="ok"}"#, 1).await;
    // The connection made before goes on; a new one gets the new certificate.
    assert_eq!(kept.get("/healthz").await.status, 200);
    assert_eq!(Tls::open(service.addr, &ca, &["h2"]).await.serial, renewed);
    // A certificate whose key is not the one beside it: refused, the renewed pair kept.
    let failed_before = metric(&mut kept, r#"recast_tls_reloads_total{outcome="failed"}"#).await;
    replace(&pki.path("stranger.pem"), &cert);
    until_metric(&mut kept, r#"recast_tls_reloads_total{outcome="failed"}"#, failed_before + 1).await;
    let mut after = Tls::open(service.addr, &ca, &["http/1.1"]).await;
    assert_eq!(after.serial, renewed);
    assert_eq!(after.get("/healthz").await.status, 200);
    assert_eq!(kept.get("/healthz").await.status, 200);
    service.stop().await;
}

#[tokio::test]
async fn sighup_reads_the_pair_again_and_files_it_cannot_serve_stop_the_start() {
    let pki = pki();
    // Served from copies padded with blank lines (PEM readers skip text outside the blocks), so
    // that the next pair can be written at the same lengths.
    let (cert, key) = (pki.path("live.pem"), pki.path("live.key"));
    for (from, to) in [(pki.path("server.pem"), &cert), (pki.path("server.key"), &key)] {
        let mut text = std::fs::read(from).unwrap();
        text.extend_from_slice(&[b'\n'; 256]);
        std::fs::write(to, text).unwrap();
    }
    let ca = pki.path("server-ca.pem");
    let dir = tempfile::TempDir::new().unwrap();
    let env = [("RECAST_TLS_CERT", cert.to_str().unwrap()), ("RECAST_TLS_KEY", key.to_str().unwrap())];
    let mut binary = Binary::spawn_with(dir.path(), &env);
    binary.wait_for_line("listening").expect("the binary listens");
    binary.addr = binary.logged_address().expect("the address it listens on");
    ready(binary.addr, &ca).await;
    let old = serial_of_file(&pki.path("server.pem"));
    assert_eq!(Tls::open(binary.addr, &ca, &["http/1.1"]).await.serial, old);
    // The next pair written with the old files' times and lengths, so that only SIGHUP can
    // tell: the files' watch sees nothing change.
    let stamp = |path: &Path| {
        let metadata = std::fs::metadata(path).unwrap();
        (metadata.len(), metadata.modified().unwrap())
    };
    let (cert_was, key_was) = (stamp(&cert), stamp(&key));
    for (from, to, was) in
        [(pki.path("second.pem"), &cert, cert_was), (pki.path("second.key"), &key, key_was)]
    {
        let mut text = std::fs::read(&from).unwrap();
        assert!(text.len() <= was.0 as usize, "the next file is no longer than the padded one");
        text.resize(was.0 as usize, b'\n');
        std::fs::write(to, text).unwrap();
        std::fs::File::options().write(true).open(to).unwrap().set_modified(was.1).unwrap();
        assert_eq!(stamp(to), was);
    }
    tokio::time::sleep(crate::https::WATCH_WAIT).await;
    assert_eq!(Tls::open(binary.addr, &ca, &["http/1.1"]).await.serial, old, "nothing read it yet");
    binary.signal("HUP");
    let renewed = serial_of_file(&pki.path("second.pem"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while Tls::open(binary.addr, &ca, &["http/1.1"]).await.serial != renewed {
        assert!(Instant::now() < deadline, "SIGHUP did not serve the new pair");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(binary.terminate().success());

    // Files it cannot serve stop the start, with a message that names the file.
    let missing = pki.path("missing.pem");
    let mut binary = Binary::spawn_with(
        dir.path(),
        &[("RECAST_TLS_CERT", missing.to_str().unwrap()), ("RECAST_TLS_KEY", key.to_str().unwrap())],
    );
    assert!(!binary.exit_status().expect("it stops").success());
    assert!(binary.log_text().contains(missing.to_str().unwrap()), "{}", binary.log_text());
    let other_key = pki.path("stranger.key");
    let mut binary = Binary::spawn_with(
        dir.path(),
        &[("RECAST_TLS_CERT", cert.to_str().unwrap()), ("RECAST_TLS_KEY", other_key.to_str().unwrap())],
    );
    assert!(!binary.exit_status().expect("it stops").success());
    let log = binary.log_text();
    assert!(
        log.contains(other_key.to_str().unwrap()) && log.contains("is not the key of the certificate"),
        "{log}"
    );
    let mut binary = Binary::spawn_with(dir.path(), &[("RECAST_TLS_CERT", cert.to_str().unwrap())]);
    assert!(!binary.exit_status().expect("it stops").success());
    assert!(binary.log_text().contains("RECAST_TLS_KEY"), "{}", binary.log_text());
}

/// Longer than the files' watch takes to see a change.
pub const WATCH_WAIT: Duration = Duration::from_millis(2500);

#[tokio::test]
async fn h2c_is_served_with_prior_knowledge_only_when_asked_for() {
    let upstream = Upstream::json(MEALS).await;
    for h2c in [true, false] {
        let service = crate::support::Service::start(Config { h2c, ..config() }).await;
        let path = crate::routes::registered(&service, &registration(&upstream.url(""), "", ""), &[]).await;
        let stream = tokio::net::TcpStream::connect(service.addr).await.unwrap();
        let handshake =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await;
        let answered = match handshake {
            Ok((mut sender, connection)) => {
                tokio::spawn(connection);
                let request =
                    Request::get(format!("http://127.0.0.1{path}")).body(Full::new(Bytes::new())).unwrap();
                match sender.send_request(request).await {
                    Ok(response) => Some(response.into_body().collect().await.unwrap().to_bytes()),
                    Err(_) => None,
                }
            }
            Err(_) => None,
        };
        match answered {
            Some(body) => {
                assert!(h2c, "HTTP/2 in the clear was answered without RECAST_H2C");
                assert_eq!(body, r#"{"id":52772,"name":"Teriyaki Chicken"}"#);
            }
            None => assert!(!h2c, "RECAST_H2C=true did not serve HTTP/2 with prior knowledge"),
        }
        // HTTP/1.1 goes on either way.
        assert_eq!(crate::support::get(&service.url(&path)).await.status, 200);
        service.stop().await;
    }
}

/// Client certificates as callers (SPEC §7): with `RECAST_TLS_CLIENT_CA`, a route naming
/// `certificates: ["app-*"]` answers a client whose certificate's CN (or a SAN DNS name) is
/// `app-ios`, over HTTP/2 and HTTP/1.1, with `$caller` of kind `certificate`; another CA's
/// certificate is refused at the handshake; another name gets 403, no certificate 401, and a
/// client without one still calls open routes. A key or token in a header is judged instead of
/// the certificate.
#[tokio::test]
async fn client_certificates_call_routes_that_name_them() {
    let pki = pki();
    pki.authority("client-ca");
    pki.issue("client-ca", "app-ios", false);
    pki.issue("client-ca", "web-portal", false);
    pki.issue_with(
        "client-ca",
        "device-7",
        "extendedKeyUsage=clientAuth\nsubjectAltName=DNS:app-watch.example",
    );
    pki.issue("other-ca", "app-android", false);
    // A CN the route names, beside a SAN that it does not: the SAN is the certificate's name.
    pki.issue_with("client-ca", "app-cn", "extendedKeyUsage=clientAuth\nsubjectAltName=DNS:web.example");
    let upstream = Upstream::json(MEALS).await;
    let ca = pki.path("server-ca.pem");
    // The authorities in a file of their own, replaced below as a certificate manager does.
    let clients = pki.path("clients.pem");
    replace(&pki.path("client-ca.pem"), &clients);
    let asking = Config { tls_client_ca: Some(clients.clone()), ..https_config(&pki) };
    let service = crate::support::Service::start_https(asking, &ca).await;
    // No certificate: the admin API and open routes still answer.
    let mut admin = Tls::open(service.addr, &ca, &["h2"]).await;
    let body = serde_json::json!({
        "path": "meal",
        "originalRoute": {"originalApi": {"baseUrl": upstream.url("")}, "path": "meal"},
        "callers": {"certificates": ["app-*"]},
        "caller": {"kind": "certificate", "id": "app-sample", "issuer": "CN=client-ca"},
        "rulesAsString": {
            "newBodyFields": {"who": {"key": "who", "type": "String"}, "kind": {"key": "kind", "type": "String"},
                              "issuer": {"key": "issuer", "type": "String"}},
            "oldBodyFields": {"who": {"expr": "$caller.id"}, "kind": {"expr": "$caller.kind"},
                              "issuer": {"expr": "$caller.issuer"}}
        }
    });
    let registered = admin.send(Method::POST, "/v1/mapping", &body.to_string()).await;
    assert_eq!(registered.status, 201, "{}", String::from_utf8_lossy(&registered.body));
    assert!(
        !String::from_utf8_lossy(&registered.body).contains("/callers/certificates"),
        "no warning where client certificates are asked for: {}",
        String::from_utf8_lossy(&registered.body)
    );
    let path = registered.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    let open = admin.send(Method::POST, "/v1/mapping", &registration(&upstream.url(""), "", "")).await;
    let open_path = open.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    assert_eq!(admin.get(&open_path).await.status, 200);
    admin.get(&path).await.assert_problem(401, "caller-unauthenticated");

    for alpn in ["h2", "http/1.1"] {
        let mut ios = Tls::open_as(service.addr, &ca, &[alpn], Some((&pki, "app-ios"))).await.unwrap();
        for _ in 0..3 {
            let answer = ios.get(&path).await;
            assert_eq!(
                String::from_utf8_lossy(&answer.body),
                r#"{"issuer":"CN=client-ca","kind":"certificate","who":"app-ios"}"#,
                "{alpn}"
            );
        }
        // A key in a header is judged instead, and refused: the certificate does not stand in.
        let key = format!("rk_{}", "A".repeat(43));
        let refused = ios.try_send(Method::GET, &path, "", &[("x-api-key", &key)]).await.unwrap();
        refused.assert_problem(401, "caller-unauthenticated");
        // The open route, with a certificate shown.
        assert_eq!(ios.get(&open_path).await.status, 200);
        // A SAN DNS name the route names, the CN it does not.
        let mut watch = Tls::open_as(service.addr, &ca, &[alpn], Some((&pki, "device-7"))).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&watch.get(&path).await.body),
            r#"{"issuer":"CN=client-ca","kind":"certificate","who":"app-watch.example"}"#
        );
        // A certificate whose CN the route names and whose SAN it does not: 403.
        let mut cn = Tls::open_as(service.addr, &ca, &[alpn], Some((&pki, "app-cn"))).await.unwrap();
        cn.get(&path).await.assert_problem(403, "caller-forbidden");
        // Another name of the same authority: 403.
        let mut portal = Tls::open_as(service.addr, &ca, &[alpn], Some((&pki, "web-portal"))).await.unwrap();
        let problem = portal.get(&path).await.assert_problem(403, "caller-forbidden");
        assert!(problem.to_string().contains("client certificate"), "{problem}");
        // Another authority's certificate, with a name the route names: refused at the handshake.
        // (Counted below as a handshake that failed for its certificate.)
        if let Ok(mut connection) =
            Tls::open_as(service.addr, &ca, &[alpn], Some((&pki, "app-android"))).await
            && let Ok(answer) = connection.try_send(Method::GET, &path, "", &[]).await
        {
            panic!("another CA's certificate was answered: {}", answer.status);
        }
    }
    assert_eq!(metric(&mut admin, r#"recast_tls_handshake_failures_total{kind="certificate"}"#).await, 2);
    assert_eq!(metric(&mut admin, r#"recast_callers_admitted_total{kind="certificate"}"#).await, 8);

    // A client coming back resumes its session, until the authorities change: then its
    // certificate is verified again, against the authorities read last, and refused.
    let returning = client_config(&ca, &["http/1.1"], Some((&pki, "app-ios")));
    for _ in 0..2 {
        let mut again = Tls::connect(service.addr, returning.clone()).await.unwrap();
        assert_eq!(again.get(&path).await.status, 200);
    }
    let mut resumed = Tls::connect(service.addr, returning.clone()).await.unwrap();
    assert!(resumed.resumed, "the session was resumed");
    assert_eq!(resumed.get(&path).await.status, 200);
    replace(&pki.path("other-ca.pem"), &clients);
    until_metric(&mut admin, r#"recast_tls_reloads_total{outcome="ok"}"#, 1).await;
    // A connection open since before: its certificate no longer stands.
    let problem = resumed.get(&path).await.assert_problem(401, "caller-unauthenticated");
    assert!(problem.to_string().contains("connect again"), "{problem}");
    if let Ok(mut connection) = Tls::connect(service.addr, returning.clone()).await
        && let Ok(answer) = connection.try_send(Method::GET, &path, "", &[]).await
    {
        panic!(
            "a session resumed past a change of the client authorities: {} (resumed: {})",
            answer.status, connection.resumed
        );
    }
    service.stop().await;

    // Without client authorities, a route naming certificates is warned of; the authorities
    // alone, or a file that cannot be read, stop the start.
    let plain = crate::support::Service::start(config()).await;
    let warned = crate::support::post_json(&plain.url("/v1/mapping"), body.to_string()).await;
    assert_eq!(warned.status, 201, "{}", String::from_utf8_lossy(&warned.body));
    assert!(String::from_utf8_lossy(&warned.body).contains("/callers/certificates"));
    plain.stop().await;
    let missing = pki.path("nowhere.pem");
    let why = match recast::server::tls::ListenerTls::new(
        &pki.path("server.pem"),
        &pki.path("server.key"),
        Some(&missing),
    ) {
        Err(why) => why,
        Ok(_) => panic!("a missing client CA file was taken"),
    };
    assert!(why.contains("nowhere.pem"), "{why}");
    let dir = tempfile::TempDir::new().unwrap();
    let mut binary = Binary::spawn_with(
        dir.path(),
        &[("RECAST_TLS_CLIENT_CA", pki.path("client-ca.pem").to_str().unwrap())],
    );
    assert!(!binary.exit_status().expect("it stops").success());
    assert!(binary.log_text().contains("RECAST_TLS_CERT"), "{}", binary.log_text());
}

/// A call over HTTPS is a SERVER span whose `url.scheme` is `https`, with the protocol the
/// client spoke (`2` over HTTP/2, whose `:authority` gives `server.address`; `1.1` through the
/// lane).
#[tokio::test]
async fn spans_of_calls_over_https_say_https_and_the_protocol() {
    use crate::traces::{Collector, Mode, SERVER, has, traced, unhex};
    let pki = pki();
    let collector = Collector::start(Mode::Take).await;
    let upstream = Upstream::json(MEALS).await;
    let ca = pki.path("server-ca.pem");
    let config = Config {
        tls_cert: Some(pki.path("server.pem")),
        tls_key: Some(pki.path("server.key")),
        ..traced(&collector)
    };
    let service = crate::support::Service::start_https(config, &ca).await;
    let mut admin = Tls::open(service.addr, &ca, &["http/1.1"]).await;
    let registered = admin.send(Method::POST, "/v1/mapping", &registration(&upstream.url(""), "", "")).await;
    let path = registered.json().get("path").and_then(Json::as_str).unwrap().to_owned();
    for (alpn, trace, version) in [
        ("h2", "4bf92f3577b34da6a3ce929d0e0e4736", "2"),
        ("http/1.1", "5bf92f3577b34da6a3ce929d0e0e4736", "1.1"),
    ] {
        let mut client = Tls::open(service.addr, &ca, &[alpn]).await;
        let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
        let answer = client.try_send(Method::GET, &path, "", &[("traceparent", &traceparent)]).await.unwrap();
        assert_eq!(answer.status, 200);
        let spans = collector.trace(&unhex(trace), 3).await;
        let server = spans.iter().find(|s| s.kind == SERVER).expect("a SERVER span");
        assert!(has(server, "url.scheme", "https"), "{server:#?}");
        assert!(has(server, "network.protocol.version", version), "{alpn}: {server:#?}");
        assert!(has(server, "server.address", "127.0.0.1"), "{alpn}: {server:#?}");
    }
    service.stop().await;
}
