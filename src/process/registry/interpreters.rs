//! The CPython interpreters of processes, as the registry keeps them: code
//! objects noted and looked up, each process's state for the BPF program.

use super::Registry;
use crate::process::Proc;

impl Registry {
    /// A walk of process `p`'s Python frames met code object `code` with
    /// `tag`: its names are read now, while the process runs.
    pub fn note_python_code(&mut self, p: Proc, code: u64, tag: u32) {
        self.py.code(p, code, tag);
    }

    /// The code object of a [`UserFrame::Python`].
    pub fn python_code(&self, code: u32) -> Option<&crate::python::Code> {
        self.py.code_at(code)
    }

    /// Whether process `p` runs a CPython interpreter whose frames are
    /// read.
    pub fn is_python(&self, p: Proc) -> bool {
        self.py.has_process(p)
    }

    /// Interpreters whose frames are not read, and why: one line each.
    pub fn python_notes(&self) -> &[String] {
        &self.py.unsupported
    }

    pub fn python_stats(&self) -> super::python::PyStats {
        super::python::PyStats {
            unmatched: self.py.unmatched.get(),
            ..self.py.stats
        }
    }

    /// Looks for a CPython interpreter among the objects process `p`
    /// maps (noted first): the BPF program's entry for it (its address
    /// space left to the caller), if it has one whose layout is known.
    pub fn note_python(&mut self, p: Proc) -> Option<crate::bpf::types::py_proc> {
        let mappings = self.snapshots.processes.get(&p.tgid)?;
        let candidates: Vec<(u32, u64, u64)> = mappings
            .iter()
            .map(|m| (m.object, m.start, m.file_offset))
            .collect();
        for (object, start, file_offset) in candidates {
            let o = &self.files.objects[object as usize];
            let Some(py) = self.py.object(object, &o.name, o.handle.as_ref()) else {
                continue;
            };
            // The lowest mapping of the object: the first found, as the
            // maps list them by address.
            return self.py.note_process(p, &py, start, file_offset);
        }
        // None (any more: an exec into another program).
        self.py.exited(p);
        None
    }
}
