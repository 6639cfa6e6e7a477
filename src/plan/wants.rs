//! What a plan reads of a document ([`Wants`]), derived from its ops the way the executor runs
//! them, so that a call can read only that ([`crate::json::ondemand`]).
//!
//! Each slot's value is either read whole (a target copies, coerces or tests it) or only walked
//! through (later scans read some of its members, index steps some of its elements). A scan that
//! is not strict follows a list to its first element, again for a list inside a list: every
//! element of a list there gets the scan's want (more than the first, which keeps this simple and
//! is still exact). An expression that runs as a program reads whole the places it consumes
//! whole and walks the members and elements on their way ([`Program::document_reads`]: `a[*].b`
//! reads `b` of each element of `a`); one that reads the document itself whole (`@`, `$` at its
//! top, `length(@)`), or any under `each`, makes its plan read the whole document (`None`).
//!
//! When each want is one scan's object and nothing else reads the document (every scan follows
//! lists, no index step, no program), each member carries the slot its scan fills
//! ([`Want::slot`]) and the `each` value is marked ([`Want::each`]): the walk then fills the
//! slots as it matches the names, and the executor runs no scan ([`Wants::fills_slots`]).

use std::collections::BTreeMap;

use super::{Each, Input, KeyTable, Op, Plan, Read, SlotId};
use crate::expr::{PathStep, Program, Seg};
use crate::json::ondemand::{Fills, NO_SLOT, Want, Wants};

/// Wants built above this many nodes make the rest whole: a bound for any rules (it is never
/// reached by rules within the limits, whose wants are at most a few per target).
const MOST_WANTS: usize = 4096;

/// A plan with more slots than this reads the whole document: building its wants would cost more
/// than reading it all saves (no rules within the limits come near it).
const MOST_SLOTS: usize = 2 * MOST_WANTS;

