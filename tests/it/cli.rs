//! The real `recast` binary's commands besides `serve`: `check` and `preview` offline, `routes`
//! against a running service, and their exit codes (0 done, 1 problems or an error answer, 2 a bad
//! command line, 3 a file or the service out of reach).

use std::path::Path;
use std::process::{Command, Output};

use http::Method;
use recast::config::Config;
use recast::secrets::Secret;

use crate::support::{Json, Service, Upstream, config, post_json, send};

const RULES: &str = r#"{"newBodyFields":{"name":{"key":"name","type":"String"},"id":{"key":"id","type":"Int"},"mix":{"key":"mix","type":"String"}},"oldBodyFields":{"name":{"keys":["strMeal"],"parents":["meals"]},"id":{"keys":["idMeal"],"parents":["meals"]},"mix":{"keys":["strArea, strMeal"],"parents":["meals"]},"spare":{"keys":["x"]}}}"#;
const SAMPLE: &str = r#"{"meals":[{"strMeal":"Soup","idMeal":"12","strArea":" Thai "}]}"#;

/// Runs `recast ARGS` without any RECAST_* variable of the environment, off the test's runtime.
async fn recast(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_recast"));
    command.args(args);
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("RECAST_")) {
        command.env_remove(name);
    }
    tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("the binary runs")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("the binary exits by itself")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn file(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn check_lists_every_problem_with_its_location_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let good = file(dir.path(), "good.json", RULES);
    let checked = recast(&["check", "--rules", &good]).await;
    assert_eq!(code(&checked), 0, "{}", text(&checked.stderr));
    let report = text(&checked.stderr);
    assert!(report.contains("the rules compile (3 targets)"), "{report}");
    assert!(report.contains("warning: /oldBodyFields/spare:"), "{report}");

    // The same rules given as a JSON string holding them (as `rulesAsString` may be).
    let quoted = file(dir.path(), "quoted.json", &serde_json::to_string(RULES).unwrap());
    assert_eq!(code(&recast(&["check", "--rules", &quoted]).await), 0);

    let bad = file(
        dir.path(),
        "bad.json",
        r#"{"newBodyFields":{"a":{"key":"a","type":"Strin"},"b":{"key":"b","type":"String"}},"oldBodyFields":{"a":{"keys":[]}}}"#,
    );
    let checked = recast(&["check", "--rules", &bad]).await;
    assert_eq!(code(&checked), 1);
    let report = text(&checked.stderr);
    for location in ["/newBodyFields/a/type", "/oldBodyFields/a/keys", "/newBodyFields/b"] {
        assert!(report.contains(&format!("error: {location}:")), "{location} missing from {report}");
    }
    assert!(report.contains("3 problem(s)"), "{report}");

    let not_json = file(dir.path(), "not.json", "{\"newBodyFields\":");
    assert_eq!(code(&recast(&["check", "--rules", &not_json]).await), 1);
    let missing = recast(&["check", "--rules", &dir.path().join("absent.json").to_string_lossy()]).await;
    assert_eq!(code(&missing), 3);
    assert!(text(&missing.stderr).contains("cannot read the rules file"), "{}", text(&missing.stderr));
    assert_eq!(code(&recast(&["check"]).await), 2, "a missing --rules is a usage error");
}

