//! `recast config diff|apply|dump` against a running service (SPEC §2.5): the plan of what a
//! file would change (each route created, updated with the JSON pointers that differ as the
//! service compares them, deleted only with `--prune` and only of the file's owner, or
//! unchanged), carried out one step at a time with `If-Match` of the version the plan saw, and
//! the stored routes written back as a file.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use uuid::Uuid;

use super::{RoutesFile, uuid_of};
use crate::json::ordered::Ordered;

/// A running service, as the commands reach it: one client, its connections kept alive.
pub struct Service {
    base: String,
    token: Option<String>,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// An answer: status, `ETag`, body.
pub struct Answer {
    pub status: StatusCode,
    pub etag: Option<String>,
    pub body: Vec<u8>,
}

impl Answer {
    /// One line for an error answer: its problem's title and detail, and each of its `errors`.
    pub fn problem(&self) -> String {
        let problem: Option<Value> = serde_json::from_slice(&self.body).ok();
        let field = |name: &str| problem.as_ref().and_then(|p| p.get(name)).and_then(Value::as_str);
        let mut line = match (field("title"), field("detail")) {
            (Some(title), Some(detail)) => format!("{}: {title}: {detail}", self.status),
            (Some(title), None) => format!("{}: {title}", self.status),
            _ => format!("{}: {}", self.status, String::from_utf8_lossy(&self.body)),
        };
        for error in
            problem.as_ref().and_then(|p| p.get("errors")).and_then(Value::as_array).into_iter().flatten()
        {
            let at = error.get("location").and_then(Value::as_str).unwrap_or("");
            let message = error.get("message").and_then(Value::as_str).unwrap_or("");
            line.push_str(&format!("\n    {at}: {message}"));
        }
        line
    }
}

/// How long one request may take (a registration's live call included).
const WITHIN: Duration = Duration::from_secs(120);

impl Service {
    pub fn new(url: &str, token: Option<&str>) -> Service {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new()).build(crate::upstream::https_or_http(http));
        Service { base: url.trim_end_matches('/').to_owned(), token: token.map(str::to_owned), client }
    }

    /// One request: its answer, or why none came.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        if_match: Option<&str>,
    ) -> Result<Answer, String> {
        let mut request = Request::builder().method(method).uri(format!("{}{path}", self.base));
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(token) = &self.token {
            let value = HeaderValue::try_from(format!("Bearer {token}"))
                .map_err(|_| "the token holds characters a header cannot".to_owned())?;
            request = request.header(header::AUTHORIZATION, value);
        }
        if let Some(tag) = if_match {
            request = request.header(header::IF_MATCH, tag);
        }
        let request = request
            .body(Full::new(body.map(Bytes::from).unwrap_or_default()))
            .map_err(|e| format!("`{}` is not a usable service URL: {e}", self.base))?;
        let exchange = async {
            let answer = self.client.request(request).await.map_err(|e| crate::logging::error_chain(&e))?;
            let status = answer.status();
            let etag = answer.headers().get(header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body =
                answer.into_body().collect().await.map_err(|e| crate::logging::error_chain(&e))?.to_bytes();
            Ok::<_, String>(Answer { status, etag, body: body.to_vec() })
        };
        tokio::time::timeout(WITHIN, exchange)
            .await
            .map_err(|_| format!("no answer within {} s", WITHIN.as_secs()))?
            .map_err(|why| format!("cannot reach recast at {}: {why}", self.base))
    }

    /// Every stored route as `GET /v1/routes` shows it (of `owner`, when given), page by page,
    /// members in their order.
    pub async fn routes(&self, owner: Option<&str>) -> Result<Vec<Ordered>, String> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = "/v1/routes?limit=500".to_owned();
            if let Some(owner) = owner {
                path.push_str(&format!("&owner={}", encoded(owner)));
            }
            if let Some(cursor) = &cursor {
                path.push_str(&format!("&cursor={}", encoded(cursor)));
            }
            let answer = self.call(Method::GET, &path, None, None).await?;
            if !answer.status.is_success() {
                return Err(format!("listing the routes: {}", answer.problem()));
            }
            let page: Ordered =
                serde_json::from_slice(&answer.body).map_err(|e| format!("listing the routes: {e}"))?;
            if let Some(Ordered::List(routes)) = page.get("routes") {
                all.extend(routes.iter().cloned());
            }
            match page.get("nextCursor").and_then(Ordered::as_str) {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Ok(all),
            }
        }
    }
}

