//! Bodies of the fuzz targets under `fuzz/`, kept in the library so `cargo test` can replay the seed
//! corpus with no fuzzer installed. Each function panics only when a property is broken.

use arbitrary::{Arbitrary, Unstructured};

use crate::exec;
use crate::json::{self, write};
use crate::rules::{Limits, compile_json};

/// The limits rules are compiled under in the fuzz targets: small documents and budgets, and
/// steps enough that no mapping these inputs make is stopped by them, so that two ways of mapping
/// can be compared (the `expr_budget` target is the one that tests the bounds).
pub const LIMITS: Limits = Limits {
    max_rules: 64,
    max_depth: 16,
    max_expr_bytes: 1 << 20,
    max_response_bytes: 64 << 20,
    max_mapping_steps: 1 << 40,
    max_source_calls: 64,
};

/// Rules JSON → compile → execute on a JSON document.
///
/// The input decodes to either raw text for both (to reach the parser's and compiler's error
/// paths) or a structured case built from a small vocabulary of names (so that compiled plans find
/// members and the executor's paths are exercised). Checks: nothing panics, the output is valid
/// JSON of the expected kind, a traced run writes the very same bytes, a call that fills the
/// scans' slots as it reads maps as the executor's own scans do (same bytes, same steps), and
/// reading only what the plan reads (`exec::map_text`, what a call runs) maps the document to
/// the very same bytes as the whole parse, or refuses it when the parser does (for the same
/// reason, unless the text is both too deep and broken, which may be refused for either). A
/// document that is an object is also split into one text per member (per element of a member
/// that is a list, as a `forEach` source's answers are held) and read as a composed route reads
/// its answers (`json::ondemand::with_parts`, for the plan's wants): that maps to the very same
/// bytes too.
pub fn rules_then_execute(data: &[u8]) -> Reached {
    let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(data)) else { return Reached::Nothing };
    let (rules, document) = case.texts();
    let Ok(compiled) = compile_json(&rules, &LIMITS) else { return Reached::RulesRefused };
    // Read on demand from a copy: the whole parse below unescapes strings in place.
    let mut on_demand = Vec::new();
    let read = exec::map_text(&compiled.plan, &mut document.clone(), 64, &mut on_demand);
    if let (Some(wants), Ok(called)) = (compiled.plan.wants(), &read) {
        // Where the walk fills the slots and hands each object over (`map_text` then), the scans
        // on the tape the same reads give write the same bytes, at the same cost.
        let mut scanned = Vec::new();
        let by_scans = json::ondemand::with_read(&mut document.clone(), wants, 64, |doc| {
            exec::execute(&compiled.plan, doc, 0, &mut scanned)
        })
        .expect("a text read on demand once is read again");
        assert_eq!(
            String::from_utf8_lossy(&on_demand),
            String::from_utf8_lossy(&scanned),
            "the slots the walk filled map otherwise than the scans"
        );
        if called.limit.is_none() {
            assert_eq!(*called, by_scans, "the slots the walk filled cost otherwise than the scans");
        } else {
            assert_eq!(called.limit, by_scans.limit, "the slots the walk filled stop otherwise");
        }
    }
    let mut text = document.clone();
    let whole = json::with_parsed(&mut text, 64, |nodes| {
        let mut plain = Vec::new();
        exec::execute(&compiled.plan, nodes, 0, &mut plain);
        let output: serde_json::Value = match serde_json::from_slice(&plain) {
            Ok(output) => output,
            Err(e) => panic!("invalid output JSON ({e}): {}", String::from_utf8_lossy(&plain)),
        };
        assert_eq!(output.is_array(), compiled.plan.is_each(), "output kind");
        let mut traced = Vec::new();
        exec::execute_traced(&compiled.plan, nodes, 0, &mut traced);
        assert_eq!(plain, traced, "tracing changed the output");
        if let Some(parts) = split_members(nodes) {
            let indexed: Vec<Vec<json::ondemand::Indexed>> = parts
                .iter()
                .map(|(_, _, texts)| {
                    let index =
                        |text: &Vec<u8>| json::ondemand::Indexed::new(text.clone(), 62).expect("JSON");
                    texts.iter().map(index).collect()
                })
                .collect();
            let names: Vec<&str> = parts.iter().map(|(name, _, _)| name.as_str()).collect();
            let read: Vec<json::ondemand::Part<'_>> = parts
                .iter()
                .zip(&indexed)
                .map(|((_, list, _), texts)| match (list, texts.as_slice()) {
                    (false, [text]) => json::ondemand::Part::One(text),
                    // A list's `null` elements stand for the elements of a `forEach` that has none.
                    _ => json::ondemand::Part::List(
                        texts.iter().map(|text| (text.text() != b"null").then_some(text)).collect(),
                    ),
                })
                .collect();
            let mut composed = Vec::new();
            json::ondemand::with_parts(&names, &read, compiled.plan.wants(), 64, |doc| {
                exec::execute(&compiled.plan, doc, 0, &mut composed)
            })
            .expect("indexed members are read");
            assert_eq!(
                String::from_utf8_lossy(&plain),
                String::from_utf8_lossy(&composed),
                "the members read as parts map otherwise than the whole parse"
            );
        }
        plain
    });
    match (&whole, &read) {
        (Ok(whole), Ok(_)) => assert_eq!(
            String::from_utf8_lossy(whole),
            String::from_utf8_lossy(&on_demand),
            "reading only what is read maps otherwise than the whole parse"
        ),
        (Err(json::JsonError::TooDeep { .. }), Err(json::JsonError::TooDeep { .. }))
        | (Err(json::JsonError::Syntax { .. }), Err(json::JsonError::Syntax { .. })) => {}
        (Err(_), Err(_)) => assert!(
            json::index::agrees_with_parser(&document, document.len() + 1) == Ok(false),
            "refused for different reasons: {whole:?}, {read:?}"
        ),
        _ => panic!("the whole parse says {whole:?}, reading what is read says {read:?}"),
    }
    let mapped = whole.map(|_| compiled.plan.target_count());
    match mapped {
        Ok(0) => Reached::MappedNothing,
        Ok(_) => Reached::Mapped,
        Err(_) => Reached::DocumentRefused,
    }
}

