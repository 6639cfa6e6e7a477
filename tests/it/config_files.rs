//! Routes as files (SPEC §2.5) with the real binary: `recast config validate` offline,
//! `diff`/`apply`/`dump` against a running service (creates, updates, `--prune` of one owner's
//! routes only, a change made meanwhile refused with 412, secrets by reference and as `***`), a
//! node from a file (reload under load, a broken file kept out, a read-only admin API), and the
//! commands against a cluster of two nodes.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http::Method;
use tokio::sync::watch;

use crate::binary::Binary;
use crate::support::{Json, Reply, Service, Upstream, config, get, send};

/// Runs `recast ARGS` with `env` and no other RECAST_* variable, off the test's runtime.
async fn recast(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_recast"));
    command.args(args);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("RECAST_")) {
        command.env_remove(name);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("the binary runs")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("the binary exits by itself")
}

fn out(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn err(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A route of a file, in YAML, calling `base` + `path` with `token`; `extra` more members.
fn route_yaml(name: &str, base: &str, path: &str, field: &str, extra: &str) -> String {
    format!(
        r#"  - name: {name}
    path: {name}
    originalRoute:
      originalApi: {{baseUrl: "{base}"}}
      path: {path}
    rulesAsString:
      newBodyFields:
        id: {{key: id, type: Int}}
        {field}: {{key: {field}, type: String}}
      oldBodyFields:
        id: {{keys: [id], parents: [user]}}
        {field}: {{keys: [first], parents: [user]}}
{extra}"#
    )
}

const USER: &str = r#"{"user":{"id":7,"first":"Ada"}}"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn validate_finds_every_problem_of_a_file_each_at_its_line_and_column_with_no_service() {
    let dir = tempfile::tempdir().unwrap();
    // Ten mistakes and more, each told at its line and column (a value's, or for a member that
    // is missing, its object's).
    let text = r#"routes:
  - name: users
    path: users
    originalRoute:
      originalApi: {baseUrl: "http://127.0.0.1:9/"}
      path: u
    authHeader: {type: Bearer, token: "${env:CONFIG_FILES_TEST_UNSET_68}"}
    rulesAsString:
      newBodyFields: {id: {key: id, type: Strnig}}
      oldBodyFields: {id: {keys: [id]}}
  - name: users
    path: users2
    originalRoute: {originalApi: {baseUrl: "ftp://127.0.0.1/"}, path: a}
    rulesAsString: {newBodyFields: {}, oldBodyFields: {}}
  - name: Orders_V2
    path: orders
    methd: GET
    originalRoute: {originalApi: {baseUrl: "http://127.0.0.1:9/"}, path: o}
    rulesAsString: {newBodyFields: {}, oldBodyFields: {}}
  - name: composed
    path: composed
    sources:
      first: {originalApi: {baseUrl: "http://127.0.0.1:9/"}, path: "/x/{{ sources.nope.id }}"}
    rulesAsString: {newBodyFields: {}, oldBodyFields: {}}
  - name: pinned
    uuid: 3f1c2a9e-4b7d-4c1e-9a5f-0d2e8b6c7a10
    path: pinned
    originalRoute: {originalApi: {baseUrl: "http://127.0.0.1:9/"}, path: p}
    tls: {ca: "${file:missing-ca.pem}"}
    rulesAsString: {newBodyFields: {}, oldBodyFields: {}}
  - name: pinned-again
    uuid: 3f1c2a9e-4b7d-4c1e-9a5f-0d2e8b6c7a10
    path: again
    originalRoute: {originalApi: {baseUrl: "http://127.0.0.1:9/"}, path: p}
    rulesAsString: {newBodyFields: {}, oldBodyFields: {}}
consumers:
  - name: app
    keys: [{id: k1, sha256: not-a-digest}]
  - name: app
"#;
    let file = write(dir.path(), "routes.yaml", text);
    let checked = recast(&["config", "validate", &file], &[]).await;
    assert_eq!(code(&checked), 1, "{}", err(&checked));
    let report = err(&checked);
    let expected = [
        "7:39: /routes/0/authHeader/token: ${env:CONFIG_FILES_TEST_UNSET_68}: the environment variable",
        "9:43: /routes/0/rulesAsString/newBodyFields/id/type: unknown type `Strnig`",
        "11:11: /routes/1/name: `users` names /routes/0 too",
        "13:44: /routes/1/originalRoute/originalApi/baseUrl: the scheme must be http or https",
        "15:11: /routes/2/name: must be 1 to 63 characters",
        "17:12: /routes/2/methd: unknown member `methd`; did you mean `method`?",
        "23:68: /routes/3/sources/first/path: reads `sources`",
        "29:15: /routes/4/tls/ca: ${file:missing-ca.pem}: cannot read",
        "32:11: /routes/5/uuid: /routes/4 has the uuid 3f1c2a9e-4b7d-4c1e-9a5f-0d2e8b6c7a10 too",
        "38:29: /consumers/0/keys/0/sha256: must be the SHA-256",
        "39:11: /consumers/1/name: `app` names another consumer too",
    ];
    for line in expected {
        assert!(report.contains(&format!("{file}:{line}")), "missing `{line}` in:\n{report}");
    }
    assert!(report.ends_with(&format!("{file}: {} problem(s)\n", report.lines().count() - 1)), "{report}");

    // The same file made right validates, offline, with the variable and the file given.
    let fixed = text
        .replace("Strnig", "Int")
        .replace("  - name: users\n    path: users2", "  - name: users-two\n    path: users2")
        .replace("ftp://", "http://")
        .replace("Orders_V2", "orders-v2")
        .replace("    methd: GET\n", "")
        .replace("sources.nope.id", "request.query.id")
        .replace("    uuid: 3f1c2a9e-4b7d-4c1e-9a5f-0d2e8b6c7a10\n    path: again", "    path: again")
        .replace("    tls: {ca: \"${file:missing-ca.pem}\"}\n", "")
        .replace("not-a-digest", &"ab".repeat(32))
        .replace("  - name: app\n\"", "\"")
        .trim_end_matches("  - name: app\n")
        .to_owned();
    let file = write(dir.path(), "fixed.yaml", &fixed);
    let checked = recast(&["config", "validate", &file], &[("CONFIG_FILES_TEST_UNSET_68", "t0k3n")]).await;
    assert_eq!(code(&checked), 0, "{}", err(&checked));
    assert!(err(&checked).contains("valid (6 routes, 1 consumers)"), "{}", err(&checked));
}

/// A service and an upstream that counts its calls, holding those to `/slow` while `gate` is
/// shut.
async fn service_and_upstream() -> (Service, Upstream, watch::Sender<bool>) {
    let (gate, shut) = watch::channel(true);
    let upstream = Upstream::start(move |received| {
        let mut reply = Reply::json(USER);
        if received.uri.path() == "/slow" {
            reply.gate = Some(shut.clone());
        }
        reply
    })
    .await;
    (Service::start(config()).await, upstream, gate)
}

fn routes_file(upstream: &Upstream, routes: &[(&str, &str)]) -> String {
    let mut text = String::from("routes:\n");
    for (name, field) in routes {
        text.push_str(&route_yaml(name, &upstream.url("/"), "u", field, ""));
    }
    text
}

#[tokio::test]
async fn apply_creates_then_changes_nothing_then_updates_one_then_prunes_only_with_prune_and_never_another_owner_s()
 {
    let (service, upstream, _gate) = service_and_upstream().await;
    let url = format!("http://{}", service.addr);
    let dir = tempfile::tempdir().unwrap();
    let three = [("users", "name"), ("orders", "name"), ("items", "name")];
    let file = write(dir.path(), "routes.yaml", &routes_file(&upstream, &three));
    let args = |command: &'static str, more: &[&'static str]| {
        let mut all = vec!["config", command, "--url"];
        all.push(Box::leak(url.clone().into_boxed_str()));
        all.push(Box::leak(file.clone().into_boxed_str()));
        all.extend_from_slice(more);
        all
    };
    // Another owner's route, registered through the API.
    let theirs = format!(
        r#"{{"name":"billing","owner":"team-b","path":"billing","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"u"}},"rulesAsString":{{"newBodyFields":{{"id":{{"key":"id","type":"Int"}}}},"oldBodyFields":{{"id":{{"keys":["id"],"parents":["user"]}}}}}}}}"#,
        upstream.url("/")
    );
    let registered = send(Method::POST, &service.url("/v1/mapping"), &[], theirs).await;
    assert_eq!(registered.status, 201, "{:?}", registered.json());
    let billing = registered.json().get("uuid").and_then(Json::as_str).unwrap().to_owned();
    let calls = upstream.received().len();

    let diff = recast(&args("diff", &["--owner", "team-a", "--exit-code"]), &[]).await;
    assert_eq!(code(&diff), 2, "{}", err(&diff));
    assert!(
        out(&diff).contains("+ route users (new)\n+ route orders (new)\n+ route items (new)\n"),
        "{}",
        out(&diff)
    );

    let applied = recast(&args("apply", &["--owner", "team-a"]), &[]).await;
    assert_eq!(code(&applied), 0, "{}", err(&applied));
    assert!(
        out(&applied).contains("applied: 3 created, 0 updated, 0 deleted, 0 unchanged"),
        "{}",
        out(&applied)
    );
    assert_eq!(upstream.received().len(), calls + 3, "one live call per route created");
    // Each at the uuid its name gives, in every environment.
    let users = recast::routes_file::uuid_of("users");
    let answer = get(&service.url(&format!("/v1/{users}/users"))).await;
    assert_eq!(answer.body.as_ref(), br#"{"id":7,"name":"Ada"}"#);
    let listed = get(&service.url("/v1/routes?owner=team-a")).await.json();
    assert_eq!(listed.get("routes").map(|routes| routes.as_array().len()), Some(3));
    let named = get(&service.url("/v1/routes?name=orders")).await.json();
    let named = named.get("routes").map(Json::as_array).unwrap();
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].get("owner").and_then(Json::as_str), Some("team-a"));

    // Again: nothing changes, no live call.
    let calls = upstream.received().len();
    let again = recast(&args("apply", &["--owner", "team-a"]), &[]).await;
    assert_eq!(code(&again), 0, "{}", err(&again));
    assert!(out(&again).contains("applied: 0 created, 0 updated, 0 deleted, 3 unchanged"), "{}", out(&again));
    assert_eq!(upstream.received().len(), calls, "no live call when nothing changes");
    let diff = recast(&args("diff", &["--owner", "team-a", "--exit-code"]), &[]).await;
    assert_eq!(code(&diff), 0, "{}{}", out(&diff), err(&diff));

    // One route edited: one PUT, one live call, the pointer that differs.
    std::fs::write(
        &file,
        routes_file(&upstream, &[("users", "name"), ("orders", "first"), ("items", "name")]),
    )
    .unwrap();
    let diff = recast(&args("diff", &["--owner", "team-a", "--output", "json"]), &[]).await;
    let plan: serde_json::Value = serde_json::from_slice(&diff.stdout).unwrap();
    assert_eq!(plan["changes"], true);
    let update = plan["steps"].as_array().unwrap().iter().find(|s| s["action"] == "update").unwrap();
    assert_eq!(update["name"], "orders");
    let changes: Vec<&str> =
        update["changes"].as_array().unwrap().iter().filter_map(|c| c.as_str()).collect();
    assert!(changes.contains(&"/rulesAsString/newBodyFields/first"), "{changes:?}");
    assert!(changes.contains(&"/rulesAsString/newBodyFields/name"), "{changes:?}");
    let calls = upstream.received().len();
    let edited = recast(&args("apply", &["--owner", "team-a"]), &[]).await;
    assert_eq!(code(&edited), 0, "{}", err(&edited));
    assert!(out(&edited).contains("~ route orders: /rulesAsString/newBodyFields/name"), "{}", out(&edited));
    assert!(
        out(&edited).contains("applied: 0 created, 1 updated, 0 deleted, 2 unchanged"),
        "{}",
        out(&edited)
    );
    assert_eq!(upstream.received().len(), calls + 1);
    let orders = recast::routes_file::uuid_of("orders");
    assert_eq!(
        get(&service.url(&format!("/v1/{orders}/orders"))).await.body.as_ref(),
        br#"{"id":7,"first":"Ada"}"#
    );

    // One removed: kept without --prune, deleted with it; the other owner's never touched.
    std::fs::write(&file, routes_file(&upstream, &[("users", "name"), ("orders", "first")])).unwrap();
    let kept = recast(&args("apply", &["--owner", "team-a"]), &[]).await;
    assert_eq!(code(&kept), 0, "{}", err(&kept));
    let items = recast::routes_file::uuid_of("items");
    assert_eq!(get(&service.url(&format!("/v1/routes/{items}"))).await.status, 200);
    let pruned = recast(&args("apply", &["--owner", "team-a", "--prune"]), &[]).await;
    assert_eq!(code(&pruned), 0, "{}", err(&pruned));
    assert!(out(&pruned).contains("- route items (prune)"), "{}", out(&pruned));
    assert_eq!(get(&service.url(&format!("/v1/routes/{items}"))).await.status, 404);
    assert_eq!(
        get(&service.url(&format!("/v1/routes/{billing}"))).await.status,
        200,
        "another owner's route stays"
    );
    // --prune without an owner is refused before anything is read.
    let unowned = recast(&args("apply", &["--prune"]), &[]).await;
    assert_eq!(code(&unowned), 2, "{}", err(&unowned));
    // A file that names another owner's route is refused for it, and changes nothing.
    std::fs::write(&file, routes_file(&upstream, &[("billing", "name")])).unwrap();
    let taken = recast(&args("apply", &["--owner", "team-a"]), &[]).await;
    assert_eq!(code(&taken), 1);
    assert!(err(&taken).contains("belongs to owner `team-b`"), "{}", err(&taken));
    assert_eq!(get(&service.url(&format!("/v1/{billing}/billing"))).await.body.as_ref(), br#"{"id":7}"#);
    service.stop().await;
}

