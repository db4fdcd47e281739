//! Code objects read from a fake process's memory: every kind of `str`,
//! and hostile objects refused without panics.

use super::*;
use std::collections::BTreeMap;

/// A process's memory made of a few regions: what a hostile or
/// half-torn-down process may show.
#[derive(Clone)]
struct Fake(BTreeMap<u64, Vec<u8>>);

impl Memory for Fake {
    fn read(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        let (start, data) = self.0.range(..=addr).next_back().ok_or_else(eof)?;
        let from = usize::try_from(addr - start).map_err(|_| eof())?;
        let to = from.checked_add(buf.len()).ok_or_else(eof)?;
        buf.copy_from_slice(data.get(from..to).ok_or_else(eof)?);
        Ok(())
    }
}

const FAKE_CODE_TYPE: u64 = 0x5000;
const FAKE_CODE: u64 = 0x10_0000;
const FAKE_NAME: u64 = 0x20_0000;
const FAKE_QUALNAME: u64 = 0x30_0000;
const FAKE_FILENAME: u64 = 0x40_0000;
const FAKE_TABLE: u64 = 0x50_0000;

fn put(b: &mut [u8], at: u16, v: &[u8]) {
    b[usize::from(at)..usize::from(at) + v.len()].copy_from_slice(v);
}

/// A compact `str` as `l`'s version lays it out, of the smallest kind
/// that holds `s`.
fn fake_str(l: &Layout, s: &str) -> Vec<u8> {
    let points: Vec<u32> = s.chars().map(u32::from).collect();
    let max = points.iter().copied().max().unwrap_or(0);
    let (kind, ascii) = match max {
        0..0x80 => (1u32, true),
        0x80..0x100 => (1, false),
        0x100..0x10000 => (2, false),
        _ => (4, false),
    };
    let data = if ascii {
        l.str_ascii_data
    } else {
        l.str_compact_data
    };
    let mut b = vec![0u8; usize::from(data)];
    put(&mut b, 8, &0x6000u64.to_le_bytes());
    put(&mut b, l.str_length, &(points.len() as u64).to_le_bytes());
    let mut state = kind << l.str_kind_shift | 1 << l.str_compact_bit;
    state |= u32::from(ascii) << l.str_ascii_bit;
    if let Some(ready) = l.str_ready_bit {
        state |= 1 << ready;
    }
    put(&mut b, l.str_state, &state.to_le_bytes());
    for p in points {
        b.extend_from_slice(&p.to_le_bytes()[..kind as usize]);
    }
    b.extend_from_slice(&[0; 4]);
    b
}

/// A process with one code object at FAKE_CODE.
fn fake_process(l: &Layout, name: &str, qualname: &str, filename: &str) -> Fake {
    let mut code = vec![0u8; CODE_HEAD];
    put(&mut code, l.ob_type, &FAKE_CODE_TYPE.to_le_bytes());
    put(&mut code, l.co_name, &FAKE_NAME.to_le_bytes());
    put(&mut code, l.co_filename, &FAKE_FILENAME.to_le_bytes());
    if let Some(q) = l.co_qualname {
        put(&mut code, q, &FAKE_QUALNAME.to_le_bytes());
    }
    put(&mut code, l.co_linetable, &FAKE_TABLE.to_le_bytes());
    put(&mut code, l.co_firstlineno, &7i32.to_le_bytes());
    let mut table = vec![0u8; usize::from(l.bytes_data)];
    put(&mut table, l.bytes_size, &4u64.to_le_bytes());
    table.extend_from_slice(&[0x80 | 13 << 3, 4, 0x80 | 15 << 3, 0]);
    Fake(BTreeMap::from([
        (FAKE_CODE, code),
        (FAKE_NAME, fake_str(l, name)),
        (FAKE_QUALNAME, fake_str(l, qualname)),
        (FAKE_FILENAME, fake_str(l, filename)),
        (FAKE_TABLE, table),
    ]))
}

fn all_layouts() -> [&'static Layout; 4] {
    [10, 11, 12, 13].map(|minor| layout(3, minor).unwrap())
}

#[test]
fn reads_every_kind_of_str() {
    for l in all_layouts() {
        let filename = "/src/\u{3a9}/\u{20000}/x.py";
        let p = fake_process(l, "m\u{e9}thode", "Klasse.m\u{e9}thode", filename);
        let code = read_code(&p, FAKE_CODE, FAKE_CODE_TYPE, l).unwrap();
        assert_eq!(code.name, "m\u{e9}thode");
        let qualname = if l.co_qualname.is_some() {
            "Klasse.m\u{e9}thode"
        } else {
            "m\u{e9}thode"
        };
        assert_eq!(code.qualname, qualname);
        assert_eq!(code.filename, filename);
        assert_eq!(code.firstlineno, 7);
        let mut words = [0u8; 24];
        p.read(FAKE_CODE + u64::from(l.tag_at), &mut words).unwrap();
        assert_eq!(code.tag, tag(&words));
        // UCS-2, and lone surrogates.
        let mut p = fake_process(l, "\u{3a9}mega", "q", "f");
        let name = p.0.get_mut(&FAKE_NAME).unwrap();
        let at = usize::from(l.str_compact_data) + 2;
        name[at..at + 2].copy_from_slice(&0xdc80u16.to_le_bytes());
        let code = read_code(&p, FAKE_CODE, FAKE_CODE_TYPE, l).unwrap();
        assert_eq!(code.name, "\u{3a9}\u{fffd}ega");
        // Cut at MAX_NAME_CHARS.
        let long = "x".repeat(3000);
        let p = fake_process(l, &long, "q", "f");
        let code = read_code(&p, FAKE_CODE, FAKE_CODE_TYPE, l).unwrap();
        assert_eq!(code.name.chars().count(), MAX_NAME_CHARS + 1);
        assert!(code.name.ends_with("x\u{2026}"));
        // The line table: +2 from line 7 for one code unit, then none.
        let start = l.co_code_start.map_or(0, u32::from);
        let instr = |unit: u32| match l.frame_kind {
            FrameKind::Object310 => unit,
            _ => start + 2 * unit,
        };
        if l.frame_kind != FrameKind::Object310 {
            assert_eq!(code.line(instr(0)), Some(9));
            assert_eq!(code.line(instr(1)), None);
        }
    }
}

