//! How glibc's allocator is set up before the proxy starts any thread.
//!
//! glibc gives each thread that allocates under contention an arena of its own (up to eight
//! per core) and keeps what an arena freed for later, and after a large block is freed it
//! raises its mmap threshold, and with it the point where the heap is trimmed, up to 32 MiB.
//! A proxy allocates in bursts: the first list of the cluster, every relist, every full
//! sync. Each burst left its peak resident in some arena, so the resident size rose in steps
//! at relists under churn and never came back down (the soak in BENCHMARKS.md).
//!
//! Two arenas and a fixed 128 KiB mmap threshold (large blocks are mapped and unmapped on
//! their own, and the heap is trimmed once 128 KiB at its top are free: glibc's default,
//! no longer raised) measured, whole process, nftables mode (kpr-bench on the 2-core
//! machine, 2026-11-28, BENCHMARKS.md): 10k Services x 10 from the API, 10 minutes of churn
//! with relists every 150 s: steady 62.6 -> 53.4 MiB, the first relist's step +8.5 -> +3.8
//! MiB; 50k from the API peak/steady 189/186 -> 176/171 MiB; 50k from a manifest 405/352 ->
//! 420/339 MiB (379/293 in another run: that peak varies from run to run); first syncs
//! unchanged within the machine's noise.
//! mimalloc (flat under churn, but peak 118 against 75 MiB at 10k) and jemalloc (peak 194
//! MiB at 50k) measured worse.
//!
//! An explicit `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` in the environment still wins: the
//! settings are only made when neither is set.

/// Sets the allocator up as the module docs say. Must run before any other thread starts:
/// arenas are created as threads first allocate.
pub fn tune() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() || std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    set(libc::M_ARENA_MAX, 2);
    set(libc::M_MMAP_THRESHOLD, 128 * 1024);
}

#[allow(unsafe_code)] // The one call into libc: see `set`'s safety note.
fn set(parameter: libc::c_int, value: libc::c_int) {
    // SAFETY: mallopt takes two integers and returns one; it has no pointer arguments and no
    // precondition. glibc serialises it against allocation in every arena. A refused setting
    // (return value 0) leaves glibc's default, which is only slower to give memory back.
    let _accepted = unsafe { libc::mallopt(parameter, value) };
}

#[cfg(test)]
mod tests {
    /// The settings are accepted by this glibc (mallopt returns 1 for a value it takes).
    #[test]
    #[allow(unsafe_code)]
    fn glibc_accepts_both_settings() {
        for (parameter, value) in [(libc::M_ARENA_MAX, 2), (libc::M_MMAP_THRESHOLD, 128 * 1024)] {
            // SAFETY: as in `super::set`.
            assert_eq!(
                unsafe { libc::mallopt(parameter, value) },
                1,
                "parameter {parameter}"
            );
        }
    }
}
