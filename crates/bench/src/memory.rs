//! Peak memory of a stretch of code, from the kernel's own accounting.
//!
//! Writing `5` to `/proc/self/clear_refs` resets the process's peak RSS (`VmHWM`) to its
//! current RSS; reading `VmHWM` after the code ran gives the peak it reached. This costs two
//! file accesses and needs no allocator hooks, which is all a benchmark report needs.

use std::fs;

const CLEAR_REFS: &str = "/proc/self/clear_refs";
const STATUS: &str = "/proc/self/status";
/// `clear_refs` value that resets the peak resident set size.
const RESET_PEAK_RSS: &str = "5";

/// Resident memory before a measured stretch, in KiB.
#[derive(Clone, Copy, Debug)]
pub struct PeakProbe {
    baseline_kib: u64,
}

impl PeakProbe {
    /// Resets the peak to the current RSS; `None` where /proc does not allow it.
    pub fn start() -> Option<Self> {
        fs::write(CLEAR_REFS, RESET_PEAK_RSS).ok()?;
        let baseline_kib = status_field(&fs::read_to_string(STATUS).ok()?, "VmRSS")?;
        Some(Self { baseline_kib })
    }

    /// KiB the peak rose above the baseline since `start`.
    pub fn extra_kib(self) -> Option<u64> {
        let peak = status_field(&fs::read_to_string(STATUS).ok()?, "VmHWM")?;
        Some(peak.saturating_sub(self.baseline_kib))
    }
}

/// A `Key:   123 kB` line of `/proc/<pid>/status`, in KiB.
pub fn status_field(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        value.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kib_fields_of_proc_status() {
        let status = "Name:\tkpr-bench\nVmHWM:\t  20480 kB\nVmRSS:\t   1024 kB\n";
        assert_eq!(status_field(status, "VmHWM"), Some(20480));
        assert_eq!(status_field(status, "VmRSS"), Some(1024));
        assert_eq!(status_field(status, "VmSwap"), None);
        assert_eq!(status_field("VmRSSX:\t1 kB\n", "VmRSS"), None);
    }

    #[test]
    fn a_large_allocation_raises_the_peak() {
        let Some(probe) = PeakProbe::start() else {
            eprintln!("no writable /proc/self/clear_refs here; nothing to check");
            return;
        };
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        drop(block);
        let extra = probe.extra_kib().expect("VmHWM readable");
        assert!(extra >= 60 << 10, "peak rose by only {extra} KiB");
    }
}