/// A member of a document split into texts: its name, whether it is a list, and its texts.
type SplitMember = (String, bool, Vec<Vec<u8>>);

/// The members of the object at the root of `doc`: each its name, whether it is a list, and its
/// value's text, or a list's elements' texts (as a composed route holds a `forEach` source's
/// answers).
fn split_members(doc: &json::Doc<'_, '_>) -> Option<Vec<SplitMember>> {
    let json::Node::Object { len, .. } = doc.first()? else { return None };
    let size = |i: usize| match doc.get(i) {
        Some(json::Node::Object { count, .. } | json::Node::Array { count, .. }) => 1 + *count,
        _ => 1,
    };
    let text = |i: usize| {
        let mut text = Vec::new();
        json::value(&mut text, doc, i);
        text
    };
    let mut members = Vec::with_capacity(*len);
    let mut i = 1;
    for _ in 0..*len {
        let json::Node::String(name) = doc.get(i)? else { return None };
        let value = i + 1;
        match doc.get(value)? {
            json::Node::Array { len, .. } => {
                let mut elements = Vec::with_capacity(*len);
                let mut e = value + 1;
                for _ in 0..*len {
                    elements.push(text(e));
                    e += size(e);
                }
                members.push(((*name).to_owned(), true, elements));
            }
            _ => members.push(((*name).to_owned(), false, vec![text(value)])),
        }
        i = value + size(value);
    }
    Some(members)
}

