use std::process::ExitCode;

use offcputime::app::{run, Outcome};

fn main() -> ExitCode {
    match run() {
        Ok(Outcome::Done | Outcome::Info) => ExitCode::SUCCESS,
        Err(e) if offcputime::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, whatever the error's sources contain.
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("offcputime: {msg}");
            ExitCode::FAILURE
        }
    }
}
