//! The README's curl examples, run against the service: each ```sh block with a curl command
//! followed by a ```json block must produce exactly that answer.

use recast::config::Config;

use crate::support::{Json, Service, post_json};

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
    let service = Service::start(Config::default()).await;
    for (path, body, expected) in examples {
        let answer = post_json(&service.url(&path), body).await;
        assert_eq!(answer.json(), Json::parse(expected.as_bytes()), "example at {path}");
    }
    service.stop().await;
}
