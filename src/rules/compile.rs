//! Compiles [`Rules`] into a [`Plan`]: checks what needs the whole document (links between
//! `newBodyFields` and `oldBodyFields`, duplicate output keys, types of concatenations, limits),
//! orders targets, and resolves every field name to a slot.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use super::{KeyEntry, Limits, Problem, Rules, Type, parse};
use crate::json::{self, Node, Nodes};
use crate::plan::{Input, KeyTable, Op, Plan, Read, SlotId, Span, Target};

/// A plan and the warnings its rules produced (e.g. unused `oldBodyFields`).
#[derive(Debug, Clone)]
pub struct Compiled {
    pub plan: Plan,
    pub warnings: Vec<Problem>,
}

/// Compiles the rules held by the JSON value at `i`: the rules object itself, or a string whose
/// content is that object (SPEC §1: `rulesAsString`).
pub fn compile_value(nodes: &Nodes<'_>, i: usize, limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    let Some(Node::String(text)) = nodes.get(i) else {
        return compile_object(nodes, i, limits);
    };
    let mut buf = text.as_bytes().to_vec();
    match json::parse(&mut buf, RULES_DEPTH) {
        // A string inside the string is reported by `parse` as "must be a JSON object".
        Ok(inner) => compile_object(&inner, 0, limits),
        Err(e) => Err(vec![Problem::new("", format!("the rules string does not hold JSON: {e}"))]),
    }
}

/// Compiles rules given as JSON text (a rules object, or a JSON string holding one).
pub fn compile_json(text: &[u8], limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    let mut buf = text.to_vec();
    match json::parse(&mut buf, RULES_DEPTH) {
        Ok(nodes) => compile_value(&nodes, 0, limits),
        Err(e) => Err(vec![Problem::new("", format!("the rules are not JSON: {e}"))]),
    }
}

/// Nesting a rules document can need: root, `oldBodyFields`, an entry, its `keys` list. Deeper
/// documents are refused while parsing, before any of their content is looked at.
const RULES_DEPTH: usize = 8;

fn compile_object(nodes: &Nodes<'_>, i: usize, limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    let mut problems = Vec::new();
    let rules = parse(nodes, i, &mut problems);
    finish(&rules, problems, limits)
}

/// Compiles rules that were read already; `problems` are those found while reading them.
pub fn compile(rules: &Rules, limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    finish(rules, Vec::new(), limits)
}

fn finish(rules: &Rules, mut problems: Vec<Problem>, limits: &Limits) -> Result<Compiled, Vec<Problem>> {
    let warnings = check(rules, limits, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Compiled { plan: lower(rules), warnings })
}

/// Whole-document checks. Returns the warnings; problems are appended.
fn check(rules: &Rules, limits: &Limits, problems: &mut Vec<Problem>) -> Vec<Problem> {
    let targets = rules.new_body_fields.len();
    if targets > limits.max_rules {
        problems.push(Problem::new(
            "/newBodyFields",
            format!("{targets} targets exceed the limit of {} (RECAST_MAX_RULES)", limits.max_rules),
        ));
    }
    if let Some(each) = &rules.each
        && each.len() > limits.max_depth
    {
        problems.push(too_deep("/each", each.len(), limits));
    }
    let sources: HashMap<&str, _> = rules.old_body_fields.iter().map(|old| (old.id.as_str(), old)).collect();
    let mut keys: HashMap<&str, &str> = HashMap::new();
    for new in &rules.new_body_fields {
        let at = pointer(&["newBodyFields", &new.id]);
        let Some(old) = sources.get(new.id.as_str()) else {
            problems.push(Problem::new(
                &at,
                format!("target `{}` has no `oldBodyFields` entry with the same id", new.id),
            ));
            continue;
        };
        if let Some(key) = &new.key {
            match keys.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(&new.id);
                }
                Entry::Occupied(first) => problems.push(Problem::new(
                    format!("{at}/key"),
                    format!("output key `{key}` is already used by target `{}`", first.get()),
                )),
            }
        }
        if let Some(ty) = new.ty
            && ty != Type::String
            && let Some(KeyEntry::Concat(names)) =
                old.keys.iter().find(|entry| matches!(entry, KeyEntry::Concat(_)))
        {
            problems.push(Problem::new(
                format!("{at}/type"),
                format!(
                    "`{}` is a concatenation, which makes text: the type must be String, not {}",
                    names.join(", "),
                    ty.name()
                ),
            ));
        }
    }
    let used: HashSet<&str> = rules.new_body_fields.iter().map(|new| new.id.as_str()).collect();
    let mut warnings = Vec::new();
    for old in &rules.old_body_fields {
        if old.parents.len() > limits.max_depth {
            problems.push(too_deep(
                &pointer(&["oldBodyFields", &old.id, "parents"]),
                old.parents.len(),
                limits,
            ));
        }
        if !used.contains(old.id.as_str()) {
            warnings.push(Problem::new(
                pointer(&["oldBodyFields", &old.id]),
                format!("`{}` is not used by any target and is ignored", old.id),
            ));
        }
    }
    warnings
}

