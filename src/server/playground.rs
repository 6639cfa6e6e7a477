//! The pages built into the binary: the playground at `GET /`, which previews rules on a sample
//! through `POST /v1/preview?trace=true` as the user types and builds the body that registers
//! them as a route; and the routes console at `GET /console`, which lists the registered routes
//! with their health through the admin API, with the admin token the user gives it.

use bytes::Bytes;
use http::{HeaderValue, Method, header};
use http_body_util::Full;

use super::{ApiError, Response};

/// The page loads only its own files and talks only to this service: no inline script or style,
/// no other origin, no plugins, no framing by other pages.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// One file of the page.
struct Asset {
    content_type: &'static str,
    body: &'static str,
}

const INDEX: Asset =
    Asset { content_type: "text/html; charset=utf-8", body: include_str!("playground/index.html") };
const SCRIPT: Asset =
    Asset { content_type: "text/javascript; charset=utf-8", body: include_str!("playground/playground.js") };
const STYLE: Asset =
    Asset { content_type: "text/css; charset=utf-8", body: include_str!("playground/playground.css") };
const EDITOR: Asset =
    Asset { content_type: "text/javascript; charset=utf-8", body: include_str!("playground/editor.js") };
const CONSOLE: Asset =
    Asset { content_type: "text/html; charset=utf-8", body: include_str!("playground/console.html") };
const CONSOLE_SCRIPT: Asset =
    Asset { content_type: "text/javascript; charset=utf-8", body: include_str!("playground/console.js") };
const CONSOLE_STYLE: Asset =
    Asset { content_type: "text/css; charset=utf-8", body: include_str!("playground/console.css") };

/// The file a one-segment path names (the path `/` is the segment `""`).
fn asset(segment: &str) -> Option<&'static Asset> {
    match segment {
        "" | "index.html" => Some(&INDEX),
        "playground.js" => Some(&SCRIPT),
        "playground.css" => Some(&STYLE),
        "editor.js" => Some(&EDITOR),
        "console" => Some(&CONSOLE),
        "console.js" => Some(&CONSOLE_SCRIPT),
        "console.css" => Some(&CONSOLE_STYLE),
        _ => None,
    }
}

/// Whether a one-segment path is a file of the page.
pub(super) fn has_file(segment: &str) -> bool {
    asset(segment).is_some()
}

/// Answers a request for a file of the page; only `GET` is allowed.
pub(super) fn file(method: &Method, segment: &str) -> Result<Response, ApiError> {
    let asset = asset(segment).ok_or(ApiError::NotFound)?;
    if method != Method::GET {
        return Err(ApiError::MethodNotAllowed { allow: "GET" });
    }
    let mut response = http::Response::new(Full::new(Bytes::from_static(asset.body.as_bytes())));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    // The files change with the binary, so a browser asks again rather than keep an old page.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    fn header(response: &Response, name: impl http::header::AsHeaderName) -> &str {
        response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    #[test]
    fn each_file_has_its_type_and_the_security_headers() {
        for (segment, content_type) in [
            ("", "text/html; charset=utf-8"),
            ("index.html", "text/html; charset=utf-8"),
            ("playground.js", "text/javascript; charset=utf-8"),
            ("playground.css", "text/css; charset=utf-8"),
            ("editor.js", "text/javascript; charset=utf-8"),
            ("console", "text/html; charset=utf-8"),
            ("console.js", "text/javascript; charset=utf-8"),
            ("console.css", "text/css; charset=utf-8"),
        ] {
            assert!(has_file(segment), "{segment}");
            let response = file(&Method::GET, segment).unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{segment}");
            assert_eq!(header(&response, header::CONTENT_TYPE), content_type, "{segment}");
            assert_eq!(header(&response, header::CACHE_CONTROL), "no-cache");
            assert_eq!(header(&response, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
            let policy = header(&response, header::CONTENT_SECURITY_POLICY);
            assert!(policy.starts_with("default-src 'self';"), "{policy}");
            assert!(!policy.contains("unsafe"), "{policy}");
        }
    }

    #[test]
    fn other_methods_are_refused_and_other_names_are_not_served() {
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::HEAD] {
            let refused = file(&method, "").unwrap_err();
            assert!(matches!(refused, ApiError::MethodNotAllowed { allow: "GET" }), "{method}: {refused:?}");
        }
        for name in ["index.htm", "playground", "playground.js.map", "v1", "console.html", "console.js.map"] {
            assert!(!has_file(name), "{name}");
        }
    }

    /// The policy forbids inline code, so the pages must keep every script and style in their
    /// files.
    #[test]
    fn the_pages_have_no_inline_code_and_load_only_served_files() {
        for page in [INDEX.body, CONSOLE.body] {
            no_inline_code(page);
        }
        for file in [SCRIPT.body, STYLE.body, EDITOR.body, CONSOLE_SCRIPT.body, CONSOLE_STYLE.body] {
            assert!(!file.contains("http://") && !file.contains("https://"), "a file reaches out");
        }
        // The scripts are modules: what they import is served here too.
        for script in [SCRIPT.body, EDITOR.body, CONSOLE_SCRIPT.body] {
            for line in script.lines().filter(|line| line.starts_with("import ")) {
                let target = line.split(" from '").nth(1).and_then(|rest| rest.split('\'').next()).unwrap();
                assert!(
                    target.strip_prefix('/').is_some_and(has_file),
                    "a script imports {target}, which is not served here"
                );
            }
        }
    }

    fn no_inline_code(page: &str) {
        assert!(!page.contains("<style"), "inline style element");
        assert!(!page.contains(" style="), "inline style attribute");
        let loaded = page.matches("<script type=\"module\" src=\"/").count();
        assert_eq!(page.matches("<script").count(), loaded, "inline script");
        for attribute in [" onclick=", " onload=", " oninput=", " onchange=", " onsubmit=", "javascript:"] {
            assert!(!page.contains(attribute), "inline handler {attribute}");
        }
        for quoted in ["src=\"", "href=\""] {
            for (at, _) in page.match_indices(quoted) {
                let target = page[at + quoted.len()..].split('"').next().unwrap();
                let served = target.strip_prefix('/').is_some_and(has_file)
                    || target == "data:,"
                    || target.starts_with('#');
                assert!(served, "the page loads {target}, which is not served here");
            }
        }
    }
}
