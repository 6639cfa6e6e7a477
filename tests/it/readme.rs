//! The README's examples and tables: each ```sh block that is one curl command followed by a
//! ```json block must print exactly that answer when run as pasted, the walk-through must work as
//! pasted, the trace shown must be the trace recast gives, and the rules and settings tables must
//! say what recast does.

use crate::process::{Group, Kept};
use crate::support::{Json, Service, config, free_port, post_json};

const README: &str = include_str!("../../README.md");

/// One curl example of the README.
struct Example {
    /// The command as pasted.
    command: String,
    /// The path it posts to and the body it posts.
    path: String,
    body: String,
    /// The json block after it.
    expected: String,
}

/// Every curl example in the README.
fn examples() -> Vec<Example> {
    let mut examples = Vec::new();
    let mut rest = README;
    while let Some(start) = rest.find("```sh\ncurl ") {
        let block = &rest[start + "```sh\n".len()..];
        let end = block.find("```").expect("closed sh block");
        let command = &block[..end];
        let after = &block[end + 3..];
        let json_start = after.find("```json\n").expect("a json block follows") + "```json\n".len();
        let json_end = after[json_start..].find("```").expect("closed json block");
        let expected = &after[json_start..json_start + json_end];

        let url_start =
            command.find("http://127.0.0.1:8080").expect("a local URL") + "http://127.0.0.1:8080".len();
        let path = command[url_start..].split_whitespace().next().expect("a path");
        let body_start = command.find("-d '").expect("a -d body") + 4;
        let body_end = command.rfind('\'').expect("a closing quote");
        examples.push(Example {
            command: command.to_owned(),
            path: path.to_owned(),
            body: command[body_start..body_end].to_owned(),
            expected: expected.to_owned(),
        });
        rest = &after[json_start + json_end..];
    }
    examples
}

/// Runs `script` with bash, with the README's address replaced by `service`'s, and returns what it
/// printed, failing the test if it fails.
async fn run_pasted(service: &Service, script: &str) -> (String, String) {
    let script = script.replace("http://127.0.0.1:8080", &format!("http://{}", service.addr));
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash").arg("-c").arg(script).output().expect("bash runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Each curl example, run as pasted with bash and curl, prints exactly the answer the README shows.
#[tokio::test]
async fn curl_examples_answer_what_the_readme_says() {
    let examples = examples();
    assert!(examples.len() >= 2, "found {} examples", examples.len());
    let service = Service::start(config()).await;
    for example in examples {
        let (stdout, _) = run_pasted(&service, &example.command).await;
        assert_eq!(
            Json::parse(stdout.as_bytes()),
            Json::parse(example.expected.as_bytes()),
            "{}",
            example.path
        );
    }
    service.stop().await;
}

/// The trace the README shows, abridged with `...`, is the start of the trace of its first example:
/// the same output, the same first entry, member for member, and the same warnings.
#[tokio::test]
async fn the_trace_shown_is_the_trace_recast_gives() {
    let start = README.find("Add `?trace=true`").expect("the trace paragraph");
    let block = &README[start..];
    let block = &block[block.find("```json\n").expect("its json block") + "```json\n".len()..];
    let block = &block[..block.find("```").expect("closed")];
    let entry_start = block.find("\"trace\": [").expect("a trace") + "\"trace\": [".len();
    let entry_end = block.find(", ...]").expect("an abridged trace");
    let first_entry = Json::parse(&block.as_bytes()[entry_start..entry_end]);
    assert!(block.contains("\"warnings\": []"), "{block}");

    let example = examples().into_iter().next().expect("a first example");
    assert_eq!(example.path, "/v1/preview");
    let service = Service::start(config()).await;
    let answer = post_json(&service.url("/v1/preview?trace=true"), example.body).await;
    assert_eq!(answer.status, 200);
    let traced = answer.json();
    assert_eq!(traced.get("output"), Some(&Json::parse(example.expected.as_bytes())));
    assert_eq!(traced.get("trace").expect("a trace").as_array().first(), Some(&first_entry));
    assert_eq!(traced.get("warnings"), Some(&Json::Array(Vec::new())));
    service.stop().await;
}

/// The walk-through's script: the README's first sh block after `heading`.
fn sh_block_after(heading: &str) -> &'static str {
    let start = README.find(heading).unwrap_or_else(|| panic!("{heading} in the README"));
    let block_start = README[start..].find("```sh\n").expect("its sh block") + start + "```sh\n".len();
    let block_end = README[block_start..].find("```").expect("closed") + block_start;
    &README[block_start..block_end]
}