/// Rules whose targets read plain paths (`a.b[0].c`), compiled twice: as they are, read through
/// the plan's scans, and with `| @` after each path, which keeps it from being a plain path, so
/// its program runs. Checks: both map every document to the very same bytes, plainly and traced,
/// and so does reading only what the scans read (`exec::map_text`).
pub fn plain_paths(data: &[u8]) -> Reached {
    let Ok(case) = PathCase::arbitrary_take_rest(Unstructured::new(data)) else { return Reached::Nothing };
    let mut document = Vec::new();
    case.document.write(&mut document);
    let (Ok(scanned), Ok(run)) =
        (compile_json(&case.rules(""), &LIMITS), compile_json(&case.rules(" | @"), &LIMITS))
    else {
        // A path of more than `max_depth` steps is refused both ways.
        return Reached::RulesRefused;
    };
    let mut on_demand = Vec::new();
    let read = exec::map_text(&scanned.plan, &mut document.clone(), 64, &mut on_demand);
    let mapped = json::with_parsed(&mut document, 64, |nodes| {
        let mut by_scans = Vec::new();
        exec::execute(&scanned.plan, nodes, 0, &mut by_scans);
        let mut by_program = Vec::new();
        exec::execute(&run.plan, nodes, 0, &mut by_program);
        assert_eq!(
            String::from_utf8_lossy(&by_scans),
            String::from_utf8_lossy(&by_program),
            "a plain path read through scans differs from its program"
        );
        let mut traced = Vec::new();
        exec::execute_traced(&scanned.plan, nodes, 0, &mut traced);
        assert_eq!(by_scans, traced, "tracing changed the output");
        assert!(read.is_ok(), "a document the parser takes is refused when read on demand: {read:?}");
        assert_eq!(
            String::from_utf8_lossy(&by_scans),
            String::from_utf8_lossy(&on_demand),
            "reading only what the scans read differs"
        );
        scanned.plan.target_count()
    });
    match mapped {
        Ok(0) => Reached::MappedNothing,
        Ok(_) => Reached::Mapped,
        Err(_) => Reached::DocumentRefused,
    }
}

#[derive(Arbitrary, Debug)]
struct PathCase {
    ignore_empty: bool,
    each: PathEach,
    /// Per target: its type and its path.
    targets: Vec<(u8, Vec<PathPart>)>,
    document: Value,
}

#[derive(Arbitrary, Debug)]
enum PathEach {
    None,
    /// `"each": [name]`.
    Path(Name),
    /// `"each": "name"`.
    Expr(Name),
    /// `"each": "name[*].{a: a, b: b, meals: meals}"`: elements built by the expression.
    Built(Name),
}

#[derive(Arbitrary, Debug)]
enum PathPart {
    Name(Name),
    Index(i8),
}

/// A name as a JMESPath quoted identifier (JSON string syntax), which any name can be.
fn quoted(name: &Name) -> String {
    let mut out = Vec::new();
    write::string(&mut out, name.as_str());
    String::from_utf8(out).unwrap_or_default()
}

impl PathCase {
    fn rules(&self, tail: &str) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"{\"ignoreEmptyValues\":");
        out.extend_from_slice(if self.ignore_empty { b"true" } else { b"false" });
        match &self.each {
            PathEach::None => {}
            PathEach::Path(name) => {
                out.extend_from_slice(b",\"each\":");
                names(&mut out, std::iter::once(name.as_str()));
            }
            PathEach::Expr(name) => {
                out.extend_from_slice(b",\"each\":");
                write::string(&mut out, &quoted(name));
            }
            PathEach::Built(name) => {
                out.extend_from_slice(b",\"each\":");
                write::string(&mut out, &format!("{}[*].{{a: a, b: b, meals: meals}}", quoted(name)));
            }
        }
        out.extend_from_slice(b",\"newBodyFields\":{");
        for (i, (ty, _)) in self.targets.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write::string(&mut out, &format!("t{i}"));
            out.extend_from_slice(b":{\"key\":");
            write::string(&mut out, &format!("k{i}"));
            out.extend_from_slice(b",\"type\":");
            write::string(&mut out, TYPES[*ty as usize % (TYPES.len() - 2)]);
            out.push(b'}');
        }
        out.extend_from_slice(b"},\"oldBodyFields\":{");
        for (i, (_, path)) in self.targets.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let mut text = String::new();
            for part in path {
                match part {
                    PathPart::Name(name) => {
                        if !text.is_empty() {
                            text.push('.');
                        }
                        text.push_str(&quoted(name));
                    }
                    PathPart::Index(n) => text.push_str(&format!("[{n}]")),
                }
            }
            if text.is_empty() {
                text.push('a');
            }
            text.push_str(tail);
            write::string(&mut out, &format!("t{i}"));
            out.extend_from_slice(b":{\"expr\":");
            write::string(&mut out, &text);
            out.push(b'}');
        }
        out.extend_from_slice(b"}}");
        out
    }
}

