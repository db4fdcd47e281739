//! The documents link to each other and to files of the repository: every
//! relative link of README.md, BENCHMARKS.md and `docs/` resolves, to a file
//! that exists and, with a `#fragment`, to a heading of that file (by the
//! anchors GitHub makes of headings). No privileges, no network: links to
//! web sites are not followed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// A heading's anchor as GitHub makes it: lower case, everything but
/// letters, digits, spaces, `-` and `_` dropped, spaces made `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a document's headings; a repeated one gets `-1`, `-2`, …
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(text) {
        let Some(rest) = line.strip_prefix('#') else {
            continue;
        };
        let heading = rest.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = anchor(heading);
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// The targets of a line's inline links and images, `[text](target)`,
/// outside inline code.
fn link_targets(line: &str) -> Vec<String> {
    // Inline code spans removed first: `[a](b)` inside backticks is text.
    let mut plain = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            plain.push(' ');
        } else if !in_code {
            plain.push(c);
        }
    }
    let mut out = Vec::new();
    let mut rest = plain.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        out.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    out
}

#[test]
fn every_link_between_the_documents_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let dir = doc.parent().unwrap();
        for (n, line) in prose(&text).iter().enumerate() {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, fragment) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let path = if file.is_empty() {
                    doc.clone()
                } else {
                    dir.join(file)
                };
                let place = format!("{}: {target} (prose line {})", doc.display(), n + 1);
                if !path.exists() {
                    broken.push(format!("{place}: no file {}", path.display()));
                    continue;
                }
                if let Some(fragment) = fragment {
                    let Ok(target_text) = std::fs::read_to_string(&path) else {
                        broken.push(format!("{place}: not a text file"));
                        continue;
                    };
                    if !anchors(&target_text).contains(fragment) {
                        broken.push(format!("{place}: no heading with that anchor"));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
}

#[test]
fn anchors_as_github_makes_them() {
    assert_eq!(
        anchor(" Running and waiting (`--on-cpu`)"),
        "running-and-waiting---on-cpu"
    );
    assert_eq!(anchor(" Intervals (`-i`, `-T`)"), "intervals--i--t");
    let text = "# A\n## B b\n```\n# not a heading\n```\n## B b\n";
    let got: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(got, ["a", "b-b", "b-b-1"]);
    assert_eq!(
        link_targets("see [x](a.md#b) and `[y](z)` and ![i](p.svg)"),
        ["a.md#b", "p.svg"]
    );
}
