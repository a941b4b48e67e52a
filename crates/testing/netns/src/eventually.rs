//! Waiting for the proxy to catch up: kube-proxy applies changes asynchronously (within its
//! sync period), so end-to-end tests poll for the expected traffic rather than sleeping.
//! The timeout is a ceiling against hangs, never a performance assertion: where every step
//! is slower for reasons of the machine (a kpr-vm guest under software emulation, where a
//! process spawn costs a hundred times the host's), [`TIMEOUT_SCALE_ENV`] multiplies it.

use std::time::{Duration, Instant};

/// Environment variable multiplying every [`eventually`] timeout (a whole number, 1 when
/// unset). kpr-vm guests set it; CI's host runs never do.
pub const TIMEOUT_SCALE_ENV: &str = "KPR_TEST_TIMEOUT_SCALE";

/// Calls `check` every `interval` until it returns `Ok`, and returns that value.
///
/// # Panics
/// When `timeout` (times [`TIMEOUT_SCALE_ENV`]) passes without success, with the last error
/// and the attempt count; on a scale that is not a whole number above zero.
#[track_caller]
pub fn eventually<T>(
    timeout: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let scale = timeout_scale();
    let timeout = timeout * scale;
    let started = Instant::now();
    let mut attempts = 0_u32;
    loop {
        attempts += 1;
        match check() {
            Ok(value) => return value,
            Err(last) if started.elapsed() >= timeout => {
                panic!(
                    "condition not met within {timeout:?} ({attempts} attempts{}); last error: {last}",
                    if scale > 1 {
                        format!(", {TIMEOUT_SCALE_ENV}={scale}")
                    } else {
                        String::new()
                    }
                )
            }
            Err(_) => std::thread::sleep(interval),
        }
    }
}

#[track_caller]
fn timeout_scale() -> u32 {
    scale_from(std::env::var_os(TIMEOUT_SCALE_ENV).as_deref())
}

#[track_caller]
fn scale_from(value: Option<&std::ffi::OsStr>) -> u32 {
    let Some(value) = value else {
        return 1;
    };
    match value.to_str().and_then(|v| v.parse::<u32>().ok()) {
        Some(scale) if scale > 0 => scale,
        _ => panic!("{TIMEOUT_SCALE_ENV}={value:?} is not a whole number above zero"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_success() {
        let mut calls = 0;
        let value = eventually(Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            if calls < 3 {
                Err(format!("call {calls}"))
            } else {
                Ok(calls * 10)
            }
        });
        assert_eq!(value, 30);
    }

    #[test]
    #[should_panic(expected = "last error: still 7")]
    fn panics_with_the_last_error_after_the_timeout() {
        eventually(Duration::from_millis(30), Duration::from_millis(5), || {
            Err::<(), _>("still 7".to_owned())
        });
    }

    #[test]
    fn the_scale_is_one_unless_set_to_a_whole_number_above_zero() {
        use std::ffi::OsStr;
        assert_eq!(scale_from(None), 1);
        assert_eq!(scale_from(Some(OsStr::new("3"))), 3);
        for bad in ["0", "-1", "1.5", "x", ""] {
            let refused = std::panic::catch_unwind(|| scale_from(Some(OsStr::new(bad))));
            assert!(refused.is_err(), "{bad:?} was taken as a scale");
        }
    }
}
