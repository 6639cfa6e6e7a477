//! docs/rules.md: every example on the page is sent to `POST /v1/preview` as written and must get
//! exactly the answer the page shows, member order included.

use crate::support::{Json, Service, post_json};

const PAGE: &str = include_str!("../../docs/rules.md");

/// How many examples docs/rules.md holds. The test must find at least this many, so an example
/// lost to a deleted or mis-fenced block fails it instead of passing unchecked.
const EXAMPLES: usize = 32;

/// What an example's last block shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The body of the 200 answer of `POST /v1/preview`.
    Output,
    /// The body of the 200 answer of `POST /v1/preview?trace=true`.
    Trace,
    /// The `errors` of the 400 `invalid-rules` answer.
    Errors,
}

/// One example: a rules block, an input block and an expected answer.
#[derive(Debug)]
struct Example<'a> {
    name: &'a str,
    /// The line of the rules block's opening fence, for failure messages.
    line: usize,
    rules: &'a str,
    input: &'a str,
    expect: Expect,
    expected: Json,
}

/// A fenced block whose info string is `json` followed by more words.
struct Block<'a> {
    line: usize,
    /// The words after `json`.
    words: Vec<&'a str>,
    body: &'a str,
}

/// The blocks of `page` that belong to the example format; other blocks are prose.
fn blocks(page: &str) -> Result<Vec<Block<'_>>, String> {
    let mut blocks = Vec::new();
    // The opening fence being read: its line, its info string and where its body starts.
    let mut open: Option<(usize, &str, usize)> = None;
    let mut at = 0;
    for (n, line) in page.split_inclusive('\n').enumerate() {
        let starts = at;
        at += line.len();
        let Some(fence) = line.trim_end().strip_prefix("```") else { continue };
        match open.take() {
            None => open = Some((n + 1, fence.trim(), at)),
            Some((line, info, body)) => {
                let mut words = info.split_whitespace();
                if words.next() == Some("json") {
                    let words: Vec<&str> = words.collect();
                    if !words.is_empty() {
                        blocks.push(Block { line, words, body: &page[body..starts] });
                    }
                }
            }
        }
    }
    match open {
        Some((line, ..)) => Err(format!("line {line}: a fenced block is never closed")),
        None => Ok(blocks),
    }
}

/// Reads every example of `page`, refusing anything that does not follow the format described at
/// the top of docs/rules.md.
fn examples(page: &str) -> Result<Vec<Example<'_>>, String> {
    let mut examples: Vec<Example<'_>> = Vec::new();
    let mut blocks = blocks(page)?.into_iter();
    while let Some(rules) = blocks.next() {
        let name = match rules.words[..] {
            ["rules", name] if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => name,
            _ => {
                return Err(format!(
                    "line {}: `json {}` where an example must start with `json rules NAME`",
                    rules.line,
                    rules.words.join(" ")
                ));
            }
        };
        if examples.iter().any(|e| e.name == name) {
            return Err(format!("line {}: a second example named `{name}`", rules.line));
        }
        let input = match blocks.next() {
            Some(block) if block.words == ["input"] => block,
            _ => return Err(format!("example `{name}`: a `json input` block must follow its rules")),
        };
        let last = blocks.next().ok_or_else(|| format!("example `{name}`: no expected answer"))?;
        let expect = match last.words[..] {
            ["output"] => Expect::Output,
            ["trace"] => Expect::Trace,
            ["errors"] => Expect::Errors,
            _ => {
                return Err(format!(
                    "example `{name}`: `json {}` where `json output`, `json trace` or `json errors` must be",
                    last.words.join(" ")
                ));
            }
        };
        // The rules and the input are sent as they are, but a typo in them should be reported as
        // the page's mistake, not as whatever the service makes of broken JSON.
        let parse = |block: &Block<'_>| {
            serde_json::from_str::<Json>(block.body)
                .map_err(|e| format!("example `{name}`, line {}: not JSON: {e}", block.line))
        };
        parse(&rules)?;
        parse(&input)?;
        examples.push(Example {
            name,
            line: rules.line,
            rules: rules.body,
            input: input.body,
            expect,
            expected: parse(&last)?,
        });
    }
    Ok(examples)
}

#[tokio::test]
async fn every_example_gets_the_answer_the_page_shows() {
    let examples = examples(PAGE).unwrap_or_else(|e| panic!("docs/rules.md: {e}"));
    assert!(
        examples.len() >= EXAMPLES,
        "docs/rules.md holds {} examples; at least {EXAMPLES} were written",
        examples.len()
    );
    let service = Service::start(Default::default()).await;
    // Every example is run before failing, so one run lists every example that is out of date.
    let mut wrong = Vec::new();
    for example in &examples {
        let path = if example.expect == Expect::Trace { "/v1/preview?trace=true" } else { "/v1/preview" };
        let body = format!(r#"{{"originalResponse":{},"mappingRules":{}}}"#, example.input, example.rules);
        let answer = post_json(&service.url(path), body).await;
        let actual = match (example.expect, answer.status.as_u16()) {
            (Expect::Output | Expect::Trace, 200) => Some(answer.json()),
            (Expect::Errors, 400) => {
                let problem = answer.json();
                let slug = problem.get("type").and_then(Json::as_str);
                let rules_problem = slug == Some("https://recast.dev/problems/invalid-rules");
                problem.get("errors").filter(|_| rules_problem).cloned()
            }
            _ => None,
        };
        if actual.as_ref() != Some(&example.expected) {
            wrong.push(format!(
                "example `{}` (docs/rules.md line {}):\n  the page shows: {}\n  recast answers: {} {}",
                example.name,
                example.line,
                example.expected,
                answer.status.as_u16(),
                String::from_utf8_lossy(&answer.body)
            ));
        }
    }
    service.stop().await;
    assert!(wrong.is_empty(), "{} of {} examples differ:\n{}", wrong.len(), examples.len(), wrong.join("\n"));
}

/// The reader refuses a page that breaks the format rather than skipping the broken example.
#[test]
fn a_broken_example_is_refused() {
    let example = |rules: &str, input: &str, last: &str| {
        format!("```json {rules}\n{{}}\n```\n\n```json {input}\n{{}}\n```\n\n```json {last}\n{{}}\n```\n")
    };
    let good = example("rules a", "input", "output");
    assert_eq!(examples(&good).map(|e| e.len()), Ok(1));
    assert_eq!(examples(&format!("```sh\ncurl x\n```\n```json\n{{}}\n```\n{good}")).map(|e| e.len()), Ok(1));

    let broken = [
        example("rules", "input", "output"),
        example("rules a", "inputs", "output"),
        example("rules a", "input", "outptu"),
        example("rules a b", "input", "output"),
        format!("{good}{good}"),
        good.replace("{}\n```\n\n```json input", "{\n```\n\n```json input"),
        good.trim_end().trim_end_matches("```").to_owned(),
        "```json output\n{}\n```\n".to_owned(),
    ];
    for page in broken {
        assert!(examples(&page).is_err(), "accepted:\n{page}");
    }
}
