//! Running the helper binaries (`ip`, `sh`) and turning failures into errors that carry
//! the command line and its stderr.

use std::process::Command;

use crate::error::{Error, Result};

/// Runs `command` to completion; returns its stdout, or an error naming it with its stderr.
pub(crate) fn run_checked(command: &mut Command) -> Result<String> {
    let output = command.output().map_err(|source| Error::CommandNotRun {
        command: describe(command),
        source,
    })?;
    if !output.status.success() {
        return Err(Error::CommandFailed {
            command: describe(command),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `ip` with `args`.
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    run_checked(Command::new("ip").args(args))
}

/// The command line as a reader would type it.
pub(crate) fn describe(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_command_reports_its_line_and_stderr() {
        let err = run_checked(Command::new("sh").args(["-c", "echo oops >&2; exit 3"])).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("sh -c echo oops >&2; exit 3"), "{text}");
        assert!(text.contains("oops"), "{text}");
        assert!(matches!(err, Error::CommandFailed { .. }));
    }

    #[test]
    fn a_missing_binary_is_reported_as_not_run() {
        let err = run_checked(&mut Command::new("/nonexistent/kpr-netns-binary")).unwrap_err();
        assert!(matches!(err, Error::CommandNotRun { .. }), "{err}");
    }

    #[test]
    fn stdout_is_returned() {
        assert_eq!(
            run_checked(Command::new("sh").args(["-c", "echo hi"])).unwrap(),
            "hi\n"
        );
    }
}