/// Runs `script` with bash (the README's address replaced by `service`'s), and returns its exit
/// status and what it printed, whatever the status.
async fn run_script(service: &Service, script: &str) -> (bool, String, String) {
    let script = script.replace("http://127.0.0.1:8080", &format!("http://{}", service.addr));
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash").arg("-c").arg(script).output().expect("bash runs")
    })
    .await
    .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

/// The README's walk-through, run as written with bash and curl, offline: against the stand-in
/// upstream the README starts with one command (on a free port and in a temporary directory),
/// with `BASE` exported as the README says.
#[tokio::test]
async fn the_walk_through_works_as_pasted_offline() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let stand_in = sh_block_after("**Offline**")
        .trim()
        .replace("8099", &port.to_string())
        .replace("/tmp/mealdb", dir.path().to_str().unwrap());
    let upstream = Group::spawn_logged(
        std::process::Command::new("bash").arg("-c").arg(&stand_in),
        "the README's stand-in upstream",
        Kept::Both,
    )
    .expect("bash runs");
    wait_for_port(port).await;
    let service = Service::start(config()).await;
    let tour = sh_block_after("### Register, call, list, update and delete a route");
    let script = format!("export BASE=http://127.0.0.1:{port}/\n{tour}");
    let (ok, stdout, stderr) = run_script(&service, &script).await;
    assert!(ok, "{stdout}\n{stderr}\n{}", upstream.output());
    let preview = r#""preview":{"id":52772,"name":"Teriyaki Chicken Casserole","ingredients":["3/4 cup soy sauce","1/2 cup water"]}"#;
    assert!(stderr.contains(preview), "registration: {stderr}");
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines[0].starts_with("route: /v1/") && lines[0].ends_with("/meals/random"), "{stdout}");
    assert_eq!(
        lines[1],
        r#"{"id":52772,"name":"Teriyaki Chicken Casserole","ingredients":["3/4 cup soy sauce","1/2 cup water"]}"#
    );
    assert!(
        lines[2].starts_with(r#"{"routes":[{"#) && lines[2].contains(r#""nextCursor":null"#),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].contains(r#""preview":{"name":"Teriyaki Chicken Casserole","area":"Japanese"}"#),
        "{}",
        lines[3]
    );
    assert_eq!(lines[4], r#"{"name":"Teriyaki Chicken Casserole","area":"Japanese"}"#);
    assert_eq!(lines[5], "204");
    assert!(lines[6].contains(r#""status":404"#), "{}", lines[6]);
    assert_eq!(lines.len(), 7, "{stdout}");
    drop(upstream);
    service.stop().await;
}

/// Where the public API cannot be reached, the tour stops at the registration with a line that
/// says why, and calls nothing with an empty route.
#[tokio::test]
async fn the_walk_through_stops_at_the_first_failure_with_a_line_that_says_why() {
    let service = Service::start(config()).await;
    // Nothing listens there.
    let base = format!("http://127.0.0.1:{}/", free_port());
    let tour = sh_block_after("### Register, call, list, update and delete a route");
    let (ok, stdout, stderr) = run_script(&service, &format!("export BASE={base}\n{tour}")).await;
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("upstream-validation-failed"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert!(
        lines[0].starts_with("The registration stored nothing: its problem is printed above."),
        "{stdout}"
    );
    assert!(lines[0].contains(&base), "{stdout}");
    service.stop().await;
}

/// Waits (at most ten seconds) until something listens on the loopback `port`.
async fn wait_for_port(port: u16) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("nothing listens on 127.0.0.1:{port} after 10 s");
}

/// Every setting of `recast serve`: its variable, its flag and its default (`None` when it has none).
fn settings() -> Vec<(String, String, Option<String>)> {
    let command = <recast::config::Config as clap::Args>::augment_args(clap::Command::new("serve"));
    command
        .get_arguments()
        .filter_map(|arg| {
            let env = arg.get_env()?.to_str()?.to_owned();
            let flag = format!("--{}", arg.get_long()?);
            let default = match arg.get_default_values() {
                [default] => Some(default.to_str()?.to_owned()),
                _ => None,
            };
            Some((env, flag, default))
        })
        .collect()
}

/// The cells of the table rows of `doc` that start with a setting's variable.
fn setting_rows(doc: &str) -> Vec<Vec<&str>> {
    doc.lines()
        .filter(|l| l.starts_with("| `RECAST_") || l.starts_with("| `OTEL_"))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect()
}

/// docs/config.md has a row for every setting of `recast serve`: its variable, its flag and its
/// default as the code has them, and no row for a setting that does not exist.
#[test]
fn the_settings_reference_matches_the_code() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config.md")).unwrap();
    let rows = setting_rows(&doc);
    let settings = settings();
    for (env, flag, default) in &settings {
        let row = rows
            .iter()
            .find(|r| r.first() == Some(&format!("`{env}`").as_str()))
            .unwrap_or_else(|| panic!("docs/config.md has no row for {env}"));
        assert_eq!(row.get(1), Some(&format!("`{flag}`").as_str()), "{env}");
        if let Some(default) = default {
            let documented = row.get(2).copied().unwrap_or_default();
            let expected = if default.is_empty() { "empty".to_owned() } else { format!("`{default}`") };
            assert_eq!(documented, expected, "the default of {env}");
        }
    }
    assert_eq!(rows.len(), settings.len(), "docs/config.md lists a setting the code does not have");
}

/// The README's short table of settings names real settings with the defaults the code has:
/// a value in one code span, a number of MiB, `empty`, or, for a setting with no default value,
/// `unset` or a few words on what recast does then.
#[test]
fn the_readmes_settings_are_the_codes() {
    let rows = setting_rows(README);
    assert!(rows.len() >= 5, "found {} settings in the README", rows.len());
    let settings = settings();
    for row in rows {
        let [variable, documented, _] = row[..] else { panic!("a row of three cells: {row:?}") };
        let (env, _, default) = settings
            .iter()
            .find(|(env, ..)| variable == format!("`{env}`"))
            .unwrap_or_else(|| panic!("the README names {variable}, which is not a setting"));
        let span =
            documented.strip_prefix('`').and_then(|d| d.strip_suffix('`')).filter(|d| !d.contains('`'));
        let documented = match (span, documented.strip_suffix(" MiB")) {
            (Some(value), _) => Some(value.to_owned()),
            (None, Some(mib)) => Some((mib.parse::<u64>().expect("a number of MiB") << 20).to_string()),
            (None, None) if documented == "empty" => Some(String::new()),
            (None, None) => None,
        };
        assert_eq!(&documented, default, "the README's default of {env}");
    }
}

/// The whole rules behind each row of the README's table "The rules language in short", whose
/// rules column is abridged: `(the start of the row's feature cell, rules document)`.
const TABLE_RULES: &[(&str, &str)] = &[
    (
        "rename",
        r#"{"newBodyFields": {"n": {"key": "name", "type": "String"}},
           "oldBodyFields": {"n": {"keys": ["strMeal"]}}}"#,
    ),
    (
        "nested extraction",
        r#"{"newBodyFields": {"i": {"key": "id", "type": "Int"}},
           "oldBodyFields": {"i": {"keys": ["id"], "parents": ["data", "items"]}}}"#,
    ),
    (
        "concatenation",
        r#"{"newBodyFields": {"q": {"key": "q", "type": "String"}},
           "oldBodyFields": {"q": {"keys": ["qty, unit"]}}}"#,
    ),
    (
        "several entries",
        r#"{"newBodyFields": {"ab": {"key": "ab", "type": "String"}},
           "oldBodyFields": {"ab": {"keys": ["a", "b"]}}}"#,
    ),
    (
        "type coercion",
        r#"{"newBodyFields": {"n": {"key": "n", "type": "Int"}, "r": {"key": "r", "type": "Double"},
           "ok": {"key": "ok", "type": "Boolean"}},
           "oldBodyFields": {"n": {"keys": ["n"]}, "r": {"keys": ["r"]}, "ok": {"keys": ["ok"]}}}"#,
    ),
    (
        "a value that does not convert",
        r#"{"newBodyFields": {"n": {"key": "n", "type": "Int"}},
           "oldBodyFields": {"n": {"keys": ["n"]}}}"#,
    ),
    (
        "`ignoreEmptyValues`",
        r#"{"ignoreEmptyValues": true,
           "newBodyFields": {"a": {"key": "a", "type": "String"}, "b": {"key": "b", "type": "String"},
           "c": {"key": "c", "type": "String"}},
           "oldBodyFields": {"a": {"keys": ["a"]}, "b": {"keys": ["b"]}, "c": {"keys": ["c"]}}}"#,
    ),
    (
        "`each`",
        r#"{"each": ["meals"], "newBodyFields": {"i": {"key": "id", "type": "Int"}},
           "oldBodyFields": {"i": {"keys": ["id"]}}}"#,
    ),
    (
        "`position`",
        r#"{"newBodyFields": {"a": {"key": "a", "type": "Int", "position": 2},
           "b": {"key": "b", "type": "Int", "position": 1}},
           "oldBodyFields": {"a": {"keys": ["a"]}, "b": {"keys": ["b"]}}}"#,
    ),
    (
        "`Json`",
        r#"{"newBodyFields": {"t": {"key": "tags", "type": "Json"}},
           "oldBodyFields": {"t": {"keys": ["tags"]}}}"#,
    ),
    (
        "expressions",
        r#"{"newBodyFields": {"s": {"key": "skus", "type": "Json"}},
           "oldBodyFields": {"s": {"expr": "items[?inStock].sku"}}}"#,
    ),
];

