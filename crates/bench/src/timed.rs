//! Running a command with input on stdin, timed, and killed if it runs too long.
//!
//! Loading a big ruleset with `iptables-nft-restore --noflush` can take many minutes; a
//! benchmark must report that as a result instead of hanging.

use std::io::{self, Read as _, Write as _};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often the child is checked; small against the loads measured (tens of ms and up).
const POLL: Duration = Duration::from_millis(1);

/// How a timed command ended.
#[derive(Debug)]
pub enum Ended {
    Exited {
        status: ExitStatus,
        /// From spawning to exit.
        elapsed: Duration,
        stderr: String,
    },
    /// Still running at the deadline, so it was killed.
    TimedOut,
}

/// Runs `command` with `input` on stdin and stdout discarded; kills it after `timeout`.
pub fn run(command: &mut Command, input: &[u8], timeout: Duration) -> io::Result<Ended> {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn()?;
    let stdin = child.stdin.take();
    let stderr = child.stderr.take();
    std::thread::scope(|scope| {
        // Writing and reading on their own threads: a child blocked on a full stderr pipe
        // while we block writing its stdin would deadlock.
        if let Some(mut pipe) = stdin {
            // A write error means the child exited (or was killed) early; its status says why.
            scope.spawn(move || pipe.write_all(input));
        }
        let reader = scope.spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = stderr {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        });
        let deadline = started + timeout;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if Instant::now() >= deadline {
                break None;
            }
            std::thread::sleep(POLL);
        };
        let elapsed = started.elapsed();
        let Some(status) = status else {
            child.kill()?;
            child.wait()?;
            return Ok(Ended::TimedOut);
        };
        let stderr = reader.join().unwrap_or_default();
        Ok(Ended::Exited {
            status,
            elapsed,
            stderr: stderr.trim().to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_status_time_and_stderr() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "wc -c >&2; exit 3"]);
        let ended = run(&mut cmd, b"12345", Duration::from_secs(10)).expect("sh runs");
        let Ended::Exited {
            status,
            elapsed,
            stderr,
        } = ended
        else {
            panic!("timed out: {ended:?}");
        };
        assert_eq!(status.code(), Some(3));
        assert_eq!(stderr, "5");
        assert!(elapsed < Duration::from_secs(10));
    }

    #[test]
    fn kills_what_outlives_the_timeout() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let started = Instant::now();
        let ended = run(&mut cmd, b"", Duration::from_millis(200)).expect("sleep runs");
        assert!(matches!(ended, Ended::TimedOut), "{ended:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn large_input_does_not_deadlock() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "cat >/dev/null; echo done >&2"]);
        let input = vec![b'x'; 8 << 20];
        let ended = run(&mut cmd, &input, Duration::from_secs(30)).expect("sh runs");
        assert!(
            matches!(&ended, Ended::Exited { status, stderr, .. } if status.success() && stderr == "done"),
            "{ended:?}"
        );
    }
}
