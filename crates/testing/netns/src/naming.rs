//! Namespace names that say who owns them, so leftovers of killed test processes can be
//! found and removed.
//!
//! A name is `kpr<pid>x<serial>-<role>`: `pid` is the creating process (a test process
//! killed by a signal never runs `Drop`, so the next lab removes its namespaces once that
//! pid is gone), `serial` tells labs of one process apart, `role` tells the namespaces of
//! one lab apart (`node`, `p0`, `cl`, ...).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// Prefix of every namespace the harness creates.
pub const NAME_PREFIX: &str = "kpr";

const MAX_ROLE_LEN: usize = 12;

/// A fresh serial for a lab (or a stand-alone namespace) of this process.
pub(crate) fn next_serial() -> usize {
    static SERIAL: AtomicUsize = AtomicUsize::new(0);
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// The name of namespace `role` of lab `serial` of this process.
pub(crate) fn namespace_name(serial: usize, role: &str) -> Result<String> {
    let valid = !role.is_empty()
        && role.len() <= MAX_ROLE_LEN
        && role.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !valid {
        return Err(Error::InvalidRole {
            role: role.to_owned(),
        });
    }
    Ok(format!("{NAME_PREFIX}{}x{serial}-{role}", std::process::id()))
}

/// The pid that created namespace `name`, if the name is one of ours.
pub(crate) fn owner_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let (pid, rest) = rest.split_once('x')?;
    let (serial, role) = rest.split_once('-')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(pid) || !all_digits(serial) || role.is_empty() {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_pid_serial_and_role() {
        let name = namespace_name(7, "node").unwrap();
        assert_eq!(name, format!("kpr{}x7-node", std::process::id()));
        assert_eq!(owner_pid(&name), Some(std::process::id() as i32));
    }

    #[test]
    fn roles_must_be_short_lowercase_alphanumerics() {
        for role in ["", "Node", "p-0", "a/b", "abcdefghijklm"] {
            assert!(namespace_name(0, role).is_err(), "{role:?} was accepted");
        }
        assert!(namespace_name(0, "p12").is_ok());
    }

    #[test]
    fn foreign_names_have_no_owner() {
        for name in [
            "",
            "kpr",
            "kpr12",
            "kpr12x-node",
            "kprx3-node",
            "kpr12x3",
            "kpr12x3-",
            "cni-1234",
            "kpr1a2x3-node",
        ] {
            assert_eq!(owner_pid(name), None, "{name:?}");
        }
        assert_eq!(owner_pid("kpr4242x0-p1"), Some(4242));
    }

    #[test]
    fn serials_are_unique() {
        let a = next_serial();
        let b = next_serial();
        assert_ne!(a, b);
    }
}
