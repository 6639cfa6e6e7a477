//! Templates (SPEC §2.3): text with `{{ expr }}` in it, compiled at registration, rendered per
//! call over a composed route's context. A template ends at the first `}}` after a complete
//! expression; `{{ '{{' }}` writes `{{`.
//!
//! Rendering never lets a value change where a request goes: in a path, every byte of a value
//! outside `A-Za-z0-9-._~` is percent-encoded, so a value stays inside its segment; query values
//! are encoded by whoever writes the query; header values are checked to be one line. A problem
//! names the value's type, never the value.

use bumpalo::Bump;

use crate::expr::{self, Arena, Budget, Doc as View, EvalError, EvalErrorKind, Patterns, Program, Val};
use crate::json::Doc;

/// A compiled template: its literal text and expressions, in order.
#[derive(Debug)]
pub struct Template {
    pieces: Vec<Piece>,
}

#[derive(Debug)]
enum Piece {
    Text(String),
    Expr(Box<Program>),
}

/// Why a template does not compile: at a byte offset of its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    pub at: usize,
    pub message: String,
}

/// How many `}}` one template's expression may hold before the one that ends it.
const MAX_CLOSINGS: usize = 8;

/// The names an expression over the context may bind: `$caller` (SPEC §2.4), always, and
/// `$item`, in a `forEach` source.
pub const CALLER: &str = "caller";
pub const ITEM: &str = "item";

/// The variables bound outside an expression over the context, in their slots' order.
pub fn bound(item: bool) -> &'static [&'static str] {
    if item { &[CALLER, ITEM] } else { &[CALLER] }
}

impl Template {
    /// Compiles `text`. `item` says whether `$item` is bound (a `forEach` source's templates).
    pub fn compile(
        text: &str,
        item: bool,
        max_depth: usize,
        patterns: &mut Patterns,
    ) -> Result<Template, TemplateError> {
        let bound = bound(item);
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        let mut offset = 0;
        while let Some(open) = rest.find("{{") {
            literal.push_str(&rest[..open]);
            let inner_start = open + 2;
            let inner = &rest[inner_start..];
            // The first `}}` after which the text before it is a whole expression.
            let mut first_error = None;
            let mut found = None;
            let mut from = 0;
            let mut tried = 0;
            // A `}}` inside an expression is rare (an object literal): a few are tried, so that
            // a text of many `}}` costs no more than a few compilations per template.
            while let Some(close) = inner[from..].find("}}")
                && tried < MAX_CLOSINGS
            {
                tried += 1;
                let end = from + close;
                match expr::compile_bound(&inner[..end], max_depth, patterns, bound) {
                    Ok(program) => {
                        found = Some((end, program));
                        break;
                    }
                    Err(errors) => {
                        first_error.get_or_insert((end, errors));
                        from = end + 1;
                    }
                }
            }
            let Some((end, program)) = found else {
                return Err(match first_error {
                    Some((_, errors)) if !inner.trim_start().is_empty() => {
                        let error = &errors[0];
                        TemplateError {
                            at: offset + inner_start + error.at,
                            message: format!("the template's expression does not compile: {}", error.message),
                        }
                    }
                    _ => TemplateError {
                        at: offset + open,
                        message: "`{{` opens a template that is not closed with `}}` (a literal `{{` is written `{{ '{{' }}`)"
                            .to_owned(),
                    },
                });
            };
            // A literal written as a template is text.
            match program.constant_text() {
                Some(text) => literal.push_str(text),
                None => {
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Expr(Box::new(program)));
                }
            }
            let consumed = inner_start + end + 2;
            rest = &rest[consumed..];
            offset += consumed;
        }
        literal.push_str(rest);
        if !literal.is_empty() || pieces.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Template { pieces })
    }

    /// A template of `text` alone, no expression in it.
    pub fn literal_text(text: String) -> Template {
        Template { pieces: vec![Piece::Text(text)] }
    }

    /// The template's text with each expression written as `x`, and whether an expression
    /// comes after a `?` or `#` (in a path: in its query or fragment).
    pub fn skeleton(&self) -> (String, bool) {
        let mut text = String::new();
        let (mut in_query, mut after_query) = (false, false);
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => {
                    text.push_str(t);
                    in_query |= t.contains(['?', '#']);
                }
                Piece::Expr(_) => {
                    after_query |= in_query;
                    text.push('x');
                }
            }
        }
        (text, after_query)
    }

    /// Whether every `%` of the template's own text starts an escape (`%` and two hex digits)
    /// within that text: a lone `%` before a template would let a value finish the escape
    /// (`%{{v}}` with `2F` writes `%2F`).
    pub fn escapes_complete(&self) -> bool {
        self.pieces.iter().all(|piece| match piece {
            Piece::Text(text) => {
                let bytes = text.as_bytes();
                bytes.iter().enumerate().filter(|(_, b)| **b == b'%').all(|(i, _)| {
                    bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                        && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
                })
            }
            Piece::Expr(_) => true,
        })
    }

    /// A path's template without its leading `/` and its literal query (which comes after
    /// every expression: [`Template::skeleton`] says so).
    pub fn without_query(mut self) -> Template {
        if let Some(at) = self.pieces.iter().position(|p| matches!(p, Piece::Text(t) if t.contains('?'))) {
            self.pieces.truncate(at + 1);
            if let Some(Piece::Text(text)) = self.pieces.last_mut()
                && let Some(cut) = text.find('?')
            {
                text.truncate(cut);
            }
        }
        if let Some(Piece::Text(text)) = self.pieces.first_mut() {
            *text = text.trim_start_matches('/').to_owned();
        }
        self
    }

    /// The text of a template without expressions.
    pub fn literal(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [Piece::Text(text)] => Some(text),
            _ => None,
        }
    }

    /// The expression of a template that is exactly one, nothing around it.
    pub fn whole(&self) -> Option<&Program> {
        match self.pieces.as_slice() {
            [Piece::Expr(program)] => Some(program),
            _ => None,
        }
    }

    /// The expressions of the template.
    pub fn programs(&self) -> impl Iterator<Item = &Program> {
        self.pieces.iter().filter_map(|piece| match piece {
            Piece::Expr(program) => Some(&**program),
            Piece::Text(_) => None,
        })
    }

    /// Appends the template rendered over `context`, each value's text through `encode`.
    pub fn render<'d>(
        &'d self,
        context: &Context<'d, '_>,
        encode: fn(&str, &mut String),
        out: &mut String,
    ) -> Result<(), RenderError> {
        self.render_tracked(context, encode, out, &mut Vec::new())
    }

    /// [`Template::render`], noting where in `out` each value was written.
    pub fn render_tracked<'d>(
        &'d self,
        context: &Context<'d, '_>,
        encode: fn(&str, &mut String),
        out: &mut String,
        ranges: &mut Vec<(usize, usize)>,
    ) -> Result<(), RenderError> {
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Expr(program) => {
                    let start = out.len();
                    context.text(program, |text| encode(text, out))?;
                    ranges.push((start, out.len()));
                }
            }
        }
        Ok(())
    }
}

