//! What a program reads of the document it runs on, as places: the paths (member names and "an
//! element of a list") of the values it reads whole. A call reads the upstream answer for them
//! ([`crate::plan::wants`]) instead of parsing it whole, so `meals[*].{id: idMeal}` reads two
//! members of each meal and skips the rest.
//!
//! The program is run on places instead of values. A value is the value at some places (`a.b`
//! is the value at `a/b`), a new list whose elements are the values at some places (`a[*].b`
//! is a list of the values at `a/*/b`), or a new value made of values already read whole (a
//! number, a comparison, a function's result). Every value a program consumes whole (writes,
//! compares, tests for truth, passes to a function) has its places read whole; a place a
//! program only walks through (`a` in `a.b`) keeps its kind, and what the walk keeps of it is
//! what the program then reads: the members it names, all the elements of a list (so an index,
//! a count or a projection sees every one). Whatever is not followed this way is read whole.
//! Each step runs once, and a run that would record too much gives up: the document is read
//! whole then.

use super::{Program, Step, StepId};

/// One step of a place's path from the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Seg<'p> {
    Member(&'p str),
    /// Every element of a list.
    Element,
}

/// A place: the path of a value from the document.
pub(crate) type Place<'p> = Vec<Seg<'p>>;

/// Places a value may stand at, at most this many; more make the program read the whole
/// document (a bound for any expression: each flatten may double them).
const MOST_PLACES: usize = 64;

/// Steps run on places, at most this many; more make the program read the whole document. A
/// program runs each of its steps once (at most 4096 bytes make far fewer steps).
const MOST_EVALUATIONS: usize = 1 << 16;

/// Path steps of the places a run records, at most this many (a few MiB); more make the program
/// read the whole document. Places multiplied by flattening and lengthened step by step could
/// otherwise take the square of the expression's length, times 64.
const MOST_HELD: usize = 1 << 18;

/// What a value of the program is, as places.
#[derive(Debug, Clone)]
enum Abs<'p> {
    /// The value at one of these places.
    At(Vec<Place<'p>>),
    /// A new list whose elements are values at these places.
    ListOf(Vec<Place<'p>>),
    /// A new value; what it holds of the document was read whole.
    New,
}

/// Places cannot say what the program reads within the bounds ([`MOST_PLACES`],
/// [`MOST_EVALUATIONS`], [`MOST_HELD`]): it reads the whole document.
struct Unbounded;

/// What a program reads of a document: the places it reads whole, and those it walks through,
/// whose kind and (of a list) number of elements it may see.
#[derive(Debug, Default)]
pub(crate) struct Reads<'p> {
    pub whole: Vec<Place<'p>>,
    pub walked: Vec<Place<'p>>,
}

struct Run<'p> {
    program: &'p Program,
    reads: Reads<'p>,
    /// Steps run so far.
    evaluations: usize,
    /// The places recorded so far, in path steps, with those of the programs run before.
    held: usize,
}

impl Program {
    /// The places of the document this program reads, when it runs with `@` and `$` the
    /// document; `None` when places cannot say what it reads. `held` counts the path steps
    /// recorded by the programs of one plan, this one's added: [`MOST_HELD`] bounds them all.
    pub(crate) fn document_reads(&self, held: &mut usize) -> Option<Reads<'_>> {
        let mut run = Run { program: self, reads: Reads::default(), evaluations: 0, held: *held };
        let top = (self.steps.len() - 1) as StepId;
        let root = Abs::At(vec![Vec::new()]);
        let value = run.eval(top, &root).ok()?;
        run.consume(value);
        if run.held > MOST_HELD {
            return None;
        }
        *held = run.held;
        let Run { mut reads, .. } = run;
        for places in [&mut reads.whole, &mut reads.walked] {
            places.sort_unstable();
            places.dedup();
        }
        Some(reads)
    }
}

impl<'p> Run<'p> {
    /// Reads whole what `value` holds of the document.
    fn consume(&mut self, value: Abs<'p>) {
        if let Abs::At(places) | Abs::ListOf(places) = value {
            self.held += size(&places);
            self.reads.whole.extend(places);
        }
    }

