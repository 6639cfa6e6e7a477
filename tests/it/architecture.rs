//! The invariants of ARCHITECTURE.md that can be read off the source: which modules may import
//! which, which alone touch RocksDB and PostgreSQL, and where `unsafe` may appear.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_engine_imports_no_server_storage_upstream_or_config() {
    let engine = ["exec", "expr", "rules", "json", "plan"];
    let forbidden = [
        "crate::server",
        "crate::config",
        "crate::storage",
        "crate::upstream",
        "tokio",
        "hyper",
        "std::net",
        "std::fs",
    ];
    let mut checked = 0;
    for part in engine {
        let path = src().join(part);
        let files = if path.is_dir() { rust_files(&path) } else { vec![path] };
        // A module's own tests may read their data files (the JMESPath compliance suites).
        for file in files.into_iter().filter(|f| !f.ends_with("tests.rs")) {
            let text = std::fs::read_to_string(&file).expect("source file");
            for name in forbidden {
                assert!(!text.contains(name), "{} mentions {name}", file.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 9, "only {checked} engine files found");
}

/// Asserts that only the files under `module` (a directory of `src/`) mention any of `names`,
/// and that some of them do.
fn only_module_mentions(module: &str, names: &[&str]) {
    let inside = src().join(module);
    let mut found = false;
    for file in rust_files(&src()) {
        let text = std::fs::read_to_string(&file).expect("source file");
        let uses: Vec<&str> = names.iter().copied().filter(|name| text.contains(name)).collect();
        if file.starts_with(&inside) {
            found |= !uses.is_empty();
        } else {
            assert!(uses.is_empty(), "{} mentions {uses:?}, which only src/{module}/ may", file.display());
        }
    }
    assert!(found, "src/{module}/ is where {names:?} are used");
}

#[test]
fn only_storage_touches_rocksdb() {
    only_module_mentions("storage", &["rocksdb::", "use rocksdb"]);
}

#[test]
fn only_cluster_touches_postgresql() {
    only_module_mentions("cluster", &["tokio_postgres", "deadpool_postgres", "postgres_rustls"]);
}

#[test]
fn the_compiler_refuses_unsafe_code_outside_the_json_writer_and_the_index_kernels() {
    // The compiler enforces it (`#![deny(unsafe_code)]`); this keeps the two exceptions these.
    for root in ["lib.rs", "main.rs"] {
        let text = std::fs::read_to_string(src().join(root)).expect("crate root");
        assert!(text.contains("#![deny(unsafe_code)]"), "{root} does not deny unsafe code");
    }
    let mut allowed = Vec::new();
    let mut compiled_for = Vec::new();
    for file in rust_files(&src()) {
        let text = std::fs::read_to_string(&file).expect("source file");
        let name = file.strip_prefix(src()).unwrap().display().to_string();
        for (i, line) in text.lines().enumerate() {
            if line.contains("allow(unsafe_code)") {
                let next = text.lines().nth(i + 1).unwrap_or_default().trim().to_owned();
                allowed.push((name.clone(), next));
            }
            if line.contains("target_feature(enable") {
                compiled_for.push(name.clone());
            }
        }
    }
    assert_eq!(
        allowed,
        [
            ("json/mod.rs".to_owned(), "pub mod write;".to_owned()),
            ("json/mod.rs".to_owned(), "pub mod simd;".to_owned())
        ]
    );
    for module in ["write.rs", "simd.rs"] {
        let text = std::fs::read_to_string(src().join("json").join(module)).unwrap();
        let blocks = text.matches("unsafe {").count();
        let reasons = text.matches("// SAFETY:").count();
        assert!(reasons >= blocks, "{module}: {blocks} unsafe blocks but {reasons} SAFETY comments");
    }
    // Functions compiled for instructions a processor may lack live only in the kernels' private
    // `avx2` module, which the detected dispatch alone reaches.
    assert!(compiled_for.iter().all(|file| file == "json/simd.rs"), "{compiled_for:?}");
    let kernels = std::fs::read_to_string(src().join("json").join("simd.rs")).unwrap();
    let private = kernels.find("\nmod avx2 {").expect("the kernels' avx2 module");
    assert!(kernels.match_indices("#[target_feature(enable").all(|(at, _)| at > private));
    assert!(!kernels[private..].contains("pub fn") && !kernels[private..].contains("pub(crate)"));
}

/// The top-level module of `src/` a file belongs to: `upstream` for `upstream/h2/frames.rs`,
/// `plan` for `plan/mod.rs`, `table` for `table.rs`; `None` for the crate roots.
fn module_of(file: &Path) -> Option<String> {
    let first = file.strip_prefix(src()).ok()?.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib" && name != "main").then_some(name)
}

/// A file's code without comments, and without the test module its end may hold: what it
/// builds with, not what its tests or its words mention.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
    text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// The top-level modules `code` names: `crate::name` anywhere, and each name in a
/// `crate::{a, b::c}` group.
fn modules_named(code: &str) -> std::collections::BTreeSet<String> {
    let ident =
        |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut named = std::collections::BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = group.split('}').next().unwrap_or_default();
                named.extend(group.split(',').map(|part| ident(part.trim())).filter(|n| !n.is_empty()));
            }
            None => {
                named.insert(ident(rest));
            }
        }
    }
    named.retain(|name| !name.is_empty() && name != "self");
    named
}

/// A cycle of `graph` (module → the modules it names, with the files that name each), as the
/// modules along it, if it has one.
fn find_cycle(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, Vec<String>>>,
) -> Option<Vec<String>> {
    fn visit(
        graph: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, Vec<String>>>,
        module: &str,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_owned());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flat_map(|edges| edges.keys()) {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph.keys().find_map(|module| visit(graph, module, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_import_each_other_without_a_cycle() {
    use std::collections::BTreeMap;
    let mut graph: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for file in rust_files(&src()).into_iter().filter(|f| !f.ends_with("tests.rs")) {
        let Some(module) = module_of(&file) else { continue };
        let code = code_of(&std::fs::read_to_string(&file).expect("source file"));
        let edges = graph.entry(module.clone()).or_default();
        for named in modules_named(&code).into_iter().filter(|named| *named != module) {
            edges.entry(named).or_default().push(file.strip_prefix(src()).unwrap().display().to_string());
        }
    }
    // Names that are not modules of the crate (a macro's `crate::logged!`) are no edges.
    let modules: Vec<String> = graph.keys().cloned().collect();
    for edges in graph.values_mut() {
        edges.retain(|named, _| modules.contains(named));
    }
    let edges: usize = graph.values().map(BTreeMap::len).sum();
    assert!(
        modules.len() >= 20 && edges >= 50,
        "{} modules, {edges} imports: the walk found too little",
        modules.len()
    );
    if let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|pair| format!("{} → {} (in {})", pair[0], pair[1], graph[&pair[0]][&pair[1]].join(", ")))
            .collect();
        panic!("the modules import each other in a circle:\n{}", steps.join("\n"));
    }
    // The search finds a circle where there is one.
    let mut circular = graph.clone();
    circular.entry("json".to_owned()).or_default().insert("server".to_owned(), vec!["(added)".to_owned()]);
    assert!(find_cycle(&circular).is_some(), "json → server → ... → json is a circle");
}
