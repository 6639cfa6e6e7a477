//! The documents of a composed call, read where each answer lies (`json::ondemand::with_parts`),
//! never written into one text: a source's context (`request` and the sources it reads) and the
//! document the rules map (every source, `request` and `_sources`).

use crate::json::ondemand::{Indexed, Part, Wants, with_parts};
use crate::json::{self, Doc};
use crate::route::composition::{Composition, Source};

use super::outcome::{Done, Ended, Value};

/// Runs `f` on a source's context: `request` and the values of the sources it reads, for what
/// its expressions read of them.
pub(super) fn with_context<R>(
    composition: &Composition,
    source: &Source,
    request_text: Option<&Indexed>,
    done: &[Option<Done>],
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, String> {
    let mut names: Vec<&str> = vec!["request"];
    let mut parts: Vec<Part<'_>> = vec![request_text.map_or(Part::Null, Part::One)];
    for &j in &source.reads {
        names.push(&composition.sources[j].name);
        parts.push(done[j].as_ref().map_or(Part::Null, |d| d.value.part()));
    }
    read(&names, &parts, Some(&source.context), max_depth, f)
}

/// Runs `f` on the document the rules map (each source's value, `request` and `_sources`),
/// read for what `wants` says the plan reads (`None`: all of it); `request` is there when
/// something reads it, and `_sources` is made only when the plan reads it.
pub(super) fn with_document<R>(
    composition: &Composition,
    request_text: Option<&Indexed>,
    done: &[Done],
    wants: Option<&Wants>,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, String> {
    let sources = if wants.is_none_or(|w| w.reads_member("_sources")) {
        let text = sources_document(composition, done);
        Some(
            Indexed::new(text, max_depth.saturating_sub(1))
                .map_err(|e| format!("`_sources` is not JSON: {e}"))?,
        )
    } else {
        None
    };
    let mut names: Vec<&str> =
        composition.by_name.iter().map(|&i| composition.sources[i].name.as_str()).collect();
    let mut parts: Vec<Part<'_>> = composition.by_name.iter().map(|&i| done[i].value.part()).collect();
    names.extend(["request", "_sources"]);
    parts
        .extend([request_text.map_or(Part::Null, Part::One), sources.as_ref().map_or(Part::Null, Part::One)]);
    read(&names, &parts, wants, max_depth, f)
}

/// `_sources`: each source's status and outcome (lists for `forEach`), and a paged source's
/// pages.
fn sources_document(composition: &Composition, done: &[Done]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * done.len());
    out.push(b'{');
    for (n, &i) in composition.by_name.iter().enumerate() {
        let (source, outcome) = (&composition.sources[i], &done[i]);
        if n > 0 {
            out.push(b',');
        }
        json::write::string(&mut out, &source.name);
        let status = |out: &mut Vec<u8>, e: &Ended| match e.status {
            Some(status) => json::write::u64(out, u64::from(status)),
            None => out.extend_from_slice(b"null"),
        };
        if outcome.list {
            out.extend_from_slice(b":{\"status\":[");
            for (i, e) in outcome.ended.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                status(&mut out, e);
            }
            out.extend_from_slice(b"],\"outcome\":[");
            for (i, e) in outcome.ended.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json::write::string(&mut out, e.outcome);
            }
            out.push(b']');
            if source.paging.is_some() {
                out.extend_from_slice(b",\"pages\":[");
                for (i, e) in outcome.ended.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    json::write::u64(&mut out, e.paged.pages as u64);
                }
                out.push(b']');
            }
            out.push(b'}');
        } else {
            let e = outcome.ended.first().copied().unwrap_or(Ended {
                status: None,
                outcome: "skipped",
                kind: None,
                paged: Default::default(),
            });
            out.extend_from_slice(b":{\"status\":");
            status(&mut out, &e);
            out.extend_from_slice(b",\"outcome\":");
            json::write::string(&mut out, e.outcome);
            if source.paging.is_some() {
                out.extend_from_slice(b",\"pages\":");
                json::write::u64(&mut out, e.paged.pages as u64);
            }
            out.push(b'}');
        }
    }
    out.push(b'}');
    out
}

impl Value {
    fn part(&self) -> Part<'_> {
        match self {
            Value::Null => Part::Null,
            Value::One(text) => Part::One(text),
            Value::List(items) => Part::List(items.iter().map(Option::as_deref).collect()),
        }
    }
}

/// The object `{names[i]: parts[i]}` as a document ([`with_parts`]).
fn read<R>(
    names: &[&str],
    parts: &[Part<'_>],
    wants: Option<&Wants>,
    max_depth: usize,
    f: impl FnOnce(&Doc<'_, '_>) -> R,
) -> Result<R, String> {
    with_parts(names, parts, wants, max_depth, f)
        .map_err(|(member, e)| format!("the answer of `{}` is not JSON: {e}", names[member]))
}
