//! Code objects and frames read from live interpreters, blocked two calls
//! deep.

use super::line_tables::unhex;
use super::*;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A child process, killed (by its own id) when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prints, as one line of JSON, what it knows of some code objects
/// (their address, names, file, first line, line table, the addresses
/// of the objects the tag hashes) and of the three functions on its
/// stack, then blocks two calls deep.
const LIVE: &str = r#"
import dis, json, sys, time

def target(x):
    return x + 1

SRC = '''
def f_\u00e9():
    pass
def f_\u03a9():
    pass
def f_\U00020000():
    pass
class K:
    def method(self):
        def inner():
            pass
        return inner
'''
ns = {}
exec(compile(SRC, "f\u00efl\u00e9_\u03a9_\U00020000.py", "exec"), ns)

def third(co):
    return co.co_qualname if sys.version_info >= (3, 11) else co.co_linetable

def describe(co):
    return {"addr": id(co), "name": co.co_name,
            "qualname": getattr(co, "co_qualname", co.co_name),
            "filename": co.co_filename, "firstlineno": co.co_firstlineno,
            "linetable": co.co_linetable.hex(),
            "words": [id(co.co_filename), id(co.co_name), id(third(co))],
            "instructions": [[i.offset, i.opname] for i in dis.get_instructions(co)]}

def blocked():
    print(json.dumps({
        "codes": [describe(c) for c in [
            target.__code__, ns["f_\u00e9"].__code__, ns["f_\u03a9"].__code__,
            ns["f_\U00020000"].__code__, ns["K"].method.__code__,
            ns["K"]().method().__code__]],
        "stack": [describe(c) for c in [
            blocked.__code__, caller.__code__, sys._getframe(2).f_code]],
    }), flush=True)
    time.sleep(600)  # LINE blocked

def caller():
    blocked()  # LINE caller

caller()  # LINE module
"#;

/// A process's memory, read with the test's own `ProcMem`.
fn read_u64(mem: &dyn Memory, addr: u64) -> u64 {
    let mut b = [0u8; 8];
    mem.read(addr, &mut b).unwrap();
    u64::from_le_bytes(b)
}

fn read_u32(mem: &dyn Memory, addr: u64) -> u32 {
    let mut b = [0u8; 4];
    mem.read(addr, &mut b).unwrap();
    u32::from_le_bytes(b)
}

/// One Python frame of a thread: its code object, the instruction as
/// the BPF program records it, and its `is_entry` or `owner` byte.
#[derive(Debug)]
struct Frame {
    code: u64,
    instr: u32,
    entry: u8,
}

/// The frames of the first thread of the first interpreter, newest
/// first, walked as the BPF program walks them.
fn walk(mem: &dyn Memory, runtime: u64, l: &Layout) -> (u64, Vec<Frame>) {
    let interp = read_u64(mem, runtime + u64::from(l.interpreters_head));
    let ts = read_u64(mem, interp + u64::from(l.interp_threads_head));
    assert_ne!(ts, 0);
    let mut frame = read_u64(mem, ts + u64::from(l.ts_frame));
    if let Some(current) = l.cframe_current_frame {
        frame = read_u64(mem, frame + u64::from(current));
    }
    let mut frames = Vec::new();
    while frame != 0 && frames.len() < 64 {
        let code = read_u64(mem, frame + u64::from(l.f_code));
        let instr = match l.frame_kind {
            FrameKind::Object310 => read_u32(mem, frame + u64::from(l.f_instr)),
            _ => read_u64(mem, frame + u64::from(l.f_instr)).wrapping_sub(code) as u32,
        };
        let mut entry = [0u8];
        if l.frame_kind != FrameKind::Object310 {
            mem.read(frame + u64::from(l.f_entry), &mut entry).unwrap();
        }
        frames.push(Frame {
            code,
            instr,
            entry: entry[0],
        });
        frame = read_u64(mem, frame + u64::from(l.f_previous));
    }
    (ts, frames)
}

/// The load bias of `object` in process `pid`, from its maps.
fn bias_in(pid: u32, object: &Path) -> u64 {
    let object = std::fs::canonicalize(object).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let segments = crate::elf::load_segments(&File::open(&object).unwrap()).unwrap();
    for line in maps.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() < 6 || Path::new(t[5]) != object {
            continue;
        }
        let start = u64::from_str_radix(t[0].split('-').next().unwrap(), 16).unwrap();
        let offset = u64::from_str_radix(t[2], 16).unwrap();
        return crate::elf::load_bias(&segments, start, offset).unwrap();
    }
    panic!("{} not mapped in {pid}:\n{maps}", object.display());
}