/// Builds the plan from rules that passed every check.
fn lower(rules: &Rules) -> Plan {
    // Output order (SPEC §1.7): by position, targets without one last; the sort is stable, so ties
    // keep the client's order.
    let mut order: Vec<usize> = (0..rules.new_body_fields.len()).collect();
    order.sort_by_key(|&i| {
        let position = rules.new_body_fields[i].position;
        (position.is_none(), position)
    });

    let sources: HashMap<&str, _> = rules.old_body_fields.iter().map(|old| (old.id.as_str(), old)).collect();
    let mut walks = Walks::default();
    let mut plan = Plan {
        ignore_empty: rules.ignore_empty_values,
        each: rules.each.as_ref().map(|path| path.iter().map(|p| p.as_str().into()).collect()),
        ops: Vec::new(),
        slot_count: 0,
        targets: Vec::new(),
        reads: Vec::new(),
        parts: Vec::new(),
    };
    let mut emits = Vec::new();
    for i in order {
        let new = &rules.new_body_fields[i];
        let (Some(old), Some(key), Some(ty)) = (sources.get(new.id.as_str()), &new.key, new.ty) else {
            continue; // Unreachable after `check`; a target without source or key is skipped.
        };
        let scan = walks.walk(&old.parents);
        let mut reads: Vec<Read> = old
            .keys
            .iter()
            .map(|entry| match entry {
                KeyEntry::Field(name) => Read::Slot(walks.slot(scan, name)),
                KeyEntry::Concat(names) => {
                    let start = plan.parts.len() as u32;
                    plan.parts.extend(names.iter().map(|name| walks.slot(scan, name)));
                    Read::Concat(Span { start, end: plan.parts.len() as u32 })
                }
            })
            .collect();
        let target = plan.targets.len() as u32;
        let mut key_json = Vec::with_capacity(key.len() + 3);
        json::write::string(&mut key_json, key);
        key_json.push(b':');
        plan.targets.push(Target {
            id: new.id.as_str().into(),
            key: key.as_str().into(),
            key_json: key_json.into(),
            ty,
            parents: old.parents.iter().map(|p| p.as_str().into()).collect(),
            keys: old.keys.clone().into(),
        });
        emits.push(if reads.len() == 1 {
            Op::Field { target, read: reads.remove(0) }
        } else {
            let start = plan.reads.len() as u32;
            plan.reads.append(&mut reads);
            Op::Array { target, reads: Span { start, end: plan.reads.len() as u32 } }
        });
    }
    plan.slot_count = walks.slot_count as usize;
    plan.ops = walks
        .scans
        .into_iter()
        .filter(|scan| !scan.names.is_empty())
        .map(|scan| {
            let names: Vec<(&str, SlotId)> = scan.names.iter().map(|(n, s)| (n.as_str(), *s)).collect();
            Op::Scan { input: scan.input, table: KeyTable::new(&names) }
        })
        .chain(emits)
        .collect();
    plan
}

/// The tree of scans being built: one per distinct `parents` prefix, created parent first.
struct Walks {
    scans: Vec<ScanDraft>,
    slots: HashMap<(usize, String), SlotId>,
    /// For a slot that holds a parent object: the scan that reads it.
    children: HashMap<SlotId, usize>,
    slot_count: SlotId,
}

struct ScanDraft {
    input: Input,
    names: Vec<(String, SlotId)>,
}

impl Default for Walks {
    fn default() -> Self {
        Walks {
            scans: vec![ScanDraft { input: Input::Root, names: Vec::new() }],
            slots: HashMap::new(),
            children: HashMap::new(),
            slot_count: 0,
        }
    }
}

impl Walks {
    /// The scan of the object reached by `parents` from the root.
    fn walk(&mut self, parents: &[String]) -> usize {
        let mut scan = 0;
        for parent in parents {
            let slot = self.slot(scan, parent);
            scan = match self.children.get(&slot) {
                Some(&child) => child,
                None => {
                    self.scans.push(ScanDraft { input: Input::Slot(slot), names: Vec::new() });
                    self.children.insert(slot, self.scans.len() - 1);
                    self.scans.len() - 1
                }
            };
        }
        scan
    }

    /// The slot for member `name` of the object that `scan` reads.
    fn slot(&mut self, scan: usize, name: &str) -> SlotId {
        if let Some(&slot) = self.slots.get(&(scan, name.to_owned())) {
            return slot;
        }
        let slot = self.slot_count;
        self.slot_count += 1;
        self.slots.insert((scan, name.to_owned()), slot);
        self.scans[scan].names.push((name.to_owned(), slot));
        slot
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