#[tokio::test]
async fn a_change_made_through_the_api_while_apply_runs_fails_that_route_s_update_with_412() {
    let (service, upstream, gate) = service_and_upstream().await;
    let url = format!("http://{}", service.addr);
    let dir = tempfile::tempdir().unwrap();
    let base = upstream.url("/");
    let file = write(
        dir.path(),
        "routes.yaml",
        &format!(
            "routes:\n{}{}",
            route_yaml("slow", &base, "slow", "name", ""),
            route_yaml("fast", &base, "u", "name", "")
        ),
    );
    let applied = recast(&["config", "apply", "--url", &url, &file], &[]).await;
    assert_eq!(code(&applied), 0, "{}", err(&applied));
    // Both edited; `slow`'s live call is held while `fast` is changed through the API.
    let edited = format!(
        "routes:\n{}{}",
        route_yaml("slow", &base, "slow", "first", ""),
        route_yaml("fast", &base, "u", "first", "")
    );
    std::fs::write(&file, &edited).unwrap();
    gate.send(false).unwrap();
    let arrived = upstream.received().len();
    let (url2, file2) = (url.clone(), file.clone());
    let applying =
        tokio::spawn(async move { recast(&["config", "apply", "--url", &url2, &file2], &[]).await });
    while upstream.received().len() == arrived {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fast = recast::routes_file::uuid_of("fast");
    let meanwhile = format!(
        r#"{{"path":"fast","originalRoute":{{"originalApi":{{"baseUrl":"{base}"}},"path":"u"}},"rulesAsString":{{"newBodyFields":{{"id":{{"key":"id","type":"Int"}}}},"oldBodyFields":{{"id":{{"keys":["id"],"parents":["user"]}}}}}}}}"#
    );
    let changed = send(Method::PUT, &service.url(&format!("/v1/routes/{fast}")), &[], meanwhile).await;
    assert_eq!(changed.status, 200, "{:?}", changed.json());
    gate.send(true).unwrap();
    let applied = applying.await.unwrap();
    assert_eq!(code(&applied), 1, "{}{}", out(&applied), err(&applied));
    assert!(
        out(&applied).contains("~ route slow:"),
        "the first update was applied and printed: {}",
        out(&applied)
    );
    assert!(err(&applied).contains("~ route fast:"), "{}", err(&applied));
    assert!(err(&applied).contains("412"), "{}", err(&applied));
    assert!(err(&applied).contains("changed on the service after the plan was made"), "{}", err(&applied));
    // The change made meanwhile stands.
    assert_eq!(get(&service.url(&format!("/v1/{fast}/fast"))).await.body.as_ref(), br#"{"id":7}"#);
    service.stop().await;
}

#[tokio::test]
async fn a_secret_by_reference_reaches_the_upstream_is_dumped_as_stars_and_the_dump_applies_as_no_change() {
    let (service, upstream, _gate) = service_and_upstream().await;
    let url = format!("http://{}", service.addr);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("client.key"), "not-a-real-pem\n").unwrap();
    let text = format!(
        "routes:\n{}",
        route_yaml(
            "users",
            &upstream.url("/"),
            "u",
            "name",
            "    authHeader: {type: Bearer, token: \"${env:CONFIG_FILES_TOKEN}\"}\n    owner: team-a\n"
        )
    );
    let file = write(dir.path(), "routes.yaml", &text);
    let token = [("CONFIG_FILES_TOKEN", "s3cret-68-token")];
    let applied = recast(&["config", "apply", "--url", &url, &file], &token).await;
    assert_eq!(code(&applied), 0, "{}", err(&applied));
    let sent = upstream.received().last().unwrap().headers.get("authorization").cloned();
    assert_eq!(sent.as_ref().and_then(|v| v.to_str().ok()), Some("Bearer s3cret-68-token"));
    let users = recast::routes_file::uuid_of("users");
    assert_eq!(get(&service.url(&format!("/v1/{users}/users"))).await.status, 200);

    // A route registered through the API whose text holds `${`: the dump writes it as text.
    std::fs::write(dir.path().join("leak.txt"), "a file of the machine that applies").unwrap();
    let noted = format!(
        r#"{{"name":"noted","owner":"team-a","path":"noted","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"u"}},"preConfiguredHeaders":{{"X-Note":"${{file:leak.txt}}"}},"rulesAsString":{{"newBodyFields":{{"id":{{"key":"id","type":"Int"}}}},"oldBodyFields":{{"id":{{"keys":["id"],"parents":["user"]}}}}}}}}"#,
        upstream.url("/")
    );
    assert_eq!(send(Method::POST, &service.url("/v1/mapping"), &[], noted).await.status, 201);
    let dumped = recast(&["config", "dump", "--url", &url], &[]).await;
    assert_eq!(code(&dumped), 0, "{}", err(&dumped));
    let yaml = out(&dumped);
    assert!(yaml.contains("token: \"***\"") || yaml.contains("token: '***'"), "{yaml}");
    assert!(!yaml.contains("s3cret"), "{yaml}");
    assert!(yaml.contains(&users.to_string()), "{yaml}");
    let dump = write(dir.path(), "dump.yaml", &yaml);
    assert_eq!(code(&recast(&["config", "validate", &dump], &[]).await), 0);
    let calls = upstream.received().len();
    let again = recast(&["config", "apply", "--url", &url, &dump], &[]).await;
    assert_eq!(code(&again), 0, "{}", err(&again));
    assert!(yaml.contains("$${file:leak.txt}"), "{yaml}");
    assert!(out(&again).contains("applied: 0 created, 0 updated, 0 deleted, 2 unchanged"), "{}", out(&again));
    assert_eq!(upstream.received().len(), calls);
    // The dump in JSON is the same file.
    let json = recast(&["config", "dump", "--url", &url, "--output", "json"], &[]).await;
    let dump = write(dir.path(), "dump.json", &out(&json));
    let again = recast(&["config", "diff", "--url", &url, "--exit-code", &dump], &[]).await;
    assert_eq!(code(&again), 0, "{}{}", out(&again), err(&again));
    // Another token is a change, told at its pointer without its value.
    let changed =
        recast(&["config", "diff", "--url", &url, &file], &[("CONFIG_FILES_TOKEN", "an-0ther-token")]).await;
    assert!(out(&changed).contains("~ route users: /authHeader/token\n"), "{}", out(&changed));
    assert!(!out(&changed).contains("an-0ther"), "{}", out(&changed));
    service.stop().await;
}

/// A key of the form callers present, and its digest as a file holds it.
fn key_and_digest() -> (String, String) {
    let key = format!("rk_{}", "k".repeat(43));
    (key.clone(), recast::hex::encode(&recast::callers::consumers::digest(key.as_bytes())))
}

#[tokio::test]
async fn a_node_from_a_file_serves_it_reloads_on_sighup_under_load_keeps_a_broken_file_out_and_changes_nothing()
 {
    let upstream = Upstream::json(USER).await;
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (key, digest) = key_and_digest();
    let consumers = format!("consumers:\n  - name: app\n    keys: [{{id: k1, sha256: {digest}}}]\n");
    let guarded = "    callers: {consumers: [app]}\n";
    let first = format!(
        "routes:\n{}{}{consumers}",
        route_yaml("users", &upstream.url("/"), "u", "name", ""),
        route_yaml("guarded", &upstream.url("/"), "u", "name", guarded)
    );
    let file = write(dir.path(), "routes.yaml", &first);
    let mut node = Binary::start_with(data.path(), &[("RECAST_ROUTES_FILE", &file)]).await;
    let users = recast::routes_file::uuid_of("users");
    let guarded_uuid = recast::routes_file::uuid_of("guarded");
    assert_eq!(
        get(&node.url(&format!("/v1/{users}/users"))).await.body.as_ref(),
        br#"{"id":7,"name":"Ada"}"#
    );
    let with_key =
        send(Method::GET, &node.url(&format!("/v1/{guarded_uuid}/guarded")), &[("x-api-key", &key)], "")
            .await;
    assert_eq!(with_key.status, 200, "the file's consumer's key");
    assert_eq!(get(&node.url(&format!("/v1/{guarded_uuid}/guarded"))).await.status, 401);

    // A client calls throughout; the file changes and SIGHUP loads it.
    let stop = Arc::new(AtomicBool::new(false));
    let (refused, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let loop_url = node.url(&format!("/v1/{users}/users"));
    let client = {
        let (stop, refused, answered) = (stop.clone(), refused.clone(), answered.clone());
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::SeqCst) && tokio::time::Instant::now() < until {
                let answer = get(&loop_url).await;
                let known = [&br#"{"id":7,"name":"Ada"}"#[..], &br#"{"id":7,"first":"Ada"}"#[..]];
                if answer.status != 200 || !known.contains(&answer.body.as_ref()) {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                answered.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    crate::support::reached(&answered, 50, "the client's calls were answered").await;
    let second = format!("routes:\n{}", route_yaml("users", &upstream.url("/"), "u", "first", ""));
    std::fs::write(&file, &second).unwrap();
    node.signal("HUP");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if get(&node.url(&format!("/v1/{users}/users"))).await.body.as_ref() == br#"{"id":7,"first":"Ada"}"# {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the new file was not served:\n{}", node.log_text());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let at = answered.load(Ordering::SeqCst);
    crate::support::reached(&answered, at + 50, "the client's calls went on").await;
    stop.store(true, Ordering::SeqCst);
    client.await.unwrap();
    assert_eq!(
        refused.load(Ordering::SeqCst),
        0,
        "no call was refused or answered otherwise during the reload"
    );
    // The route the file no longer names is gone; so is its consumer.
    assert_eq!(get(&node.url(&format!("/v1/{guarded_uuid}/guarded"))).await.status, 404);

    // A broken file keeps what serves, and every problem is logged.
    std::fs::write(&file, second.replace("type: Int", "type: Itn").replace("name: users", "name: Users"))
        .unwrap();
    node.signal("HUP");
    assert!(node.wait_for_line("the routes file has problems").is_some(), "{}", node.log_text());
    let log = node.log_text();
    assert!(
        log.contains("/routes/0/name") && log.contains("/routes/0/rulesAsString/newBodyFields/id/type"),
        "{log}"
    );
    assert_eq!(
        get(&node.url(&format!("/v1/{users}/users"))).await.body.as_ref(),
        br#"{"id":7,"first":"Ada"}"#
    );

    // A file changed without a signal is read again within a second or two.
    std::fs::write(
        &file,
        route_yaml("users", &upstream.url("/"), "u", "given", "").replace("  - name", "routes:\n  - name"),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(&node.url(&format!("/v1/{users}/users"))).await.body.as_ref() != br#"{"id":7,"given":"Ada"}"# {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the changed file was not served:\n{}",
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The same routes again (a comment added): read again, nothing changed, nothing swapped.
    let same = std::fs::read_to_string(&file).unwrap() + "# touched\n";
    std::fs::write(&file, same).unwrap();
    node.signal("HUP");
    assert!(
        node.wait_for_line("changed=0")
            .is_some_and(|line| line.contains("routes file loaded") && line.contains("routes=1")),
        "{}",
        node.log_text()
    );

    // The admin API reads, and changes nothing.
    assert_eq!(get(&node.url(&format!("/v1/routes/{users}"))).await.status, 200);
    let registration = route_yaml("x", "http://127.0.0.1:9/", "u", "name", "");
    let refused_post = send(Method::POST, &node.url("/v1/mapping"), &[], registration).await;
    refused_post.assert_problem(405, "read-only");
    assert_eq!(refused_post.header("allow"), Some("GET"));
    send(Method::DELETE, &node.url(&format!("/v1/routes/{users}")), &[], "")
        .await
        .assert_problem(405, "read-only");
    send(Method::POST, &node.url("/v1/consumers"), &[], r#"{"name":"x"}"#)
        .await
        .assert_problem(405, "read-only");
    assert_eq!(get(&node.url(&format!("/v1/{users}/users"))).await.status, 200);
    // Nothing was written to disk.
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0, "the data directory stays empty");
    assert!(node.terminate().success());

    // RECAST_CALLERS_REQUIRED holds for a file's routes: an open one keeps the node from serving.
    let strict = write(dir.path(), "strict.yaml", &first);
    let data = tempfile::tempdir().unwrap();
    let mut strict_node = Binary::spawn_with(
        data.path(),
        &[("RECAST_ROUTES_FILE", &strict), ("RECAST_CALLERS_REQUIRED", "true")],
    );
    let line = strict_node.wait_for_line("routes file problem").unwrap_or_else(|| strict_node.log_text());
    assert!(line.contains("/routes/0/callers: RECAST_CALLERS_REQUIRED"), "{line}");
    strict_node.addr = strict_node.logged_address().expect("it listens");
    assert_eq!(get(&strict_node.url("/readyz")).await.status, 503, "not ready without a file that loaded");
    assert!(strict_node.terminate().success());
}

#[tokio::test]
async fn config_commands_against_a_cluster_of_two_nodes() {
    let upstream = Upstream::json(USER).await;
    let postgres = tokio::task::spawn_blocking(crate::postgres::Postgres::start).await.unwrap();
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let key = "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7";
    let url = postgres.url();
    let env = [
        ("RECAST_DATABASE_URL", url.as_str()),
        ("RECAST_SECRET_KEY", key),
        ("RECAST_SYNC_INTERVAL_MS", "500"),
    ];
    let a = Binary::start_with(a_dir.path(), &env).await;
    let b = Binary::start_with(b_dir.path(), &env).await;
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "routes.yaml",
        &routes_file(&upstream, &[("users", "name"), ("orders", "name"), ("items", "name")]),
    );
    let applied = recast(&["config", "apply", "--url", &a.url(""), "--owner", "team-a", &file], &[]).await;
    assert_eq!(code(&applied), 0, "{}", err(&applied));
    // Node b converges: the same file shows no change there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let diff =
            recast(&["config", "diff", "--url", &b.url(""), "--owner", "team-a", "--exit-code", &file], &[])
                .await;
        if code(&diff) == 0 {
            assert!(
                out(&diff).contains("0 to create, 0 to update, 0 to delete, 3 unchanged"),
                "{}",
                out(&diff)
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node b did not converge: {}{}",
            out(&diff),
            err(&diff)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // An edit applied through b reaches a.
    std::fs::write(
        &file,
        routes_file(&upstream, &[("users", "first"), ("orders", "name"), ("items", "name")]),
    )
    .unwrap();
    let edited = recast(&["config", "apply", "--url", &b.url(""), "--owner", "team-a", &file], &[]).await;
    assert_eq!(code(&edited), 0, "{}", err(&edited));
    let users = recast::routes_file::uuid_of("users");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(&a.url(&format!("/v1/{users}/users"))).await.body.as_ref() != br#"{"id":7,"first":"Ada"}"# {
        assert!(tokio::time::Instant::now() < deadline, "node a did not converge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A name is one route's across the cluster: the database's index refuses a second at once,
    // even on a node that has not seen the first.
    let named = |path: &str| {
        format!(
            r#"{{"name":"shared","path":"{path}","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"u"}},"rulesAsString":{{"newBodyFields":{{"id":{{"key":"id","type":"Int"}}}},"oldBodyFields":{{"id":{{"keys":["id"],"parents":["user"]}}}}}}}}"#,
            upstream.url("/")
        )
    };
    let (on_a, on_b) = (a.url("/v1/mapping"), b.url("/v1/mapping"));
    let (first, second) = tokio::join!(
        send(Method::POST, &on_a, &[], named("one")),
        send(Method::POST, &on_b, &[], named("two"))
    );
    let mut statuses = [first.status.as_u16(), second.status.as_u16()];
    statuses.sort();
    assert_eq!(statuses, [201, 409], "{:?} {:?}", first.json(), second.json());
    drop((a, b));
    drop(postgres);
}
