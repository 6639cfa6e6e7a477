//! `/v1/consumers…` (SPEC §2.4), behind the admin token: consumers, and the API keys they call
//! routes with. A key is shown once, in the answer that issues it; what is stored and listed of
//! it is its id, its first characters and its times. Each change is written to the store first,
//! then put in the directory the request path reads, under the service's write lock, so two
//! changes of one consumer never lose each other.

use http::{Method, StatusCode};
use serde::Serialize;
use serde_json::Value;

use super::mapping::admin_json;
use super::reply::{json, read_body};
use super::{ApiError, Request, Response, State};
use crate::callers::config::consumer_name_ok;
use crate::callers::consumers::{self, MAX_KEYS, MAX_METADATA, StoredConsumer};
use crate::logging::logged;

/// Sends a request under `/v1/consumers` to its handler; `rest` is what follows it.
pub(super) async fn handle(
    state: &State,
    request: Request,
    rest: Option<&str>,
) -> Result<Response, ApiError> {
    state.loaded()?;
    let method = request.method().clone();
    let parts: Vec<&str> = rest.map(|rest| rest.split('/').collect()).unwrap_or_default();
    match (&method, parts.as_slice()) {
        (&Method::GET, []) => list(state, request.uri().query()),
        (&Method::POST, []) => create(state, request).await,
        (_, []) => Err(ApiError::MethodNotAllowed { allow: "GET, POST" }),
        (_, [name]) => {
            let name = (*name).to_owned();
            match method {
                Method::GET => show(state, &name),
                Method::PUT => change(state, request, &name).await,
                Method::DELETE => delete(state, &name).await,
                _ => Err(ApiError::MethodNotAllowed { allow: "GET, PUT, DELETE" }),
            }
        }
        (_, [name, "keys"]) => {
            let name = (*name).to_owned();
            match method {
                Method::GET => keys(state, &name),
                Method::POST => issue(state, request, &name).await,
                _ => Err(ApiError::MethodNotAllowed { allow: "GET, POST" }),
            }
        }
        (_, [name, "keys", id]) => {
            let (name, id) = ((*name).to_owned(), (*id).to_owned());
            match method {
                Method::DELETE => revoke(state, &name, &id).await,
                _ => Err(ApiError::MethodNotAllowed { allow: "DELETE" }),
            }
        }
        _ => Err(ApiError::NotFound),
    }
}

/// A consumer as shown: never a key, only what tells keys apart.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConsumerView<'a> {
    name: &'a str,
    metadata: &'a Value,
    created_at: u64,
    updated_at: u64,
    keys: Vec<KeyView<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyView<'a> {
    id: &'a str,
    prefix: &'a str,
    created_at: u64,
    expires_at: Option<u64>,
    /// Its last use on this node (milliseconds since the epoch), if it was used.
    last_used_at: Option<u64>,
}

fn view<'a>(state: &State, consumer: &'a StoredConsumer) -> ConsumerView<'a> {
    ConsumerView {
        name: &consumer.name,
        metadata: &consumer.metadata,
        created_at: consumer.created_at,
        updated_at: consumer.updated_at,
        keys: key_views(state, consumer),
    }
}

fn key_views<'a>(state: &State, consumer: &'a StoredConsumer) -> Vec<KeyView<'a>> {
    consumer
        .keys
        .iter()
        .map(|key| KeyView {
            id: &key.id,
            prefix: &key.prefix,
            created_at: key.created_at,
            expires_at: key.expires_at,
            last_used_at: state.door.directory.last_used(&key.digest),
        })
        .collect()
}

fn reply(status: StatusCode, value: &impl Serialize) -> Result<Response, ApiError> {
    let body = serde_json::to_vec(value).map_err(|e| ApiError::Storage(e.to_string()))?;
    Ok(json(status, body))
}

