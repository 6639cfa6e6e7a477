//! The README's examples: each ```sh block that is one curl command followed by a ```json block
//! must produce exactly that answer, and the walk-through must work as pasted.

use crate::support::{Json, Reply, Service, Upstream, config, post_json};

/// `(path, body, expected answer)` of every curl example in the README.
fn examples() -> Vec<(String, String, String)> {
    let readme = include_str!("../../README.md");
    let mut examples = Vec::new();
    let mut rest = readme;
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
        examples.push((path.to_owned(), command[body_start..body_end].to_owned(), expected.to_owned()));
        rest = &after[json_start + json_end..];
    }
    examples
}

#[tokio::test]
async fn curl_examples_answer_what_the_readme_says() {
    let examples = examples();
    assert!(examples.len() >= 2, "found {} examples", examples.len());
    let service = Service::start(config()).await;
    for (path, body, expected) in examples {
        let answer = post_json(&service.url(&path), body).await;
        assert_eq!(answer.json(), Json::parse(expected.as_bytes()), "example at {path}");
    }
    service.stop().await;
}

/// The README's walk-through, run as written with bash and curl, against the service and a local
/// upstream standing in for the public API.
#[tokio::test]
async fn the_walk_through_works_as_pasted() {
    const MEAL: &str = r#"{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken Casserole","strArea":"Japanese","strMeasure1":"3/4 cup","strIngredient1":"soy sauce","strMeasure2":"1/2 cup","strIngredient2":"water","strMeasure3":"","strIngredient3":""}]}"#;
    let upstream = Upstream::start(|received| match received.uri.path() {
        "/api/json/v1/1/random.php" => Reply::json(MEAL),
        _ => Reply::with(404, "{}"),
    })
    .await;
    let service = Service::start(config()).await;
    let readme = include_str!("../../README.md");
    let start =
        readme.find("### Register, call, list, update and delete a route").expect("a walk-through section");
    let block_start = readme[start..].find("```sh\n").expect("its sh block") + start + "```sh\n".len();
    let block_end = readme[block_start..].find("```").expect("closed") + block_start;
    let script = readme[block_start..block_end]
        .replace("http://127.0.0.1:8080", &format!("http://{}", service.addr))
        .replace("https://www.themealdb.com/", &upstream.url("/"));
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash").arg("-c").arg(script).output().expect("bash runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
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
    service.stop().await;
}

/// docs/config.md has a row for every setting of `recast serve`: its variable, its flag and its
/// default as the code has them, and no row for a setting that does not exist.
#[test]
fn the_settings_reference_matches_the_code() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config.md")).unwrap();
    let rows: Vec<Vec<&str>> = doc
        .lines()
        .filter(|l| l.starts_with("| `RECAST_"))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    let command = <recast::config::Config as clap::Args>::augment_args(clap::Command::new("serve"));
    let mut settings = 0;
    for arg in command.get_arguments() {
        let Some(env) = arg.get_env().and_then(|e| e.to_str()) else { continue };
        settings += 1;
        let row = rows
            .iter()
            .find(|r| r.first() == Some(&format!("`{env}`").as_str()))
            .unwrap_or_else(|| panic!("docs/config.md has no row for {env}"));
        let flag = format!("`--{}`", arg.get_long().unwrap());
        assert_eq!(row.get(1), Some(&flag.as_str()), "{env}");
        if let [default] = arg.get_default_values() {
            let default = default.to_str().unwrap();
            let documented = row.get(2).copied().unwrap_or_default();
            let expected = if default.is_empty() { "empty".to_owned() } else { format!("`{default}`") };
            assert_eq!(documented, expected, "the default of {env}");
        }
    }
    assert_eq!(rows.len(), settings, "docs/config.md lists a setting the code does not have");
}
