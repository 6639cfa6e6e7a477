//! Test harness: an order-keeping JSON value for reading and comparing documents, the service
//! started in-process on 127.0.0.1:0, and a small HTTP client.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recast::config::Config;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The default configuration, with loopback upstreams allowed (the test upstreams listen on
/// 127.0.0.1, which the outbound policy refuses by default).
pub fn config() -> Config {
    Config { upstream_allow: "127.0.0.0/8".parse().expect("a network"), ..Config::default() }
}

/// A JSON value whose objects keep their members in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    pub fn parse(text: &[u8]) -> Json {
        serde_json::from_slice(text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(text)))
    }

    pub fn get(&self, name: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> &[Json] {
        match self {
            Json::Array(items) => items,
            other => panic!("not an array: {other}"),
        }
    }

    /// The same value with every object's members sorted, for order-blind comparison.
    pub fn sorted(&self) -> Json {
        match self {
            Json::Array(items) => Json::Array(items.iter().map(Json::sorted).collect()),
            Json::Object(members) => {
                let mut members: Vec<_> = members.iter().map(|(k, v)| (k.clone(), v.sorted())).collect();
                members.sort_by(|a, b| a.0.cmp(&b.0));
                Json::Object(members)
            }
            other => other.clone(),
        }
    }
}

/// Compact JSON text, members in order.
impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Json::Null => f.write_str("null"),
            Json::Bool(b) => write!(f, "{b}"),
            Json::Number(n) => write!(f, "{n}"),
            Json::String(s) => write!(f, "{}", serde_json::Value::String(s.clone())),
            Json::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Json::Object(members) => {
                f.write_str("{")?;
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}:{v}", serde_json::Value::String(k.clone()))?;
                }
                f.write_str("}")
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(n).map(Json::Number).ok_or_else(|| E::custom("not finite"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::String(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Json::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Json::Object(members))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// The service running in-process on an ephemeral loopback port, with its own data directory.
pub struct Service {
    pub addr: SocketAddr,
    pub dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), recast::server::RunError>>>,
    _temp: Option<TempDir>,
}

impl Service {
    /// Starts the service with `config`, in a fresh temporary data directory, and waits until it
    /// has loaded its routes.
    pub async fn start(config: Config) -> Service {
        let temp = TempDir::new().expect("a temporary directory");
        let dir = temp.path().to_owned();
        let mut service = Service::start_in(config, &dir).await;
        service._temp = Some(temp);
        service
    }

    /// Starts the service on the data directory `dir` (kept by the caller, e.g. across restarts).
    pub async fn start_in(mut config: Config, dir: &Path) -> Service {
        config.data_dir = dir.to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(recast::server::run(listener, config, async move {
            let _ = stopped.await;
        }));
        let service = Service { addr, dir: dir.to_owned(), stop: Some(stop), task: Some(task), _temp: None };
        service.wait_ready().await;
        service
    }

    /// Waits until `/readyz` answers 200 (the stored routes are loaded).
    pub async fn wait_ready(&self) {
        for _ in 0..500 {
            let ready = get(&self.url("/readyz")).await;
            if ready.status == 200 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the service did not become ready");
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Asks the service to stop and waits until `run` returns.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server run");
        }
    }
}

/// A request an upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// What an upstream answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub delay: std::time::Duration,
    /// More headers to answer with.
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    pub fn json(body: &str) -> Reply {
        Reply::with(200, body)
    }

    pub fn with(status: u16, body: &str) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: body.as_bytes().to_vec(),
            delay: Default::default(),
            headers: Vec::new(),
        }
    }
}

type Replier = dyn Fn(&Received) -> Reply + Send + Sync;

/// A real HTTP/1.1 server on 127.0.0.1:0 that plays an upstream: it answers every request with
/// what the test's function returns and records what it received.
pub struct Upstream {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl Upstream {
    pub async fn start(reply: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let reply: Arc<Replier> = Arc::new(reply);
        let log = received.clone();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = connections.clone();
        let task = tokio::spawn(async move {
            // Connection tasks belong to this task: stopping the upstream closes them too.
            let mut serving = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (reply, log) = (reply.clone(), log.clone());
                serving.spawn(async move {
                    let service =
                        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let (reply, log) = (reply.clone(), log.clone());
                            async move {
                                let (parts, body) = request.into_parts();
                                let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                                let received = Received {
                                    method: parts.method,
                                    uri: parts.uri,
                                    headers: parts.headers,
                                    body,
                                };
                                let answer = reply(&received);
                                log.lock().unwrap().push(received);
                                tokio::time::sleep(answer.delay).await;
                                let mut response = http::Response::new(Full::new(Bytes::from(answer.body)));
                                *response.status_mut() = http::StatusCode::from_u16(answer.status).unwrap();
                                response
                                    .headers_mut()
                                    .insert("content-type", answer.content_type.parse().unwrap());
                                for (name, value) in answer.headers {
                                    response.headers_mut().insert(name, value.parse().unwrap());
                                }
                                Ok::<_, std::convert::Infallible>(response)
                            }
                        });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Upstream { addr, received, connections, task }
    }

    /// Always answers `body` with 200.
    pub async fn json(body: &'static str) -> Upstream {
        Upstream::start(move |_| Reply::json(body)).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// How many TCP connections were accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An answer, fully read.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Json {
        Json::parse(&self.body)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Checks an RFC 9457 answer: status, content type, members, and the problem type's slug.
    pub fn assert_problem(&self, status: u16, slug: &str) -> Json {
        assert_eq!(self.status.as_u16(), status, "{}", String::from_utf8_lossy(&self.body));
        assert_eq!(self.header("content-type"), Some("application/problem+json"));
        let problem = self.json();
        assert_eq!(
            problem.get("type").and_then(Json::as_str),
            Some(format!("https://recast.dev/problems/{slug}").as_str())
        );
        assert_eq!(problem.get("status"), Some(&Json::Number(status.into())));
        for member in ["title", "detail", "instance"] {
            assert!(problem.get(member).and_then(Json::as_str).is_some(), "{member} in {problem}");
        }
        problem
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends one request and reads the whole answer.
pub async fn send(method: Method, url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Answer {
    try_send(method, url, headers, body).await.expect("the service answers")
}

/// Like [`send`], but `None` when no whole answer comes (the service died meanwhile).
pub async fn try_send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Option<Answer> {
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(body.into())).expect("request");
    let response = client().request(request).await.ok()?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    Some(Answer { status: parts.status, headers: parts.headers, body })
}

pub async fn post_json(url: &str, body: impl Into<Bytes>) -> Answer {
    send(Method::POST, url, &[("content-type", "application/json")], body).await
}

pub async fn get(url: &str) -> Answer {
    send(Method::GET, url, &[], "").await
}