/// Consumers listed in one page when `limit` is not given, and the most one page holds.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// `GET /v1/consumers[?limit=N][&cursor=NAME]`: by name, a page at a time.
fn list(state: &State, query: Option<&str>) -> Result<Response, ApiError> {
    let (mut limit, mut after) = (DEFAULT_PAGE, None);
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*name {
            "limit" => {
                limit = value.parse().ok().filter(|n| (1..=MAX_PAGE).contains(n)).ok_or_else(|| {
                    ApiError::InvalidQuery(format!("`limit` must be a number from 1 to {MAX_PAGE}"))
                })?
            }
            "cursor" => after = Some(value.into_owned()),
            other => {
                return Err(ApiError::InvalidQuery(format!(
                    "unknown parameter `{other}`; this endpoint takes `limit` and `cursor`"
                )));
            }
        }
    }
    let all = state.door.directory.all();
    let page: Vec<_> =
        all.iter().filter(|c| after.as_ref().is_none_or(|after| c.name > *after)).take(limit + 1).collect();
    let next = (page.len() > limit).then(|| page[limit - 1].name.clone());
    #[derive(Serialize)]
    struct Page<'a> {
        consumers: Vec<ConsumerView<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    }
    let consumers = page.iter().take(limit).map(|c| view(state, c)).collect();
    reply(StatusCode::OK, &Page { consumers, next })
}

fn show(state: &State, name: &str) -> Result<Response, ApiError> {
    let consumer = state.door.directory.get(name).ok_or(ApiError::NotFound)?;
    reply(StatusCode::OK, &view(state, &consumer))
}

fn keys(state: &State, name: &str) -> Result<Response, ApiError> {
    let consumer = state.door.directory.get(name).ok_or(ApiError::NotFound)?;
    #[derive(Serialize)]
    struct Keys<'a> {
        keys: Vec<KeyView<'a>>,
    }
    reply(StatusCode::OK, &Keys { keys: key_views(state, &consumer) })
}

/// The members a consumer's body may have, checked: `name` (when `named`) and `metadata`.
fn consumer_body(body: &[u8], named: bool) -> Result<(Option<String>, Value), ApiError> {
    let value = admin_json(body)?;
    let Value::Object(members) = value else {
        return Err(ApiError::InvalidRequest(
            "the body must be an object: {\"name\": ..., \"metadata\": {...}}".into(),
        ));
    };
    let mut name = None;
    let mut metadata = Value::Null;
    for (member, value) in members {
        match (member.as_str(), value) {
            ("name", Value::String(given)) => name = Some(given),
            ("name", _) => return Err(ApiError::InvalidRequest("`name` must be a string".into())),
            ("metadata", value @ (Value::Object(_) | Value::Null)) => metadata = value,
            ("metadata", _) => return Err(ApiError::InvalidRequest("`metadata` must be an object".into())),
            (other, _) => {
                return Err(ApiError::InvalidRequest(crate::suggest::unknown(
                    "member",
                    other,
                    &["name", "metadata"],
                )));
            }
        }
    }
    if named && name.is_none() {
        return Err(ApiError::InvalidRequest("missing required member `name`".into()));
    }
    if metadata.to_string().len() > MAX_METADATA {
        return Err(ApiError::InvalidRequest(format!(
            "`metadata` must be at most {MAX_METADATA} bytes of JSON"
        )));
    }
    Ok((name, metadata))
}

fn checked_name(name: &str) -> Result<(), ApiError> {
    if consumer_name_ok(name) {
        Ok(())
    } else {
        Err(ApiError::InvalidRequest(
            "a consumer's name is 1 to 64 letters, digits, `.`, `_` and `-`, starting with a letter or digit"
                .into(),
        ))
    }
}

/// `POST /v1/consumers`.
async fn create(state: &State, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(state, &parts.headers, body).await?;
    let (name, metadata) = consumer_body(&body, true)?;
    let name = name.unwrap_or_default();
    checked_name(&name)?;
    let _writing = state.writes.lock().await;
    if state.door.directory.get(&name).is_some() {
        return Err(ApiError::Conflict(format!("a consumer named `{name}` exists")));
    }
    let now = crate::callers::now_ms();
    let consumer = StoredConsumer { name, metadata, created_at: now, updated_at: now, keys: Vec::new() };
    state.stored(state.store.put_consumer(consumer.clone()).await)?;
    state.door.directory.put(consumer.clone());
    logged!(tracing::Level::INFO, consumer = %consumer.name, "consumer created");
    reply(StatusCode::CREATED, &view(state, &consumer))
}

/// `PUT /v1/consumers/{name}`: its metadata; its keys stay.
async fn change(state: &State, request: Request, name: &str) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(state, &parts.headers, body).await?;
    let (given, metadata) = consumer_body(&body, false)?;
    if given.is_some_and(|given| given != name) {
        return Err(ApiError::InvalidRequest("the name of a consumer cannot change".into()));
    }
    let _writing = state.writes.lock().await;
    let mut consumer = (*state.door.directory.get(name).ok_or(ApiError::NotFound)?).clone();
    consumer.metadata = metadata;
    consumer.updated_at = crate::callers::now_ms();
    state.stored(state.store.put_consumer(consumer.clone()).await)?;
    state.door.directory.put(consumer.clone());
    reply(StatusCode::OK, &view(state, &consumer))
}