/// Chains of names of a template's expression looked along for a missing member.
const READ_PATHS: usize = 4;

/// Members of an object a missing name's closest one is looked for among.
const SUGGESTED_AMONG: usize = 256;

/// Why a template could not be rendered. It names the value's type, never the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// The expression failed (SPEC §2.3: a template's evaluation error fails its source).
    Failed(String),
    /// The value cannot be written where the template is (null, a list, an object).
    Type(&'static str),
    /// The value is null because a member the expression reads is missing: which, and the
    /// closest name there is (an admin's live call only, [`Context::explain`]).
    Missing(String),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Failed(why) => write!(f, "its expression failed: {why}"),
            RenderError::Type("null") => {
                f.write_str("its value is null, which cannot be written as text here")
            }
            RenderError::Type(kind) => {
                write!(f, "its value is {} {kind}, which cannot be written as text here", article(kind))
            }
            RenderError::Missing(why) => write!(f, "its value is null: {why}"),
        }
    }
}

fn article(kind: &str) -> &'static str {
    if kind.starts_with(['a', 'o']) { "an" } else { "a" }
}

/// What templates, `when` and `forEach` are evaluated over: the context document, and the
/// `forEach` element when there is one.
pub struct Context<'d, 'a> {
    pub doc: &'d Doc<'d, 'a>,
    pub item: Option<Val<'d>>,
    /// `$caller`: `null` on an open route.
    pub caller: Val<'d>,
    pub arena: &'d Arena<'d>,
    /// An admin's live call (a registration's, an update's, a *Try it*): a value that is null
    /// because a member its expression reads is missing says which, with the closest name the
    /// object has ([`RenderError::Missing`]). Those words name the document's members, so a
    /// route's callers never get them.
    pub explain: bool,
}

impl<'d, 'a> Context<'d, 'a> {
    /// Runs `program` over the context.
    pub fn eval(&self, program: &'d Program) -> Result<Val<'d>, RenderError> {
        let nodes: &'d [simd_json::Node<'d>] = self.doc;
        let root = Val::from_tape(nodes, 0);
        // A program compiled without `$item` has no slot for it: the value is not set.
        let bound = [self.caller, self.item.unwrap_or(Val::Null)];
        expr::evaluate_bound(program, nodes, root, self.arena, &bound)
            .map_err(|e: EvalError| RenderError::Failed(safe_message(&e)))
    }

