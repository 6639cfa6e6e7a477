//! Compiles [`Rules`] into a [`Plan`]: checks what needs the whole document (links between
//! `newBodyFields` and `oldBodyFields`, duplicate output keys, types of concatenations, limits),
//! orders targets, and resolves every field name to a slot.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use super::{Each, KeyEntry, Limits, MAX_PROBLEMS, Problem, Rules, Type, parse};
use crate::expr::{self, PathStep, Program};
use crate::json::{self, Node, Nodes};
use crate::plan::{self, Input, KeyTable, Member, Op, Plan, Read, SlotId, Span, Target};

/// A plan and the warnings its rules produced (e.g. unused `oldBodyFields`).
#[derive(Debug, Clone)]
pub struct Compiled {
    pub plan: Plan,
    pub warnings: Vec<Problem>,
}

/// Compiles the rules held by the JSON value at `i`: the rules object itself, or a string whose
/// content is that object (SPEC §1: `rulesAsString`).
pub fn compile_value(nodes: &Nodes<'_>, i: usize, limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    let (rules, problems) = match nodes.get(i) {
        Some(Node::String(text)) => read_text(text.as_bytes(), false)?,
        _ => {
            let mut problems = Vec::new();
            (parse(nodes, i, &mut problems), problems)
        }
    };
    finish(&rules, problems, limits)
}

/// Compiles rules given as JSON text (a rules object, or a JSON string holding one).
pub fn compile_json(text: &[u8], limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    let (rules, problems) = read_text(text, true)?;
    finish(&rules, problems, limits)
}

/// Compiles rules that were read already.
pub fn compile(rules: &Rules, limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    finish(rules, Vec::new(), limits)
}

/// Reads rules given as JSON text (as [`compile_json`] takes them) and checks them fully, without
/// building a plan: for tools that work on the rules themselves.
pub fn read_json(text: &[u8], limits: &Limits) -> Result<Rules, Vec<Problem>> {
    let (rules, mut problems) = read_text(text, true)?;
    check(&rules, limits, &mut expr::Patterns::default(), &mut problems);
    if problems.is_empty() { Ok(rules) } else { Err(problems) }
}

/// Nesting a rules document can need: root, `oldBodyFields`, an entry, its `keys` list. Deeper
/// documents are refused while parsing, before any of their content is looked at.
const RULES_DEPTH: usize = 8;

/// Parses rules text and reads the rules in it, unwrapping one JSON string holding them when
/// `unwrap_string` is set. Returns the rules read and the shape problems found.
fn read_text(text: &[u8], unwrap_string: bool) -> Result<(Rules, Vec<Problem>), Vec<Problem>> {
    let mut buf = Vec::with_capacity(text.len() + crate::json::PADDING);
    buf.extend_from_slice(text);
    json::with_parsed(&mut buf, RULES_DEPTH, |nodes| match nodes.first() {
        Some(Node::String(inner)) if unwrap_string => read_text(inner.as_bytes(), false),
        _ => {
            let mut problems = Vec::new();
            let rules = parse(nodes, 0, &mut problems);
            Ok((rules, problems))
        }
    })
    .unwrap_or_else(|e| {
        // Told in words and by place, from the text as written (the parser rewrites its copy).
        let e = json::diagnose(text, RULES_DEPTH).err().unwrap_or(e);
        Err(vec![Problem::new(
            "",
            format!("the rules text is not valid JSON: {}", json::place::described(text, &e)),
        )])
    })
}

fn finish(rules: &Rules, mut problems: Vec<Problem>, limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    // The patterns of the document's expressions, each compiled once for both passes.
    let mut patterns = expr::Patterns::default();
    let warnings = check(rules, limits, &mut patterns, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Compiled { plan: lower(rules, limits, &mut patterns), warnings })
}

/// The variables the rules' expressions may read besides their own: `$caller` (SPEC §2.4), the
/// caller of the call (`null` on an open route), which the executor binds.
const BOUND: &[&str] = &["caller"];

