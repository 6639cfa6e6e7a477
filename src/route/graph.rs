//! The graph of a composed route's sources (SPEC §2.3): `after` read into waits (unknown names
//! located), an order in which each source comes after those it waits for (or the cycle that
//! prevents one), and each source's closure: the sources it waits for directly or through
//! theirs, which its expressions may read. Pure.

use crate::json::push_pointer;
use crate::rules::Problem;

/// The sources' waits, checked.
pub struct Graph {
    /// Each source's direct waits, by index.
    pub waits: Vec<Vec<usize>>,
    /// The sources in an order where each comes after those it waits for.
    pub order: Vec<usize>,
    /// Each source's closure, sorted.
    pub closure: Vec<Vec<usize>>,
}

/// `/sources/<name>`.
pub fn location_of(name: &str) -> String {
    let mut at = "/sources".to_owned();
    push_pointer(&mut at, name);
    at
}

impl Graph {
    /// The graph of sources named `names`, each waiting for its `after`; `None` when they wait
    /// for each other in a cycle (the problem added). Unknown names are problems too, and left
    /// out.
    pub fn of<'a>(
        names: &[&str],
        after: impl Iterator<Item = &'a [String]>,
        problems: &mut Vec<Problem>,
    ) -> Option<Graph> {
        let mut waits: Vec<Vec<usize>> = Vec::new();
        for (source, after) in names.iter().zip(after) {
            let mut direct = Vec::new();
            for (i, name) in after.iter().enumerate() {
                match names.iter().position(|n| n == name) {
                    Some(j) if !direct.contains(&j) => direct.push(j),
                    Some(_) => {}
                    None => problems.push(Problem::new(
                        format!("{}/after/{i}", location_of(source)),
                        crate::suggest::unknown("source", name, names),
                    )),
                }
            }
            waits.push(direct);
        }
        let order = match order(&waits) {
            Ok(order) => order,
            Err(cycle) => {
                let path: Vec<&str> = cycle.iter().map(|&i| names[i]).collect();
                problems.push(Problem::new(
                    format!("{}/after", location_of(names[cycle[0]])),
                    format!("the sources wait for each other in a cycle: {}", path.join(" → ")),
                ));
                return None;
            }
        };
        let mut closure: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
        for &i in &order {
            let mut mine: Vec<usize> = Vec::new();
            for &j in &waits[i] {
                mine.push(j);
                mine.extend(closure[j].iter().copied());
            }
            mine.sort_unstable();
            mine.dedup();
            closure[i] = mine;
        }
        Some(Graph { waits, order, closure })
    }
}

/// An order of the sources in which each comes after those it waits for, or a cycle (its
/// sources, the first repeated at its end).
fn order(waits: &[Vec<usize>]) -> Result<Vec<usize>, Vec<usize>> {
    // 0: not seen, 1: on the path, 2: done.
    let mut state = vec![0u8; waits.len()];
    let mut order = Vec::with_capacity(waits.len());
    let mut path = Vec::new();
    fn visit(
        i: usize,
        waits: &[Vec<usize>],
        state: &mut [u8],
        order: &mut Vec<usize>,
        path: &mut Vec<usize>,
    ) -> Result<(), Vec<usize>> {
        match state[i] {
            2 => return Ok(()),
            1 => {
                let from = path.iter().position(|&p| p == i).unwrap_or(0);
                let mut cycle = path[from..].to_vec();
                cycle.push(i);
                return Err(cycle);
            }
            _ => {}
        }
        state[i] = 1;
        path.push(i);
        for &j in &waits[i] {
            visit(j, waits, state, order, path)?;
        }
        path.pop();
        state[i] = 2;
        order.push(i);
        Ok(())
    }
    for i in 0..waits.len() {
        visit(i, waits, &mut state, &mut order, &mut path)?;
    }
    Ok(order)
}