fn encoded(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// What one route of the plan is to do.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Step {
    /// Registered (`POST /v1/mapping`), with its live call.
    Create {
        name: String,
        uuid: Uuid,
        #[serde(skip)]
        body: String,
    },
    /// Replaced (`PUT /v1/routes/{uuid}` with `If-Match`), with its live call.
    Update {
        name: String,
        uuid: Uuid,
        changes: Vec<String>,
        #[serde(skip)]
        etag: Option<String>,
        #[serde(skip)]
        body: String,
    },
    /// Deleted (`--prune`): the file's owner's, not in the file.
    Delete {
        name: Option<String>,
        uuid: Uuid,
        #[serde(skip)]
        etag: Option<String>,
    },
    Unchanged {
        name: String,
        uuid: Uuid,
    },
}

impl Step {
    fn changes(&self) -> bool {
        !matches!(self, Step::Unchanged { .. })
    }

    /// The plan's line for it.
    pub fn line(&self) -> String {
        match self {
            Step::Create { name, .. } => format!("+ route {name} (new)"),
            Step::Update { name, changes, .. } => format!("~ route {name}: {}", changes.join(", ")),
            Step::Delete { name, uuid, .. } => {
                format!("- route {} (prune)", name.clone().unwrap_or_else(|| uuid.to_string()))
            }
            Step::Unchanged { name, .. } => format!("  route {name} (unchanged)"),
        }
    }
}

