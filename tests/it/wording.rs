//! The messages the profiler prints agree with their numbers: "1 block
//! has", not "1 blocks have". A string literal of `src/` in which a
//! placeholder (`{}`, `{name}`) is followed by a plural noun (directly, or
//! after a word or two such as "user" or "kernel") fails this test: a count
//! of 1 would print it wrong. Such a count is written with
//! `offcputime::text::count(n, "block", "blocks")`, and the verbs and
//! pronouns after it with `offcputime::text::noun(n, "has", "have")`.
//!
//! Where the placeholder is not a count, or a count that is never 1 (a
//! size, a limit exceeded), the line the literal begins on or the line
//! before it (or the placeholder's line) says so with `// wording: a count
//! never 1` (or `// wording: not a count`). Comments are not read, nor unit tests (`#[cfg(test)] mod tests
//! { .. }`, files named `tests.rs` or under a `tests/` folder).

use std::path::{Path, PathBuf};

/// Plural nouns that a count before them must agree with.
const PLURALS: &[&str] = &[
    "blocks",
    "stacks",
    "processes",
    "threads",
    "frames",
    "functions",
    "files",
    "objects",
    "mappings",
    "rows",
    "notices",
    "captures",
    "intervals",
    "samples",
    "switches",
    "copies",
    "methods",
    "tables",
    "walks",
    "wake-ups",
    "traces",
    "entries",
    "notifications",
    "words",
    "names",
    "records",
    "cgroups",
    "events",
    "errors",
    "tasks",
    "runs",
    "wakers",
    "profiles",
    "lines",
    "maps",
    "fields",
    "types",
];

/// Words between a placeholder and a noun that show the noun is not what
/// the placeholder counts ("{flag} is about blocks", "{t} in its tables").
const NOT_BETWEEN: &[&str] = &[
    "a", "about", "an", "and", "are", "at", "by", "for", "in", "is", "its", "of", "or", "the",
    "their", "to", "was", "were", "with",
];

const MARKERS: &[&str] = &["// wording: a count never 1", "// wording: not a count"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "tests") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