/// The README's rules table: every row's input, mapped by the whole rules of [`TABLE_RULES`] for its
/// feature, gives exactly the row's output, and every row has its rules.
#[tokio::test]
async fn the_rules_table_shows_what_its_rules_give() {
    let start = README.find("\n| feature | input | rules | output |\n").expect("the rules table");
    let rows: Vec<Vec<&str>> = README[start + 1..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| line.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), TABLE_RULES.len(), "the table's rows and the rules held for them");
    let code = |cell: &str| cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')).map(str::to_owned);
    let service = Service::start(config()).await;
    for row in &rows {
        let [feature, input, shown, output] = row[..] else { panic!("a row of four cells: {row:?}") };
        let (_, rules) = TABLE_RULES
            .iter()
            .find(|(start, _)| feature.starts_with(start))
            .unwrap_or_else(|| panic!("no rules held for the row {feature}"));
        // The abridged rules: each code span, cut at `...`, is part of the whole rules' compact text.
        let compact = Json::parse(rules.as_bytes()).to_string();
        let spans: Vec<&str> = shown.split('`').skip(1).step_by(2).collect();
        assert!(!spans.is_empty(), "{feature}: the rules cell shows no code");
        for piece in spans.iter().flat_map(|span| span.split("...")).filter(|p| !p.is_empty()) {
            assert!(compact.contains(piece), "{feature}: `{piece}` is not in the rules {compact}");
        }
        let input = code(input).unwrap_or_else(|| panic!("{feature}: the input is one code span"));
        let output = code(output).unwrap_or_else(|| panic!("{feature}: the output is one code span"));
        let body = format!(r#"{{"originalResponse": {input}, "mappingRules": {rules}}}"#);
        let answer = post_json(&service.url("/v1/preview"), body).await;
        assert_eq!(answer.status, 200, "{feature}: {}", String::from_utf8_lossy(&answer.body));
        assert_eq!(answer.json(), Json::parse(output.as_bytes()), "{feature}");
    }
    service.stop().await;
}

/// The README is the product page: at most 250 lines; detail belongs in `docs/`.
#[test]
fn the_readme_keeps_to_its_budget_of_lines() {
    let lines = README.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines, more than 250: move detail into docs/");
}