    /// Hands the text of `program`'s value (a scalar) to `f`.
    fn text(&self, program: &'d Program, mut f: impl FnMut(&str)) -> Result<(), RenderError> {
        let value = self.eval(program)?;
        self.scalar(program, value, &mut f)
    }

    /// Hands the text of `value`, the value of `program`, to `f`: [`scalar_text`], a null
    /// explained when the context says so.
    pub fn scalar(
        &self,
        program: &Program,
        value: Val<'_>,
        f: &mut impl FnMut(&str),
    ) -> Result<(), RenderError> {
        scalar_text(value, f).map_err(|error| match error {
            RenderError::Type("null") if self.explain => {
                self.missing(program).map_or(error, RenderError::Missing)
            }
            other => other,
        })
    }

    /// Why `program` found nothing, when a member it reads is missing: the first name, along
    /// the chains of names it reads (from the context, or from `$item`), that an object lacks,
    /// with the closest name the object has (looked for among its first
    /// [`SUGGESTED_AMONG`] members).
    fn missing(&self, program: &Program) -> Option<String> {
        let nodes: &[simd_json::Node<'_>] = self.doc;
        for (start, names) in program.read_paths(READ_PATHS) {
            let (mut at, mut shown) = match start {
                expr::Start::Context => (0, String::new()),
                // `$item` takes the second slot ([`bound`]); `$caller` and a `let` variable are
                // not looked along.
                expr::Start::Var(1) if self.item.is_some() => match self.item {
                    Some(Val::TapeObject(i) | Val::TapeList(i)) => (i, "$item".to_owned()),
                    _ => continue,
                },
                expr::Start::Var(_) => continue,
            };
            'names: for name in names {
                // Through lists to their first element, as a projection's first value.
                while let Some(simd_json::Node::Array { len, .. }) = nodes.get(at) {
                    if *len == 0 {
                        break 'names;
                    }
                    at += 1;
                    shown.push_str("[0]");
                }
                let Some(members) = crate::json::members(nodes, at) else { break };
                match crate::json::member(nodes, at, name) {
                    Some(next) => {
                        at = next;
                        if !shown.is_empty() {
                            shown.push('.');
                        }
                        shown.push_str(name);
                    }
                    None => {
                        let owner =
                            if shown.is_empty() { "the context".to_owned() } else { format!("`{shown}`") };
                        let meant =
                            crate::suggest::closest(name, members.take(SUGGESTED_AMONG).map(|(n, _)| n));
                        return Some(match meant {
                            Some(meant) => {
                                format!("{owner} has no member `{name}` (did you mean `{meant}`?)")
                            }
                            None => format!("{owner} has no member `{name}`"),
                        });
                    }
                }
            }
        }
        None
    }

    /// The view of the context for writing values.
    pub fn view(&self) -> View<'d> {
        View { nodes: self.doc }
    }
}

/// An evaluation error in words that name no value: a wrong type and a bound are told as
/// they are (their messages name types and bounds); a value out of its range or form (a
/// date a format does not read) is told by its kind alone, since its message may quote it.
fn safe_message(error: &EvalError) -> String {
    match error.kind {
        EvalErrorKind::InvalidValue => {
            "a function or operator was given a value out of its range or form (invalid-value)".to_owned()
        }
        _ => error.to_string(),
    }
}

/// Hands the text of a scalar to `f`: strings as they are, numbers as JSON writes them,
/// `true`/`false`. Anything else is a [`RenderError::Type`].
pub fn scalar_text(value: Val<'_>, f: &mut impl FnMut(&str)) -> Result<(), RenderError> {
    match value {
        Val::String(s) => f(s),
        Val::Bool(b) => f(if b { "true" } else { "false" }),
        Val::Number(n) => {
            let mut out = Vec::new();
            n.write(&mut out);
            f(std::str::from_utf8(&out).unwrap_or_default());
        }
        other => return Err(RenderError::Type(other.kind().name())),
    }
    Ok(())
}

/// A path value: every byte outside `A-Za-z0-9-._~` percent-encoded, so that it stays one
/// segment (`/`, `?`, `#`, `%`, `@`, `:` included).
pub fn encode_segment(text: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in text.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
}

/// A value taken as it is (query values, encoded when the query is written; header values,
/// checked after).
pub fn as_is(text: &str, out: &mut String) {
    out.push_str(text);
}

/// The scratch one source's evaluations share: an arena within the call's expression budget.
pub struct Scratch {
    bump: Bump,
    budget: Budget,
}

impl Scratch {
    pub fn new(max_bytes: usize, max_steps: u64) -> Scratch {
        Scratch { bump: Bump::new(), budget: Budget::new(max_bytes, max_steps) }
    }

