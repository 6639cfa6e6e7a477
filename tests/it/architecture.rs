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

/// The import graph of the files of one module: which file uses an item another file of the
/// module defines, through a `use` or a path (`super::x::Y`, `crate::m::x::Y`, `self::x`, or an
/// alias a `use` made), a re-export followed to the file that defines the item. A `pub use` the
/// file does not use itself is no import of its own; test modules, and code built only for tests
/// or fuzzing, are left out.
mod files {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// A module path below the crate root (`["upstream", "oauth"]`).
    type ModPath = Vec<String>;

    /// One file: its module path, its code, its `use` declarations.
    struct File {
        name: String,
        module: ModPath,
        code: String,
        /// Each `use` flattened: the path as written, the name it brings in, whether it is `pub`.
        uses: Vec<(Vec<String>, String, bool)>,
    }

    pub struct Crate {
        files: BTreeMap<ModPath, File>,
    }

    impl File {
        /// Whether the file's code defines an item named `name`.
        fn defines(&self, name: &str) -> bool {
            const KINDS: [&str; 9] =
                ["struct", "enum", "fn", "trait", "type", "const", "static", "mod", "union"];
            let words: Vec<&str> = self.code.split_whitespace().collect();
            words.windows(2).any(|pair| KINDS.contains(&pair[0]) && super::files::ident_of(pair[1]) == name)
        }
    }

    fn ident_of(s: &str) -> &str {
        ident(s)
    }