/// What `plan` reads of a document, or `None` when it may read anything.
pub(crate) fn wants(plan: &Plan) -> Option<Wants> {
    if plan.slot_count > MOST_SLOTS {
        return None;
    }
    let programs: Vec<&Program> = plan
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Expr { program, .. } => plan.programs.get(*program as usize),
            _ => None,
        })
        .collect();
    // Under `each` an expression runs on each element and on `$`: not read on demand.
    if matches!(plan.each, Some(Each::Expr(_))) || (!programs.is_empty() && plan.each.is_some()) {
        return None;
    }
    // The places the expressions read whole; one that reads the document whole reads it all.
    // (The places of all of them are bounded together: many targets each just within the bound
    // of one would hold far more.)
    let (mut read, mut held) = (Vec::new(), 0);
    let no_program = programs.is_empty();
    for program in programs {
        let reads = program.document_reads(&mut held)?;
        if reads.whole.iter().any(Vec::is_empty) {
            return None;
        }
        read.extend(reads.whole.into_iter().map(|place| (place, true)));
        read.extend(reads.walked.into_iter().map(|place| (place, false)));
    }
    let mut slots = vec![Tree::default(); plan.slot_count];
    let mut whole = |slot: SlotId| {
        if let Some(tree) = slots.get_mut(slot as usize) {
            tree.whole = true;
        }
    };
    for op in &plan.ops {
        match op {
            Op::Text { slot, .. } | Op::Field { slot, .. } => whole(*slot),
            Op::Concat { parts, .. } => plan.parts[parts.range()].iter().for_each(|s| whole(*s)),
            Op::Array { reads, .. } => {
                for read in &plan.reads[reads.range()] {
                    match read {
                        Read::Slot(slot) => whole(*slot),
                        Read::Concat(parts) => plan.parts[parts.range()].iter().for_each(|s| whole(*s)),
                    }
                }
            }
            Op::Scan { .. } | Op::Index { .. } | Op::Expr { .. } => {}
        }
    }
    // A scan or index step comes after the scan that fills its input: walked backwards, each
    // slot's tree is complete before the op that fills it hands it up.
    let mut root = Tree::default();
    for op in plan.ops.iter().rev() {
        let (input, tree) = match op {
            Op::Scan { input, strict, table } => {
                // Each slot is filled by one op: its tree moves up to it, never copied (a copy at
                // every level of a deep `parents` would cost the tree times the depth).
                let members = table
                    .names()
                    .into_iter()
                    .map(|(name, slot)| {
                        (name.into(), Tree { slot: Some(slot), ..std::mem::take(&mut slots[slot as usize]) })
                    })
                    .collect();
                (input, Tree { lists: !strict, members, ..Tree::default() })
            }
            Op::Index { input, slot, .. } => (
                input,
                Tree {
                    elements: Some(Box::new(std::mem::take(&mut slots[*slot as usize]))),
                    ..Tree::default()
                },
            ),
            _ => continue,
        };
        match input {
            Input::Root => root.merge(tree),
            Input::Slot(slot) => slots[*slot as usize].merge(tree),
        }
    }
    for (place, whole) in read {
        let mut at = Tree { whole, ..Tree::default() };
        for seg in place.iter().rev() {
            at = match seg {
                Seg::Member(name) => {
                    Tree { members: BTreeMap::from([((*name).into(), at)]), ..Tree::default() }
                }
                Seg::Element => Tree { elements: Some(Box::new(at)), ..Tree::default() },
            };
        }
        root.merge(at);
    }
    let plan_slots = plan.slot_count as u32;
    let mut path_slots = 0;
    if let Some(Each::Path(path)) = &plan.each {
        // The value at the end of the path is the list whose elements are mapped, or an object
        // mapped alone; each name on the way is looked up after following lists (`each_list`).
        // The names on the way fill slots of their own after the plan's: only the first member
        // of each name is followed, as the executor follows it.
        let mut at = root.clone();
        at.merge(Tree { elements: Some(Box::new(root)), each: true, ..Tree::default() });
        for (i, name) in path.iter().enumerate().rev() {
            at.slot = Some(plan_slots + i as u32);
            at = Tree { lists: true, members: BTreeMap::from([(name.clone(), at)]), ..Tree::default() };
        }
        root = at;
        path_slots = path.len() as u32;
    }
    // The walk fills the scans' slots when every scan follows lists, nothing else reads the
    // document (no program, no index step), and each want is one scan's object, kept apart.
    let mut exact = no_program
        && plan.ops.iter().all(|op| match op {
            Op::Scan { strict, .. } => !strict,
            Op::Index { .. } => false,
            _ => true,
        });
    let mut flat = Vec::new();
    root.flatten(&mut flat, &mut exact);
    if !exact {
        return Some(Wants::new(flat));
    }
    let fills = Fills { plan_slots, slots: plan_slots + path_slots, root_row: plan.each.is_none() };
    Some(Wants::filling(flat, fills))
}

/// What expressions over a document read of it (a composed route's context, SPEC §2.3): an
/// expression that is a plain path of names and indexes reads the value at its end whole, and
/// only the members and elements on its way; any other reads whole each top-level member it
/// names ([`Program::context_names`]), or the whole document when it reads that.
pub(crate) fn wants_of<'p>(programs: impl IntoIterator<Item = &'p Program>) -> Wants {
    wants_with(programs, Program::context_names)
}

/// [`wants_of`] for expressions over a value that may be a list (a page of an upstream's
/// answers, SPEC §2.3 "Pages"): one that indexes or slices it (`[-1].id || ''`) reads it whole
/// ([`Program::value_names`]).
pub(crate) fn wants_of_value<'p>(programs: impl IntoIterator<Item = &'p Program>) -> Wants {
    wants_with(programs, Program::value_names)
}

