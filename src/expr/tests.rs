//! The language's semantics, pinned by the published JMESPath compliance suites: the original
//! specification's (a copy in `tests/data/jmespath/`, MIT, see its LICENSE) and the Community
//! Edition's (read from `../shared/jmespath/community` when it is there). A bug found anywhere
//! becomes one more case in [`own_cases`].

use std::path::{Path, PathBuf};

use bumpalo::Bump;

use super::*;
use crate::json::{self, Nodes};

const DEPTH: usize = 64;

/// What one case expects.
enum Expected {
    Value(Const),
    Error(String),
}

/// Runs `expression` over the document `given` (JSON text) and checks it against `expected`;
/// `Err` says how it failed.
fn check(given: &str, expression: &str, expected: &Expected) -> Result<(), String> {
    let compiled = compile(expression, DEPTH);
    let program = match (compiled, expected) {
        (Ok(program), _) => program,
        (Err(errors), Expected::Error(kind)) if errors.iter().any(|e| e.kind.name() == kind) => {
            return if is_compile_error(kind) {
                Ok(())
            } else {
                Err(format!("{kind} expected while running, not at compile time: {errors:?}"))
            };
        }
        (Err(errors), _) => return Err(format!("does not compile: {errors:?}")),
    };
    let mut buffer = given.as_bytes().to_vec();
    json::with_parsed(&mut buffer, DEPTH, |doc| {
        let nodes: &Nodes<'_> = doc;
        let bump = Bump::new();
        let arena = Arena::new(&bump, 64 << 20);
        let root = Val::from_tape(nodes, 0);
        let result = evaluate(&program, nodes, root, root, &arena);
        let view = Doc { nodes };
        match (result, expected) {
            (Ok(value), Expected::Value(want)) if view.equal(value, Val::from_const(want)) => Ok(()),
            (Ok(value), Expected::Value(want)) => {
                Err(format!("gave {}, expected {}", view.to_json(value), view.to_json(Val::from_const(want))))
            }
            (Ok(value), Expected::Error(kind)) => {
                Err(format!("gave {}, expected the error {kind}", view.to_json(value)))
            }
            (Err(e), Expected::Error(kind)) if e.kind.name() == kind && !is_compile_error(kind) => Ok(()),
            (Err(e), _) => Err(format!("failed: {} ({})", e.message, e.kind.name())),
        }
    })
    .map_err(|e| format!("given is not JSON: {e}"))?
}

/// The suites' error kinds that SPEC §1.8 makes compile errors; the others are found running.
fn is_compile_error(kind: &str) -> bool {
    matches!(kind, "syntax" | "unknown-function" | "invalid-arity" | "undefined-variable")
}

/// Cases of the original suite that the Community Edition's suite answers otherwise; SPEC §1.8
/// says the Community Edition's answer is the one.
const SUPERSEDED: &[(&str, &str)] = &[("literal.json", r"'\\'")];

/// One file's cases: `(given as JSON text, expression, expected)`.
fn cases(path: &Path) -> Vec<(String, String, Expected)> {
    let mut text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let suite =
        json::with_parsed(&mut text, 128, |doc| Const::from_tape(doc, 0)).expect("a suite file is JSON");
    let Const::List(groups) = suite else { panic!("{}: a suite is a list of groups", path.display()) };
    let field = |c: &Const, name: &str| match c {
        Const::Object(members) => members.iter().find(|(k, _)| &**k == name).map(|(_, v)| v.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    for group in groups.iter() {
        let given = to_json(&field(group, "given").expect("a group has given"));
        let Some(Const::List(items)) = field(group, "cases") else { continue };
        for case in items.iter() {
            let Some(Const::String(expression)) = field(case, "expression") else { continue };
            let expected = match (field(case, "result"), field(case, "error")) {
                (_, Some(Const::String(kind))) => Expected::Error(kind.into()),
                (Some(value), _) => Expected::Value(value),
                // Benchmark items without a result are not cases.
                _ => continue,
            };
            out.push((given.clone(), expression.into(), expected));
        }
    }
    out
}

fn to_json(value: &Const) -> String {
    Doc { nodes: &[] }.to_json(Val::from_const(value))
}

/// Runs every case of every `.json` file under `dir`; returns `(file, cases, failures)` rows and
/// the failures' descriptions.
fn run_suite(dir: &Path, skip: &[&str]) -> (Vec<Row>, Vec<String>) {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for path in files {
        let name = path.strip_prefix(dir).unwrap_or(&path).display().to_string();
        if skip.contains(&name.as_str()) {
            continue;
        }
        let cases = cases(&path);
        let (mut failed, mut superseded) = (0, 0);
        for (given, expression, expected) in &cases {
            if dir.ends_with("jmespath") && SUPERSEDED.contains(&(name.as_str(), expression.as_str())) {
                superseded += 1;
                continue;
            }
            if let Err(why) = check(given, expression, expected) {
                failed += 1;
                failures.push(format!("{name}: {expression:?} on {}: {why}", clip(given)));
            }
        }
        rows.push(Row { file: name, cases: cases.len(), failed, superseded });
    }
    (rows, failures)
}

fn clip(text: &str) -> String {
    if text.len() > 120 { format!("{}…", &text[..text.floor_char_boundary(120)]) } else { text.to_owned() }
}

/// One file's count of cases.
struct Row {
    file: String,
    cases: usize,
    failed: usize,
    /// Left out: see [`SUPERSEDED`].
    superseded: usize,
}

fn report(suite: &str, rows: &[Row], failures: &[String]) {
    eprintln!("{suite}:");
    for row in rows {
        let passed = row.cases - row.failed - row.superseded;
        let superseded = match row.superseded {
            0 => String::new(),
            n => format!(", {n} superseded by the Community Edition's case"),
        };
        eprintln!("  {:32} {:>4} cases, {:>4} passed{superseded}", row.file, row.cases, passed);
    }
    let total: usize = rows.iter().map(|r| r.cases).sum();
    eprintln!("  {total} cases, {} failed", failures.len());
    for failure in failures.iter().take(400) {
        eprintln!("  FAIL {failure}");
    }
}

#[test]
fn the_original_suite_passes_whole() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/jmespath");
    let (rows, failures) = run_suite(&dir, &[]);
    report("the original JMESPath suite", &rows, &failures);
    assert_eq!(rows.len(), 15, "the copied suite's files");
    assert!(failures.is_empty(), "{} cases failed", failures.len());
}

#[test]
fn the_community_suite_passes_whole_when_it_is_beside_the_clone() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/jmespath/community");
    if !dir.is_dir() {
        eprintln!(
            "NOT RUN: the Community Edition's suite is not at {} (it is not in the repository)",
            dir.display()
        );
        return;
    }
    // An optional legacy mode recast does not have (SPEC §1.8).
    let (rows, failures) = run_suite(&dir, &["legacy/legacy-literal.json"]);
    report("the JMESPath Community Edition suite", &rows, &failures);
    assert!(failures.is_empty(), "{} cases failed", failures.len());
}
