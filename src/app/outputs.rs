//! The outputs' sinks, from their opening before anything is measured to
//! their files put in place.

use super::*;

/// Every output's sink, in the order of [`Config::outputs`]: the first
/// (`-o`, or stdout) and the others. A sink is taken out as it is written
/// whole or finished; those left when this is dropped (an error returned
/// early) are discarded: an existing file stays as it was and no new one
/// appears.
pub(super) struct Outputs {
    /// The sinks not yet written or finished.
    sinks: Vec<Sink>,
}

impl Outputs {
    /// Opens every output: a path that cannot be written fails now, before
    /// any measurement. A pprof or OTLP profile is not written to a
    /// terminal.
    pub(super) fn open(config: &Config) -> Result<Outputs> {
        let stall = config.tracer.test.stall_in_write;
        let first = Sink::open(config.output.as_deref(), stall)?;
        let mut outputs = Outputs { sinks: vec![first] };
        let binary = match config.format {
            Format::Pprof(_) => {
                Some("a pprof profile is gzipped binary data: write it with -o FILE.pb.gz")
            }
            Format::Otlp(_) => {
                Some("an OTLP profile is protobuf binary data: write it with -o FILE.otlp")
            }
            _ => None,
        };
        if let (Sink::Stdout, Some(what)) = (&outputs.sinks[0], binary) {
            // SAFETY: isatty has no preconditions.
            if unsafe { libc::isatty(1) } == 1 {
                anyhow::bail!("{what}, or redirect stdout");
            }
        }
        for (path, _) in &config.more_outputs {
            outputs.sinks.push(Sink::open(Some(path), stall)?);
        }
        Ok(outputs)
    }

    /// A scratch file beside the first output that is a file, else in
    /// `$TMPDIR`.
    pub(super) fn scratch(&self) -> Result<std::fs::File> {
        self.sinks
            .iter()
            .find_map(|s| s.scratch())
            .unwrap_or_else(|| crate::records::scratch_in(&std::env::temp_dir()))
            .context("cannot make a scratch file for the records of the blocks")
    }

    /// The sinks not yet written, for `-i`'s intervals written one part at
    /// a time (see [`Sink::write_part`]).
    pub(super) fn parts(&mut self) -> &mut [Sink] {
        &mut self.sinks
    }

    /// Writes each output whole in its format (`render`), putting each
    /// file in place once written; after a failure the outputs not written
    /// yet are discarded.
    pub(super) fn write(
        &mut self,
        config: &Config,
        mut render: impl FnMut(&Format, &mut dyn Write) -> io::Result<()>,
    ) -> Result<()> {
        for (_, format) in config.outputs() {
            let Some(sink) = self.next() else {
                break;
            };
            sink.write(|out| render(format, out))?;
        }
        Ok(())
    }

    /// `-i`, after the last interval: a file that got every interval is
    /// put in place; one opened for a name pattern (to check it could be
    /// written) is discarded, each interval having had a file of its own.
    pub(super) fn finish_parts(&mut self, config: &Config) -> Result<()> {
        for (path, _) in config.outputs() {
            let Some(sink) = self.next() else {
                break;
            };
            if path.and_then(crate::intervals::NamePattern::new).is_some() {
                sink.discard();
            } else {
                sink.finish()?;
            }
        }
        Ok(())
    }

    /// The first sink not written yet, taken out.
    fn next(&mut self) -> Option<Sink> {
        (!self.sinks.is_empty()).then(|| self.sinks.remove(0))
    }
}

/// The sinks neither written nor finished are discarded.
impl Drop for Outputs {
    fn drop(&mut self) {
        self.sinks.drain(..).for_each(Sink::discard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(args: &[&str]) -> Config {
        let args = std::iter::once("offcputime").chain(args.iter().copied());
        Args::try_parse_from(args).unwrap().into_config().unwrap()
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn outputs_dropped_unwritten_leave_the_files_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.txt");
        let new = dir.path().join("new.folded");
        std::fs::write(&old, "before").unwrap();
        let config = config(&["-o", old.to_str().unwrap(), "-o", new.to_str().unwrap()]);
        drop(Outputs::open(&config).unwrap());
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "before");
        assert_eq!(names(dir.path()), ["old.txt"]);
    }

    #[test]
    fn outputs_written_are_put_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.txt");
        let new = dir.path().join("new.folded");
        std::fs::write(&old, "before").unwrap();
        let config = config(&["-o", old.to_str().unwrap(), "-o", new.to_str().unwrap()]);
        let mut outputs = Outputs::open(&config).unwrap();
        outputs
            .write(&config, |format, out| write!(out, "{format:?}"))
            .unwrap();
        drop(outputs);
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "Text");
        assert_eq!(std::fs::read_to_string(&new).unwrap(), "Folded");
        assert_eq!(names(dir.path()), ["new.folded", "old.txt"]);
    }

    #[test]
    fn a_failed_write_discards_the_outputs_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("first.txt");
        let second = dir.path().join("second.txt");
        std::fs::write(&second, "before").unwrap();
        let config = config(&[
            "-o",
            first.to_str().unwrap(),
            "-o",
            second.to_str().unwrap(),
        ]);
        let mut outputs = Outputs::open(&config).unwrap();
        let written = outputs.write(&config, |_, _| Err(io::Error::other("no room")));
        assert!(written.is_err());
        drop(outputs);
        assert_eq!(std::fs::read_to_string(&second).unwrap(), "before");
        assert_eq!(names(dir.path()), ["second.txt"]);
    }

    #[test]
    fn parts_are_put_in_place_when_finished() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("intervals.txt");
        let config = config(&["-i", "1", "-o", out.to_str().unwrap()]);
        let mut outputs = Outputs::open(&config).unwrap();
        for part in ["one\n", "two\n"] {
            outputs.parts()[0]
                .write_part(|out| out.write_all(part.as_bytes()))
                .unwrap();
        }
        outputs.finish_parts(&config).unwrap();
        drop(outputs);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "one\ntwo\n");
    }
}