#[tokio::test]
async fn preview_prints_what_the_preview_endpoint_answers() {
    let dir = tempfile::tempdir().unwrap();
    let rules = file(dir.path(), "rules.json", RULES);
    let input = file(dir.path(), "input.json", SAMPLE);
    let service = Service::start(config()).await;
    let body = format!(r#"{{"originalResponse":{SAMPLE},"mappingRules":{RULES}}}"#);
    for (flag, query) in [(None, ""), (Some("--trace"), "?trace=true")] {
        let mut args = vec!["preview", "--rules", &rules, "--input", &input];
        args.extend(flag);
        let printed = recast(&args).await;
        assert_eq!(code(&printed), 0, "{}", text(&printed.stderr));
        let served = post_json(&service.url(&format!("/v1/preview{query}")), body.clone()).await;
        assert_eq!(served.status, 200);
        assert_eq!(text(&printed.stdout), format!("{}\n", text(&served.body)), "{flag:?}");
    }
    let printed = recast(&["preview", "--rules", &rules, "--input", &input]).await;
    assert_eq!(Json::parse(&printed.stdout), Json::parse(br#"{"name":"Soup","id":12,"mix":"Thai Soup"}"#));
    service.stop().await;

    let broken = file(dir.path(), "broken.json", r#"{"meals":"#);
    let failed = recast(&["preview", "--rules", &rules, "--input", &broken]).await;
    assert_eq!(code(&failed), 1);
    assert!(text(&failed.stderr).contains("the input is not valid JSON"), "{}", text(&failed.stderr));
    assert!(failed.stdout.is_empty());
    let bad_rules = file(dir.path(), "bad.json", r#"{"newBodyFields":{}}"#);
    assert_eq!(code(&recast(&["preview", "--rules", &bad_rules, "--input", &input]).await), 1);
    let absent = dir.path().join("absent.json");
    assert_eq!(code(&recast(&["preview", "--rules", &rules, "--input", &absent.to_string_lossy()]).await), 3);
}

#[tokio::test]
async fn routes_lists_shows_purges_counts_and_deletes_with_the_admin_token() {
    let upstream = Upstream::json(SAMPLE).await;
    let service = Service::start(Config { admin_token: Some(Secret::new("admin-c4f2")), ..config() }).await;
    let registration = format!(
        r#"{{"path":"soup","originalRoute":{{"originalApi":{{"baseUrl":"{}"}},"path":"meals"}},"authHeader":{{"type":"Bearer","token":"upstream-secret-81d0"}},"rulesAsString":{RULES},"cache":{{"ttlSeconds":600}}}}"#,
        upstream.url("/api")
    );
    let admin = [("authorization", "Bearer admin-c4f2"), ("content-type", "application/json")];
    let created = send(Method::POST, &service.url("/v1/mapping"), &admin, registration).await;
    assert_eq!(created.status, 201, "{}", text(&created.body));
    let uuid = created.json().get("uuid").and_then(Json::as_str).unwrap().to_owned();
    let url = service.url("");
    let url = url.trim_end_matches('/');

    let listed = recast(&["routes", "list", "--url", url, "--token", "admin-c4f2"]).await;
    assert_eq!(code(&listed), 0, "{}", text(&listed.stderr));
    let listing = text(&listed.stdout);
    assert!(listing.contains(&uuid) && !listing.contains("upstream-secret-81d0"), "{listing}");
    // Flags before the subcommand work too, and the page size is passed on.
    let page = recast(&["routes", "--url", url, "--token", "admin-c4f2", "list", "--limit", "1"]).await;
    assert_eq!(code(&page), 0, "{}", text(&page.stderr));

    let shown = recast(&["routes", "get", &uuid, "--url", url, "--token", "admin-c4f2"]).await;
    assert_eq!(code(&shown), 0);
    assert_eq!(Json::parse(&shown.stdout).get("uuid").and_then(Json::as_str), Some(uuid.as_str()));

    let refused = recast(&["routes", "list", "--url", url, "--token", "wrong"]).await;
    assert_eq!(code(&refused), 1);
    assert!(text(&refused.stderr).starts_with("401"), "{}", text(&refused.stderr));
    assert_eq!(code(&recast(&["routes", "list", "--url", url]).await), 1, "no token");
    assert_eq!(
        code(&recast(&["routes", "list", "--url", url, "--token", "a\nb"]).await),
        2,
        "a token no header can hold"
    );

    // A purge: the call after it goes upstream again.
    let call = service.url(&format!("/v1/{uuid}/soup"));
    for _ in 0..2 {
        assert_eq!(send(Method::GET, &call, &[], "").await.status, 200);
    }
    assert_eq!(upstream.received().len(), 2, "the live call and one call; the other was a hit");
    let purged = recast(&["routes", "purge", &uuid, "--url", url, "--token", "admin-c4f2"]).await;
    assert_eq!(code(&purged), 0, "{}", text(&purged.stderr));
    assert_eq!(text(&purged.stderr), "purged\n");
    assert_eq!(
        send(Method::GET, &call, &[], "").await.header("cache-status"),
        Some("recast; fwd=miss; stored; ttl=600")
    );
    assert_eq!(upstream.received().len(), 3);

    // The three calls above, counted on the route.
    let stats =
        recast(&["routes", "stats", &uuid, "--url", url, "--token", "admin-c4f2", "--minutes", "2"]).await;
    assert_eq!(code(&stats), 0, "{}", text(&stats.stderr));
    let counted = Json::parse(&stats.stdout);
    assert_eq!(counted.get("calls"), Some(&Json::Number(3.into())), "{}", text(&stats.stdout));
    assert_eq!(counted.get("minutes"), Some(&Json::Number(2.into())));
    let window =
        recast(&["routes", "stats", &uuid, "--url", url, "--token", "admin-c4f2", "--minutes", "9"]).await;
    assert_eq!(code(&window), 1);
    assert!(text(&window.stderr).starts_with("400"), "{}", text(&window.stderr));

    // The key ring: one key, sealing the one route; a re-seal finds nothing to do.
    let keys = recast(&["keys", "status", "--url", url, "--token", "admin-c4f2"]).await;
    assert_eq!(code(&keys), 0, "{}", text(&keys.stderr));
    let status = Json::parse(&keys.stdout);
    let sealing = status.get("sealing").and_then(Json::as_str).unwrap().to_owned();
    assert_eq!(sealing.len(), 8, "{}", text(&keys.stdout));
    let resealed = recast(&["keys", "--url", url, "--token", "admin-c4f2", "reseal", "--batch", "5"]).await;
    assert_eq!(code(&resealed), 0, "{}", text(&resealed.stderr));
    assert_eq!(Json::parse(&resealed.stdout).get("resealed"), Some(&Json::Number(0.into())));
    let refused = recast(&["keys", "reseal", "--url", url, "--token", "wrong"]).await;
    assert_eq!(code(&refused), 1);
    assert!(text(&refused.stderr).starts_with("401"), "{}", text(&refused.stderr));

    let deleted = recast(&["routes", "delete", &uuid, "--url", url, "--token", "admin-c4f2"]).await;
    assert_eq!(code(&deleted), 0, "{}", text(&deleted.stderr));
    let gone = recast(&["routes", "get", &uuid, "--url", url, "--token", "admin-c4f2"]).await;
    assert_eq!(code(&gone), 1);
    assert!(text(&gone.stderr).starts_with("404"), "{}", text(&gone.stderr));
    // A path-changing id is sent as one segment: not found, not another endpoint.
    let odd = recast(&["routes", "delete", "../../v1/mapping", "--url", url, "--token", "admin-c4f2"]).await;
    assert_eq!(code(&odd), 1);
    assert!(text(&odd.stderr).starts_with("404"), "{}", text(&odd.stderr));
    service.stop().await;

    // Nothing listens there any more.
    let unreachable = recast(&["routes", "list", "--url", url]).await;
    assert_eq!(code(&unreachable), 3, "{}", text(&unreachable.stderr));
    assert!(text(&unreachable.stderr).contains("cannot reach recast"), "{}", text(&unreachable.stderr));
}

#[tokio::test]
async fn check_and_preview_take_expressions() {
    let dir = tempfile::tempdir().unwrap();
    let rules = file(
        dir.path(),
        "rules.json",
        r#"{"newBodyFields":{"n":{"key":"n","type":"String"},"c":{"key":"c","type":"Int"}},
            "oldBodyFields":{"n":{"expr":"upper(meals[0].strMeal)"},"c":{"expr":"length(meals)"}}}"#,
    );
    let checked = recast(&["check", "--rules", &rules]).await;
    assert_eq!(code(&checked), 0, "{}", text(&checked.stderr));
    let input = file(dir.path(), "input.json", SAMPLE);
    let printed = recast(&["preview", "--rules", &rules, "--input", &input]).await;
    assert_eq!(code(&printed), 0, "{}", text(&printed.stderr));
    assert_eq!(Json::parse(&printed.stdout), Json::parse(br#"{"n":"SOUP","c":1}"#));

    let bad = file(
        dir.path(),
        "bad.json",
        r#"{"newBodyFields":{"n":{"key":"n","type":"String"}},"oldBodyFields":{"n":{"expr":"meals[0].nope(@)"}}}"#,
    );
    let checked = recast(&["check", "--rules", &bad]).await;
    assert_eq!(code(&checked), 1);
    let report = text(&checked.stderr);
    assert!(
        report.contains("error: /oldBodyFields/n/expr: at character 9: unknown function nope()"),
        "{report}"
    );
}

/// Runs `recast ARGS` with `input` on its standard input.
async fn recast_with_input(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut command = Command::new(env!("CARGO_BIN_EXE_recast"));
    command.args(args).stdin(std::process::Stdio::piped());
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("RECAST_")) {
        command.env_remove(name);
    }
    let input = input.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("the binary runs");
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_dash_reads_standard_input_wherever_a_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let rules = file(dir.path(), "rules.json", RULES);
    let sample = file(dir.path(), "sample.json", SAMPLE);
    let from_file = recast(&["preview", "--rules", &rules, "--input", &sample]).await;
    let from_stdin = recast_with_input(&["preview", "--rules", &rules, "--input", "-"], SAMPLE).await;
    assert_eq!(code(&from_stdin), 0, "{}", text(&from_stdin.stderr));
    assert_eq!(from_stdin.stdout, from_file.stdout);
    let rules_from_stdin = recast_with_input(&["preview", "--rules", "-", "--input", &sample], RULES).await;
    assert_eq!(rules_from_stdin.stdout, from_file.stdout);
    let checked = recast_with_input(&["check", "--rules", "-"], RULES).await;
    assert_eq!(code(&checked), 0, "{}", text(&checked.stderr));
    let both = recast_with_input(&["preview", "--rules", "-", "--input", "-"], RULES).await;
    assert!(text(&both.stderr).contains("only one of --rules and --input can be standard input"));
    // A sample that is not JSON is told by line and column, in words.
    let broken =
        recast_with_input(&["preview", "--rules", &rules, "--input", "-"], "{\n  \"meals\": [1,]\n}").await;
    assert_eq!(code(&broken), 1);
    assert_eq!(
        text(&broken.stderr),
        "-: the input is not valid JSON: line 2, column 15 (in `meals`): not a value, found `]`\n"
    );
}

#[tokio::test]
async fn the_help_names_every_command_the_docs_describe() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md")).unwrap();
    let top = text(&recast(&["--help"]).await.stdout);
    let routes = text(&recast(&["routes", "--help"]).await.stdout);
    let line = top.lines().find(|l| l.trim_start().starts_with("routes")).expect("routes in the help");
    for command in ["list", "get", "delete", "purge", "stats", "export", "import"] {
        assert!(
            docs.contains(&format!("routes [--url URL] [--token TOKEN] {command}"))
                || docs.contains(&format!("`recast routes {command}")),
            "docs/cli.md: {command}"
        );
        assert!(
            routes.lines().any(|l| l.trim_start().starts_with(command)),
            "recast routes --help: {command}\n{routes}"
        );
    }
    for word in ["list", "show", "delete", "purge", "stats", "export", "import"] {
        assert!(line.to_lowercase().contains(word), "recast --help says of routes: {line}");
    }
}

#[tokio::test]
async fn check_registration_validates_a_composition_offline_graph_included() {
    let dir = tempfile::tempdir().unwrap();
    // The worked example of docs/composition.md, as written there.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/composition.md")).unwrap();
    let start = doc.find("```json registration\n").unwrap() + "```json registration\n".len();
    let example = &doc[start..start + doc[start..].find("```").unwrap()];
    let good = file(dir.path(), "dashboard.json", example);
    let checked = recast(&["check", "--registration", &good]).await;
    assert_eq!(code(&checked), 0, "{}", text(&checked.stderr));
    assert!(
        text(&checked.stderr).contains("the registration is valid (4 sources, 5 targets)"),
        "{}",
        text(&checked.stderr)
    );

    let cyclic = example
        .replace(r#""after": ["user"], "forEach""#, r#""after": ["orders"], "forEach""#)
        .replace(r#""limit": "5" }, "after": ["user"]"#, r#""limit": "5" }, "after": ["user", "city"]"#);
    assert_ne!(cyclic, example);
    let bad = file(dir.path(), "cyclic.json", &cyclic);
    let checked = recast(&["check", "--registration", &bad]).await;
    assert_eq!(code(&checked), 1, "{}", text(&checked.stderr));
    let report = text(&checked.stderr);
    assert!(
        report.contains("error: /sources/city/after: the sources wait for each other in a cycle"),
        "{report}"
    );

    let misplaced = example.replacen(
        r#""path": "dashboard","#,
        r#""path": "dashboard", "retry": {"attempts": 1, "on": [503]}, "rulesAsString2": 1,"#,
        1,
    );
    let checked = recast(&["check", "--registration", &file(dir.path(), "misplaced.json", &misplaced)]).await;
    assert_eq!(code(&checked), 1);
    assert!(
        text(&checked.stderr).contains("error: /rulesAsString2: unknown member"),
        "{}",
        text(&checked.stderr)
    );
    assert_eq!(code(&recast(&["check", "--rules", &good, "--registration", &good]).await), 2);
}

/// A log filter that would silence every line (a word that is no level) stops the start with a
/// message; an invalid value taken from a variable is named by the variable, not by its flag.
#[tokio::test]
async fn settings_that_would_mislead_stop_the_start_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let serve = |variables: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_recast"));
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir", &data]);
        for (name, _) in std::env::vars().filter(|(name, _)| name.starts_with("RECAST_")) {
            command.env_remove(name);
        }
        command.envs(variables.iter().copied());
        command
    };
    let run = |mut command: Command| async move {
        let output = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            tokio::task::spawn_blocking(move || command.output()),
        )
        .await
        .expect("the binary stops by itself")
        .unwrap()
        .unwrap();
        (code(&output), text(&output.stderr))
    };
    let (exit, stderr) = run(serve(&[("RECAST_LOG", "verbose")])).await;
    assert_ne!(exit, 0, "{stderr}");
    assert!(stderr.contains("RECAST_LOG: `verbose` is neither a level"), "{stderr}");
    let (exit, stderr) = run(serve(&[("RECAST_WORKERS", "0")])).await;
    assert_eq!(exit, 2, "{stderr}");
    assert!(stderr.contains("RECAST_WORKERS (the --workers flag)"), "{stderr}");
    // Given as a flag, the flag is what is named.
    let mut flagged = serve(&[]);
    flagged.args(["--workers", "0"]);
    let (exit, stderr) = run(flagged).await;
    assert_eq!(exit, 2, "{stderr}");
    assert!(stderr.contains("--workers") && !stderr.contains("RECAST_WORKERS"), "{stderr}");
}

#[tokio::test]
async fn consumers_and_their_keys_are_managed_from_the_command_line() {
    let service = Service::start(Config { admin_token: Some(Secret::new("admin-c4f2")), ..config() }).await;
    let url = service.url("");
    let url = url.trim_end_matches('/');
    let run = |args: &[&str]| {
        let mut all: Vec<String> = vec!["consumers".into()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        all.extend(["--url".into(), url.to_owned(), "--token".into(), "admin-c4f2".into()]);
        async move { recast(&all.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    let added = run(&["add", "mobile-app", "--metadata", r#"{"tier":"gold"}"#]).await;
    assert_eq!(code(&added), 0, "{}", text(&added.stderr));
    assert_eq!(code(&run(&["add", "bad", "--metadata", "[1]"]).await), 2);
    let issued = run(&["keys", "add", "mobile-app", "--expires-at", "2999-01-01T00:00:00Z"]).await;
    assert_eq!(code(&issued), 0, "{}", text(&issued.stderr));
    assert!(text(&issued.stderr).contains("shown this once"), "{}", text(&issued.stderr));
    let issued = Json::parse(&issued.stdout);
    let key = issued.get("key").and_then(Json::as_str).unwrap().to_owned();
    let id = issued.get("id").and_then(Json::as_str).unwrap().to_owned();
    let listed = run(&["keys", "list", "mobile-app"]).await;
    assert!(
        text(&listed.stdout).contains(&id) && !text(&listed.stdout).contains(&key),
        "{}",
        text(&listed.stdout)
    );
    let all = run(&["list"]).await;
    assert!(text(&all.stdout).contains(r#""name":"mobile-app""#), "{}", text(&all.stdout));
    let shown = run(&["get", "mobile-app"]).await;
    assert!(text(&shown.stdout).contains(r#""tier":"gold""#));
    let revoked = run(&["keys", "revoke", "mobile-app", &id]).await;
    assert_eq!((code(&revoked), text(&revoked.stderr)), (0, "revoked\n".to_owned()));
    assert_eq!(code(&run(&["keys", "revoke", "mobile-app", &id]).await), 1);
    let deleted = run(&["delete", "mobile-app"]).await;
    assert_eq!((code(&deleted), text(&deleted.stderr)), (0, "deleted\n".to_owned()));
    let gone = run(&["get", "mobile-app"]).await;
    assert_eq!(code(&gone), 1);
    assert!(text(&gone.stderr).starts_with("404"), "{}", text(&gone.stderr));
    service.stop().await;
}
