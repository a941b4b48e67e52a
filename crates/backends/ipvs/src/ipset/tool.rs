//! The `ipset` tool as an [`Ipset`]: `ipset save` read back, `ipset restore -exist` of the
//! changes as a script. Not the proxy's path (see the module above for why netlink); kept
//! as the benchmark's baseline and as an independent writer in tests.

use super::{Ipset, SetChange, SetSpec, Sets, parse_save};

/// The `ipset` binary in the calling thread's network namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct IpsetCli;

impl Ipset for IpsetCli {
    fn read(&mut self, specs: &[SetSpec]) -> Result<Sets, String> {
        let output = std::process::Command::new("ipset")
            .arg("save")
            .output()
            .map_err(|e| format!("ipset save: {e}"))?;
        checked("ipset save", &output)?;
        parse_save(&String::from_utf8_lossy(&output.stdout), specs)
    }

    fn write(&mut self, changes: &[SetChange]) -> Result<(), String> {
        if changes.is_empty() {
            return Ok(());
        }
        restore(&super::render(changes))
    }
}

/// `ipset restore -exist` with `script` on stdin.
fn restore(script: &str) -> Result<(), String> {
    use std::io::Write as _;
    let spawn_error = |e: std::io::Error| format!("ipset restore -exist: {e}");
    let mut child = std::process::Command::new("ipset")
        .args(["restore", "-exist"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(spawn_error)?;
    }
    let output = child.wait_with_output().map_err(spawn_error)?;
    checked("ipset restore -exist", &output)
}

fn checked(what: &str, output: &std::process::Output) -> Result<(), String> {
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(format!("{what} failed ({}): {}", output.status, stderr.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipset_failure_names_the_command() {
        let output = std::process::Command::new("sh")
            .args(["-c", "echo 'set KUBE-X does not exist' >&2; exit 1"])
            .output()
            .unwrap();
        let error = checked("ipset restore -exist", &output).unwrap_err();
        assert!(error.contains("ipset restore -exist failed"), "{error}");
        assert!(error.contains("KUBE-X does not exist"), "{error}");
    }
}