/// Raw bytes as a JSON text: the structural index and the walk over it (`json::index`) take or
/// refuse it exactly as the tape parser does, the tokens of a text they take are those a walk
/// byte by byte finds (`json::index::agrees_with_parser`), and the index's kernels (AVX2 where
/// the processor has it, and SSE2) find the same tokens, escapes and errors, at the input's own
/// alignment and at another (`json::index::kernels_agree`).
pub fn json_index(data: &[u8]) -> Reached {
    // The same bytes at another alignment: every kernel still finds what it found.
    let offset = 1 + data.len() % 31;
    let mut moved = vec![b' '; offset + data.len()];
    moved[offset..].copy_from_slice(data);
    if let Err(differ) = json::index::kernels_agree(&moved[offset..]) {
        panic!("at offset {offset}: {differ}");
    }
    match json::index::agrees_with_parser(data, 16) {
        Ok(true) => Reached::Mapped,
        Ok(false) => Reached::DocumentRefused,
        Err(differ) => panic!("{differ}"),
    }
}

/// How far one fuzz input got, so a corpus replay can tell it exercises the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reached {
    /// The bytes did not decode to a case.
    Nothing,
    RulesRefused,
    DocumentRefused,
    /// Rules without targets were run.
    MappedNothing,
    /// Rules with targets were run on a document.
    Mapped,
}

/// Names that structured rules and documents share.
const NAMES: [&str; 8] = ["a", "b", "meals", "idMeal", "x y", "q\"", "ü", ""];
const TYPES: [&str; 10] =
    ["String", "Int", "Long", "Double", "Float", "Boolean", "Json", "Int?", "Integer", ""];

#[derive(Arbitrary, Debug)]
enum Case {
    Raw { rules: Vec<u8>, document: Vec<u8> },
    Built { rules: BuiltRules, document: Value },
}

#[derive(Arbitrary, Debug)]
struct BuiltRules {
    ignore_empty: bool,
    each: Option<Vec<Name>>,
    targets: Vec<Target>,
}

#[derive(Arbitrary, Debug)]
struct Target {
    key: Name,
    ty: u8,
    position: Option<i8>,
    /// One inner list per `keys` entry; several names make a concatenation.
    keys: Vec<Vec<Name>>,
    parents: Vec<Name>,
}

#[derive(Arbitrary, Debug)]
enum Name {
    Known(u8),
    Other(String),
}

/// A JSON document. Decoded by hand (not derived) to bound its nesting: decoding and writing
/// recurse, and the document must stay within the parser's depth limit.
#[derive(Debug)]
enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Text(String),
    Known(u8),
    List(Vec<Value>),
    Object(Vec<(Name, Value)>),
}

impl Case {
    fn texts(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            Case::Raw { rules, document } => (rules.clone(), document.clone()),
            Case::Built { rules, document } => {
                let mut text = Vec::new();
                document.write(&mut text);
                (rules.json(), text)
            }
        }
    }
}

impl Name {
    fn as_str(&self) -> &str {
        match self {
            Name::Known(i) => NAMES[*i as usize % NAMES.len()],
            Name::Other(s) => s,
        }
    }
}

