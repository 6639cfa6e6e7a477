//! The playground and console pages: their files served with their types and security headers,
//! and each page driven end to end in headless Chromium against the real binary
//! (`tests/browser/playground.mjs`, `tests/browser/console.mjs`).
//! Where Chromium, Node.js or playwright-core is missing the browser test says so in one line and
//! is skipped, unless `scripts/test.sh` installed them (it leaves a marker in the target directory):
//! then their absence fails it.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use http::Method;
use recast::config::Config;
use recast::secrets::Secret;

use crate::binary::Binary;
use crate::process::Group;
use crate::support::{Service, send};

#[tokio::test]
async fn the_page_and_its_files_are_served_with_their_types_and_policy() {
    // The page needs no admin token, even when recast has one.
    let service =
        Service::start(Config { admin_token: Some(Secret::new("admin-9f2")), ..Config::default() }).await;
    for (path, content_type, holds) in [
        ("/", "text/html; charset=utf-8", "<title>recast playground</title>"),
        ("/index.html", "text/html; charset=utf-8", r#"<script type="module" src="/playground.js">"#),
        ("/playground.js", "text/javascript; charset=utf-8", "/v1/preview?trace=true"),
        ("/playground.css", "text/css; charset=utf-8", "prefers-color-scheme: dark"),
        ("/editor.js", "text/javascript; charset=utf-8", "export class Editor"),
        ("/console", "text/html; charset=utf-8", "<title>recast console</title>"),
        ("/console.js", "text/javascript; charset=utf-8", "/v1/routes/${target.uuid}/stats?minutes=5"),
        ("/console.css", "text/css; charset=utf-8", ":focus-visible"),
    ] {
        let answer = send(Method::GET, &service.url(path), &[], "").await;
        assert_eq!(answer.status, 200, "{path}");
        assert_eq!(answer.header("content-type"), Some(content_type), "{path}");
        assert_eq!(answer.header("cache-control"), Some("no-cache"), "{path}");
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"), "{path}");
        let policy = answer.header("content-security-policy").unwrap_or("");
        assert!(
            policy.starts_with("default-src 'self';") && policy.contains("script-src 'self';"),
            "{policy}"
        );
        assert!(answer.header("x-request-id").is_some(), "{path}");
        assert!(String::from_utf8_lossy(&answer.body).contains(holds), "{path} holds {holds}");
    }
    for method in [Method::POST, Method::PUT, Method::DELETE, Method::HEAD] {
        for path in ["/", "/index.html", "/playground.js"] {
            let refused = send(method.clone(), &service.url(path), &[], "").await;
            assert_eq!(refused.status, 405, "{method} {path}");
            assert_eq!(refused.header("allow"), Some("GET"), "{method} {path}");
        }
    }
    send(Method::GET, &service.url("/playground.js.map"), &[], "").await.assert_problem(404, "not-found");
    service.stop().await;
}

/// Starts the binary and runs `tests/browser/playground.mjs` against it; its screenshots land in
/// the target directory's `tmp/playground`.
#[tokio::test]
async fn the_page_previews_marks_problems_and_builds_a_registration_in_chromium() {
    let Some(browser) = browser_parts("the playground's") else { return };
    let dir = tempfile::TempDir::new().unwrap();
    let binary = Binary::start(dir.path()).await;
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("playground");
    let base = format!("http://{}", binary.addr);
    let args = [base, artifacts.display().to_string()];
    run_in_chromium(&browser.join("playground.mjs"), &args, "the playground's", &binary).await;
}

/// Starts the binary with an admin token (and another without) and runs
/// `tests/browser/console.mjs` against them; its screenshots land in the target directory's
/// `tmp/console` (docs/console.md shows them).
#[tokio::test]
async fn the_console_signs_in_lists_120_routes_filters_them_and_shows_their_health_in_chromium() {
    let Some(browser) = browser_parts("the console's") else { return };
    const TOKEN: &str = "console-admin-5c2e";
    let dir = tempfile::TempDir::new().unwrap();
    let binary = Binary::start_with(dir.path(), &[("RECAST_ADMIN_TOKEN", TOKEN)]).await;
    // A second service, without an admin token: the console says its admin endpoints are open.
    let open_dir = tempfile::TempDir::new().unwrap();
    let open = Binary::start(open_dir.path()).await;
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    let args = [
        format!("http://{}", binary.addr),
        TOKEN.to_owned(),
        artifacts.display().to_string(),
        format!("http://{}", open.addr),
    ];
    run_in_chromium(&browser.join("console.mjs"), &args, "the console's", &binary).await;
}

/// `tests/browser`, when Chromium, Node.js and the npm packages are here. Otherwise says in one
/// line that `whose` browser test did not run and answers `None`, unless `scripts/test.sh`
/// installed them (its marker is in the target directory): then their absence fails the test.
fn browser_parts(whose: &str) -> Option<std::path::PathBuf> {
    let browser = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("browser");
    let Some(why) = missing_browser_parts(&browser) else { return Some(browser) };
    let marker = Path::new(env!("CARGO_TARGET_TMPDIR")).join(BROWSER_MARKER);
    assert!(
        !marker.exists(),
        "{why}, but scripts/test.sh installed the browser test's parts ({} says so): \
         run ./scripts/test.sh again to reinstall them",
        marker.display()
    );
    // Straight to stderr, so the line shows even when the test harness captures output: the
    // `ok` the harness prints for this test then means it did not run, and says so.
    let _ = writeln!(
        std::io::stderr(),
        "NOT RUN: {whose} browser test did not run, because {why}; its `ok` below means only \
         that. ./scripts/test.sh installs what it needs and runs it."
    );
    None
}

/// Runs `node script args…` and fails with its output and `binary`'s log unless it succeeds.
async fn run_in_chromium(script: &Path, args: &[String], whose: &str, binary: &Binary) {
    let (script, args) = (script.to_owned(), args.to_vec());
    // Node.js and the Chromium it starts form one group, killed whole once node exits.
    let output = tokio::task::spawn_blocking(move || {
        let mut command = Command::new("node");
        command.arg(script).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        Group::spawn(&mut command).expect("node runs").wait_with_output().expect("node's output")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{whose} browser test failed ({}):\n{stdout}\n{stderr}\nrecast's log:\n{}",
        output.status,
        binary.log_text()
    );
    println!("{stdout}");
}

/// The file `scripts/test.sh` (`ensure_browser`) writes in the target directory's `tmp` once it has
/// installed Chromium, Node.js and playwright-core.
const BROWSER_MARKER: &str = "browser-test-required";

/// Why the browser test cannot run here, if it cannot.
fn missing_browser_parts(browser: &Path) -> Option<String> {
    if !Path::new("/usr/bin/chromium").is_file() {
        return Some("/usr/bin/chromium is missing (Debian package chromium)".to_owned());
    }
    if !Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some("node is missing (Node.js 20 or newer)".to_owned());
    }
    for package in ["playwright-core", "axe-core"] {
        if !browser.join("node_modules").join(package).is_dir() {
            return Some(format!("{package} is not installed (npm ci --prefix tests/browser)"));
        }
    }
    None
}