    /// `text` with comments and the insides of string and character literals blanked, so
    /// that no word in them is taken for code.
    fn blank_comments_and_strings(text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let rest = &bytes[i..];
            if rest.starts_with(b"//") {
                while i < bytes.len() && bytes[i] != b'\n' {
                    out.push(b' ');
                    i += 1;
                }
            } else if rest.starts_with(b"/*") {
                let mut depth = 0;
                while i < bytes.len() {
                    if bytes[i..].starts_with(b"/*") {
                        depth += 1;
                        out.extend_from_slice(b"  ");
                        i += 2;
                    } else if bytes[i..].starts_with(b"*/") {
                        depth -= 1;
                        out.extend_from_slice(b"  ");
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        out.push(if bytes[i] == b'\n' { b'\n' } else { b' ' });
                        i += 1;
                    }
                }
            } else if rest.starts_with(b"r#\"") || rest.starts_with(b"r\"") || rest.starts_with(b"br\"") {
                let open = rest.iter().position(|&b| b == b'"').unwrap();
                let hashes = rest[..open].iter().filter(|&&b| b == b'#').count();
                let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
                out.extend_from_slice(&rest[..=open]);
                i += open + 1;
                while i < bytes.len() && !bytes[i..].starts_with(&close) {
                    out.push(if bytes[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            } else if bytes[i] == b'"' {
                out.push(b'"');
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    let skip = if bytes[i] == b'\\' { 2 } else { 1 };
                    for _ in 0..skip.min(bytes.len() - i) {
                        out.push(if bytes[i] == b'\n' { b'\n' } else { b' ' });
                        i += 1;
                    }
                }
            } else if bytes[i] == b'\'' && rest.len() >= 3 && (rest[2] == b'\'' || rest[1] == b'\\') {
                // A character literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
                let end = rest[1..].iter().position(|&b| b == b'\'').map_or(1, |p| p + 2);
                out.extend(std::iter::repeat_n(b' ', end));
                i += end;
                continue;
            } else {
                out.push(bytes[i]);
                i += 1;
                continue;
            }
            if i < bytes.len() && bytes[i] == b'"' {
                out.push(b'"');
                i += 1;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `code` without the items built only for tests or fuzzing (`#[cfg(test)]`,
    /// `#[cfg(feature = "fuzzing")]`, either in `any(...)`).
    fn without_test_items(code: &str) -> String {
        let mut out = String::with_capacity(code.len());
        let mut rest = code;
        while let Some(at) = rest.find("#[cfg(") {
            let attribute_end = rest[at..].find(")]").map_or(rest.len(), |e| at + e + 2);
            let attribute = &rest[at..attribute_end];
            out.push_str(&rest[..at]);
            let gated = attribute.contains("test") || attribute.contains("fuzzing");
            if !gated || attribute.contains("not(") {
                out.push_str(attribute);
                rest = &rest[attribute_end..];
                continue;
            }
            // The item after it: to its `;`, or to the `}` closing its first `{`.
            let item = &rest[attribute_end..];
            let mut depth = 0usize;
            let mut end = item.len();
            for (i, c) in item.char_indices() {
                match c {
                    ';' if depth == 0 => {
                        end = i + 1;
                        break;
                    }
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &item[end..];
        }
        out.push_str(rest);
        out
    }

    /// `code` with the `super::` of code inside inline modules read from the file's own module:
    /// in `mod a { mod b { .. } }`, `super::super::X` inside `b` names the file's `X` (written
    /// `self::X`), and one more `super::` its parent's.
    fn inline_modules_flattened(code: &str) -> String {
        let mut out = String::with_capacity(code.len());
        // The brace depth at which each enclosing inline module opened.
        let mut open: Vec<usize> = Vec::new();
        let mut depth = 0usize;
        let mut i = 0;
        while i < code.len() {
            let rest = &code[i..];
            let word_start = i == 0 || !code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
            if word_start && rest.starts_with("mod ") {
                let name = ident(&rest[4..]);
                let after = rest[4 + name.len()..].trim_start();
                if !name.is_empty() && after.starts_with('{') {
                    let skip = rest.len() - after.len();
                    out.push_str(&rest[..skip + 1]);
                    depth += 1;
                    open.push(depth);
                    i += skip + 1;
                    continue;
                }
            }
            if word_start && rest.starts_with("super::") {
                let mut k = 0;
                while code[i + 7 * k..].starts_with("super::") {
                    k += 1;
                }
                let d = open.len();
                if d > 0 {
                    out.push_str("self::");
                    for _ in d..k {
                        out.push_str("super::");
                    }
                    i += 7 * k;
                    continue;
                }
            }
            let c = rest.chars().next().unwrap();
            match c {
                '{' => depth += 1,
                '}' => {
                    if open.last() == Some(&depth) {
                        open.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                _ => {}
            }
            out.push(c);
            i += c.len_utf8();
        }
        out
    }

    /// Whether `code` names `name` as an item (not a field or method of the same name: `.name`
    /// and `name: T`).
    fn names(code: &str, name: &str) -> bool {
        let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        code.match_indices(name).any(|(at, _)| {
            let before = code[..at].chars().next_back();
            let after = &code[at + name.len()..];
            let declared = ["fn", "mod", "struct", "enum", "trait", "type", "const", "static"]
                .iter()
                .any(|kind| code[..at].trim_end().ends_with(kind));
            !before.is_some_and(|c| is_word(c) || c == '.')
                && !declared
                && !after.starts_with(is_word)
                && (!after.trim_start().starts_with(':') || after.starts_with("::"))
        })
    }

    fn ident(s: &str) -> &str {
        let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
        &s[..end]
    }

    /// A use tree (`a::b::{c, d::{e, f as g}}`) flattened into paths and the names they bring.
    fn flatten(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = tree[..open]
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut base = prefix.to_vec();
            base.extend(head);
            // Split at commas outside braces.
            let (mut depth, mut from) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        flatten(&inner[from..i], &base, out);
                        from = i + 1;
                    }
                    _ => {}
                }
            }
            flatten(&inner[from..], &base, out);
            return;
        }
        if tree.is_empty() {
            return;
        }
        let (path, alias) = match tree.split_once(" as ") {
            Some((path, alias)) => (path, Some(alias.trim())),
            None => (tree, None),
        };
        let mut segments = prefix.to_vec();
        segments.extend(path.split("::").map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned));
        let last = segments.last().cloned().unwrap_or_default();
        let name = alias.map(str::to_owned).unwrap_or_else(|| {
            if last == "self" { prefix.last().cloned().unwrap_or_default() } else { last }
        });
        if segments.last().is_some_and(|s| s == "self") {
            segments.pop();
        }
        out.push((segments, name));
    }

    /// The `use` declarations of `code`, flattened, and `code` without them.
    fn uses_of(code: &str) -> (Vec<(Vec<String>, String, bool)>, String) {
        let mut uses = Vec::new();
        let mut rest_code = String::with_capacity(code.len());
        let mut rest = code;
        loop {
            let found = ["use ", "pub use ", "pub(crate) use ", "pub(super) use ", "pub(in "]
                .iter()
                .filter_map(|start| {
                    let mut from = 0;
                    while let Some(at) = rest[from..].find(start) {
                        let at = from + at;
                        let line_start = rest[..at].rfind('\n').map_or(0, |n| n + 1);
                        if rest[line_start..at].trim().is_empty() {
                            return Some(at);
                        }
                        from = at + start.len();
                    }
                    None
                })
                .min();
            let Some(at) = found else { break };
            let Some(semicolon) = rest[at..].find(';').map(|s| at + s) else { break };
            let statement = &rest[at..semicolon];
            rest_code.push_str(&rest[..at]);
            rest = &rest[semicolon + 1..];
            let Some(use_at) = statement.find("use ") else { continue };
            let public = statement.starts_with("pub");
            let mut flat = Vec::new();
            flatten(&statement[use_at + 4..], &[], &mut flat);
            uses.extend(flat.into_iter().map(|(path, name)| (path, name, public)));
        }
        rest_code.push_str(rest);
        (uses, rest_code)
    }

    impl Crate {
        pub fn read(src: &Path) -> Crate {
            let mut files = BTreeMap::new();
            for path in super::rust_files(src) {
                let relative = path.strip_prefix(src).unwrap();
                let mut module: ModPath =
                    relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                let last = module.pop().unwrap();
                let stem = last.trim_end_matches(".rs").to_owned();
                if stem == "tests" || module.iter().any(|m| m == "tests") {
                    continue;
                }
                if stem != "mod" && stem != "lib" && stem != "main" {
                    module.push(stem);
                }
                if last == "main.rs" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let code = inline_modules_flattened(&without_test_items(&blank_comments_and_strings(&text)));
                let (uses, code) = uses_of(&code);
                let name = relative.display().to_string();
                files.insert(module.clone(), File { name, module, code, uses });
            }
            Crate { files }
        }

        /// `path` as written in `file`, absolute (below the crate root), when it is a path of
        /// this crate.
        fn absolute(&self, file: &File, path: &[String]) -> Option<ModPath> {
            let (first, rest) = path.split_first()?;
            let mut base = match first.as_str() {
                "crate" => Vec::new(),
                "self" => file.module.clone(),
                "super" => {
                    let mut base = file.module.clone();
                    base.pop();
                    let mut rest = rest;
                    while rest.first().is_some_and(|s| s == "super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    base.extend(rest.iter().cloned());
                    return Some(base);
                }
                name => {
                    let mut child = file.module.clone();
                    child.push(name.to_owned());
                    if self.files.contains_key(&child) {
                        child
                    } else {
                        let (alias, _, _) = file.uses.iter().find(|(p, n, _)| n == name && p.len() > 1)?;
                        self.absolute(file, alias)?
                    }
                }
            };
            base.extend(rest.iter().cloned());
            Some(base)
        }

        /// The file that defines what `path` (absolute) names, following re-exports.
        fn defining(&self, path: &[String], hops: usize) -> Option<&File> {
            let split = (0..=path.len()).rev().find(|&n| self.files.contains_key(&path[..n]))?;
            let file = &self.files[&path[..split]];
            let item = path.get(split)?;
            if hops > 0
                && !file.defines(item)
                && let Some((from, _, _)) = file.uses.iter().find(|(_, name, _)| name == item)
                && let Some(target) = self.absolute(file, from)
            {
                return self.defining(&target, hops - 1).or(Some(file));
            }
            Some(file)
        }

        /// The files of `module` (`src/<module>/`) and the ones each imports, with what.
        pub fn graph(&self, module: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
            let mut graph: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
            for file in self.files.values().filter(|f| f.module.first().is_some_and(|m| m == module)) {
                let edges = graph.entry(file.name.clone()).or_default();
                let mut seen = BTreeSet::new();
                let mut add = |target: Option<&File>, what: String| {
                    if let Some(target) = target
                        && target.module.first().is_some_and(|m| m == module)
                        && target.name != file.name
                        && seen.insert((target.name.clone(), what.clone()))
                    {
                        edges.entry(target.name.clone()).or_default().push(what);
                    }
                };
                for (path, name, public) in &file.uses {
                    // A re-export the file does not use itself imports nothing for it.
                    let used = !public || names(&file.code, name);
                    if !used {
                        continue;
                    }
                    if let Some(absolute) = self.absolute(file, path) {
                        if self.files.contains_key(&absolute) {
                            // A module brought in by name: its uses are paths below.
                            continue;
                        }
                        add(self.defining(&absolute, 5), format!("use {}", path.join("::")));
                    }
                }
                // Paths in the code: `crate::`, `super::`, `self::` and a module's name or alias.
                let code = &file.code;
                for (at, _) in code.match_indices("::") {
                    let start = code[..at]
                        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                        .map_or(0, |s| s + 1);
                    if start != at - ident(&code[start..]).len() && !code[start..at].contains("::") {
                        continue;
                    }
                    // Only a path's first `::` starts one.
                    if code[start..at].contains("::") {
                        continue;
                    }
                    let mut end = at;
                    while code[end..].starts_with("::") {
                        let next = ident(&code[end + 2..]);
                        if next.is_empty() {
                            break;
                        }
                        end += 2 + next.len();
                    }
                    let path: Vec<String> = code[start..end].split("::").map(str::to_owned).collect();
                    if path.len() < 2 {
                        continue;
                    }
                    if let Some(absolute) = self.absolute(file, &path)
                        && !self.files.contains_key(&absolute)
                    {
                        add(self.defining(&absolute, 5), path.join("::"));
                    }
                }
            }
            graph
        }
    }
}

/// Every module's files import each other without a circle: a file that names an item of
/// another file of its module never is, however indirectly, named back. (`expr` keeps one: its
/// compiled form and its errors live in `mod.rs`, which calls the lexer, parser and lowering
/// that use them; it is listed, and must be taken off the list once it is gone.)
#[test]
fn the_files_of_each_module_import_each_other_without_a_cycle() {
    let krate = files::Crate::read(&src());
    let known_circles = ["expr"];
    let mut modules: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            path.is_dir().then(|| path.file_name()?.to_str().map(str::to_owned)).flatten()
        })
        .collect();
    modules.sort();
    let mut total = 0;
    for module in &modules {
        let graph = krate.graph(module);
        total += graph.values().map(|edges| edges.len()).sum::<usize>();
        let cycle = find_cycle(&graph);
        if known_circles.contains(&module.as_str()) {
            assert!(
                cycle.is_some(),
                "{module}'s files no longer import each other in a circle: take it off the list"
            );
            continue;
        }
        if let Some(cycle) = cycle {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|pair| format!("{} → {} ({})", pair[0], pair[1], graph[&pair[0]][&pair[1]].join(", ")))
                .collect();
            panic!("the files of {module} import each other in a circle:\n{}", steps.join("\n"));
        }
    }
    assert!(
        modules.len() >= 12 && total >= 200,
        "{} modules, {total} imports: the walk found too little",
        modules.len()
    );
    // The walk sees what the four modules split by job import, so it would see a circle: the
    // edges that one more import would close are there.
    let upstream = krate.graph("upstream");
    assert!(upstream["upstream/mod.rs"].contains_key("upstream/error.rs"), "{upstream:#?}");
    assert!(upstream["upstream/oauth/fetch.rs"].contains_key("upstream/mod.rs"), "{upstream:#?}");
    let server = krate.graph("server");
    assert!(server["server/call.rs"].contains_key("server/state.rs"), "through server/mod.rs's re-export");
    let route = krate.graph("route");
    assert!(route["route/request.rs"].contains_key("route/render.rs"));
    let json = krate.graph("json");
    assert!(json["json/ondemand.rs"].contains_key("json/doc.rs"));
    let mut closed = upstream.clone();
    closed
        .get_mut("upstream/error.rs")
        .unwrap()
        .insert("upstream/mod.rs".to_owned(), vec!["(added)".to_owned()]);
    assert!(find_cycle(&closed).is_some());
}