/// Compiles the expression `source` found at `at`; its problems are appended, each located at
/// the member with the character offset in the message.
fn expression(
    source: &str,
    at: &str,
    limits: &Limits,
    patterns: &mut expr::Patterns,
    problems: &mut Vec<Problem>,
) -> Option<Program> {
    match expr::compile_bound(source, limits.max_depth, patterns, BOUND) {
        Ok(program) => Some(program),
        Err(errors) => {
            problems.extend(
                errors.iter().map(|e| {
                    Problem::new(at, format!("at character {}: {}", e.char_offset(source), e.message))
                }),
            );
            None
        }
    }
}

/// The most warnings one expression's lint gives.
const MAX_LINTS: usize = 8;

/// Whole-document checks. Returns the warnings; problems are appended.
fn check(
    rules: &Rules,
    limits: &Limits,
    patterns: &mut expr::Patterns,
    problems: &mut Vec<Problem>,
) -> Vec<Problem> {
    let targets = rules.new_body_fields.len();
    if targets > limits.max_rules {
        problems.push(Problem::new(
            "/newBodyFields",
            format!("{targets} targets exceed the limit of {} (RECAST_MAX_RULES)", limits.max_rules),
        ));
    }
    match &rules.each {
        Some(Each::Path(each)) if each.len() > limits.max_depth => {
            problems.push(too_deep("/each", each.len(), limits));
        }
        Some(Each::Expr(source)) => {
            expression(source, "/each", limits, patterns, problems);
        }
        _ => {}
    }
    let mut warnings = Vec::new();
    let mut lint = |source: &str, at: String| {
        // An expression too long to compile is refused for that; a few warnings of one are
        // enough to tell its mistake, and the document's are bounded as its problems are.
        if source.len() > expr::MAX_EXPR_BYTES || warnings.len() >= MAX_PROBLEMS {
            return;
        }
        // Offsets come in order: characters are counted once, from one to the next.
        let (mut counted, mut characters) = (0, 0);
        for (offset, message) in expr::lint(source, limits.max_depth).into_iter().take(MAX_LINTS) {
            characters += source[counted..offset].chars().count();
            counted = offset;
            warnings.push(Problem::new(at.clone(), format!("at character {characters}: {message}")));
        }
    };
    if let Some(Each::Expr(source)) = &rules.each {
        lint(source, "/each".to_owned());
    }
    for old in &rules.old_body_fields {
        if let Some(source) = &old.expr {
            lint(source, pointer(&["oldBodyFields", &old.id, "expr"]));
        }
    }
    let sources: HashMap<&str, _> = rules.old_body_fields.iter().map(|old| (old.id.as_str(), old)).collect();
    let mut keys: HashMap<&str, &str> = HashMap::new();
    for new in &rules.new_body_fields {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        // Built only for a problem: most documents have none.
        let at = || pointer(&["newBodyFields", &new.id]);
        if let Some(key) = &new.key {
            match keys.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(&new.id);
                }
                Entry::Occupied(first) => problems.push(Problem::new(
                    format!("{}/key", at()),
                    format!("output key `{key}` is already used by target `{}`", first.get()),
                )),
            }
        }
        let Some(old) = sources.get(new.id.as_str()) else {
            problems.push(Problem::new(
                at(),
                format!("target `{}` has no `oldBodyFields` entry with the same id", new.id),
            ));
            continue;
        };
        if let Some(ty) = new.ty
            && ty != Type::String
            && let Some(KeyEntry::Concat(names)) =
                old.keys.iter().find(|entry| matches!(entry, KeyEntry::Concat(_)))
        {
            problems.push(Problem::new(
                format!("{}/type", at()),
                format!(
                    "`{}` is a concatenation, which makes text: the type must be String, not {}",
                    names.join(", "),
                    ty.name()
                ),
            ));
        }
    }
    let used: HashSet<&str> = rules.new_body_fields.iter().map(|new| new.id.as_str()).collect();
    for old in &rules.old_body_fields {
        if problems.len() >= MAX_PROBLEMS {
            break;
        }
        if old.parents.len() > limits.max_depth {
            problems.push(too_deep(
                &pointer(&["oldBodyFields", &old.id, "parents"]),
                old.parents.len(),
                limits,
            ));
        }
        if let Some(source) = &old.expr {
            expression(source, &pointer(&["oldBodyFields", &old.id, "expr"]), limits, patterns, problems);
        }
        if !used.contains(old.id.as_str()) && warnings.len() < MAX_PROBLEMS {
            warnings.push(Problem::new(
                pointer(&["oldBodyFields", &old.id]),
                format!("`{}` is not used by any target and is ignored", old.id),
            ));
        }
    }
    warnings
}