/// Whatever a process's memory holds, reading a code object returns
/// (an error, or names within the bounds), with no panic and no
/// allocation beyond what the bounds allow.
#[test]
fn hostile_code_objects_are_refused() {
    for l in all_layouts() {
        let good = fake_process(l, "name", "qual", "file.py");
        let read = |p: &Fake| read_code(p, FAKE_CODE, FAKE_CODE_TYPE, l);
        let malformed = |p: &Fake| matches!(read(p), Err(Unreadable::Malformed(_)));
        let memory = |p: &Fake| matches!(read(p), Err(Unreadable::Memory(_)));
        let with = |region: u64, at: u16, v: &[u8]| {
            let mut p = good.clone();
            put(p.0.get_mut(&region).unwrap(), at, v);
            p
        };
        assert!(matches!(
            read(&with(FAKE_CODE, l.ob_type, &[1])),
            Err(Unreadable::NotCode)
        ));
        assert!(malformed(&with(FAKE_CODE, l.co_name, &[0; 8])));
        assert!(malformed(&with(FAKE_CODE, l.co_linetable, &[0; 8])));
        assert!(memory(&with(FAKE_CODE, l.co_filename, &[1; 8])));
        assert!(memory(&with(FAKE_CODE, l.co_filename, &[0xff; 8])));
        let str_state = |p: &Fake| u32_at(&p.0[&FAKE_NAME], usize::from(l.str_state)).unwrap();
        let state = str_state(&good);
        let kind_mask = 7 << l.str_kind_shift;
        for bad in [
            state & !kind_mask | 3 << l.str_kind_shift,
            state & !kind_mask,
            state & !(1 << l.str_compact_bit),
            state & !kind_mask | 2 << l.str_kind_shift,
        ] {
            assert!(malformed(&with(FAKE_NAME, l.str_state, &bad.to_le_bytes())));
        }
        if let Some(ready) = l.str_ready_bit {
            let bad = state & !(1 << ready);
            assert!(malformed(&with(FAKE_NAME, l.str_state, &bad.to_le_bytes())));
        }
        assert!(malformed(&with(
            FAKE_NAME,
            l.str_length,
            &(-1i64).to_le_bytes()
        )));
        assert!(memory(&with(
            FAKE_NAME,
            l.str_length,
            &i64::MAX.to_le_bytes()
        )));
        let ascii_data = usize::from(l.str_ascii_data);
        let mut p = good.clone();
        p.0.get_mut(&FAKE_NAME).unwrap()[ascii_data] = 0xe9;
        assert!(malformed(&p), "an ASCII str with a byte above 127");
        assert!(malformed(&with(
            FAKE_TABLE,
            l.bytes_size,
            &(-1i64).to_le_bytes()
        )));
        assert!(memory(&with(
            FAKE_TABLE,
            l.bytes_size,
            &i64::MAX.to_le_bytes()
        )));
        for addr in [0, 8, u64::MAX, u64::MAX - 100, FAKE_CODE + 1] {
            assert!(read_code(&good, addr, FAKE_CODE_TYPE, l).is_err());
        }
        // A str at the very end of the address space.
        let mut p = good.clone();
        put(
            p.0.get_mut(&FAKE_CODE).unwrap(),
            l.co_name,
            &(u64::MAX - 4).to_le_bytes(),
        );
        p.0.insert(u64::MAX - 4, vec![0; 4]);
        assert!(read(&p).is_err());

        // Random bytes anywhere.
        let mut rng = crate::hostile::Rng(0x2545_f491_4f6c_dd1d ^ u64::from(l.version.1));
        let mut next = || rng.next();
        let regions: Vec<u64> = good.0.keys().copied().collect();
        for _ in 0..3000 {
            let mut p = good.clone();
            for _ in 0..1 + next() % 4 {
                let region = regions[(next() % regions.len() as u64) as usize];
                let data = p.0.get_mut(&region).unwrap();
                let at = (next() % data.len() as u64) as usize;
                data[at] = next() as u8;
            }
            if let Ok(code) = read(&p) {
                assert!(code.name.chars().count() <= MAX_NAME_CHARS + 1);
                for instr in [0, 1, 100, 200, 201, u32::MAX] {
                    code.line(instr);
                }
            }
        }
    }
}