fn wants_with<'p>(
    programs: impl IntoIterator<Item = &'p Program>,
    names_of: impl Fn(&'p Program) -> Result<Vec<&'p str>, &'static str>,
) -> Wants {
    let mut root = Tree::default();
    let whole = || Tree { whole: true, ..Tree::default() };
    for program in programs {
        match (program.plain_path(), names_of(program)) {
            (Some(path), _) => {
                let mut at = whole();
                for step in path.iter().rev() {
                    at = match step {
                        PathStep::Field(name) => {
                            Tree { members: BTreeMap::from([((*name).into(), at)]), ..Tree::default() }
                        }
                        PathStep::Index(_) => Tree { elements: Some(Box::new(at)), ..Tree::default() },
                    };
                }
                root.merge(at);
            }
            (None, Ok(names)) => {
                let members = names.into_iter().map(|name| (name.into(), whole())).collect();
                root.merge(Tree { members, ..Tree::default() });
            }
            (None, Err(_)) => root.merge(whole()),
        }
    }
    let mut flat = Vec::new();
    root.flatten(&mut flat, &mut false);
    Wants::new(flat)
}

/// A want as a tree, while it is put together.
#[derive(Debug, Clone, Default)]
struct Tree {
    whole: bool,
    /// A list here is followed to its elements (a scan that is not strict).
    lists: bool,
    members: BTreeMap<Box<str>, Tree>,
    /// What index steps read of the elements of a list here.
    elements: Option<Box<Tree>>,
    /// The slot a scan fills with this value ([`Want::slot`]).
    slot: Option<SlotId>,
    /// The value an `each` path leads to ([`Want::each`]).
    each: bool,
    /// Two scans fill different slots with this value: the walk cannot fill them.
    clash: bool,
}

impl Tree {
    fn merge(&mut self, other: Tree) {
        self.whole |= other.whole;
        self.lists |= other.lists;
        self.each |= other.each;
        self.clash |= other.clash;
        match (self.slot, other.slot) {
            (Some(mine), Some(theirs)) if mine != theirs => self.clash = true,
            (None, theirs) => self.slot = theirs,
            _ => {}
        }
        for (name, tree) in other.members {
            self.members.entry(name).or_default().merge(tree);
        }
        match (&mut self.elements, other.elements) {
            (Some(mine), Some(theirs)) => mine.merge(*theirs),
            (mine @ None, theirs) => *mine = theirs,
            (Some(_), None) => {}
        }
    }

    /// Appends this tree's wants to `flat`, its own first; returns its index. Clears `exact`
    /// when the wants cannot say where the scans' slots are: two slots for one value, or scans
    /// (or an `each` list) below a value read whole, whose members are then not looked up.
    fn flatten(self, flat: &mut Vec<Want>, exact: &mut bool) -> u32 {
        let at = flat.len();
        let whole = self.whole || at >= MOST_WANTS;
        let slot = self.slot.unwrap_or(NO_SLOT);
        *exact &= !self.clash && !(whole && (self.each || !self.members.is_empty()));
        flat.push(Want { slot, each: self.each, ..Want::new(whole, KeyTable::new(&[]), None) });
        if whole {
            return at as u32;
        }
        // The elements of a list here: those a scan follows get this tree again (a list in a
        // list is followed too), those an index step reads get its tree.
        let elements = match (self.lists, self.elements) {
            (false, None) => None,
            (true, None) => Some(at as u32),
            (false, Some(tree)) => Some(tree.flatten(flat, exact)),
            (true, Some(tree)) => {
                let mut both = Tree { lists: true, members: self.members.clone(), ..Tree::default() };
                both.merge(*tree);
                Some(both.flatten(flat, exact))
            }
        };
        let children: Vec<(Box<str>, SlotId)> =
            self.members.into_iter().map(|(name, tree)| (name, tree.flatten(flat, exact))).collect();
        let names: Vec<(&str, SlotId)> = children.iter().map(|(n, w)| (n.as_ref(), *w)).collect();
        flat[at] = Want { slot, each: self.each, ..Want::new(whole, KeyTable::new(&names), elements) };
        at as u32
    }
}