/// Builds the plan from rules that passed every check.
fn lower(rules: &Rules, limits: &Limits, patterns: &mut expr::Patterns) -> Plan {
    // Output order (SPEC §1.7): by position, targets without one last; the sort is stable, so ties
    // keep the client's order.
    let mut order: Vec<usize> = (0..rules.new_body_fields.len()).collect();
    order.sort_by_key(|&i| {
        let position = rules.new_body_fields[i].position;
        (position.is_none(), position)
    });

    let sources: HashMap<&str, _> = rules.old_body_fields.iter().map(|old| (old.id.as_str(), old)).collect();
    let mut walks = Walks::new();
    let mut plan = Plan {
        ignore_empty: rules.ignore_empty_values,
        each: None,
        ops: Vec::new(),
        slot_count: 0,
        scan_count: 0,
        targets: Vec::new(),
        reads: Vec::new(),
        parts: Vec::new(),
        programs: Vec::new(),
        bounds: crate::plan::Bounds {
            built_bytes: limits.max_expr_bytes,
            answer_bytes: limits.max_response_bytes,
            steps: limits.max_mapping_steps,
        },
        object_steps: 0,
        wants: None,
    };
    // Expressions compiled in `check` compile again here; they cannot fail now.
    let mut program = |plan: &mut Plan, source: &str| {
        let program = expr::compile_bound(source, limits.max_depth, patterns, BOUND).ok()?;
        plan.programs.push(program);
        Some((plan.programs.len() - 1) as u32)
    };
    plan.each = match &rules.each {
        Some(Each::Path(path)) => Some(plan::Each::Path(path.iter().map(|p| p.as_str().into()).collect())),
        Some(Each::Expr(source)) => program(&mut plan, source).map(plan::Each::Expr),
        None => None,
    };
    let mut emits = Vec::new();
    for i in order {
        let new = &rules.new_body_fields[i];
        let (Some(old), Some(key), Some(ty)) = (sources.get(new.id.as_str()), &new.key, new.ty) else {
            continue; // Unreachable after `check`; a target without source or key is skipped.
        };
        if let Some(source) = &old.expr {
            let Ok(compiled) = expr::compile_bound(source, limits.max_depth, patterns, BOUND) else {
                continue;
            };
            let target = plan.targets.len() as u32;
            plan.targets.push(Target {
                id: new.id.as_str().into(),
                key: key.as_str().into(),
                ty,
                parents: Box::default(),
                keys: Box::default(),
                expr: Some(source.as_str().into()),
                // Those from the document (a `let` variable's are not where the trace looks).
                reads: compiled
                    .read_paths(crate::plan::TRACED_READS)
                    .into_iter()
                    .filter(|(start, _)| *start == expr::Start::Context)
                    .map(|(_, names)| names.into_iter().map(Box::from).collect())
                    .collect(),
            });
            let member = Member::new(key);
            // A plain path reads its value through the scans, as `keys` do, but by JMESPath's
            // rules: a name reads only an object's member, an index only a list's element.
            let path = compiled.plain_path().filter(|steps| !steps.is_empty());
            emits.push(match (path.map(|steps| walks.path(&steps)), ty) {
                (Some(slot), Type::String) => Op::Text { target, slot, member },
                (Some(slot), _) => Op::Field { target, ty, slot, member },
                (None, _) => {
                    plan.programs.push(compiled);
                    let program = (plan.programs.len() - 1) as u32;
                    Op::Expr { target, ty, program, member }
                }
            });
            continue;
        }
        let scan = walks.walk(&old.parents);
        let mut reads: Vec<Read> = old
            .keys
            .iter()
            .map(|entry| match entry {
                KeyEntry::Field(name) => Read::Slot(walks.slot(scan, Cow::Borrowed(name))),
                KeyEntry::Concat(names) => {
                    let start = plan.parts.len() as u32;
                    plan.parts.extend(names.iter().map(|name| walks.slot(scan, Cow::Borrowed(name))));
                    Read::Concat(Span { start, end: plan.parts.len() as u32 })
                }
            })
            .collect();
        let target = plan.targets.len() as u32;
        plan.targets.push(Target {
            id: new.id.as_str().into(),
            key: key.as_str().into(),
            ty,
            parents: old.parents.iter().map(|p| p.as_str().into()).collect(),
            keys: old.keys.clone().into(),
            expr: None,
            reads: Box::default(),
        });
        let member = Member::new(key);
        emits.push(match (reads.as_slice(), ty) {
            ([Read::Slot(slot)], Type::String) => Op::Text { target, slot: *slot, member },
            ([Read::Slot(slot)], _) => Op::Field { target, ty, slot: *slot, member },
            ([Read::Concat(parts)], _) => Op::Concat { target, parts: *parts, member },
            _ => {
                let start = plan.reads.len() as u32;
                plan.reads.append(&mut reads);
                Op::Array { target, ty, member, reads: Span { start, end: plan.reads.len() as u32 } }
            }
        });
    }
    plan.slot_count = walks.slot_count as usize;
    plan.ops = walks
        .drafts
        .into_iter()
        .filter_map(|draft| match draft {
            Draft::Scan { names, .. } if names.is_empty() => None,
            Draft::Scan { input, strict, names } => {
                let names: Vec<(&str, SlotId)> = names.iter().map(|(n, s)| (n.as_ref(), *s)).collect();
                Some(Op::Scan { input, strict, table: KeyTable::new(&names) })
            }
            Draft::Index { input, index, slot } => Some(Op::Index { input, index, slot }),
        })
        .chain(emits)
        .collect();
    plan.scan_count = plan.ops.iter().filter(|op| matches!(op, Op::Scan { .. })).count();
    plan.wants = crate::plan::wants(&plan);
    plan.object_steps = plan.steps_per_object();
    plan
}

