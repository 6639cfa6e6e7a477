//! Routes as files (SPEC §2.5): a YAML or JSON file of registrations (each with a `name`) and
//! consumers, read with the line and column of every value (`yaml.rs`), its `${env:NAME}` and
//! `${file:PATH}` references resolved (`refs.rs`), and checked as a whole, offline: every problem
//! at once, each at its place. `recast config validate|diff|apply|dump` (`cli::config`; `remote.rs` against a
//! running service) and a node from a file (`RECAST_ROUTES_FILE`, `server::routes_file`) read it
//! through [`read`].

pub mod refs;
pub mod remote;
pub mod yaml;

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use uuid::Uuid;

use crate::callers::{StoredConsumer, StoredKey};
use crate::json::ordered::Ordered;
use crate::route::{Registration, Route, RouteConfig, shape};
use crate::rules::{Limits, compile_json};
use yaml::At;

/// The most problems of one file told.
pub const MOST_PROBLEMS: usize = 1000;

/// The most bytes a routes file may hold.
pub const MAX_FILE_BYTES: u64 = yaml::MOST_BYTES as u64;

/// The namespace of the uuids of routes a file names without giving one: a route's uuid is the
/// UUID (version 5) of its name in it, the same in every environment and on every node.
pub const NAMESPACE: Uuid = Uuid::from_u128(0x7265_6361_7374_4000_8000_726f_7574_6573);

/// The uuid of a route named `name` that gives none.
pub fn uuid_of(name: &str) -> Uuid {
    Uuid::new_v5(&NAMESPACE, name.as_bytes())
}

/// A problem of a file: where (line, column and JSON pointer), and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub at: At,
    pub pointer: String,
    pub message: String,
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pointer = if self.pointer.is_empty() { "(the file)" } else { &self.pointer };
        write!(f, "{}:{}: {pointer}: {}", self.at.line, self.at.column, self.message)
    }
}

/// One route of a file, checked.
#[derive(Debug)]
pub struct FileRoute {
    pub name: String,
    /// Its `uuid`, or [`uuid_of`] its name.
    pub uuid: Uuid,
    /// Whether the file gives the uuid.
    pub uuid_given: bool,
    pub owner: Option<String>,
    /// Its registration body, references resolved, members in the file's order: what `apply`
    /// sends.
    pub body: Ordered,
    /// Its configuration, as a registration of that body stores it.
    pub config: RouteConfig,
    /// It compiled (made at time 0, revision 0): what a node from the file serves.
    pub route: Route,
}

/// A file read and checked.
#[derive(Debug, Default)]
pub struct RoutesFile {
    pub routes: Vec<FileRoute>,
    pub consumers: Vec<StoredConsumer>,
}

