//! The `expr_eval` and `expr_differential` targets: an expression (the input's first line) run
//! over a document (the rest), and what another JMESPath implementation needs to be compared
//! with recast's.

use bumpalo::Bump;

use crate::expr::{self, Arena, Budget, Doc, EvalErrorKind, Step, Val};
use crate::json;

/// What one input reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExprReached {
    /// The first line is not an expression recast compiles.
    Refused,
    /// The rest is not JSON.
    DocumentRefused,
    /// The expression gave a value.
    Value,
    /// It failed while running (a wrong type or value).
    Failed,
    /// It built more than its budget and was stopped.
    OverBudget,
}

/// Bytes the values of one evaluation may take.
pub const EXPR_BUDGET: usize = 1 << 20;

/// What recast makes of one input, for comparison with another implementation.
#[derive(Debug, Clone, PartialEq)]
pub enum ExprOutcome {
    Refused,
    DocumentRefused,
    /// The value as compact JSON.
    Value(String),
    /// The error's kind, as the compliance suites name it.
    Failed(&'static str),
    OverBudget,
}

/// Splits an input into the expression (its first line) and the document (the rest).
pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, b"{}"),
    }
}

/// Compiles and runs the input. Checks: nothing panics; a refusal has at least one error, each
/// at an offset inside the expression and on a character boundary; a value is valid JSON; the
/// arena holds no more than a few times the budget, however much the expression would build.
pub fn expr_eval(data: &[u8]) -> ExprReached {
    match run(data) {
        ExprOutcome::Refused => ExprReached::Refused,
        ExprOutcome::DocumentRefused => ExprReached::DocumentRefused,
        ExprOutcome::Value(_) => ExprReached::Value,
        ExprOutcome::Failed(_) => ExprReached::Failed,
        ExprOutcome::OverBudget => ExprReached::OverBudget,
    }
}

/// [`expr_eval`]'s run, with its outcome in full.
pub fn run(data: &[u8]) -> ExprOutcome {
    run_as(data, false)
}

/// [`run`] with the original specification's evaluation (`expr::evaluate_original`), for the
/// `expr_differential` target.
pub fn run_original(data: &[u8]) -> ExprOutcome {
    run_as(data, true)
}

fn run_as(data: &[u8], original: bool) -> ExprOutcome {
    let (text, document) = split(data);
    let Ok(text) = std::str::from_utf8(text) else { return ExprOutcome::Refused };
    let program = match expr::compile(text, 16) {
        Ok(program) => program,
        Err(errors) => {
            assert!(!errors.is_empty(), "a refusal says why");
            for error in &errors {
                assert!(error.at <= text.len() && text.is_char_boundary(error.at), "{error:?} in {text:?}");
                assert!(!error.message.is_empty());
            }
            return ExprOutcome::Refused;
        }
    };
    let mut document = document.to_vec();
    let outcome = json::with_parsed(&mut document, 64, |doc| {
        let nodes: &json::Nodes<'_> = doc;
        let bump = Bump::new();
        let budget = Budget::new(EXPR_BUDGET, u64::MAX);
        let arena = Arena::new(&bump, &budget);
        let root = Val::from_tape(nodes, 0);
        let evaluate = if original { expr::evaluate_original } else { expr::evaluate };
        let outcome = match evaluate(&program, nodes, root, root, &arena) {
            Ok(value) => {
                let written = Doc { nodes }.to_json(value);
                if let Err(e) = serde_json::from_str::<serde_json::Value>(&written) {
                    panic!("{text:?} wrote invalid JSON ({e}): {written}");
                }
                ExprOutcome::Value(written)
            }
            Err(e) if matches!(e.kind, EvalErrorKind::OverBudget(_)) => ExprOutcome::OverBudget,
            Err(e) => ExprOutcome::Failed(e.kind.name()),
        };
        // Lists grow by doubling in the arena, which keeps the old buffers: a few times what was
        // charged, never what the expression would have built.
        assert!(
            bump.allocated_bytes() <= 4 * EXPR_BUDGET + (1 << 20),
            "{} bytes for {text:?}",
            bump.allocated_bytes()
        );
        outcome
    });
    outcome.unwrap_or(ExprOutcome::DocumentRefused)
}

/// Whether the expression uses only what the original JMESPath specification has, so that an
/// implementation of it can be compared with recast: no arithmetic, conditional, `let`,
/// variables, `$`, Community Edition or recast functions, no slice (which the Community Edition
/// also takes of strings) and no raw string with a backslash (whose escapes differ).
pub fn original_language_only(text: &str) -> bool {
    let Ok(program) = expr::compile(text, 16) else { return false };
    if text.contains('\\') {
        return false;
    }
    program.steps.iter().all(|step| match step {
        Step::Arith(..) | Step::Sign(..) | Step::Ternary(..) | Step::Let(..) | Step::Var(_) | Step::Root => {
            false
        }
        Step::Slice(..) | Step::SliceProject(..) => false,
        Step::Call(function, ..) => function.in_original_language(),
        _ => true,
    })
}

/// Whether the expression uses an expression reference (`&x`) other than as the argument of a
/// function that runs one, which recast refuses when it runs (invalid-type) and some
/// implementations take as a value.
pub fn expref_outside_a_call(text: &str) -> bool {
    let Ok(program) = expr::compile(text, 16) else { return false };
    let arguments: Vec<u32> = program
        .steps
        .iter()
        .filter_map(|step| match step {
            Step::Call(function, args, _) => Some(
                program.kids[args.range()]
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| function.takes_expref(*i))
                    .map(|(_, k)| *k),
            ),
            _ => None,
        })
        .flatten()
        .collect();
    program
        .steps
        .iter()
        .enumerate()
        .any(|(i, step)| matches!(step, Step::Expref(_)) && !arguments.contains(&(i as u32)))
}