/// The scans being built, with the index steps of expressions' plain paths among them: one scan
/// per object reached by a distinct `parents` prefix or path prefix, each created before the
/// drafts that read the slots it fills. Names of `keys` are borrowed from the rules; those of
/// expressions are copied.
struct Walks<'r> {
    drafts: Vec<Draft<'r>>,
    /// The slot of a member name in the object a scan (a draft's index) reads.
    slots: HashMap<(usize, Cow<'r, str>), SlotId>,
    /// The scan of an input, following lists (`false`) or strict.
    scans: HashMap<(Input, bool), usize>,
    /// The slot an index step fills, by its input and index.
    indexes: HashMap<(Input, i64), SlotId>,
    slot_count: SlotId,
}

enum Draft<'r> {
    Scan { input: Input, strict: bool, names: Vec<(Cow<'r, str>, SlotId)> },
    Index { input: Input, index: i64, slot: SlotId },
}

impl<'r> Walks<'r> {
    fn new() -> Self {
        let mut walks = Walks {
            drafts: Vec::new(),
            slots: HashMap::new(),
            scans: HashMap::new(),
            indexes: HashMap::new(),
            slot_count: 0,
        };
        // The root's scan first, as listings of plans show it.
        walks.scan(Input::Root, false);
        walks
    }

    /// The scan of the object reached by `parents` from the root.
    fn walk(&mut self, parents: &'r [String]) -> usize {
        let mut scan = self.scan(Input::Root, false);
        for parent in parents {
            let slot = self.slot(scan, Cow::Borrowed(parent));
            scan = self.scan(Input::Slot(slot), false);
        }
        scan
    }

    /// The slot that ends an expression's plain path from the root; `steps` is not empty.
    fn path(&mut self, steps: &[PathStep<'_>]) -> SlotId {
        let mut input = Input::Root;
        let mut last = 0;
        for step in steps {
            last = match *step {
                PathStep::Field(name) => {
                    let scan = self.scan(input, true);
                    self.slot(scan, Cow::Owned(name.to_owned()))
                }
                PathStep::Index(index) => self.index(input, index),
            };
            input = Input::Slot(last);
        }
        last
    }

    /// The scan of `input`, made when there is none yet.
    fn scan(&mut self, input: Input, strict: bool) -> usize {
        *self.scans.entry((input, strict)).or_insert_with(|| {
            self.drafts.push(Draft::Scan { input, strict, names: Vec::new() });
            self.drafts.len() - 1
        })
    }

    /// The slot of the element at `index` of the list at `input`.
    fn index(&mut self, input: Input, index: i64) -> SlotId {
        *self.indexes.entry((input, index)).or_insert_with(|| {
            let slot = self.slot_count;
            self.slot_count += 1;
            self.drafts.push(Draft::Index { input, index, slot });
            slot
        })
    }

    /// The slot for member `name` of the object that `scan` reads.
    fn slot(&mut self, scan: usize, name: Cow<'r, str>) -> SlotId {
        match self.slots.entry((scan, name)) {
            Entry::Occupied(found) => *found.get(),
            Entry::Vacant(vacant) => {
                let slot = self.slot_count;
                self.slot_count += 1;
                if let Some(Draft::Scan { names, .. }) = self.drafts.get_mut(scan) {
                    names.push((vacant.key().1.clone(), slot));
                }
                vacant.insert(slot);
                slot
            }
        }
    }
}

fn pointer(parts: &[&str]) -> String {
    let mut out = String::new();
    for part in parts {
        json::push_pointer(&mut out, part);
    }
    out
}

fn too_deep(at: &str, len: usize, limits: &Limits) -> Problem {
    Problem::new(
        at,
        format!("a path of {len} steps exceeds the limit of {} (RECAST_MAX_DEPTH)", limits.max_depth),
    )
}

#[cfg(test)]
mod tests {
    use expect_test::{Expect, expect};

    use super::*;

    fn plan(rules: &str, expected: Expect) {
        let compiled = compile_json(rules.as_bytes(), &Limits::default()).expect("rules compile");
        expected.assert_eq(&compiled.plan.to_string());
    }

    fn problems(rules: &str, limits: Limits, expected: Expect) {
        let problems = compile_json(rules.as_bytes(), &limits).expect_err("rules are refused");
        let text: Vec<String> = problems.iter().map(Problem::to_string).collect();
        expected.assert_eq(&text.join("\n"));
    }

    #[test]
    fn shared_parents_are_scanned_once_and_targets_follow_position() {
        plan(
            r#"{"ignoreEmptyValues":true,
                "newBodyFields":{
                  "name":{"key":"name","type":"String"},
                  "id":{"key":"id","type":"Int","position":0},
                  "ing":{"key":"ingredients","type":"String"},
                  "cat":{"key":"category","type":"String","position":5},
                  "raw":{"key":"raw","type":"Json"}},
                "oldBodyFields":{
                  "id":{"keys":["idMeal"],"parents":["meals"]},
                  "name":{"keys":["strMeal"],"parents":["meals"]},
                  "ing":{"keys":["strMeasure1, strIngredient1","strMeasure2, strIngredient2"],"parents":["meals"]},
                  "cat":{"keys":["name"],"parents":["meals","category"]},
                  "raw":{"keys":["meals"]}}}"#,
            expect![[r#"
                ignore empty values
                scan root: meals→s0
                scan s0: idMeal→s1 category→s2 strMeal→s4 strMeasure1→s5 strIngredient1→s6 strMeasure2→s7 strIngredient2→s8
                scan s2: name→s3
                field id (Int) ← s1
                field category (String) ← s3
                field name (String) ← s4
                array ingredients (String) ← [concat(s5 s6), concat(s7 s8)]
                field raw (Json) ← s0
            "#]],
        );
    }

    #[test]
    fn each_and_root_reads() {
        plan(
            r#"{"each":["data","items"],"newBodyFields":{"a":{"key":"a","type":"Long?"}},"oldBodyFields":{"a":{"keys":["a"]}}}"#,
            expect![[r#"
                each data.items
                scan root: a→s0
                field a (Long) ← s0
            "#]],
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_location() {
        problems(
            r#"{"ignoreEmptyValues":"yes","each":[""],"extra":1,
                "newBodyFields":{
                  "a":{"key":"x","type":"Integer"},
                  "b":{"key":"x","type":"Int","position":1.5},
                  "c":{"type":"String","colour":"red"},
                  "d":{"key":"d","type":"Int"},
                  "e":"not an object"},
                "oldBodyFields":{
                  "a":{"keys":["", "p,,q"],"parents":"meals"},
                  "b":{"keys":"x","type":"Whatever"},
                  "c":{"keys":[1],"parents":[" "]},
                  "d":{"keys":["u, v"]},
                  "d":{"keys":["again"]}}}"#,
            Limits::default(),
            expect![[r#"
                /ignoreEmptyValues: must be true or false, found a string
                /each/0: a field name must not be empty
                /extra: unknown member `extra`; the known members are ignoreEmptyValues, each, newBodyFields, oldBodyFields
                /newBodyFields/a/type: unknown type `Integer`; the known types are String, Int, Long, Double, Float, Boolean, Json (a trailing `?` is allowed)
                /newBodyFields/b/position: must be an integer, found a number
                /newBodyFields/c/colour: unknown member `colour`; the known members are key, type, position
                /newBodyFields/c: missing required member `key`
                /newBodyFields/e: must be an object with `key` and `type`, found a string
                /oldBodyFields/a/keys/0: a field name must not be empty
                /oldBodyFields/a/keys/1: concatenation `p,,q` has an empty field name
                /oldBodyFields/a/parents: must be a list of field names, found a string
                /oldBodyFields/b/keys: must be a list of field names, found a string
                /oldBodyFields/b/type: unknown type `Whatever`; the known types are String, Int, Long, Double, Float, Boolean, Json (a trailing `?` is allowed)
                /oldBodyFields/c/keys/0: must be a string, found a number
                /oldBodyFields/c/parents/0: a field name must not be empty
                /oldBodyFields/d: duplicate member `d`
                /newBodyFields/b/key: output key `x` is already used by target `a`
                /newBodyFields/d/type: `u, v` is a concatenation, which makes text: the type must be String, not Int"#]],
        );
    }

    #[test]
    fn limits_are_problems_too() {
        problems(
            r#"{"each":["a","b","c"],"newBodyFields":{"a":{"key":"a","type":"Int"},"b":{"key":"b","type":"Int"}},
                "oldBodyFields":{"a":{"keys":["a"],"parents":["p","q","r"]},"b":{"keys":["b"]}}}"#,
            Limits { max_rules: 1, max_depth: 2, ..Limits::default() },
            expect![[r#"
                /newBodyFields: 2 targets exceed the limit of 1 (RECAST_MAX_RULES)
                /each: a path of 3 steps exceeds the limit of 2 (RECAST_MAX_DEPTH)
                /oldBodyFields/a/parents: a path of 3 steps exceeds the limit of 2 (RECAST_MAX_DEPTH)"#]],
        );
    }

    #[test]
    fn documents_that_are_not_rules() {
        problems("[]", Limits::default(), expect!["(document): rules must be a JSON object, found a list"]);
        problems(
            "{}",
            Limits::default(),
            expect![[r#"
                (document): missing required member `newBodyFields`
                (document): missing required member `oldBodyFields`"#]],
        );
        problems(
            r#""{\"newBodyFields\": 1""#,
            Limits::default(),
            expect![
                "(document): the rules text is not valid JSON: line 1, column 20 (in `newBodyFields`): the text ends early: expected ',' or '}'"
            ],
        );
        problems(
            r#""\"nested\"""#,
            Limits::default(),
            expect!["(document): rules must be a JSON object, found a string"],
        );
    }

    /// `newBodyFields` members `t0`, `t1`, ...: String targets with their own id as key.
    fn string_targets(count: usize) -> Vec<String> {
        (0..count).map(|i| format!(r#""t{i}":{{"key":"t{i}","type":"String"}}"#)).collect()
    }

    #[test]
    fn duplicate_members_are_found_in_small_and_large_objects() {
        // 20 targets: past the names a small object compares in a list, they are hashed.
        let new = string_targets(20);
        let mut old: Vec<String> = (0..20).map(|i| format!(r#""t{i}":{{"keys":["t{i}"]}}"#)).collect();
        old[5] = r#""t5":{"keys":["t5"],"keys":["again"]}"#.to_owned();
        let rules = format!(
            r#"{{"newBodyFields":{{{},"t3":{{"key":"x","type":"String"}},"t18":{{"key":"y","key":"z","type":"String"}}}},"oldBodyFields":{{{}}},"newBodyFields":{{}}}}"#,
            new.join(","),
            old.join(",")
        );
        problems(
            &rules,
            Limits::default(),
            expect![[r#"
            /newBodyFields/t3: duplicate member `t3`
            /newBodyFields/t18: duplicate member `t18`
            /oldBodyFields/t5/keys: duplicate member `keys`
            /newBodyFields: duplicate member `newBodyFields`"#]],
        );
    }

    #[test]
    fn a_duplicate_is_found_where_the_names_move_from_the_list_to_the_hash_set() {
        // The 16th name is the last one compared in the list; the 17th is the first hashed.
        for (count, twice) in [(15, "t3"), (16, "t0"), (16, "t15")] {
            let members = string_targets(count);
            let rules = format!(
                r#"{{"newBodyFields":{{{},"{twice}":{{}}}},"oldBodyFields":{{}}}}"#,
                members.join(",")
            );
            let problems = compile_json(rules.as_bytes(), &Limits::default()).expect_err("refused");
            let duplicates: Vec<String> = problems
                .iter()
                .filter(|p| p.message.starts_with("duplicate"))
                .map(Problem::to_string)
                .collect();
            assert_eq!(
                duplicates,
                [format!("/newBodyFields/{twice}: duplicate member `{twice}`")],
                "{count}"
            );
        }
    }

    #[test]
    fn locations_escape_slash_and_tilde_in_names() {
        problems(
            r#"{"newBodyFields":{"a/b":{"type":"String"},"c~d":{"key":"k","type":"Text"}},"oldBodyFields":{"a/b":{"keys":[""]}}}"#,
            Limits::default(),
            expect![[r#"
                /newBodyFields/a~1b: missing required member `key`
                /newBodyFields/c~0d/type: unknown type `Text`; the known types are String, Int, Long, Double, Float, Boolean, Json (a trailing `?` is allowed)
                /oldBodyFields/a~1b/keys/0: a field name must not be empty
                /newBodyFields/c~0d: target `c~d` has no `oldBodyFields` entry with the same id"#]],
        );
    }

    #[test]
    fn expressions_compile_into_the_plan() {
        plan(
            r#"{"each":"items[?stock > `0`]",
                "newBodyFields":{"sku":{"key":"sku","type":"String"},"total":{"key":"total","type":"Double"}},
                "oldBodyFields":{"sku":{"keys":["sku"]},"total":{"expr":"to_number(price) * qty"}}}"#,
            expect![[r#"
                each expr items[?stock > `0`]
                scan root: sku→s0
                field sku (String) ← s0
                expr total (Double) ← to_number(price) * qty
            "#]],
        );
    }

    #[test]
    fn plain_paths_are_read_through_strict_scans_shared_like_parents() {
        plan(
            r#"{"newBodyFields":{
                  "a":{"key":"a","type":"String"},"b":{"key":"b","type":"Int"},"c":{"key":"c","type":"Json"},
                  "d":{"key":"d","type":"String"},"e":{"key":"e","type":"String"},"f":{"key":"f","type":"Int"}},
                "oldBodyFields":{
                  "a":{"expr":"meals[0].strMeal"},"b":{"expr":"meals[0].\"id Meal\""},
                  "c":{"expr":"meals[-1]"},"d":{"keys":["strMeal"],"parents":["meals"]},
                  "e":{"expr":"meals[0].strMeal || 'none'"},"f":{"expr":"count"}}}"#,
            expect![[r#"
                scan root: meals→s5
                strict scan root: meals→s0 count→s7
                index s0[0]→s1
                strict scan s1: strMeal→s2 id Meal→s3
                index s0[-1]→s4
                scan s5: strMeal→s6
                field a (String) ← s2 (expr meals[0].strMeal)
                field b (Int) ← s3 (expr meals[0]."id Meal")
                field c (Json) ← s4 (expr meals[-1])
                field d (String) ← s6
                expr e (String) ← meals[0].strMeal || 'none'
                field f (Int) ← s7 (expr count)
            "#]],
        );
    }

    #[test]
    fn expression_problems_are_located_at_their_member_with_the_character() {
        problems(
            r#"{"each":"items[?",
                "newBodyFields":{"a":{"key":"a","type":"Int"},"b":{"key":"b","type":"Int"},"c":{"key":"c","type":"Int"},
                                 "d":{"key":"d","type":"Int"},"e":{"key":"e","type":"Int"}},
                "oldBodyFields":{"a":{"expr":"é.lenth(@, `1`) + nope(@)"},"b":{"expr":"sum(a, b)"},
                                 "c":{"expr":"x","keys":["x"]},"d":{"parents":["p"]},"e":{"expr":"$undefined"}}}"#,
            Limits::default(),
            expect![[r#"
                /oldBodyFields/c: a source reads its value by `keys` (with `parents`) or by `expr`, not both
                /oldBodyFields/d: missing required member `keys`
                /each: at character 7: syntax error: the expression ends before the `[?` at character 5 is closed with `]`
                /oldBodyFields/a/expr: at character 0: syntax error: unexpected character 'é'
                /oldBodyFields/b/expr: at character 0: sum() takes 1 argument, not 2
                /oldBodyFields/e/expr: at character 0: undefined variable $undefined"#]],
        );
        problems(
            r#"{"newBodyFields":{"a":{"key":"a","type":"Int"}},"oldBodyFields":{"a":{"expr":"a.lenth(@) + nope(@, `[`)"}}}"#,
            Limits::default(),
            expect![
                "/oldBodyFields/a/expr: at character 21: syntax error: the literal `[` is not JSON: it ends before its value is complete"
            ],
        );
        problems(
            r#"{"newBodyFields":{"a":{"key":"a","type":"Int"}},"oldBodyFields":{"a":{"expr":"a.lenth(@) + nope(@)"}}}"#,
            Limits::default(),
            expect![[r#"
                /oldBodyFields/a/expr: at character 2: unknown function lenth(); did you mean length()?
                /oldBodyFields/a/expr: at character 13: unknown function nope()"#]],
        );
    }

    #[test]
    fn unused_sources_are_warnings() {
        let compiled = compile_json(
            br#"{"newBodyFields":{},"oldBodyFields":{"spare":{"keys":["x"]}}}"#,
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(compiled.plan.target_count(), 0);
        assert_eq!(
            compiled.warnings,
            [Problem::new("/oldBodyFields/spare", "`spare` is not used by any target and is ignored")]
        );
    }
}
