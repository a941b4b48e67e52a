//! CPU time from `/proc`: of a whole process (the proxy, HAProxy) and of chosen threads of
//! this one (the L4 benchmark's client and servers, which share kpr-bench's process). Beside
//! a wall-clock figure, it tells one party's own work from waiting for the others, and shows
//! which party a shared machine's cores went to.

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `/proc/<pid>/stat` counts in clock ticks of `USER_HZ`, 100 on every Linux architecture
/// this runs on (the kernel fixes it for user space whatever its own tick rate).
const USER_HZ: u64 = 100;

/// CPU time (user + system, all threads) process `pid` has used so far.
pub fn process(pid: u32) -> Option<Duration> {
    stat_cpu_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
pub fn stat_cpu_time(stat: &str) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 1000 / USER_HZ))
}

/// Threads of this process counted together: each registers itself (an async runtime's
/// `on_thread_start`), their CPU time is summed from `/proc/self/task/<tid>/stat`.
#[derive(Clone, Debug, Default)]
pub struct Threads {
    ids: Arc<Mutex<Vec<u32>>>,
}

impl Threads {
    /// Adds the calling thread.
    pub fn register_this_thread(&self) {
        if let Some(tid) = this_thread_id() {
            self.ids.lock().unwrap_or_else(|p| p.into_inner()).push(tid);
        }
    }

    /// The registered threads' ids (to move them into a cgroup, for instance).
    pub fn ids(&self) -> Vec<u32> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// CPU time of every registered thread still alive (a thread that ended took its count
    /// with it; runtime workers live as long as the runtime).
    pub fn cpu_time(&self) -> Duration {
        self.ids()
            .iter()
            .filter_map(|tid| std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok())
            .filter_map(|stat| stat_cpu_time(&stat))
            .sum()
    }
}

/// The calling thread's id, from `/proc/thread-self` (a link to `<pid>/task/<tid>`).
fn this_thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_utime_plus_stime_after_the_command_name() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        let stat = "4242 (kube (proxy) rs) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 62 0 0 20 0 9 0";
        assert_eq!(stat_cpu_time(stat), Some(Duration::from_millis(3_120)));
        assert_eq!(stat_cpu_time("4242 (x) S 1"), None);
        assert!(process(std::process::id()).is_some());
    }

    /// Spins until the kernel has counted `budget` of the calling thread's CPU, however
    /// busy the machine.
    fn spin_for_cpu(budget: Duration) {
        let own = || stat_cpu_time(&std::fs::read_to_string("/proc/thread-self/stat").unwrap()).unwrap();
        let mut x = 0u64;
        while own() < budget {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
    }

    #[test]
    fn registered_threads_are_counted_and_others_are_not() {
        let threads = Threads::default();
        let busy = threads.clone();
        let (spent, read) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let registered = std::thread::spawn(move || {
            busy.register_this_thread();
            spin_for_cpu(Duration::from_millis(150));
            spent.0.send(()).unwrap();
            // Alive until the count has been read.
            read.1.recv().unwrap();
        });
        // An unregistered thread burns far more: were it counted, the sum would show it.
        std::thread::spawn(|| spin_for_cpu(Duration::from_millis(600)))
            .join()
            .unwrap();
        spent.1.recv().unwrap();
        let counted = threads.cpu_time();
        read.0.send(()).unwrap();
        registered.join().unwrap();
        assert!(counted >= Duration::from_millis(150), "{counted:?}");
        assert!(
            counted < Duration::from_millis(600),
            "an unregistered thread was counted: {counted:?}"
        );
    }
}
