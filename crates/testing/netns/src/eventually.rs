//! Waiting for the proxy to catch up: kube-proxy applies changes asynchronously (within its
//! sync period), so end-to-end tests poll for the expected traffic rather than sleeping.
//! The timeout is a ceiling against hangs, never a performance assertion.

use std::time::{Duration, Instant};

/// Calls `check` every `interval` until it returns `Ok`, and returns that value.
///
/// # Panics
/// When `timeout` passes without success, with the last error and the attempt count.
#[track_caller]
pub fn eventually<T>(
    timeout: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let started = Instant::now();
    let mut attempts = 0_u32;
    loop {
        attempts += 1;
        match check() {
            Ok(value) => return value,
            Err(last) if started.elapsed() >= timeout => {
                panic!("condition not met within {timeout:?} ({attempts} attempts); last error: {last}")
            }
            Err(_) => std::thread::sleep(interval),
        }
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
}