impl BuiltRules {
    fn json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"{\"ignoreEmptyValues\":");
        out.extend_from_slice(if self.ignore_empty { b"true" } else { b"false" });
        if let Some(each) = &self.each {
            out.extend_from_slice(b",\"each\":");
            names(&mut out, each.iter().map(Name::as_str));
        }
        out.extend_from_slice(b",\"newBodyFields\":{");
        for (i, t) in self.targets.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write::string(&mut out, &format!("t{i}"));
            out.extend_from_slice(b":{\"key\":");
            write::string(&mut out, t.key.as_str());
            out.extend_from_slice(b",\"type\":");
            write::string(&mut out, TYPES[t.ty as usize % TYPES.len()]);
            if let Some(position) = t.position {
                out.extend_from_slice(b",\"position\":");
                write::i64(&mut out, i64::from(position));
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"},\"oldBodyFields\":{");
        for (i, t) in self.targets.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write::string(&mut out, &format!("t{i}"));
            out.extend_from_slice(b":{\"keys\":");
            let entries: Vec<String> = t
                .keys
                .iter()
                .map(|entry| entry.iter().map(Name::as_str).collect::<Vec<_>>().join(", "))
                .collect();
            names(&mut out, entries.iter().map(String::as_str));
            out.extend_from_slice(b",\"parents\":");
            names(&mut out, t.parents.iter().map(Name::as_str));
            out.push(b'}');
        }
        out.extend_from_slice(b"}}");
        out
    }
}

fn names<'a>(out: &mut Vec<u8>, names: impl Iterator<Item = &'a str>) {
    out.push(b'[');
    for (i, name) in names.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write::string(out, name);
    }
    out.push(b']');
}

/// Deepest nesting of a built document.
const MAX_NESTING: usize = 12;

impl<'a> Arbitrary<'a> for Value {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Value> {
        Value::nested(u, 0)
    }
}

impl Value {
    fn nested(u: &mut Unstructured<'_>, depth: usize) -> arbitrary::Result<Value> {
        let kinds = if depth < MAX_NESTING { 8 } else { 6 };
        Ok(match u.int_in_range(0..=kinds)? {
            0 => Value::Null,
            1 => Value::Bool(u.arbitrary()?),
            2 => Value::Int(u.arbitrary()?),
            3 => Value::Uint(u.arbitrary()?),
            4 => Value::Float(u.arbitrary()?),
            5 => Value::Text(u.arbitrary()?),
            6 => Value::Known(u.arbitrary()?),
            7 => {
                let mut items = Vec::new();
                while items.len() < 16 && u.arbitrary()? {
                    items.push(Value::nested(u, depth + 1)?);
                }
                Value::List(items)
            }
            _ => {
                let mut members = Vec::new();
                while members.len() < 16 && u.arbitrary()? {
                    members.push((u.arbitrary()?, Value::nested(u, depth + 1)?));
                }
                Value::Object(members)
            }
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Value::Int(n) => write::i64(out, *n),
            Value::Uint(n) => write::u64(out, *n),
            Value::Float(f) => {
                if !write::f64(out, *f) {
                    out.extend_from_slice(b"0.5");
                }
            }
            Value::Text(s) => write::string(out, s),
            Value::Known(i) => {
                let texts = [" 12 ", "4.5", "TRUE", "", "  ", "1e3", "-0", "abc"];
                write::string(out, texts[*i as usize % texts.len()]);
            }
            Value::List(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(out);
                }
                out.push(b']');
            }
            Value::Object(members) => {
                out.push(b'{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write::string(out, name.as_str());
                    out.push(b':');
                    value.write(out);
                }
                out.push(b'}');
            }
        }
    }
}

pub mod bounds;
mod caller_token;
mod compose;
mod expr;
mod headers;
mod http;
mod stages;
mod trace_context;
mod upstream;
mod upstream_h2;

pub use self::bounds::{BoundsReached, mapping_bounds};
pub use self::caller_token::{TokenReached, caller_token};
pub use self::compose::{compose_compile, compose_pages, compose_render};
pub use self::expr::{
    EXPR_BUDGET, ExprOutcome, ExprReached, expr_eval, expref_outside_a_call, original_language_only,
    run as expr_run, run_original as expr_run_original, split as expr_split,
};
pub use self::headers::{HeadersReached, upstream_headers};
pub use self::http::{DELIBERATE_PANIC, Ending, HttpReached, ROUTE_PATH, http_request, http_request_ending};
pub use self::stages::{exec_document, rules_compile, upstream_url};
pub use self::trace_context::{TraceReached, trace_context};
pub use self::upstream::{AnswerReached, upstream_answer};
pub use self::upstream_h2::upstream_answer_h2;