    /// Reads whole the value of each of `kids`, run on `cur`: a new value is made of them.
    fn consume_all(&mut self, kids: &[StepId], cur: &Abs<'p>) -> Result<Abs<'p>, Unbounded> {
        for &kid in kids {
            let value = self.eval(kid, cur)?;
            self.consume(value);
        }
        Ok(Abs::New)
    }

    /// Walks to the places of `value` (their kind, and a list's number of elements, are seen).
    fn walk(&mut self, value: &Abs<'p>) {
        if let Abs::At(places) | Abs::ListOf(places) = value {
            self.held += size(places);
            self.reads.walked.extend(places.iter().cloned());
        }
    }

    /// The elements of `value`, walked to.
    fn items(&mut self, value: &Abs<'p>) -> Abs<'p> {
        let each = items(value);
        self.walk(&each);
        each
    }

    fn eval(&mut self, id: StepId, cur: &Abs<'p>) -> Result<Abs<'p>, Unbounded> {
        // Each step runs once per run of its parent, so this is the program's size; the bound
        // keeps any mistake there from taking exponential time.
        self.evaluations += 1;
        if self.evaluations > MOST_EVALUATIONS {
            return Err(Unbounded);
        }
        let value = self.step(id, cur)?;
        self.walk(&value);
        if self.held > MOST_HELD {
            return Err(Unbounded);
        }
        Ok(value)
    }

    fn step(&mut self, id: StepId, cur: &Abs<'p>) -> Result<Abs<'p>, Unbounded> {
        let program = self.program;
        let kids = |range: super::Range| &program.kids[range.range()];
        Ok(match &program.steps[id as usize] {
            Step::Current => cur.clone(),
            Step::Root => Abs::At(vec![Vec::new()]),
            // A binding's value is read whole where it is bound.
            Step::Var(_) | Step::Const(_) | Step::Expref(_) => Abs::New,
            Step::Field(name) => members(cur, std::slice::from_ref(name)),
            Step::Path(range) => members(cur, &program.paths[range.range()]),
            &Step::Sub(left, right) | &Step::Pipe(left, right) => {
                let base = self.eval(left, cur)?;
                self.eval(right, &base)?
            }
            Step::Index(_) => items(cur),
            // A slice of a list is a list of its elements; of a string, a new string (the place
            // of a string is read whatever its want).
            Step::Slice(..) => match items(cur) {
                Abs::At(places) => Abs::ListOf(places),
                other => other,
            },
            &Step::ListProject(left, right) => {
                let base = self.eval(left, cur)?;
                let each = self.items(&base);
                self.project(&each, right)?
            }
            &Step::SliceProject(left, right) => {
                // `right` runs on a string's slice itself, on a list's elements as a projection;
                // it is run here once either way (twice per level would take 2^n runs).
                let base = self.eval(left, cur)?;
                if let Abs::At(_) = base {
                    // What may be a string's slice is read whole: `right` reads within it.
                    self.consume(base);
                    let value = self.eval(right, &Abs::New)?;
                    self.consume(value);
                    Abs::New
                } else {
                    let each = self.items(&base);
                    self.project(&each, right)?
                }
            }
            &Step::ObjectProject(left, right) => {
                // Places cannot name every member: the object is read whole.
                let base = self.eval(left, cur)?;
                self.consume(base);
                let value = self.eval(right, &Abs::New)?;
                self.consume(value);
                Abs::New
            }
            &Step::Flatten(inner) => {
                // The elements, and the elements of those that are lists.
                let base = self.eval(inner, cur)?;
                match self.items(&base) {
                    Abs::At(places) => {
                        let mut both = elements(&places);
                        both.extend(places);
                        bounded(Abs::ListOf(both))?
                    }
                    other => other,
                }
            }
            &Step::Filter(left, condition, right) => {
                let base = self.eval(left, cur)?;
                let each = self.items(&base);
                let test = self.eval(condition, &each)?;
                self.consume(test);
                self.project(&each, right)?
            }
            &Step::MultiList(range) | &Step::MultiHash(range, _) => self.consume_all(kids(range), cur)?,
            &Step::Or(a, b) | &Step::And(a, b) | &Step::Compare(_, a, b) | &Step::Arith(_, a, b) => {
                self.consume_all(&[a, b], cur)?
            }
            &Step::Not(inner) | &Step::Sign(_, inner) => self.consume_all(&[inner], cur)?,
            &Step::Ternary(a, b, c) => self.consume_all(&[a, b, c], cur)?,
            &Step::Let(bindings, body) => {
                for pair in kids(bindings).chunks_exact(2) {
                    let value = self.eval(pair[1], cur)?;
                    self.consume(value);
                }
                self.eval(body, cur)?
            }
            &Step::Call(_, args, _) => {
                // Arguments are read whole; an expression reference runs on what they hold,
                // read whole already, and on `$`.
                for &arg in kids(args) {
                    let value = match program.steps[arg as usize] {
                        Step::Expref(inner) => self.eval(inner, &Abs::New)?,
                        _ => self.eval(arg, cur)?,
                    };
                    self.consume(value);
                }
                Abs::New
            }
        })
    }

    /// `right` run on each element of `each` (the elements of a list), as a projection: a new
    /// list of its values.
    fn project(&mut self, each: &Abs<'p>, right: StepId) -> Result<Abs<'p>, Unbounded> {
        match self.eval(right, each)? {
            Abs::At(places) => Ok(Abs::ListOf(places)),
            other => {
                self.consume(other);
                Ok(Abs::New)
            }
        }
    }
}

/// The member reached from a value by `names`, one inside the other.
fn members<'p>(value: &Abs<'p>, names: &'p [Box<str>]) -> Abs<'p> {
    match value {
        Abs::At(places) => Abs::At(
            places
                .iter()
                .map(|place| {
                    let mut place = place.clone();
                    place.extend(names.iter().map(|name| Seg::Member(name)));
                    place
                })
                .collect(),
        ),
        // A list has no members.
        Abs::ListOf(_) | Abs::New => Abs::New,
    }
}

/// The path steps `places` hold, as [`MOST_HELD`] counts them.
fn size(places: &[Place<'_>]) -> usize {
    places.iter().map(|place| place.len() + 1).sum()
}

/// The places of the elements of lists at `places`.
fn elements<'p>(places: &[Place<'p>]) -> Vec<Place<'p>> {
    places
        .iter()
        .map(|place| {
            let mut place = place.clone();
            place.push(Seg::Element);
            place
        })
        .collect()
}

/// The elements of a value that is a list, each run on by a projection or a filter.
fn items<'p>(value: &Abs<'p>) -> Abs<'p> {
    match value {
        Abs::At(places) => Abs::At(elements(places)),
        Abs::ListOf(places) => Abs::At(places.clone()),
        Abs::New => Abs::New,
    }
}

/// `value`, or [`Unbounded`] when it stands at too many places.
fn bounded(value: Abs<'_>) -> Result<Abs<'_>, Unbounded> {
    match &value {
        Abs::At(places) | Abs::ListOf(places) if places.len() > MOST_PLACES => Err(Unbounded),
        _ => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::Seg;

    /// The places an expression reads whole, written `a/*/b` (`*`: every element).
    fn reads(expression: &str) -> Option<Vec<String>> {
        let program = super::super::compile(expression, 64).expect("an expression");
        let places = program.document_reads(&mut 0)?.whole;
        Some(
            places
                .iter()
                .map(|place| {
                    let segs: Vec<&str> = place
                        .iter()
                        .map(|seg| match seg {
                            Seg::Member(name) => name,
                            Seg::Element => "*",
                        })
                        .collect();
                    segs.join("/")
                })
                .collect(),
        )
    }

    #[test]
    fn projections_filters_and_indexes_read_what_they_name_inside_lists() {
        let cases: [(&str, &[&str]); 10] = [
            ("meals[0].strMeal", &["meals/*/strMeal"]),
            ("meals[*].{id: idMeal, name: strMeal}", &["meals/*/idMeal", "meals/*/strMeal"]),
            ("meals[?strArea == 'x'].strMeal", &["meals/*/strArea", "meals/*/strMeal"]),
            ("meals[].tags[0]", &["meals/*/tags/*", "meals/*/*/tags/*"]),
            ("meals[1:3].id", &["meals/*/id"]),
            ("a.b | [0].c", &["a/b/*/c"]),
            ("meals[*].strMeal | [0]", &["meals/*/strMeal"]),
            // Arguments are read whole, and what a reference to an expression reads of them is
            // in them.
            ("sort_by(meals, &strMeal)[*].idMeal", &["meals"]),
            ("length(total)", &["total"]),
            ("a.*.b", &["a"]),
        ];
        for (expression, expected) in cases {
            assert_eq!(
                reads(expression),
                Some(expected.iter().map(|s| s.to_string()).collect()),
                "{expression}"
            );
        }
    }

    #[test]
    fn the_document_itself_is_a_place_read_whole() {
        for expression in ["@", "length(@)", "$", "keys($)", "[0]"] {
            let places = reads(expression).expect("places");
            assert!(places.iter().any(|p| p.is_empty() || p == "*"), "{expression}: {places:?}");
        }
        assert_eq!(reads("@"), Some(vec![String::new()]));
    }

    /// Slice projections nested as deep as the parser allows are run on places once per step:
    /// running each level's right side twice took 2^depth runs.
    #[test]
    fn nested_slice_projections_are_run_once_per_step() {
        let nested = format!("a{}", "[:]".repeat(60));
        let places = reads(&nested).expect("read for its places, within the bound of runs");
        // Each level projects the elements of the one before.
        assert_eq!(places, vec![format!("a{}", "/*".repeat(60))]);
    }

    /// Places multiplied by flattening, then lengthened a step at a time, are not all kept: past
    /// the bound the whole document is read.
    #[test]
    fn places_that_would_take_too_much_memory_read_the_whole_document() {
        // The places of six flattens, 40 names deep, then a list of 600 copies of them.
        let long = format!("a[][][][][][].{}[{}@]", "b.".repeat(40), "@,".repeat(599));
        assert!(long.len() < super::super::MAX_EXPR_BYTES);
        assert_eq!(reads(&long), None);
        let short = format!("a[][][][][][].{}[{}@]", "b.".repeat(6), "@,".repeat(2));
        assert!(reads(&short).is_some());
    }

    /// The bound on places holds for all the expressions of one rules document together: each
    /// of its targets within it alone, all of them past it, read the whole document.
    #[test]
    fn the_places_of_all_the_targets_are_bounded_together() {
        let expression = format!("a[][][][][][].{}[{}@]", "b.".repeat(10), "@,".repeat(19));
        let mut held = 0;
        super::super::compile(&expression, 64).expect("compiles").document_reads(&mut held).expect("places");
        assert!(held > 1000, "{held} path steps");
        let targets = super::MOST_HELD / held + 1;
        assert!(targets <= crate::rules::Limits::default().max_rules, "{targets} targets");
        let rules = |n: usize| {
            let new: Vec<String> =
                (0..n).map(|i| format!(r#""t{i}":{{"key":"t{i}","type":"Json"}}"#)).collect();
            let old: Vec<String> = (0..n)
                .map(|i| {
                    format!(r#""t{i}":{{"expr":{}}}"#, serde_json::to_string(&expression).expect("a string"))
                })
                .collect();
            format!(r#"{{"newBodyFields":{{{}}},"oldBodyFields":{{{}}}}}"#, new.join(","), old.join(","))
        };
        let plan = |n| {
            crate::rules::compile_json(rules(n).as_bytes(), &crate::rules::Limits::default())
                .expect("rules")
                .plan
        };
        assert!(plan(targets - 1).wants().is_some());
        assert!(plan(targets).wants().is_none());
    }

    #[test]
    fn flattening_again_and_again_reads_the_whole_document() {
        let flattened = format!("a{}", "[]".repeat(8));
        assert_eq!(reads(&flattened), None);
        assert!(reads("a[][][]").is_some());
    }

    /// Expressions of the shapes that walk into lists and objects, over names the documents
    /// below hold.
    fn expression() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("c".to_owned()),
            Just("@".to_owned()),
            Just("`1`".to_owned()),
            Just("'x'".to_owned()),
        ];
        // Shapes of one and of two smaller expressions, `{l}` and `{r}`.
        const ONE: [&str; 8] = [
            "({l})[0]",
            "({l})[-1]",
            "({l})[1:]",
            "!({l})",
            "length({l})",
            "sort_by({l}, &a)",
            "$.{l}",
            "({l})[?@ == 'x']",
        ];
        const TWO: [&str; 13] = [
            "{l}.{r}",
            "({l}) | ({r})",
            "({l})[*].{r}",
            "({l})[].{r}",
            "({l}).*.{r}",
            "({l})[?({r}) == 'x']",
            "{p: {l}, q: {r}}",
            "[{l}, {r}]",
            "({l}) || ({r})",
            "({l}) && ({r})",
            "map(&({l}), {r})",
            "let $v = {l} in {r}",
            "({l})[?{r}].a",
        ];
        leaf.prop_recursive(4, 24, 3, |inner| {
            prop_oneof![
                8 => (inner.clone(), 0..ONE.len()).prop_map(|(l, i)| ONE[i].replace("{l}", &l)),
                13 => (inner.clone(), inner.clone(), 0..TWO.len())
                    .prop_map(|(l, r, i)| TWO[i].replace("{l}", &l).replace("{r}", &r)),
                1 => (inner.clone(), inner.clone(), inner).prop_map(|(l, c, r)| format!("({l})[?{c}].{r}")),
            ]
        })
    }

    /// Documents with lists in objects and objects in lists, under the names `a`, `b`, `c`.
    const DOCUMENTS: [&str; 4] = [
        r#"{"a":[{"a":1,"b":"x","c":[{"a":"x"},[2,{"b":3}]]},{"a":"x","b":[],"c":{"a":{}}},[{"b":"x"}],"x"],"b":{"a":[1,"x",[{"c":1}]],"b":{"c":"x"}},"c":"x"}"#,
        r#"[{"a":{"b":[{"c":"x"},{"c":[1,2]}]},"b":1},{"a":[[{"a":"x"}]],"c":{"a":"x","b":"x"}},2]"#,
        r#"{"a":{"a":{"a":[{"b":"x"},{"a":1,"b":{"c":[]}}]}},"b":[[[1,"x"],{"a":"x"}],{"b":{"a":1}}],"c":{"b":[]}}"#,
        r#""x""#,
    ];

    /// Maps each document by a route whose one target is `expression`, reading it for the
    /// places the expression reads and parsing it whole: `Err` says how they differ (in value
    /// or in failures).
    fn read_as_whole(expression: &str) -> Result<(), String> {
        let rules = format!(
            r#"{{"newBodyFields":{{"v":{{"key":"v","type":"Json"}}}},"oldBodyFields":{{"v":{{"expr":{}}}}}}}"#,
            serde_json::to_string(&expression).expect("a string")
        );
        let Ok(compiled) = crate::rules::compile_json(rules.as_bytes(), &crate::rules::Limits::default())
        else {
            return Ok(());
        };
        let failures = |outcome: crate::exec::Outcome| (outcome.expression_errors, outcome.limit);
        for document in DOCUMENTS {
            let mut read = Vec::new();
            let read_ok =
                crate::exec::map_text(&compiled.plan, &mut document.as_bytes().to_vec(), 64, &mut read);
            let mut whole = Vec::new();
            let parsed = crate::json::with_parsed(&mut document.as_bytes().to_vec(), 64, |doc| {
                crate::exec::execute(&compiled.plan, doc, 0, &mut whole)
            });
            let (read_ok, parsed) = (read_ok.map(failures).ok(), parsed.map(failures).ok());
            if read_ok != parsed || read != whole {
                return Err(format!(
                    "{expression} on {document}: read {} ({read_ok:?}), whole {} ({parsed:?})",
                    String::from_utf8_lossy(&read),
                    String::from_utf8_lossy(&whole)
                ));
            }
        }
        Ok(())
    }

    /// Tests of a list or an object for truth, and of its length, see all of it.
    #[test]
    fn what_a_filter_tests_is_read_whole() {
        for expression in [
            "a[?c].a",
            "a[?b].a",
            "b.a[?@ == 'x']",
            "a[?length(c) > `1`].b",
            "a[*].c | [0]",
            "[?a].b",
            "a[?!c].a",
        ] {
            assert_eq!(read_as_whole(expression), Ok(()));
            assert!(
                super::super::compile(expression, 64).expect("compiles").document_reads(&mut 0).is_some(),
                "{expression} is read for its places"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1500))]

        /// A route mapped by an expression reads the answer for the places the expression
        /// reads and gives what the same route gives on the answer parsed whole: the same
        /// value, and the same failures.
        #[test]
        fn reading_the_places_maps_what_the_whole_parse_maps(expression in expression()) {
            proptest::prop_assert_eq!(read_as_whole(&expression), Ok(()));
        }
    }
}
