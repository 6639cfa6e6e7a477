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
        let budget = Budget::new(64 << 20, u64::MAX);
        let arena = Arena::new(&bump, &budget);
        let root = Val::from_tape(nodes, 0);
        let result = evaluate(&program, nodes, root, root, &arena);
        let view = Doc { nodes };
        let same =
            |value, want| view.equal(value, Val::from_const(want), &Budget::new(0, u64::MAX)) == Ok(true);
        match (result, expected) {
            (Ok(value), Expected::Value(want)) if same(value, want) => Ok(()),
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

/// The project's own cases: the Community Edition's features (from its specification, since its
/// suite is not in the repository), recast's own functions, and bugs found anywhere.
/// `(given, expression, expected JSON or "error:<kind>")`.
const OWN: &[(&str, &str, &str)] = &[
    // Arithmetic: exact on integers, floats otherwise; `//` floors, `%` takes the divisor's sign.
    ("{}", "`7` + `5`", "12"),
    ("{}", "`9007199254740993` + `0`", "9007199254740993"),
    ("{}", "`9223372036854775807` + `1`", "9223372036854775808.0"),
    ("{}", "`7` // `2`", "3"),
    ("{}", "`-7` // `2`", "-4"),
    ("{}", "`-7` % `3`", "2"),
    ("{}", "`7.5` % `2`", "1.5"),
    ("{}", "`1` / `0`", "error:invalid-value"),
    ("{}", "'a' + `1`", "error:invalid-type"),
    ("{\"a\":2,\"b\":3}", "a * b - -a", "8"),
    ("{\"a\":2}", "a × `4` ÷ `8` − `1`", "0.0"),
    // The conditional, `let`, and `$` under a projection.
    ("{\"n\":0,\"e\":\"\"}", "e ? 'text' : n ? 'number' : 'none'", "\"number\""),
    ("{\"rate\":2,\"items\":[1,2]}", "let $r = rate in items[*].multiply(@)", "error:unknown-function"),
    ("{\"rate\":2,\"items\":[1,2]}", "let $r = rate in items[*].[@, $r]", "[[1,2],[2,2]]"),
    ("{\"rate\":2,\"items\":[{\"p\":1},{\"p\":3}]}", "items[*].[p, $.rate]", "[[1,2],[3,2]]"),
    ("{}", "let $a = `1` in $b", "error:undefined-variable"),
    // String functions, by code point.
    ("{\"s\":\"  Grüße  \"}", "upper(trim(s))", "\"GRÜSSE\""),
    ("{\"s\":\"a-b-c\"}", "split(s, '-', `1`)", "[\"a\",\"b-c\"]"),
    ("{\"s\":\"7\"}", "pad_left(s, `3`, '0')", "\"007\""),
    ("{\"s\":\"héhé\"}", "find_last(s, 'h')", "2"),
    ("{\"s\":\"héhé\"}", "s[1:3]", "\"éh\""),
    ("{\"s\":\"aXbX\"}", "replace(s, 'X', '-', `1`)", "\"a-bX\""),
    // Where the Community Edition's text decides and its suites are silent (docs/behaviour.md):
    // `to_number` takes JSON's number grammar and nothing else,
    ("{}", "to_number('1.')", "null"),
    ("{}", "to_number('1.e3')", "null"),
    ("{}", "to_number('.5')", "null"),
    ("{}", "to_number('+1')", "null"),
    ("{}", "to_number(' 1')", "null"),
    ("{}", "to_number('01')", "null"),
    ("{}", "to_number('1e400')", "null"),
    ("{}", "to_number('-0.5e-1')", "-0.05"),
    ("{}", "to_number('1E+2')", "100.0"),
    // `replace` finds an empty `old` between every two characters and at both ends (as
    // Python, whose implementation the Community Edition's is), and a count stops it early,
    ("{}", "replace('abc', '', '-')", "\"-a-b-c-\""),
    ("{}", "replace('abc', '', '-', `2`)", "\"-a-bc\""),
    ("{}", "replace('', '', '-')", "\"-\""),
    // and the bounds of `find_first` and `find_last` are a slice's (JEP-14: "the slice
    // `[$start:$end]`"): negative ones count from the end.
    ("{\"s\":\"subject string\"}", "find_first(s, 's', `-6`)", "8"),
    ("{\"s\":\"subject string\"}", "find_first(s, 's', `-99`, `100`)", "0"),
    ("{\"s\":\"subject string\"}", "find_last(s, 's', `0`, `-7`)", "0"),
    ("{\"s\":\"subject string\"}", "find_last(s, 't', `-99`, `-6`)", "6"),
    ("{\"s\":\"héhé\"}", "find_first(s, 'é', `-1`)", "3"),
    // Integers and floats compare exactly (through the float, 2^53 + 1 would equal 2^53.0 and
    // sorting would see no total order),
    ("{}", "`9007199254740993` > `9007199254740992.0`", "true"),
    ("{}", "`9007199254740993` == `9007199254740992.0`", "false"),
    ("{}", "`9007199254740992` == `9007199254740992.0`", "true"),
    ("{}", "`-2` > `-2.5`", "true"),
    ("{}", "`18446744073709551615` < `1e30`", "true"),
    (
        "{}",
        "sort([`9007199254740993`, `9007199254740992.0`, `9007199254740992`, `9007199254740992.5`])",
        "[9007199254740992.0,9007199254740992,9007199254740992.0,9007199254740993]",
    ),
    // text to strip is found in a table for ASCII and in order for the rest,
    ("{\"s\":\"xxéaéxx\"}", "trim(s, 'x')", "\"éaé\""),
    ("{\"s\":\"xxéaéxx\"}", "trim(s, 'éx')", "\"a\""),
    ("{\"s\":\"xxéaéxx\"}", "trim_left(s, 'xé')", "\"aéxx\""),
    // and an `old` longer than the text is not looked for.
    ("{}", "replace('ab', 'abc', '-')", "\"ab\""),
    // Steps and indexes far beyond a list are no error, and no wrapped arithmetic.
    ("{\"a\":[0,1,2,3]}", "a[1::`9223372036854775807`]", "error:syntax"),
    ("{\"a\":[0,1,2,3]}", "a[1::9223372036854775807]", "[1]"),
    ("{\"a\":[0,1,2,3]}", "a[-1::-9223372036854775807]", "[3]"),
    ("{\"a\":[0,1,2,3]}", "a[-9223372036854775807:9223372036854775807:9223372036854775807]", "[0]"),
    ("{\"a\":[0,1,2,3]}", "a[9223372036854775807::-9223372036854775807]", "[3]"),
    ("{\"a\":[0,1,2,3]}", "a[::-9223372036854775808]", "error:syntax"),
    ("{\"s\":\"abcd\"}", "s[1::9223372036854775807]", "\"b\""),
    ("{\"s\":\"abcd\"}", "s[::-9223372036854775807]", "\"d\""),
    ("{\"a\":[0,1,2,3]}", "a[-9223372036854775807]", "null"),
    ("{\"a\":[0,1,2,3]}", "a[9223372036854775807]", "null"),
    // Objects of many members are equal whatever their order, also past the size searched
    // member by member, and `merge`, `from_items` and `group_by` keep the last value of a name.
    (
        "{\"a\":{\"k1\":1,\"k2\":2,\"k3\":3,\"k4\":4,\"k5\":5,\"k6\":6,\"k7\":7,\"k8\":8,\"k9\":9,\"k10\":10},\
          \"b\":{\"k10\":10,\"k9\":9,\"k8\":8,\"k7\":7,\"k6\":6,\"k5\":5,\"k4\":4,\"k3\":3,\"k2\":2,\"k1\":1}}",
        "[a == b, a == merge(b, {k1: `0`}), merge(a, b, {k3: 'x'}).k3, length(keys(merge(a, b)))]",
        "[true,false,\"x\",10]",
    ),
    (
        "{}",
        "from_items([['a','1'],['b','2'],['c','3'],['d','4'],['e','5'],['f','6'],['g','7'],['h','8'],['i','9'],['a','10'],['j','11'],['b','12']])",
        "{\"a\":\"10\",\"b\":\"12\",\"c\":\"3\",\"d\":\"4\",\"e\":\"5\",\"f\":\"6\",\"g\":\"7\",\"h\":\"8\",\"i\":\"9\",\"j\":\"11\"}",
    ),
    // Grouping and pairs: member order is the document's.
    (
        "{\"o\":[{\"k\":\"b\",\"v\":1},{\"k\":\"a\",\"v\":2},{\"k\":\"b\",\"v\":3}]}",
        "group_by(o, &k)",
        "{\"b\":[{\"k\":\"b\",\"v\":1},{\"k\":\"b\",\"v\":3}],\"a\":[{\"k\":\"a\",\"v\":2}]}",
    ),
    ("{\"z\":1,\"a\":2}", "items(@)", "[[\"z\",1],[\"a\",2]]"),
    ("{\"z\":1,\"a\":2}", "keys(@)", "[\"z\",\"a\"]"),
    ("{}", "from_items([['a', `1`], ['b', `2`], ['a', `3`]])", "{\"a\":3,\"b\":2}"),
    ("{}", "zip(`[1,2,3]`, `[\"a\",\"b\"]`)", "[[1,\"a\"],[2,\"b\"]]"),
    // recast's own: rounding as written, dates in zones, linear-time patterns.
    ("{}", "round(`2.345`, `2`)", "2.35"),
    ("{}", "round(`-2.5`, `0`)", "-3.0"),
    ("{}", "round(`1.005`, `2`)", "1.01"),
    ("{}", "round(`0.000001`, `2`)", "0.0"),
    ("{}", "round(`12`, `3`)", "12"),
    ("{}", "round(`1.5`, `16`)", "error:invalid-value"),
    (
        "{\"t\":1700000000}",
        "date_format(t, '%Y-%m-%dT%H:%M:%S%:z', 'Europe/Paris')",
        "\"2023-11-14T23:13:20+01:00\"",
    ),
    (
        "{\"t\":\"2024-07-01T12:00:00Z\"}",
        "date_format(t, '%A %-d %B %Y, %H:%M', 'America/New_York')",
        "\"Monday 1 July 2024, 08:00\"",
    ),
    ("{\"t\":1700000000.5}", "date_format(t, '%H:%M:%S%.3f')", "\"22:13:20.500\""),
    ("{\"t\":\"yesterday\"}", "date_format(t, '%Y')", "error:invalid-value"),
    ("{\"t\":true}", "date_format(t, '%Y')", "error:invalid-type"),
    ("{\"d\":\"14/11/2023 23:13\"}", "date_parse(d, '%d/%m/%Y %H:%M', 'Europe/Paris')", "1699999980"),
    (
        "{\"d\":\"2023-11-14 22:13:20 +0000\"}",
        "date_parse(d, '%Y-%m-%d %H:%M:%S %z', 'Asia/Tokyo')",
        "1700000000",
    ),
    ("{\"d\":\"not a date\"}", "date_parse(d, '%Y-%m-%d')", "error:invalid-value"),
    ("{\"s\":\"order #A-1234 shipped\"}", "regex_extract(s, '#([A-Z])-(\\\\d+)')", "\"A\""),
    ("{\"s\":\"order 1234\"}", "regex_extract(s, '\\\\d+')", "\"1234\""),
    ("{\"s\":\"none\"}", "regex_extract(s, '\\\\d+')", "null"),
    ("{\"s\":\"Tel: 555-0100\"}", "regex_match(s, '^Tel')", "true"),
    (
        "{\"s\":\"2024-07-01\"}",
        "regex_replace(s, '(?<y>\\\\d+)-(\\\\d+)-(\\\\d+)', '$3.$2.${y}')",
        "\"01.07.2024\"",
    ),
];

#[test]
fn own_cases() {
    let mut failures = Vec::new();
    for &(given, expression, expected) in OWN {
        let expected = match expected.strip_prefix("error:") {
            Some(kind) => Expected::Error(kind.to_owned()),
            None => {
                let mut text = expected.as_bytes().to_vec();
                Expected::Value(
                    json::with_parsed(&mut text, DEPTH, |doc| Const::from_tape(doc, 0)).expect("JSON"),
                )
            }
        };
        if let Err(why) = check(given, expression, &expected) {
            failures.push(format!("{expression:?} on {given}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Literal arguments that are not literals, or not ones a function takes, are compile errors
/// (SPEC §1.8), checked once at registration.
#[test]
fn literal_arguments_are_compiled_once() {
    for (expression, message) in [
        ("date_format(`0`, '%Y', 'Mars/Olympus')", "unknown time zone \"Mars/Olympus\""),
        ("date_format(`0`, '%Y', zone)", "takes its zone (argument 3) as a literal string"),
        ("date_format(`0`, '%Q%')", "the format \"%Q%\" is not one"),
        ("regex_match('a', '(')", "the pattern \"(\" does not compile"),
        ("regex_match('a', '(a)\\1')", "does not compile"),
        ("regex_replace('a', p, 'b')", "takes its pattern (argument 2) as a literal string"),
        // Nested past 32 levels: refused before it can take a thread's stack to compile.
        (&format!("regex_match('a', '{}a{}')", "(".repeat(40), ")".repeat(40)), "does not compile"),
        (&format!("regex_match('a', 'a{}')", "*".repeat(300)), "does not compile"),
    ] {
        let errors = compile(expression, DEPTH).expect_err(expression);
        assert!(errors.iter().any(|e| e.message.contains(message)), "{expression}: {errors:?}");
    }
}

/// Expressions as deep as their 4,096 bytes allow are refused by the depth bound, whichever way
/// they nest: compiling, running or dropping them never takes a thread's stack.
#[test]
fn deep_expressions_are_refused_at_the_depth_bound() {
    let deep = [
        format!("{}a", "a.".repeat(2000)),
        format!("{}a", "a | ".repeat(1000)),
        format!("a{}", "[0]".repeat(1300)),
        format!("{}a{}", "(".repeat(2000), ")".repeat(2000)),
        format!("`{}1{}`", "[".repeat(2000), "]".repeat(2000)),
        format!("{}a", "!".repeat(4000)),
    ];
    for text in &deep {
        let errors = compile(text, DEPTH).expect_err("too deep");
        assert!(errors.iter().any(|e| e.message.contains("deeper than 64")), "{errors:?}");
    }
    compile(&format!("{}a", "a.".repeat(40)), DEPTH).expect("40 levels compile");
}

/// The text of each compile error a user meets most, as the user reads it: the cases of the
/// first afternoon with recast, and the common mistakes of the JMESPath community.
#[test]
fn compile_errors_are_told_in_the_users_words() {
    let told = |source: &str| match super::compile(source, 64) {
        Ok(_) => super::lint(source, 64)
            .into_iter()
            .map(|(at, message)| format!("warning at {at}: {message}"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(errors) => {
            errors.iter().map(|e| format!("at {}: {}", e.at, e.message)).collect::<Vec<_>>().join("\n")
        }
    };
    let cases = [
        // An argument list left open: not "unexpected `)`, expecting `,` or `)`".
        (
            "sum(to_number(price)",
            "at 20: syntax error: the expression ends before the `(` at character 3 is closed with `)`",
        ),
        (
            "length(foo",
            "at 10: syntax error: the expression ends before the `(` at character 6 is closed with `)`",
        ),
        // Bare numbers: JMESPath's numbers are JSON literals.
        (
            "items[?price > 10]",
            "at 15: syntax error: a number as a value is a JSON literal, with backticks around it: `` `10` `` (a bare number is only an index, as in `a[0]`)",
        ),
        (
            "items[?price > 1.05]",
            "at 15: syntax error: a number as a value is a JSON literal, with backticks around it: `` `1.05` `` (a bare number is only an index, as in `a[0]`)",
        ),
        (
            "total * -2",
            "at 9: syntax error: a number as a value is a JSON literal, with backticks around it: `` `2` `` (a bare number is only an index, as in `a[0]`)",
        ),
        // A literal without JSON quotes (the legacy form).
        (
            "`foo`",
            "at 0: syntax error: `foo` is not JSON: a literal in backticks is a JSON value, so text is written with quotes, `\"foo\"`, or as the raw string 'foo'",
        ),
        (
            "name == `it's`",
            "at 8: syntax error: `it's` is not JSON: a literal in backticks is a JSON value, so text is written with quotes, `\"it's\"`, or as the raw string 'it\\'s'",
        ),
        (
            "`[1, 2`",
            "at 0: syntax error: the literal `[1, 2` is not JSON: it ends before its value is complete",
        ),
        ("`{\"a\": }`", "at 0: syntax error: the literal is not JSON: not a value at character 7"),
        // `==` with a double-quoted name compiles, and compares with a field: a warning.
        (
            "a[?b == \"x\"]",
            "warning at 8: \"x\" is the field named x, not the text x: text is written 'x' (or `\"x\"`)",
        ),
        ("a[?\"first name\" == 'x']", ""),
        // Quotes that name a field compared with a literal are meant.
        ("a[?\"status\" == 'active']", ""),
        ("a[?'active' != \"status\"]", ""),
        // Brackets left open, closed wrongly, or closing nothing.
        ("a[0", "at 3: syntax error: the expression ends before the `[` at character 1 is closed with `]`"),
        // Characters, not bytes: `é` is two bytes (the outer offset is in bytes here).
        (
            "\"é\"[0",
            "at 6: syntax error: the expression ends before the `[` at character 3 is closed with `]`",
        ),
        (
            "items[?a == 'x'",
            "at 15: syntax error: the expression ends before the `[?` at character 5 is closed with `]`",
        ),
        ("{a: b", "at 5: syntax error: the expression ends before the `{` at character 0 is closed with `}`"),
        ("a[0}", "at 3: syntax error: `}` does not close the `[` at character 1, which needs `]` first"),
        ("a)", "at 1: syntax error: `)` closes nothing: no `(` is open before it"),
        // A trailing dot or pipe.
        ("a.", "at 2: syntax error: the expression ends too early, expecting a name, *, [ or {"),
        ("a | ", "at 4: syntax error: the expression ends too early"),
        // A misspelt function.
        ("lenght(@)", "at 0: unknown function lenght(); did you mean length()?"),
        ("to_numbr(price)", "at 0: unknown function to_numbr(); did you mean to_number()?"),
    ];
    let mut wrong = Vec::new();
    for (source, expected) in cases {
        let got = told(source);
        if got != expected {
            wrong.push(format!("{source}\n  expected: {expected}\n  got:      {got}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every case of the suites run as a route's rules (one `Json` target reading the expression):
/// a call reads only the top-level members its expressions name (`plan::wants`), and maps what
/// the whole parse maps.
#[test]
fn expressions_read_on_demand_map_what_the_whole_parse_maps() {
    let mut dirs = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/jmespath")];
    let community = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/jmespath/community");
    if community.is_dir() {
        dirs.push(community);
    }
    let (mut on_demand, mut differ) = (0, Vec::new());
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| entry.expect("a directory entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for path in files {
            for (given, expression, _) in cases(&path) {
                let rules = format!(
                    r#"{{"newBodyFields":{{"v":{{"key":"v","type":"Json"}}}},"oldBodyFields":{{"v":{{"expr":{}}}}}}}"#,
                    serde_json::to_string(&expression).expect("a string")
                );
                let Ok(compiled) =
                    crate::rules::compile_json(rules.as_bytes(), &crate::rules::Limits::default())
                else {
                    continue;
                };
                if compiled.plan.wants().is_none() {
                    continue;
                }
                on_demand += 1;
                let mut read = Vec::new();
                let read_ok =
                    crate::exec::map_text(&compiled.plan, &mut given.clone().into_bytes(), DEPTH, &mut read);
                let mut whole = Vec::new();
                let mut buffer = given.clone().into_bytes();
                let parsed = json::with_parsed(&mut buffer, DEPTH, |doc| {
                    crate::exec::execute(&compiled.plan, doc, 0, &mut whole)
                });
                // The same value, and the same failures (the steps taken differ: fewer members).
                let failures = |outcome: crate::exec::Outcome| (outcome.expression_errors, outcome.limit);
                if read_ok.map(failures).ok() != parsed.map(failures).ok() || read != whole {
                    differ.push(format!(
                        "{}: {expression:?} on {}: on demand {}, whole {}",
                        path.display(),
                        clip(&given),
                        String::from_utf8_lossy(&read),
                        String::from_utf8_lossy(&whole)
                    ));
                }
            }
        }
    }
    assert!(differ.is_empty(), "{} of {on_demand} differ:\n{}", differ.len(), differ.join("\n"));
    eprintln!("ON_DEMAND {on_demand}");
    assert!(on_demand > 300, "only {on_demand} cases were read on demand");
}

#[test]
fn the_names_an_expression_reads_are_chained_as_far_as_names_go() {
    let reads = |source: &str| {
        let program = compile(source, DEPTH).unwrap();
        let shown = |(start, names): (Start, Vec<&str>)| match start {
            Start::Context => names.join("."),
            Start::Var(_) => format!("$.{}", names.join(".")),
        };
        program.read_paths(4).into_iter().map(shown).collect::<Vec<_>>()
    };
    assert_eq!(reads("a.b.c"), ["a.b.c"]);
    assert_eq!(reads("a.b[0].c"), ["a.b.c"]);
    assert_eq!(reads("sum(orders.items[*].price)"), ["orders.items.price"]);
    assert_eq!(reads("a[].b"), ["a.b"]);
    assert_eq!(reads("a.b[?x == `1`].c"), ["a.b"]);
    assert_eq!(reads("a.*.b"), ["a"]);
    assert_eq!(reads("x || y.z"), ["x", "y.z"]);
    assert_eq!(reads("join(',', [a, b.c])"), ["a", "b.c"]);
    assert_eq!(reads("a | b"), ["a"]);
    assert_eq!(reads("sort_by(items, &price)"), ["items"]);
    assert_eq!(reads("'text'"), Vec::<String>::new());
    assert_eq!(reads("let $x = a in $x.b.c"), ["a", "$.b.c"]);
    assert_eq!(reads("[a, b, c, d, e, f]").len(), 4, "at most as many as asked");
}