/// Each interpreter, blocked in `time.sleep` two calls deep: its code
/// objects read through `/proc/PID/mem` are what it says they are (names
/// of every kind of `str`, file, first line, line table), their tags
/// are those of the addresses it gives, and its frames, walked with the
/// table's offsets from `_PyRuntime`, name the three functions at the
/// lines of their calls.
#[test]
fn reads_code_objects_of_live_interpreters() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("live.py");
    let source = LIVE;
    std::fs::write(&script, source).unwrap();
    let line_of = |marker: &str| {
        source
            .lines()
            .position(|l| l.ends_with(&format!("# LINE {marker}")))
            .unwrap() as u32
            + 1
    };
    let want_lines = [line_of("blocked"), line_of("caller"), line_of("module")];
    for py in pythons() {
        let what = py.exe.display().to_string();
        let mut child = Running(
            Command::new(&py.exe)
                .arg(&script)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let said: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: {e}: {line:?}"));

        let file = File::open(&py.object).unwrap();
        let name = py.object.file_name().unwrap().to_str().unwrap();
        let interp = inspect(&file, name).unwrap().unwrap();
        let l = interp.layout.unwrap();
        let bias = bias_in(pid, &py.object);
        if py.exe == py.object {
            assert_eq!(bias, 0, "{what}: a non-PIE executable");
        }
        let code_type = interp.code_type + bias;
        let mem = ProcMem::open(pid).unwrap();

        check_code_objects(&what, &said, &mem, code_type, l);

        // The thread state and its frames, once the thread sleeps.
        let runtime = interp.runtime + bias;
        let mut key = [0u8; 8];
        mem.read(runtime + u64::from(l.tss_key), &mut key).unwrap();
        assert_eq!(
            u32::from_le_bytes(key[..4].try_into().unwrap()),
            1,
            "{what}: _is_initialized"
        );
        let frames = frames_once_asleep(&what, &mem, runtime, l, pid, code_type, want_lines[0]);
        check_frames(
            &what,
            &frames,
            &said["stack"],
            &mem,
            code_type,
            l,
            &want_lines,
        );
    }
}