/// The plan of a file against the service: its routes in the file's order, then deletions.
/// Every route the plan cannot decide (another owner's, a body the service refuses) is told,
/// all of them, as the error.
pub async fn plan(
    service: &Service,
    file: &RoutesFile,
    owner: Option<&str>,
    prune: bool,
) -> Result<Vec<Step>, Vec<String>> {
    let stored = service.routes(None).await.map_err(|why| vec![why])?;
    let uuid_of_view =
        |view: &Ordered| view.get("uuid").and_then(Ordered::as_str).and_then(|u| Uuid::parse_str(u).ok());
    let mut by_uuid: HashMap<Uuid, &Ordered> = HashMap::new();
    let mut by_name: HashMap<&str, &Ordered> = HashMap::new();
    for view in &stored {
        if let Some(uuid) = uuid_of_view(view) {
            by_uuid.insert(uuid, view);
        }
        if let Some(name) = view.get("name").and_then(Ordered::as_str) {
            by_name.insert(name, view);
        }
    }
    let mut steps = Vec::new();
    let mut problems = Vec::new();
    let mut matched = HashSet::new();
    for route in &file.routes {
        let name = &route.name;
        let found = match route.uuid_given {
            true => by_uuid.get(&route.uuid),
            false => by_name.get(name.as_str()).or_else(|| by_uuid.get(&uuid_of(name))),
        };
        let Some(view) = found else {
            let mut body = route.body.clone();
            body.set("uuid", Ordered::text(route.uuid.to_string()));
            if let Some(holder) = by_name.get(name.as_str()).and_then(|v| uuid_of_view(v)) {
                problems.push(format!("route {name}: the service's route {holder} holds this name; give the file that route's uuid, or another name"));
                continue;
            }
            steps.push(Step::Create { name: name.clone(), uuid: route.uuid, body: body.to_json() });
            continue;
        };
        let uuid = uuid_of_view(view).unwrap_or(route.uuid);
        matched.insert(uuid);
        if view.get("status").and_then(Ordered::as_str) == Some("locked") {
            problems.push(format!(
                "route {name}: the service's route {uuid} cannot be read (its key is missing); not touched"
            ));
            continue;
        }
        let held = view.get("owner").and_then(Ordered::as_str);
        if let Some(held) = held
            && Some(held) != route.owner.as_deref()
        {
            problems.push(format!(
                "route {name}: the service's route {uuid} belongs to owner `{held}`, not {}; not touched",
                route
                    .owner
                    .as_deref()
                    .map_or("this file (which names no owner)".to_owned(), |o| format!("`{o}`"))
            ));
            continue;
        }
        if let Some(holder) = by_name.get(name.as_str()).and_then(|v| uuid_of_view(v)).filter(|h| *h != uuid)
        {
            problems.push(format!(
                "route {name}: the service's route {holder} holds this name; the file's uuid is {uuid}'s"
            ));
            continue;
        }
        let mut body = route.body.clone();
        // Matched by name, the stored route keeps its own uuid.
        body.remove("uuid");
        let body = body.to_json();
        let path = format!("/v1/routes/{uuid}?dryRun=true");
        match service.call(Method::PUT, &path, Some(body.clone()), None).await {
            Ok(answer) if answer.status == StatusCode::OK => {
                let compared: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
                let changes: Vec<String> = compared
                    .get("changes")
                    .and_then(Value::as_array)
                    .map(|list| list.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                    .unwrap_or_default();
                if changes.is_empty() {
                    steps.push(Step::Unchanged { name: name.clone(), uuid });
                } else {
                    steps.push(Step::Update { name: name.clone(), uuid, changes, etag: answer.etag, body });
                }
            }
            Ok(answer) => problems.push(format!("route {name}: {}", answer.problem())),
            Err(why) => return Err(vec![why]),
        }
    }
    if prune && let Some(owner) = owner {
        for view in &stored {
            let Some(uuid) = uuid_of_view(view) else { continue };
            if view.get("owner").and_then(Ordered::as_str) == Some(owner) && !matched.contains(&uuid) {
                let etag = view.get("revision").map(|r| format!("\"{}\"", r.to_json()));
                let name = view.get("name").and_then(Ordered::as_str).map(str::to_owned);
                steps.push(Step::Delete { name, uuid, etag });
            }
        }
    }
    if problems.is_empty() { Ok(steps) } else { Err(problems) }
}

/// The plan in words: a line per route that changes, then the counts.
pub fn plan_text(steps: &[Step], all: bool) -> String {
    let mut out = String::new();
    for step in steps.iter().filter(|s| all || s.changes()) {
        out.push_str(&step.line());
        out.push('\n');
    }
    let [create, update, delete, unchanged] = counts(steps);
    out.push_str(&format!(
        "{create} to create, {update} to update, {delete} to delete, {unchanged} unchanged\n"
    ));
    out
}

/// How many routes the plan creates, updates, deletes and leaves unchanged.
pub fn counts(steps: &[Step]) -> [usize; 4] {
    let mut counts = [0; 4];
    for step in steps {
        counts[match step {
            Step::Create { .. } => 0,
            Step::Update { .. } => 1,
            Step::Delete { .. } => 2,
            Step::Unchanged { .. } => 3,
        }] += 1;
    }
    counts
}

/// The plan for machines: `{"steps": [...], "changes": bool}`.
pub fn plan_json(steps: &[Step]) -> String {
    serde_json::json!({"steps": steps, "changes": differs(steps)}).to_string()
}

/// Whether the plan changes anything.
pub fn differs(steps: &[Step]) -> bool {
    steps.iter().any(Step::changes)
}

/// Carries out the plan, a step at a time, each line printed by `done` as it is done; stops at
/// the first step that fails, with why.
pub async fn apply(service: &Service, steps: &[Step], done: &mut dyn FnMut(String)) -> Result<(), String> {
    for step in steps {
        let answer = match step {
            Step::Unchanged { .. } => continue,
            Step::Create { body, .. } => {
                service.call(Method::POST, "/v1/mapping", Some(body.clone()), None).await?
            }
            Step::Update { uuid, etag, body, .. } => {
                service
                    .call(Method::PUT, &format!("/v1/routes/{uuid}"), Some(body.clone()), etag.as_deref())
                    .await?
            }
            Step::Delete { uuid, etag, .. } => {
                service.call(Method::DELETE, &format!("/v1/routes/{uuid}"), None, etag.as_deref()).await?
            }
        };
        if answer.status.is_success() {
            done(step.line());
            continue;
        }
        let why = match answer.status {
            StatusCode::PRECONDITION_FAILED => format!(
                "{}: it changed on the service after the plan was made ({}); run `recast config diff` again",
                step.line(),
                answer.problem()
            ),
            _ => format!("{}: {}", step.line(), answer.problem()),
        };
        return Err(why);
    }
    Ok(())
}

/// The stored routes (of `owner`) as a routes file's value: each view as the registration that
/// makes it (what the service adds to a view left out, its path without `/v1/{uuid}/`), secrets
/// as the `"***"` the views hold, which `apply` keeps as `PUT` does. A route with no name gets
/// `route-` and the start of its uuid, told in the notes; a route that cannot be read is left out,
/// told too.
pub async fn dump(service: &Service, owner: Option<&str>) -> Result<(Ordered, Vec<String>), String> {
    let mut notes = Vec::new();
    let mut routes = Vec::new();
    for mut view in service.routes(owner).await? {
        let uuid = view.get("uuid").and_then(Ordered::as_str).unwrap_or_default().to_owned();
        if view.get("status").and_then(Ordered::as_str) == Some("locked") {
            notes.push(format!("route {uuid} is left out: it cannot be read (its key is missing)"));
            continue;
        }
        for own in ["auth", "createdAt", "updatedAt", "status", "problem", "revision"] {
            let removed = view.remove(own);
            // A route whose callers' credential is sent at each call says so in its `authHeader`.
            if own == "auth"
                && removed.as_ref().and_then(Ordered::as_str) == Some("runtime")
                && view.get("authHeader").is_none_or(|a| *a == Ordered::Scalar(Value::Null))
                && view.get("sources").is_none()
            {
                view.set("authHeader", Ordered::Object(vec![("type".to_owned(), Ordered::text("Runtime"))]));
            }
        }
        for nullable in ["authHeader", "preConfiguredBody"] {
            if view.get(nullable) == Some(&Ordered::Scalar(Value::Null)) {
                view.remove(nullable);
            }
        }
        if let Some(path) = view.get("path").and_then(Ordered::as_str) {
            let own = path.strip_prefix(&format!("/v1/{uuid}/")).unwrap_or(path).to_owned();
            view.set("path", Ordered::text(own));
        }
        if view.get("name").is_none() {
            let name = format!("route-{}", &uuid[..8.min(uuid.len())]);
            notes.push(format!("route {uuid} has no name: written as `{name}`, which an apply gives it"));
            // First, as a file lists it.
            if let Ordered::Object(members) = &mut view {
                members.insert(0, ("name".to_owned(), Ordered::text(name)));
            }
        }
        escape_references(&mut view);
        routes.push(view);
    }
    Ok((Ordered::Object(vec![("routes".to_owned(), Ordered::List(routes))]), notes))
}

/// Every `${` of the service's text written `$${`: what a route holds is text, never a reference
/// that whoever applies the dump would resolve (a `${file:...}` registered through the API would
/// otherwise send that machine's file to the service on the next apply).
fn escape_references(value: &mut Ordered) {
    match value {
        Ordered::Scalar(Value::String(text)) if text.contains("${") => *text = text.replace("${", "$${"),
        Ordered::Scalar(_) => {}
        Ordered::List(items) => items.iter_mut().for_each(escape_references),
        Ordered::Object(members) => members.iter_mut().for_each(|(_, member)| escape_references(member)),
    }
}

/// A file's value as YAML text, members in their order: block style, every string and every
/// name that is not a plain word written as a JSON string (which YAML reads as it is: no scalar
/// is typed or folded otherwise than JSON says), numbers, booleans and nulls as JSON writes them.
pub fn to_yaml(value: &Ordered) -> String {
    let mut out = String::new();
    match inline(value) {
        Some(text) => {
            out.push_str(&text);
            out.push('\n');
        }
        None => block(value, 0, &mut out),
    }
    out
}

/// A value written on its key's line: a scalar, or an empty list or object.
fn inline(value: &Ordered) -> Option<String> {
    match value {
        Ordered::Scalar(_) => Some(value.to_json()),
        Ordered::List(items) if items.is_empty() => Some("[]".to_owned()),
        Ordered::Object(members) if members.is_empty() => Some("{}".to_owned()),
        _ => None,
    }
}

/// A member name as YAML reads it back: a plain word (`rulesAsString`, `X-Note`) as it is,
/// anything else quoted.
fn name(name: &str) -> String {
    let plain = name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !matches!(name.to_ascii_lowercase().as_str(), "true" | "false" | "null");
    if plain { name.to_owned() } else { Value::String(name.to_owned()).to_string() }
}

fn block(value: &Ordered, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    let entry = |head: String, value: &Ordered, out: &mut String| match inline(value) {
        Some(text) => {
            out.push_str(&format!("{pad}{head} {text}\n"));
        }
        None => {
            out.push_str(&format!("{pad}{head}\n"));
            block(value, indent + 2, out);
        }
    };
    match value {
        Ordered::Object(members) => {
            for (key, member) in members {
                entry(format!("{}:", name(key)), member, out);
            }
        }
        Ordered::List(items) => {
            for item in items {
                entry("-".to_owned(), item, out);
            }
        }
        Ordered::Scalar(_) => out.push_str(&format!("{pad}{}\n", value.to_json())),
    }
}

#[cfg(test)]
mod tests {
    use super::{Ordered, to_yaml};

    #[test]
    fn what_dump_writes_reads_back_the_same() {
        let text = r##"{"routes":[{"name":"a","0o17":"0o17","true":"true","":"","k e y":"  a\nb","x":"x\n\n",
            "n":[1,-2,1.5,1e300,18446744073709551615,true,null,"~","null","12","-","- x","#c","a: b",{},[]],
            "nested":{"deep":[[{"q":"'"}]]},"u":"é\u0001\"\\/"}]}"##;
        let value: Ordered = serde_json::from_str(text).unwrap();
        let yaml = to_yaml(&value);
        let (back, _) =
            crate::routes_file::yaml::parse(&yaml).unwrap_or_else(|e| panic!("{}: {yaml}", e.message));
        assert_eq!(back.to_json(), value.to_json(), "{yaml}");
    }
}
