//! Property tests: for arbitrary inputs and arbitrary valid rules the executor never panics, always
//! writes valid JSON, agrees with the independent reference mapper (which reads the same rules
//! text itself) member for member and in order, and traces without changing its output; arbitrary
//! rules text never makes the compiler panic.

use proptest::prelude::*;
use proptest::{collection, option, sample};
use recast::rules::{Limits, compile_json};

use crate::baseline;
use crate::support::Json;

/// Member names shared by the rules and the documents, so that lookups hit as well as miss.
const NAMES: [&str; 9] = ["a", "b", "meals", "idMeal", "str Meal", "x\"y", "ünï", "list", "n/~"];
const TYPES: [&str; 9] = ["String", "Int", "Long", "Double", "Float", "Boolean", "Json", "String?", "Int?"];

fn name() -> impl Strategy<Value = String> {
    prop_oneof![4 => sample::select(&NAMES[..]).prop_map(str::to_owned), 1 => "[a-c]{1,2}"]
}

fn scalar() -> impl Strategy<Value = Json> {
    prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(|n| Json::Number(n.into())),
        any::<u64>().prop_map(|n| Json::Number(n.into())),
        (0i64..=2).prop_map(|n| Json::Number(n.into())),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Json::Number)),
        // Short decimals, such as prices: the floats whose text is what the writer writes.
        (-100_000i64..100_000, 0..6).prop_filter_map("finite", |(n, places)| {
            serde_json::Number::from_f64(n as f64 / 10f64.powi(places)).map(Json::Number)
        }),
        sample::select(
            &[
                "",
                "  ",
                "abc",
                " 12 ",
                "-7",
                "4.5",
                "1e3",
                "TRUE",
                "false",
                "9223372036854775808",
                "\"q\\\n\t",
                "ünïcødé",
                " 1 tsp",
                "inf",
                "0x10",
            ][..]
        )
        .prop_map(|s| Json::String(s.to_owned())),
        "\\PC{0,8}".prop_map(Json::String),
    ]
}

/// A document whose objects hold their members in any order, names repeated at times.
fn document() -> impl Strategy<Value = Json> {
    scalar().prop_recursive(5, 96, 6, |inner| {
        prop_oneof![
            collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
            collection::vec((name(), inner), 0..6).prop_map(Json::Object),
        ]
    })
}

/// `s` as a JSON string.
fn text(s: &str) -> String {
    Json::String(s.to_owned()).to_string()
}