/// `DELETE /v1/consumers/{name}`: the consumer and every key it held.
async fn delete(state: &State, name: &str) -> Result<Response, ApiError> {
    let _writing = state.writes.lock().await;
    state.stored(state.store.delete_consumer(name.to_owned()).await)?;
    state.door.directory.remove(name);
    logged!(tracing::Level::INFO, consumer = %name, "consumer deleted");
    Ok(no_content())
}

fn no_content() -> Response {
    let mut response = json(StatusCode::NO_CONTENT, Vec::new());
    response.headers_mut().remove(http::header::CONTENT_TYPE);
    response
}

/// `POST /v1/consumers/{name}/keys` (`{"expiresAt": ...}` optional: milliseconds since the
/// epoch, or an RFC 3339 time): the key, shown this once.
async fn issue(state: &State, request: Request, name: &str) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(state, &parts.headers, body).await?;
    let now = crate::callers::now_ms();
    let expires_at =
        if body.iter().all(u8::is_ascii_whitespace) { None } else { expiry(&admin_json(&body)?, now)? };
    let _writing = state.writes.lock().await;
    let mut consumer = (*state.door.directory.get(name).ok_or(ApiError::NotFound)?).clone();
    if consumer.keys.len() >= MAX_KEYS {
        return Err(ApiError::Conflict(format!(
            "the consumer holds {MAX_KEYS} keys, the most it may; revoke one first"
        )));
    }
    let issued = consumers::issue(now, expires_at);
    consumer.keys.push(issued.stored.clone());
    consumer.updated_at = now;
    state.stored(state.store.put_consumer(consumer.clone()).await)?;
    state.door.directory.put(consumer);
    logged!(tracing::Level::INFO, consumer = %name, key = %issued.stored.id, "key issued");
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Issued<'a> {
        id: &'a str,
        key: &'a str,
        prefix: &'a str,
        created_at: u64,
        expires_at: Option<u64>,
    }
    let shown = Issued {
        id: &issued.stored.id,
        key: &issued.key,
        prefix: &issued.stored.prefix,
        created_at: issued.stored.created_at,
        expires_at: issued.stored.expires_at,
    };
    let mut response = reply(StatusCode::CREATED, &shown)?;
    // Shown once: no cache along the way may keep it.
    response.headers_mut().insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `expiresAt` of a key's body: in the future, as milliseconds since the epoch.
fn expiry(body: &Value, now: u64) -> Result<Option<u64>, ApiError> {
    let Value::Object(members) = body else {
        return Err(ApiError::InvalidRequest("the body must be an object: {\"expiresAt\": ...}".into()));
    };
    if let Some(other) = members.keys().find(|m| *m != "expiresAt") {
        return Err(ApiError::InvalidRequest(crate::suggest::unknown("member", other, &["expiresAt"])));
    }
    let at = match members.get("expiresAt") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(text)) => {
            text.parse::<jiff::Timestamp>().ok().and_then(|t| u64::try_from(t.as_millisecond()).ok())
        }
        Some(_) => None,
    };
    match at {
        Some(at) if at > now => Ok(Some(at)),
        Some(_) => Err(ApiError::InvalidRequest("`expiresAt` is not in the future".into())),
        None => Err(ApiError::InvalidRequest(
            "`expiresAt` must be milliseconds since the epoch or an RFC 3339 time, such as \"2027-01-31T00:00:00Z\"".into(),
        )),
    }
}

/// `DELETE /v1/consumers/{name}/keys/{id}`: refused from now on.
async fn revoke(state: &State, name: &str, id: &str) -> Result<Response, ApiError> {
    let _writing = state.writes.lock().await;
    let mut consumer = (*state.door.directory.get(name).ok_or(ApiError::NotFound)?).clone();
    let before = consumer.keys.len();
    consumer.keys.retain(|key| key.id != id);
    if consumer.keys.len() == before {
        return Err(ApiError::NotFound);
    }
    consumer.updated_at = crate::callers::now_ms();
    state.stored(state.store.put_consumer(consumer.clone()).await)?;
    state.door.directory.put(consumer);
    logged!(tracing::Level::INFO, consumer = %name, key = %id, "key revoked");
    Ok(no_content())
}
