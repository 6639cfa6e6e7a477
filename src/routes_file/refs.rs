//! References in a routes file's strings (SPEC §2.5): `${env:NAME}` is the environment variable
//! `NAME`, `${file:PATH}` the text of the file `PATH` (relative to the routes file's folder; one
//! line end at its end is dropped, so that a token written by `echo` is the token). They are
//! resolved by whatever reads the file (a `recast config` command, a node from the file), so a
//! file in version control holds no secret. `$${` writes a literal `${`. A variable that is not
//! set, a file that cannot be read and a reference of another kind are problems at their string.

use std::path::Path;

use serde_json::Value;

use crate::json::ordered::Ordered;
use crate::json::push_pointer;

/// The most bytes one `${file:...}` may bring.
const MOST_FILE_BYTES: u64 = 1 << 20;

/// Resolves every reference in `value`'s strings (member names are left as written), telling
/// `problem` each one that cannot be, with its string's pointer.
pub fn resolve(value: &mut Ordered, dir: &Path, problem: &mut dyn FnMut(String, String)) {
    let mut at = String::new();
    walk(value, dir, &mut at, problem);
}

fn walk(value: &mut Ordered, dir: &Path, at: &mut String, problem: &mut dyn FnMut(String, String)) {
    let len = at.len();
    match value {
        Ordered::Scalar(Value::String(text)) if text.contains("${") => match expand(text, dir) {
            Ok(resolved) => *text = resolved,
            Err(why) => problem(at.clone(), why),
        },
        Ordered::List(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                at.push('/');
                at.push_str(&i.to_string());
                walk(item, dir, at, problem);
                at.truncate(len);
            }
        }
        Ordered::Object(members) => {
            for (name, member) in members.iter_mut() {
                push_pointer(at, name);
                walk(member, dir, at, problem);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

/// `text` with its references replaced, or why one cannot be.
// `${env:NAME}` is a file's reference to the environment of whoever reads it (SPEC §2.5), not a
// setting of recast: settings are read by clap alone.
#[allow(clippy::disallowed_methods)]
pub fn expand(text: &str, dir: &Path) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        // `$${` is a `${` as written.
        if rest[..start].ends_with('$') {
            out.push_str(&rest[..start - 1]);
            out.push_str("${");
            rest = &rest[start + 2..];
            continue;
        }
        out.push_str(&rest[..start]);
        let body = &rest[start + 2..];
        let Some(end) = body.find('}') else {
            return Err(
                "`${` opens a reference that no `}` closes (write `$${` for the text `${`)".to_owned()
            );
        };
        let reference = &body[..end];
        match reference.split_once(':') {
            Some(("env", name)) if !name.is_empty() => match std::env::var(name) {
                Ok(value) => out.push_str(&value),
                Err(std::env::VarError::NotPresent) => {
                    return Err(format!("${{env:{name}}}: the environment variable {name} is not set"));
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(format!("${{env:{name}}}: the environment variable {name} is not UTF-8"));
                }
            },
            Some(("file", path)) if !path.is_empty() => {
                let full = dir.join(path);
                let read = std::fs::File::open(&full).and_then(|file| {
                    let mut text = String::new();
                    std::io::Read::read_to_string(
                        &mut std::io::Read::take(file, MOST_FILE_BYTES + 1),
                        &mut text,
                    )?;
                    Ok(text)
                });
                match read {
                    Ok(text) if text.len() as u64 > MOST_FILE_BYTES => {
                        return Err(format!(
                            "${{file:{path}}}: the file holds more than {MOST_FILE_BYTES} bytes"
                        ));
                    }
                    Ok(text) => {
                        let text = text
                            .strip_suffix('\n')
                            .map(|t| t.strip_suffix('\r').unwrap_or(t))
                            .unwrap_or(&text);
                        out.push_str(text);
                    }
                    Err(e) => return Err(format!("${{file:{path}}}: cannot read {}: {e}", full.display())),
                }
            }
            _ => {
                return Err(format!(
                    "`${{{reference}}}` is no reference: write ${{env:NAME}} or ${{file:PATH}} (or $${{ for the text `${{`)"
                ));
            }
        }
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand;
    use std::path::Path;

    #[test]
    fn references_are_resolved_or_told() {
        let dir = std::env::temp_dir().join(format!("recast-refs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), "s3cret\n").unwrap();
        assert_eq!(expand("Bearer ${file:token}", &dir).unwrap(), "Bearer s3cret");
        // A variable every test process has, read as the reference reads it.
        #[allow(clippy::disallowed_methods)]
        let path = std::env::var("PATH").unwrap();
        assert_eq!(expand("a${env:PATH}b${env:PATH}", &dir).unwrap(), format!("a{path}b{path}"));
        assert_eq!(expand("$${env:X} costs $5", &dir).unwrap(), "${env:X} costs $5");
        assert!(expand("${env:RECAST_REFS_TEST_UNSET_VAR}", &dir).unwrap_err().contains("is not set"));
        assert!(expand("${file:missing}", &dir).unwrap_err().contains("cannot read"));
        assert!(expand("${vault:x}", &dir).unwrap_err().contains("no reference"));
        assert!(expand("${env:X", Path::new(".")).unwrap_err().contains("no `}`"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