    pub fn arena(&self) -> Arena<'_> {
        Arena::new(&self.bump, &self.budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::with_parsed;

    fn compile(text: &str) -> Result<Template, TemplateError> {
        Template::compile(text, true, 64, &mut Patterns::default())
    }

    /// Renders `template` over `context` (an object), with `$item` its member `__item`.
    fn render(
        template: &str,
        context: &str,
        item: &str,
        encode: fn(&str, &mut String),
    ) -> Result<String, RenderError> {
        let template = compile(template).unwrap();
        let mut context: serde_json::Value = serde_json::from_str(context).unwrap();
        context["__item"] = serde_json::from_str(item).unwrap();
        let mut text = context.to_string().into_bytes();
        with_parsed(&mut text, 64, |doc| {
            let scratch = Scratch::new(1 << 20, 1 << 20);
            let arena = scratch.arena();
            let item = View { nodes: doc }.field(Val::from_tape(doc, 0), "__item");
            let context = Context { doc, item: Some(item), caller: Val::Null, arena: &arena, explain: true };
            let mut out = String::new();
            template.render(&context, encode, &mut out).map(|()| out)
        })
        .unwrap()
    }

    #[test]
    fn templates_are_found_and_literals_kept() {
        assert_eq!(compile("users/42").unwrap().literal(), Some("users/42"));
        assert_eq!(compile("").unwrap().literal(), Some(""));
        assert_eq!(compile("a{{ '{{' }}b").unwrap().literal(), Some("a{{b"));
        assert!(compile("{{user.id}}").unwrap().whole().is_some());
        assert!(compile("x{{user.id}}").unwrap().whole().is_none());
        // A `}}` inside the expression does not end it.
        let t = compile("{{ {a: user.id}}}").unwrap();
        assert_eq!(t.programs().count(), 1);
        let e = compile("a{{ user.id").unwrap_err();
        assert!(e.message.contains("not closed"), "{e:?}");
        assert_eq!(e.at, 1);
        let e = compile("{{ user..id }}").unwrap_err();
        assert!(e.message.contains("does not compile"), "{e:?}");
        assert!(compile("{{ $nope }}").is_err());
        assert!(compile("{{ $item }}").is_ok());
        assert!(Template::compile("{{ $item }}", false, 64, &mut Patterns::default()).is_err());
    }

    #[test]
    fn values_stay_in_their_segment() {
        let context = r#"{"user": {"id": 42, "name": "a/b", "ok": true, "f": 1.5, "n": null, "l": [1]}}"#;
        let r = |t: &str| render(t, context, "0", encode_segment);
        assert_eq!(r("users/{{user.id}}").unwrap(), "users/42");
        assert_eq!(r("{{user.name}}").unwrap(), "a%2Fb");
        assert_eq!(r("{{user.ok}}-{{user.f}}").unwrap(), "true-1.5");
        assert_eq!(r("{{user.n}}"), Err(RenderError::Type("null")));
        assert_eq!(r("{{user.l}}"), Err(RenderError::Type("array")));
        assert_eq!(r("{{user}}"), Err(RenderError::Type("object")));
        // Null for want of a member: which one, and the name probably meant (an admin's call).
        let missing = |why: &str| Err(RenderError::Missing(why.to_owned()));
        assert_eq!(r("{{user.nmae}}"), missing("`user` has no member `nmae` (did you mean `name`?)"));
        assert_eq!(r("{{user.l[0].x}}"), Err(RenderError::Type("null")));
        assert_eq!(
            r("{{usr.id || user.idd}}"),
            missing("the context has no member `usr` (did you mean `user`?)")
        );
        assert_eq!(
            render("{{$item.ids}}", context, r#"{"id": 1}"#, encode_segment),
            missing("`$item` has no member `ids` (did you mean `id`?)")
        );
        // A `let` variable is not `$item`: not looked along.
        assert_eq!(
            render("{{ let $u = user in $u.nmae }}", context, r#"{"nmae": 1}"#, encode_segment),
            Err(RenderError::Type("null"))
        );
        for (value, encoded) in [
            ("../admin", "..%2Fadmin"),
            ("%2e%2e", "%252e%252e"),
            ("@evil.example/", "%40evil.example%2F"),
            ("http://10.0.0.1/", "http%3A%2F%2F10.0.0.1%2F"),
            ("?x=1#", "%3Fx%3D1%23"),
            (" ", "%20"),
            ("\n", "%0A"),
            ("é", "%C3%A9"),
        ] {
            let json = serde_json::to_string(value).unwrap();
            assert_eq!(render("{{$item}}", "{}", &json, encode_segment).unwrap(), encoded, "{value:?}");
        }
    }

    #[test]
    fn a_failing_expression_fails_the_render() {
        let e = render("{{ abs('x') }}", "{}", "0", as_is).unwrap_err();
        assert!(matches!(&e, RenderError::Failed(why) if why.contains("abs")), "{e:?}");
        assert_eq!(
            RenderError::Type("object").to_string(),
            "its value is an object, which cannot be written as text here"
        );
    }
}