/// The string literals of `code` outside comments and `#[cfg(test)] mod
/// tests { .. }` blocks: each as its characters (a line continuation, `\`
/// and the line break and indentation after it, taken out as the compiler
/// does) with the line (from 1) each is on, and the line it begins on.
fn literals(code: &str) -> Vec<(usize, Vec<(char, usize)>)> {
    let c: Vec<char> = code.chars().collect();
    let at = |i: usize, s: &str| s.chars().enumerate().all(|(k, x)| c.get(i + k) == Some(&x));
    let mut found = Vec::new();
    let (mut i, mut line, mut depth) = (0, 1, 0usize);
    // The depth at which a unit-test block began, while in one.
    let mut skipping: Option<usize> = None;
    while i < c.len() {
        if at(i, "//") {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i, "/*") {
            while i < c.len() && !at(i, "*/") {
                line += (c[i] == '\n') as usize;
                i += 1;
            }
            i += 2;
        } else if at(i, "#[cfg(test)]") {
            i += "#[cfg(test)]".len();
            let mut j = i;
            while j < c.len() && c[j].is_whitespace() {
                j += 1;
            }
            if at(j, "mod tests") {
                let mut k = j + "mod tests".len();
                while k < c.len() && c[k].is_whitespace() {
                    k += 1;
                }
                if c.get(k) == Some(&'{') && skipping.is_none() {
                    skipping = Some(depth);
                }
            }
        } else if c[i] == '\'' {
            // A char literal ('"', '\\'), or a lifetime.
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c[i] == 'r'
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
            && (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#'))
        {
            // A raw string: r"..", r#".."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                i += 1;
                continue;
            }
            let end = format!("\"{}", "#".repeat(hashes));
            j += 1;
            let (begins, mut lit) = (line, Vec::new());
            while j < c.len() && !at(j, &end) {
                lit.push((c[j], line));
                line += (c[j] == '\n') as usize;
                j += 1;
            }
            if skipping.is_none() {
                found.push((begins, lit));
            }
            i = j + end.len();
        } else if c[i] == '"' {
            let mut j = i + 1;
            let (begins, mut lit) = (line, Vec::new());
            while j < c.len() && c[j] != '"' {
                if c[j] == '\\' {
                    match c.get(j + 1) {
                        Some('\n') => {
                            line += 1;
                            j += 2;
                            while j < c.len() && c[j].is_whitespace() {
                                line += (c[j] == '\n') as usize;
                                j += 1;
                            }
                        }
                        Some(&x) => {
                            lit.push((if x == 'n' { '\n' } else { x }, line));
                            j += 2;
                        }
                        None => j += 1,
                    }
                } else {
                    lit.push((c[j], line));
                    line += (c[j] == '\n') as usize;
                    j += 1;
                }
            }
            if skipping.is_none() {
                found.push((begins, lit));
            }
            i = j + 1;
        } else {
            match c[i] {
                '\n' => line += 1,
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if skipping == Some(depth) {
                        skipping = None;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    found
}

/// The lines of `lit` where a placeholder is followed by a plural noun,
/// with what follows it.
fn disagreeing(lit: &[(char, usize)]) -> Vec<(usize, String)> {
    let text: Vec<char> = lit.iter().map(|&(ch, _)| ch).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if text[i] == '{' && text.get(i + 1) == Some(&'{') {
            i += 2;
            continue;
        }
        if text[i] != '{' {
            i += 1;
            continue;
        }
        let Some(close) = text[i..].iter().position(|&ch| ch == '}').map(|p| i + p) else {
            break;
        };
        let inner: String = text[i + 1..close].iter().collect();
        let name = inner.split(':').next().unwrap();
        if !name.chars().all(|ch| ch.is_alphanumeric() || ch == '_') {
            i += 1;
            continue;
        }
        // Up to three words after it, one space apart.
        let mut j = close + 1;
        let mut words: Vec<String> = Vec::new();
        while words.len() < 3 && text.get(j) == Some(&' ') {
            let start = j + 1;
            let mut k = start;
            while k < text.len() && (text[k].is_alphabetic() || text[k] == '-') {
                k += 1;
            }
            if k == start {
                break;
            }
            words.push(text[start..k].iter().collect());
            j = k;
        }
        for (n, w) in words.iter().enumerate() {
            if PLURALS.contains(&w.as_str()) {
                out.push((lit[i].1, format!("{{{inner}}} {}", words[..=n].join(" "))));
                break;
            }
            if NOT_BETWEEN.contains(&w.as_str()) {
                break;
            }
        }
        i = close + 1;
    }
    out
}

#[test]
fn counts_agree_with_their_nouns() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        // The robustness tests of the file readers (a test module).
        if rel == Path::new("hostile.rs") {
            continue;
        }
        let code = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = code.lines().collect();
        // The marker on any line from the one before the literal to the
        // placeholder's (a literal's lines cannot hold a comment).
        let marked = |from: usize, to: usize| {
            lines[from.saturating_sub(2)..to.min(lines.len())]
                .iter()
                .any(|t| MARKERS.iter().any(|m| t.contains(m)))
        };
        for (begins, lit) in literals(&code) {
            for (line, what) in disagreeing(&lit) {
                if !marked(begins, line) {
                    found.push(format!("{}:{line}: \"{what}\"", rel.display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "counts followed by a plural noun, wrong for a count of 1: write them with \
         offcputime::text::count(n, \"block\", \"blocks\") (and a verb or pronoun after them \
         with text::noun(n, \"has\", \"have\")), or, for a count that is never 1 or not a \
         count, put `// wording: a count never 1` (or `// wording: not a count`) on the line the \
         literal begins on or the one before:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_guard_finds_a_count_before_a_plural() {
    let lits = literals(
        "fn f() { eprintln!(\"x: {} blocks have none, {n} user \\\n   stacks, {{}} rows\"); }\n\
         // \"{} blocks\"\n\
         #[cfg(test)]\nmod tests {\n    fn g() { format!(\"{} frames\"); }\n}\n\
         fn h() { format!(\"{t} in its tables, {} blocks\"); }\n",
    );
    let found: Vec<_> = lits
        .iter()
        .flat_map(|(_, l)| disagreeing(l.as_slice()))
        .collect();
    assert_eq!(
        found,
        vec![
            (1, "{} blocks".to_string()),
            (1, "{n} user stacks".to_string()),
            (8, "{} blocks".to_string()),
        ]
    );
}