/// A valid rules document as JSON text, with targets in a random order and random positions.
fn rules() -> impl Strategy<Value = String> {
    let entry = prop_oneof![
        3 => name().prop_filter("single names hold no comma", |n| !n.contains(',')),
        1 => collection::vec(name(), 2..4).prop_map(|names| names.join(", ")),
    ];
    let target = (
        sample::select(&TYPES[..]),
        option::of(-2i64..3),
        collection::vec(entry, 1..4),
        collection::vec(name(), 0..3),
        sample::select(&["", "\"", "ü", " ", "/"][..]),
    );
    (any::<bool>(), option::of(collection::vec(name(), 0..3)), collection::vec(target, 0..6)).prop_map(
        |(ignore, each, targets)| {
            let list = |items: &[String]| items.iter().map(|s| text(s)).collect::<Vec<_>>().join(",");
            let mut new = Vec::new();
            let mut old = Vec::new();
            for (i, (ty, position, keys, parents, suffix)) in targets.into_iter().enumerate() {
                let ty = if keys.iter().any(|k| k.contains(',')) { "String" } else { ty };
                let position = position.map(|p| format!(r#","position":{p}"#)).unwrap_or_default();
                let key = text(&format!("k{i}{suffix}"));
                new.push(format!(r#""t{i}":{{"key":{key},"type":"{ty}"{position}}}"#));
                old.push(format!(r#""t{i}":{{"keys":[{}],"parents":[{}]}}"#, list(&keys), list(&parents)));
            }
            let each = each.map(|path| format!(r#","each":[{}]"#, list(&path))).unwrap_or_default();
            format!(
                r#"{{"ignoreEmptyValues":{ignore}{each},"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
                new.join(","),
                old.join(",")
            )
        },
    )
}

/// Runs recast on `input` (JSON text) and returns its output bytes, plain and traced.
fn run(rules: &str, input: &str) -> (Vec<u8>, Vec<u8>) {
    let compiled = compile_json(rules.as_bytes(), &Limits::default()).expect("generated rules compile");
    let mut buf = input.as_bytes().to_vec();
    let mapped = recast::json::with_parsed(&mut buf, 64, |nodes| {
        let mut plain = Vec::new();
        recast::exec::execute(&compiled.plan, nodes, 0, &mut plain);
        let mut traced = Vec::new();
        let trace = recast::exec::execute_traced(&compiled.plan, nodes, 0, &mut traced);
        assert!(trace.entries.len() <= compiled.plan.target_count() * recast::exec::TRACE_ELEMENTS);
        (plain, traced)
    })
    .expect("generated input parses");
    assert_eq!(
        String::from_utf8_lossy(&read_only_what_is_wanted(&compiled.plan, input)),
        String::from_utf8_lossy(&mapped.0),
        "reading only what the plan reads maps as the whole parse does; rules: {rules}"
    );
    mapped
}

/// `input` mapped as a call maps an upstream answer: reading only what the plan reads.
fn read_only_what_is_wanted(plan: &recast::plan::Plan, input: &str) -> Vec<u8> {
    let mut buf = input.as_bytes().to_vec();
    let mut out = Vec::new();
    recast::exec::map_text(plan, &mut buf, 64, &mut out).expect("generated input is read");
    out
}

/// The comparison above sees order and repeated names: on a document whose first `a` is not its
/// last and rules whose positions reverse the declaration order, recast and the reference agree,
/// and an output with the members swapped, or built from the last `a`, does not compare equal.
#[test]
fn the_reference_comparison_tells_member_order_and_repeated_names_apart() {
    let rules = r#"{"newBodyFields":{"x":{"key":"x","type":"Int","position":2},"y":{"key":"y","type":"Json","position":1}},"oldBodyFields":{"x":{"keys":["a"]},"y":{"keys":["b"]}}}"#;
    let input = r#"{"a":1,"b":{"d":1,"c":2,"d":3},"a":2}"#;
    let output = Json::parse(&run(rules, input).0);
    let reference = baseline::Rules::read(rules.as_bytes()).unwrap();
    assert_eq!(output, Json::parse(&baseline::map_bytes(&reference, input.as_bytes())));
    assert_eq!(output.to_string(), r#"{"y":{"d":1,"c":2,"d":3},"x":1}"#);
    for wrong in [
        r#"{"x":1,"y":{"d":1,"c":2,"d":3}}"#,
        r#"{"y":{"d":1,"c":2,"d":3},"x":2}"#,
        r#"{"y":{"c":2,"d":3},"x":1}"#,
    ] {
        assert_ne!(output, Json::parse(wrong.as_bytes()), "{wrong}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn output_is_valid_json_and_agrees_with_the_reference(rules in rules(), input in document()) {
        let input = input.to_string();
        let (plain, traced) = run(&rules, &input);
        let output = Json::read(&plain)
            .map_err(|e| TestCaseError::fail(format!("invalid JSON ({e}): {}", String::from_utf8_lossy(&plain))))?;
        // The very function the engine benchmark times as its baseline, from the rules text.
        let reference = baseline::Rules::read(rules.as_bytes()).map_err(TestCaseError::fail)?;
        let reference = Json::parse(&baseline::map_bytes(&reference, input.as_bytes()));
        // Objects compare member by member, in order.
        prop_assert_eq!(output, reference);
        prop_assert_eq!(plain, traced, "tracing changes nothing in the output");
    }

    #[test]
    fn arbitrary_rules_text_never_panics(text in "\\PC{0,200}") {
        let _ = compile_json(text.as_bytes(), &Limits::default());
    }

    #[test]
    fn arbitrary_json_as_rules_never_panics_and_maps_to_json(rules in document(), input in document()) {
        let text = rules.to_string();
        if let Ok(compiled) = compile_json(text.as_bytes(), &Limits::default()) {
            let mut buf = input.to_string().into_bytes();
            let mut out = Vec::new();
            recast::json::with_parsed(&mut buf, 64, |nodes| recast::exec::execute(&compiled.plan, nodes, 0, &mut out))
                .unwrap();
            prop_assert!(Json::read(&out).is_ok());
        }
    }
}

/// Member names of the list elements below: short ones, names of exactly 16 and 17 bytes that
/// share their first eight bytes (the words that identify a name cover 16), a longer one, and
/// `n`, which holds an object or a list of objects in some elements.
const ELEMENT_NAMES: [&str; 8] =
    ["a", "b", "n", "idMeal", "ünï", "strIngredient_16", "strIngredient_017", "a member name of 24 bytes"];

/// An object as JSON text, written member by member, so names may repeat.
fn object_text<V: std::fmt::Display>(members: impl Iterator<Item = (&'static str, V)>) -> String {
    let members: Vec<String> = members.map(|(name, value)| format!("{}:{value}", text(name))).collect();
    format!("{{{}}}", members.join(","))
}

/// An object as JSON text with members drawn from the first three element names, repeats and
/// any order allowed.
fn small_object() -> impl Strategy<Value = String> {
    collection::vec((sample::select(&ELEMENT_NAMES[..3]), scalar()), 0..4)
        .prop_map(|members| object_text(members.into_iter()))
}

/// An `each` list whose elements are much alike, as JSON text: most elements have the members of the first, in its order, with other values; the rest
/// have members of their own. Names repeat inside an element; values may be objects (with
/// repeated names too) or lists of objects, which a scan below `n` follows to their first element.
fn similar_elements() -> impl Strategy<Value = Vec<String>> {
    let names = collection::vec(sample::select(&ELEMENT_NAMES[..]), 0..8);
    let value = prop_oneof![
        4 => scalar().prop_map(|v| v.to_string()),
        2 => small_object(),
        1 => collection::vec(small_object(), 0..3).prop_map(|list| format!("[{}]", list.join(","))),
    ];
    let element = (option::weighted(0.3, names.clone()), collection::vec(value, 8));
    (names, collection::vec(element, 1..10)).prop_map(|(shared, elements)| {
        elements
            .into_iter()
            .map(|(own, values)| object_text(own.unwrap_or_else(|| shared.clone()).into_iter().zip(values)))
            .collect()
    })
}

/// One target of [`element_rules`]: type, `keys` entry, `parents`.
type ElementTarget = (String, String, Vec<String>);

/// Whether to ignore empty values, and targets over the element names: single names or
/// concatenations of two at the top level, and `Json` targets at the top level or below `n`.
fn element_rules() -> impl Strategy<Value = (bool, Vec<ElementTarget>)> {
    let target = (
        sample::select(&TYPES[..]),
        sample::select(&ELEMENT_NAMES[..]),
        option::weighted(0.3, sample::select(&ELEMENT_NAMES[..])),
    )
        .prop_map(|(ty, key, second)| {
            let (ty, key) = match second {
                Some(second) => ("String", format!("{key}, {second}")),
                None => (ty, key.to_owned()),
            };
            (ty.to_owned(), key, Vec::new())
        });
    let nested = (sample::select(&ELEMENT_NAMES[..3]), any::<bool>()).prop_map(|(key, below)| {
        ("Json".to_owned(), key.to_owned(), if below { vec!["n".to_owned()] } else { Vec::new() })
    });
    (any::<bool>(), collection::vec(prop_oneof![3 => target, 1 => nested], 1..7))
}

/// The rules text of [`element_rules`], mapping the elements of `items` with `each`, or one
/// element at the root without.
fn element_rules_text(ignore: bool, targets: &[ElementTarget], each: bool) -> String {
    let mut new = Vec::new();
    let mut old = Vec::new();
    for (i, (ty, key, parents)) in targets.iter().enumerate() {
        let parents: Vec<String> = parents.iter().map(|p| text(p)).collect();
        new.push(format!(r#""t{i}":{{"key":"k{i}","type":"{ty}"}}"#));
        old.push(format!(r#""t{i}":{{"keys":[{}],"parents":[{}]}}"#, text(key), parents.join(",")));
    }
    let each = if each { r#","each":["items"]"# } else { "" };
    format!(
        r#"{{"ignoreEmptyValues":{ignore}{each},"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
        new.join(","),
        old.join(",")
    )
}

/// recast's output for `input` under `rules`, as [`run`] writes it untraced.
fn map_text(rules: &str, input: &str) -> String {
    String::from_utf8(run(rules, input).0).expect("UTF-8")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The executor remembers the members of one `each` element to read the next one faster;
    /// whatever the elements, the list must map exactly as each element mapped on its own.
    #[test]
    fn each_element_maps_as_it_does_alone(
        elements in similar_elements(),
        (ignore, targets) in element_rules(),
    ) {
        let listed = map_text(&element_rules_text(ignore, &targets, true), &format!(r#"{{"items":[{}]}}"#, elements.join(",")));
        let alone_rules = element_rules_text(ignore, &targets, false);
        let alone: Vec<String> = elements
            .iter()
            .map(|element| map_text(&alone_rules, element))
            .filter(|mapped| !(ignore && mapped == "{}"))
            .collect();
        prop_assert_eq!(listed, format!("[{}]", alone.join(",")), "elements: {:?}", elements);
    }
}

/// A plain path of names (quoted when they are not identifiers) and indexes, as JMESPath text.
fn plain_path() -> impl Strategy<Value = String> {
    let step = prop_oneof![
        3 => name().prop_map(|n| {
            let plain = n.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if plain { n } else { text(&n) }
        }),
        1 => (-3i64..4).prop_map(|i| format!("[{i}]")),
    ];
    collection::vec(step, 1..5).prop_map(|steps| {
        let mut path = String::new();
        for step in steps {
            if !path.is_empty() && !step.starts_with('[') {
                path.push('.');
            }
            path.push_str(&step);
        }
        path
    })
}

/// Rules whose targets read plain paths, written as `path` followed by `tail` (`""`, or a pipe
/// into `@` that keeps the path from being read through the scans), with an optional `each`.
fn path_rules(ignore: bool, each: &str, targets: &[(String, &str)], tail: &str) -> String {
    let new: Vec<String> = targets
        .iter()
        .enumerate()
        .map(|(i, (_, ty))| format!(r#""t{i}":{{"key":"k{i}","type":"{ty}"}}"#))
        .collect();
    let old: Vec<String> = targets
        .iter()
        .enumerate()
        .map(|(i, (path, _))| format!(r#""t{i}":{{"expr":{}}}"#, text(&format!("{path}{tail}"))))
        .collect();
    format!(
        r#"{{"ignoreEmptyValues":{ignore}{each},"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#,
        new.join(","),
        old.join(",")
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A plain path is read through the plan's scans instead of running its program; it must
    /// read what the program reads, under `each` of every kind too, and trace alike.
    #[test]
    fn plain_paths_read_what_their_programs_read(
        ignore in any::<bool>(),
        each in sample::select(&["", r#","each":["list"]"#, r#","each":"list""#, r#","each":"list[*].{a: a, b: b, list: list}""#][..]),
        targets in collection::vec((plain_path(), sample::select(&TYPES[..])), 1..6),
        input in document(),
    ) {
        let input = input.to_string();
        let scanned = path_rules(ignore, each, &targets, "");
        let run_by_program = path_rules(ignore, each, &targets, " | @");
        let (plain, traced) = run(&scanned, &input);
        let (expected, _) = run(&run_by_program, &input);
        prop_assert_eq!(
            String::from_utf8_lossy(&plain),
            String::from_utf8_lossy(&expected),
            "rules: {}",
            scanned
        );
        prop_assert_eq!(plain, traced, "tracing changes nothing in the output");
    }
}

/// `json` as JSON text spelled in other ways the parser reads as the same value, chosen by the
/// bits of `seed`: spaces around tokens, characters of strings written as `\u` escapes
/// (surrogate pairs beyond the first plane) or short escapes, and integers written as `-0` or
/// with an exponent (which makes them doubles, on both paths alike).
fn respelled(json: &Json, seed: &mut u64, out: &mut String) {
    let mut bit = || {
        *seed = seed.rotate_left(5) ^ 0x9e37_79b9_7f4a_7c15;
        *seed & 7 == 0
    };
    if bit() {
        out.push_str(" \n\t");
    }
    match json {
        Json::Null | Json::Bool(_) => out.push_str(&json.to_string()),
        Json::Number(n) => match (n.as_i64(), bit()) {
            (Some(0), true) => out.push_str("-0"),
            (Some(i), true) => out.push_str(&format!("{i}e0")),
            // A float spelled with a trailing zero: not the text the writer writes for it.
            (None, true) if n.is_f64() && !n.to_string().contains('e') => out.push_str(&format!("{n}0")),
            _ => out.push_str(&n.to_string()),
        },
        Json::String(s) => respelled_string(s, &mut bit, out),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                respelled(item, seed, out);
            }
            out.push(']');
        }
        Json::Object(members) => {
            out.push('{');
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                respelled_string(
                    name,
                    &mut || {
                        *seed = seed.rotate_left(3) ^ 0x2545_f491_4f6c_dd1d;
                        *seed & 3 == 0
                    },
                    out,
                );
                out.push_str(" : ");
                respelled(value, seed, out);
            }
            out.push_str(" }");
        }
    }
}

fn respelled_string(s: &str, bit: &mut impl FnMut() -> bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if bit() => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || bit() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A call reads only what its plan reads (`exec::map_text`); whatever the rules and however
    /// the text is spelled, the output is the whole parse's, and a text one edit away from a
    /// document is refused by the one exactly when the other refuses it.
    #[test]
    fn reading_only_what_is_read_maps_and_refuses_as_the_whole_parse(
        rules in rules(),
        input in document(),
        mut seed in any::<u64>(),
        edit in (any::<prop::sample::Index>(), sample::select(&[None, Some(b'"'), Some(b'\\'), Some(b','), Some(b'}'), Some(b']'), Some(b'1'), Some(b'-'), Some(b'e'), Some(b' ')][..])),
    ) {
        let mut text = String::new();
        respelled(&input, &mut seed, &mut text);
        prop_assert!(Json::read(text.as_bytes()).is_ok(), "{}", text);
        run(&rules, &text);
        let compiled = compile_json(rules.as_bytes(), &Limits::default()).expect("generated rules compile");
        // One byte deleted or replaced.
        let mut edited = text.into_bytes();
        let at = edit.0.index(edited.len());
        match edit.1 {
            None => { edited.remove(at); }
            Some(byte) => edited[at] = byte,
        }
        let mut buf = edited.clone();
        let whole = recast::json::with_parsed(&mut buf, 64, |nodes| {
            let mut out = Vec::new();
            recast::exec::execute(&compiled.plan, nodes, 0, &mut out);
            out
        });
        let mut buf = edited.clone();
        let mut out = Vec::new();
        let read = recast::exec::map_text(&compiled.plan, &mut buf, 64, &mut out).map(|_| out);
        prop_assert_eq!(
            whole.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()).map_err(|_| ()),
            read.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()).map_err(|_| ()),
            "{}: {:?} {:?}", String::from_utf8_lossy(&edited), whole, read
        );
    }
}
