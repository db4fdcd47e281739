//! Unit tests of the CPython support, run against the interpreters
//! installed: the helpers that find them here, the tests in `tests/`.

use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;

mod code_objects;
mod interpreters;
mod line_tables;
mod live;

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A missing interpreter or tool: a failure under CI=true, else a
/// skip, said.
fn missing(what: &str) {
    assert!(!ci(), "{what} is needed (CI=true)");
    eprintln!("skipped: {what} not found");
}

/// An interpreter the tests run: its executable, the object that holds
/// the interpreter (the shared libpython, or the executable itself),
/// and the version it says it is.
#[derive(Debug)]
struct Python {
    exe: PathBuf,
    object: PathBuf,
    version: (u8, u8, u8),
}

impl Python {
    fn minor(&self) -> u8 {
        self.version.1
    }
    fn layout(&self) -> &'static Layout {
        layout(self.version.0, self.version.1).unwrap()
    }
}

/// pyenv's newest 3.10, 3.11, 3.12 and 3.13 (shared builds), and
/// Debian's /usr/bin/python3.11 (the interpreter linked into a non-PIE
/// executable).
fn pythons() -> Vec<Python> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv"))
        .join("versions");
    let mut found = Vec::new();
    for minor in 10..=13u8 {
        let newest = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let micro: u8 = name.strip_prefix(&format!("3.{minor}."))?.parse().ok()?;
                Some((micro, e.path()))
            })
            .max();
        let Some((_, dir)) = newest else {
            missing(&format!(
                "pyenv's CPython 3.{minor} (under {})",
                root.display()
            ));
            continue;
        };
        let exe = dir.join(format!("bin/python3.{minor}"));
        let object = dir.join(format!("lib/libpython3.{minor}.so.1.0"));
        if !exe.exists() || !object.exists() {
            missing(&format!("{} and {}", exe.display(), object.display()));
            continue;
        }
        found.push(Python {
            version: version_of(&exe),
            exe,
            object,
        });
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.exists() {
        found.push(Python {
            version: version_of(&debian),
            exe: debian.clone(),
            object: debian,
        });
    } else {
        missing("/usr/bin/python3.11");
    }
    found
}

/// What the interpreter says its version is.
fn version_of(exe: &Path) -> (u8, u8, u8) {
    let out = Command::new(exe)
        .args(["-c", "import sys; print(*sys.version_info[:3])"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}: {out:?}", exe.display());
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Vec<u8> = text
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (v[0], v[1], v[2])
}

/// Python source with loops, multi-line expressions (with line jumps
/// of more than 127 both ways), try/except/finally, a comprehension,
/// nested functions, a class, a coroutine, a lambda and a line longer
/// than 254 bytes of bytecode.
fn sample_source() -> String {
    let gap = "\n".repeat(150);
    let far = vec!["        x"; 140].join(",\n");
    let plus = vec!["a"; 200].join(" + ");
    format!(
        r#"import sys

def loops(n):
    total = 0
    for i in range(n):
        while total < i:
            total += 1
        else:
            total -= 1
    return total

def multiline(a, b):
    x = (a +
         b *
         a)
    y = max(
        a,{gap}
        b,
    )
    return x, y

def handler(v):
    try:
        r = 1 / v
    except ZeroDivisionError as e:
        r = None
    except (TypeError,
            ValueError):
        r = -1
    finally:
        v = 0
    return r

def comprehension(xs):
    return [x * 2 for x in xs if x % 3]

def outer(k):
    def inner(j):
        return j + k
    return inner

def far_call(f, x):
    return f(
{far}
    )

def long_line(a):
    return {plus}

class Thing:
    @staticmethod
    def method(q):
        async def coro():
            return q
        return lambda: q
{gap}
if __name__ == "__main__":
    loops(3)
"#
    )
}
