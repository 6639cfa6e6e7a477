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
    let engine = ["exec", "expr", "rules", "json", "plan.rs"];
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
fn the_compiler_refuses_unsafe_code_outside_the_json_writer() {
    // The compiler enforces it (`#![deny(unsafe_code)]`); this keeps the one exception single.
    for root in ["lib.rs", "main.rs"] {
        let text = std::fs::read_to_string(src().join(root)).expect("crate root");
        assert!(text.contains("#![deny(unsafe_code)]"), "{root} does not deny unsafe code");
    }
    let mut allowed = Vec::new();
    for file in rust_files(&src()) {
        let text = std::fs::read_to_string(&file).expect("source file");
        for (i, line) in text.lines().enumerate() {
            if line.contains("allow(unsafe_code)") {
                let next = text.lines().nth(i + 1).unwrap_or_default().trim().to_owned();
                allowed.push((file.strip_prefix(src()).unwrap().display().to_string(), next));
            }
        }
    }
    assert_eq!(allowed, [("json/mod.rs".to_owned(), "pub mod write;".to_owned())]);
    let writer = std::fs::read_to_string(src().join("json").join("write.rs")).unwrap();
    let blocks = writer.matches("unsafe {").count();
    let reasons = writer.matches("// SAFETY:").count();
    assert!(reasons >= blocks, "{blocks} unsafe blocks but {reasons} SAFETY comments");
}