/// Reads and checks the file at `path`: its text, references, shape, every route as a
/// registration is checked before its live call (shape, settings, sources, templates, rules),
/// names and uuids unique, consumers. `owner` (`--owner`) is given to each route that names
/// none; a route naming another is a problem. Every problem at once, in the file's order.
pub fn read(path: &Path, limits: &Limits, owner: Option<&str>) -> Result<RoutesFile, Vec<Located>> {
    let whole =
        |message: String| vec![Located { at: At { line: 1, column: 1 }, pointer: String::new(), message }];
    let size =
        std::fs::metadata(path).map_err(|e| whole(format!("cannot read {}: {e}", path.display())))?.len();
    if size > MAX_FILE_BYTES {
        return Err(whole(format!(
            "the file holds {size} bytes; a routes file holds at most {MAX_FILE_BYTES}"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| whole(format!("cannot read {}: {e}", path.display())))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let before = &bytes[..e.valid_up_to()];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = before.iter().rev().take_while(|&&b| b != b'\n').count() + 1;
        vec![Located {
            at: At { line, column },
            pointer: String::new(),
            message: "not UTF-8 text".to_owned(),
        }]
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parse(text, dir, limits, owner)
}

/// [`read`] of a text, its `${file:...}` references relative to `dir`.
pub fn parse(
    text: &str,
    dir: &Path,
    limits: &Limits,
    owner: Option<&str>,
) -> Result<RoutesFile, Vec<Located>> {
    let mut value = yaml::parse_unplaced(text)
        .map_err(|e| vec![Located { at: e.at, pointer: String::new(), message: e.message }])?;
    let mut found = Vec::new();
    let mut problems: Vec<(String, String)> = Vec::new();
    refs::resolve(&mut value, dir, &mut |pointer, message| problems.push((pointer, message)));
    let mut file = RoutesFile::default();
    match &value {
        Ordered::Object(members) => {
            for (name, _) in
                members.iter().filter(|(name, _)| !matches!(name.as_str(), "routes" | "consumers"))
            {
                problems.push((
                    pointer_of("", name),
                    crate::suggest::unknown("member", name, &["routes", "consumers"]),
                ));
            }
        }
        _ => problems.push((
            String::new(),
            "a routes file is an object: {\"routes\": [...], \"consumers\": [...]}".to_owned(),
        )),
    }
    match value.get("routes") {
        Some(Ordered::List(routes)) => {
            for (i, body) in routes.iter().enumerate() {
                let at = format!("/routes/{i}");
                if let Some(route) = route(body, &at, limits, owner, &mut problems) {
                    file.routes.push(route);
                }
            }
        }
        None | Some(Ordered::Scalar(Value::Null)) => {}
        Some(_) => problems.push(("/routes".to_owned(), "must be a list of registrations".to_owned())),
    }
    // Names and uuids: one route each, among all the file's routes (those with problems too).
    if let Some(Ordered::List(routes)) = value.get("routes") {
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut uuids: HashMap<Uuid, usize> = HashMap::new();
        for (i, route) in routes.iter().enumerate() {
            let Some(name) = route.get("name").and_then(Ordered::as_str) else { continue };
            if let Some(first) = names.insert(name, i) {
                problems.push((
                    format!("/routes/{i}/name"),
                    format!("`{name}` names /routes/{first} too: a name is one route's"),
                ));
                continue;
            }
            let given = route.get("uuid").and_then(Ordered::as_str).and_then(|u| Uuid::try_parse(u).ok());
            let uuid = given.unwrap_or_else(|| uuid_of(name));
            if let Some(first) = uuids.insert(uuid, i) {
                let member = if given.is_some() { "uuid" } else { "name" };
                problems.push((
                    format!("/routes/{i}/{member}"),
                    format!("/routes/{first} has the uuid {uuid} too"),
                ));
            }
        }
    }
    let consumers = value.get("consumers").map(|c| serde_json::from_str::<Value>(&c.to_json()));
    match consumers {
        Some(Ok(Value::Array(consumers))) => file.consumers = self::consumers(&consumers, &mut problems),
        None | Some(Ok(Value::Null)) => {}
        Some(_) => problems.push(("/consumers".to_owned(), "must be a list of consumers".to_owned())),
    }
    if problems.is_empty() {
        return Ok(file);
    }
    // The file again, to locate its problems.
    let places = yaml::parse(text).map(|(_, places)| places).unwrap_or_default();
    // A check made twice (a name's pattern, before the shape's check and by it) is told once.
    let mut told = std::collections::HashSet::new();
    let total = problems.len();
    for (pointer, message) in problems {
        if found.len() == MOST_PROBLEMS {
            break;
        }
        if told.insert((pointer.clone(), message.clone())) {
            found.push(Located { at: places.find(&pointer), pointer, message });
        }
    }
    // In the file's order; a place's problems in the order found.
    found.sort_by_key(|p| (p.at.line, p.at.column));
    if total > found.len() && found.len() == MOST_PROBLEMS {
        let at = found.last().map(|p| p.at).unwrap_or_default();
        found.push(Located {
            at,
            pointer: String::new(),
            message: format!("and more: only the first {MOST_PROBLEMS} problems are told"),
        });
    }
    Err(found)
}

fn pointer_of(base: &str, name: &str) -> String {
    let mut pointer = base.to_owned();
    crate::json::push_pointer(&mut pointer, name);
    pointer
}

/// One route of the file checked as a registration is before its live call, or `None` with
/// its problems told.
fn route(
    body: &Ordered,
    at: &str,
    limits: &Limits,
    owner: Option<&str>,
    problems: &mut Vec<(String, String)>,
) -> Option<FileRoute> {
    if !matches!(body, Ordered::Object(_)) {
        problems.push((at.to_owned(), "a route is a registration: an object (SPEC §2.1)".to_owned()));
        return None;
    }
    let mut body = body.clone();
    let before = problems.len();
    let name = match body.get("name") {
        Some(Ordered::Scalar(Value::String(name))) => Some(name.clone()),
        None => {
            problems.push((format!("{at}/name"), "every route of a file has a `name`".to_owned()));
            None
        }
        // Told by the shape's check.
        Some(_) => None,
    };
    // The labels are checked here too: the shape's problems end the route's checks.
    for member in ["name", "owner"] {
        if let Some(text) = body.get(member).and_then(Ordered::as_str)
            && !crate::route::is_label(text)
        {
            problems.push((format!("{at}/{member}"), crate::route::LABEL_RULE.to_owned()));
        }
    }
    match (body.get("owner").and_then(Ordered::as_str).map(str::to_owned), owner) {
        (Some(given), Some(owner)) if given != owner => problems.push((
            format!("{at}/owner"),
            format!(
                "this route's owner is `{given}`, not `{owner}` (--owner): a file applies one owner's routes"
            ),
        )),
        (None, Some(owner)) => body.set("owner", Ordered::text(owner)),
        _ => {}
    }
    let text = body.to_json();
    let value: Value = match serde_json::from_str(&text) {
        Ok(value) => value,
        Err(e) => {
            problems.push((at.to_owned(), e.to_string()));
            return None;
        }
    };
    let shaped = shape::check(&value);
    let located = |problem: crate::rules::Problem| (format!("{at}{}", problem.location), problem.message);
    if !shaped.is_empty() {
        problems.extend(shaped.into_iter().map(located));
        return None;
    }
    let registration: Registration = match serde_json::from_str(&text) {
        Ok(registration) => registration,
        Err(e) => {
            problems.push((at.to_owned(), e.to_string()));
            return None;
        }
    };
    let given = registration.given_uuid().ok().flatten();
    let rules_problems = |problems: &mut Vec<(String, String)>, found: Vec<crate::rules::Problem>| {
        problems.extend(found.into_iter().map(|p| (format!("{at}/rulesAsString{}", p.location), p.message)));
    };
    let config = match registration.validate_with(false, None, limits) {
        Ok(config) => config,
        Err(found) => {
            problems.extend(found.into_iter().map(located));
            // The rules, compiled too: every problem of the route at once.
            if let Some(rules) =
                body.get("rulesAsString").filter(|rules| **rules != Ordered::Scalar(Value::Null))
                && let Err(found) = compile_json(rules.to_json().as_bytes(), limits)
            {
                rules_problems(problems, found);
            }
            return None;
        }
    };
    problems.extend(config.unshowable().into_iter().map(located));
    let name = name?;
    let uuid = given.unwrap_or_else(|| uuid_of(&name));
    // Compiled as a node serves it (rules, request with its uuid): what does not compile is told.
    let compiled = Route::new(uuid, 0, 0, config.clone(), limits);
    match &compiled.rules {
        Err(found) => rules_problems(problems, found.clone()),
        Ok(_) => {
            if let Some(why) = compiled.broken() {
                problems.push((at.to_owned(), why));
            }
        }
    }
    if problems.len() > before {
        return None;
    }
    Some(FileRoute {
        name,
        uuid,
        uuid_given: given.is_some(),
        owner: config.owner.clone(),
        body,
        config,
        route: compiled,
    })
}

/// The file's consumers (SPEC §2.4), each key as `{"id", "sha256"}` (its digest, never the key),
/// with `expiresAt` (milliseconds, or RFC 3339) when it ends.
fn consumers(list: &[Value], problems: &mut Vec<(String, String)>) -> Vec<StoredConsumer> {
    let mut out: Vec<StoredConsumer> = Vec::new();
    let mut digests: HashMap<String, String> = HashMap::new();
    for (i, consumer) in list.iter().enumerate() {
        let at = format!("/consumers/{i}");
        let Value::Object(members) = consumer else {
            problems.push((at, "a consumer is an object: {\"name\", \"metadata\", \"keys\"}".to_owned()));
            continue;
        };
        for member in members.keys().filter(|m| !matches!(m.as_str(), "name" | "metadata" | "keys")) {
            problems.push((
                pointer_of(&at, member),
                crate::suggest::unknown("member", member, &["name", "metadata", "keys"]),
            ));
        }
        let name = match members.get("name") {
            Some(Value::String(name)) if crate::callers::config::consumer_name_ok(name) => name.clone(),
            Some(Value::String(_)) => {
                problems.push((format!("{at}/name"), "a consumer's name is 1 to 64 letters, digits, `.`, `_` and `-`, starting with a letter or digit".to_owned()));
                continue;
            }
            _ => {
                problems.push((format!("{at}/name"), "every consumer has a `name` (a string)".to_owned()));
                continue;
            }
        };
        if out.iter().any(|c| c.name == name) {
            problems.push((format!("{at}/name"), format!("`{name}` names another consumer too")));
        }
        let metadata = match members.get("metadata") {
            None | Some(Value::Null) => Value::Null,
            Some(value @ Value::Object(_))
                if value.to_string().len() <= crate::callers::consumers::MAX_METADATA =>
            {
                value.clone()
            }
            Some(Value::Object(_)) => {
                problems.push((
                    format!("{at}/metadata"),
                    format!("must be at most {} bytes of JSON", crate::callers::consumers::MAX_METADATA),
                ));
                Value::Null
            }
            Some(_) => {
                problems.push((format!("{at}/metadata"), "must be an object".to_owned()));
                Value::Null
            }
        };
        let mut keys = Vec::new();
        match members.get("keys") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                if list.len() > crate::callers::consumers::MAX_KEYS {
                    problems.push((
                        format!("{at}/keys"),
                        format!("a consumer holds at most {} keys", crate::callers::consumers::MAX_KEYS),
                    ));
                }
                for (k, key) in list.iter().enumerate() {
                    if let Some(key) = file_key(key, &format!("{at}/keys/{k}"), problems) {
                        if keys.iter().any(|other: &StoredKey| other.id == key.id) {
                            problems.push((
                                format!("{at}/keys/{k}/id"),
                                format!("`{}` is another key's id too", key.id),
                            ));
                        }
                        if let Some(other) = digests.insert(key.digest.clone(), format!("{at}/keys/{k}")) {
                            problems
                                .push((format!("{at}/keys/{k}/sha256"), format!("the same key as {other}")));
                        }
                        keys.push(key);
                    }
                }
            }
            Some(_) => {
                problems.push((format!("{at}/keys"), "must be a list of {\"id\", \"sha256\"}".to_owned()))
            }
        }
        out.push(StoredConsumer { name, metadata, created_at: 0, updated_at: 0, keys });
    }
    out
}

/// One key of a consumer in a file: `{"id", "sha256", "expiresAt"?}`.
fn file_key(key: &Value, at: &str, problems: &mut Vec<(String, String)>) -> Option<StoredKey> {
    let Value::Object(members) = key else {
        problems.push((at.to_owned(), "a key is {\"id\", \"sha256\"}: its digest, never the key".to_owned()));
        return None;
    };
    for member in members.keys().filter(|m| !matches!(m.as_str(), "id" | "sha256" | "expiresAt")) {
        let hint =
            if member == "key" { " (a file holds a key's digest, `sha256`, never the key)" } else { "" };
        problems.push((
            pointer_of(at, member),
            format!("{}{hint}", crate::suggest::unknown("member", member, &["id", "sha256", "expiresAt"])),
        ));
    }
    let id = match members.get("id") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= 64 => id.clone(),
        _ => {
            problems.push((format!("{at}/id"), "every key has an `id`: 1 to 64 characters".to_owned()));
            return None;
        }
    };
    let digest = match members.get("sha256") {
        Some(Value::String(hex)) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            hex.to_ascii_lowercase()
        }
        _ => {
            problems.push((
                format!("{at}/sha256"),
                "must be the SHA-256 of the key as 64 hex digits (`printf %s \"$KEY\" | sha256sum`)"
                    .to_owned(),
            ));
            return None;
        }
    };
    let expires_at = match members.get("expiresAt") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
        Some(Value::String(text)) => {
            match text.parse::<jiff::Timestamp>().ok().and_then(|t| u64::try_from(t.as_millisecond()).ok()) {
                Some(at) => Some(at),
                None => {
                    problems.push((
                        format!("{at}/expiresAt"),
                        "must be milliseconds since the epoch or an RFC 3339 time".to_owned(),
                    ));
                    return None;
                }
            }
        }
        Some(_) => {
            problems.push((
                format!("{at}/expiresAt"),
                "must be milliseconds since the epoch or an RFC 3339 time".to_owned(),
            ));
            return None;
        }
    };
    let prefix = format!("{}…", &digest[..8]);
    Some(StoredKey { id, prefix, digest, created_at: 0, expires_at })
}