/// The code objects the program listed (`said["codes"]`), read through
/// `mem`: names, file, first line, line table and tag as it says; and
/// what is not a code object is not taken for one.
fn check_code_objects(
    what: &str,
    said: &serde_json::Value,
    mem: &ProcMem,
    code_type: u64,
    l: &Layout,
) {
    for want in said["codes"].as_array().unwrap() {
        let addr = want["addr"].as_u64().unwrap();
        let code =
            read_code(mem, addr, code_type, l).unwrap_or_else(|e| panic!("{what}: {want}: {e}"));
        assert_eq!(code.name, want["name"].as_str().unwrap(), "{what}");
        assert_eq!(code.qualname, want["qualname"].as_str().unwrap(), "{what}");
        assert_eq!(code.filename, want["filename"].as_str().unwrap(), "{what}");
        assert_eq!(
            i64::from(code.firstlineno),
            want["firstlineno"].as_i64().unwrap()
        );
        let table = unhex(want["linetable"].as_str().unwrap());
        let first = code.firstlineno;
        let lines = match l.co_code_start {
            None => LineTable::pep626(table, first),
            Some(s) => LineTable::locations(table, first, u32::from(s)),
        };
        assert_eq!(code.lines, lines, "{what}");
        // The tag: of the words Python gives, and of the bytes
        // read again.
        let ids: Vec<u64> = want["words"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_u64().unwrap())
            .collect();
        let mut words = [0u8; 24];
        for (i, id) in ids.iter().enumerate() {
            words[8 * i..8 * i + 8].copy_from_slice(&id.to_le_bytes());
        }
        assert_eq!(code.tag, tag(&words), "{what}: {}", code.qualname);
        let mut again = [0u8; 24];
        mem.read(addr + u64::from(l.tag_at), &mut again).unwrap();
        assert_eq!(again, words);
    }
    let names: Vec<&str> = said["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["filename"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"f\u{ef}l\u{e9}_\u{3a9}_\u{20000}.py"));
    // Not a code object: the type object itself; a str.
    let not = read_code(mem, code_type, code_type, l).unwrap_err();
    assert!(matches!(not, Unreadable::NotCode), "{not}");
    let s = said["codes"][0]["words"][0].as_u64().unwrap();
    assert!(matches!(
        read_code(mem, s, code_type, l),
        Err(Unreadable::NotCode)
    ));
    assert!(matches!(
        read_code(mem, 8, code_type, l),
        Err(Unreadable::Memory(_))
    ));
}

/// The frames of the interpreter's thread, walked from `runtime`, once the
/// newest is at line `blocked` (its sleep): at most 20 s.
fn frames_once_asleep(
    what: &str,
    mem: &ProcMem,
    runtime: u64,
    l: &Layout,
    pid: u32,
    code_type: u64,
    blocked: u32,
) -> Vec<Frame> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (ts, frames) = walk(mem, runtime, l);
        if let Some(at) = l.ts_native_thread_id {
            assert_eq!(read_u64(mem, ts + u64::from(at)), u64::from(pid), "{what}");
        }
        let py_frames: Vec<&Frame> = frames
            .iter()
            .filter(|f| !(l.frame_kind == FrameKind::Interp312 && f.entry == l.owner_cstack))
            .collect();
        let top = py_frames.first().map(|f| {
            read_code(mem, f.code, code_type, l)
                .ok()
                .and_then(|c| c.line(f.instr))
        });
        if top == Some(Some(blocked)) {
            return frames;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {frames:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The frames walked are the three the program's stack says (`stack`),
/// each at its call's line and instruction, with the shims 3.12 adds.
fn check_frames(
    what: &str,
    frames: &[Frame],
    stack: &serde_json::Value,
    mem: &ProcMem,
    code_type: u64,
    l: &Layout,
    want_lines: &[u32],
) {
    let mut py_frames = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        match l.frame_kind {
            FrameKind::Interp312 if f.entry == l.owner_cstack => {
                // A shim: after the module's frame, the last.
                assert_eq!(i, 3, "{what}: {frames:?}");
                continue;
            }
            FrameKind::Interp312 => assert_eq!(f.entry, 0, "{what}: owned by the thread"),
            FrameKind::Interp311 => {
                assert_eq!(f.entry, u8::from(i == 2), "{what}: is_entry of {i}")
            }
            FrameKind::Object310 => {}
        }
        py_frames.push(f);
    }
    assert_eq!(py_frames.len(), 3, "{what}: {frames:?}");
    let shims = frames.len() - py_frames.len();
    assert_eq!(
        shims,
        usize::from(l.frame_kind == FrameKind::Interp312),
        "{what}"
    );
    for (i, f) in py_frames.iter().enumerate() {
        let want = &stack[i];
        assert_eq!(f.code, want["addr"].as_u64().unwrap(), "{what}: frame {i}");
        let code = read_code(mem, f.code, code_type, l).unwrap();
        assert_eq!(code.name, want["name"].as_str().unwrap());
        assert_eq!(code.line(f.instr), Some(want_lines[i]), "{what}: frame {i}");
        // Which instruction the frame is at: the call, or one of
        // its inline caches.
        let unit = match l.co_code_start {
            None => u64::from(f.instr) * 2,
            Some(s) => u64::from(f.instr - u32::from(s)),
        };
        let (at, op) = want["instructions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i[0].as_u64().unwrap(), i[1].as_str().unwrap()))
            .take_while(|(at, _)| *at <= unit)
            .last()
            .unwrap();
        assert!(op.starts_with("CALL"), "{what}: frame {i} at {unit}: {op}");
        eprintln!(
            "{what}: frame {i} ({}) at byte {unit}: {op} at {at}, +{} code units",
            code.name,
            (unit - at) / 2
        );
        match l.frame_kind {
            // At the call itself.
            FrameKind::Object310 => assert_eq!(unit, at),
            _ if l.version == (3, 13) => assert_eq!(unit, at),
            // In a C call (the newest frame) at the call; having
            // called a Python function, at its last cache entry.
            _ if i == 0 => assert_eq!(unit, at, "{what}"),
            _ => assert!(unit > at, "{what}: frame {i}"),
        }
    }
}
