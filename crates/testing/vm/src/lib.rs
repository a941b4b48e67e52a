//! Test support: run host-built test code inside a throw-away qemu guest that boots
//! Debian's stock kernel.
//!
//! Why a VM: this host's kernel has no `ip_vs` and no `dummy` module, so the ipvs mode
//! cannot be tested on it. Debian's kernel has both. The guest boots that kernel (from the
//! `linux-image-*` package, unpacked into a cache, never installed) under qemu's software
//! emulation, which takes ~2.5 s per boot here; `/dev/kvm` on these machines is a
//! paravirtual flavour that cannot run a stock kernel usably.
//!
//! The guest gets an initramfs holding static busybox (from Debian's `busybox-static`),
//! the kernel's netfilter, IPVS, ipset, bridge, veth and dummy modules (loaded on demand by
//! the kernel through busybox's `modprobe`), this host's own kernel tools (`ip`, the
//! iptables flavours, `ipset`, `nft`, `conntrack`, and `dash` as `/bin/sh`, because
//! busybox's shell runs its own small `ip` before the one in `PATH`; with the shared
//! libraries `ldd` lists: host and guest userland are the same Debian release), Debian's
//! `ipvsadm` (the admin's view of IPVS, for tests to compare with) and the test's
//! binaries, stripped of debug info. The guest has **no network device** (`-nodefaults`): only `lo`, so no
//! packet can leave it; tests build the namespaces they need inside it.
//!
//! A test uses [`in_guest`]: on the host it boots a guest that runs the same test binary
//! with the same test name, and asserts on the guest's exit status; inside the guest (the
//! `/init` script sets [`GUEST_ENV`]) it runs the test's body. A guest that cannot boot,
//! a missing tool and a timeout all fail the test with the guest's console in the message.
//!
//! Cost control: downloads and the unpacked kernel are kept in a cache directory
//! ([`CACHE_ENV`], default `/var/cache/kpr-vm`), shared by concurrent test processes
//! under a file lock; each run builds its own small initramfs in a temporary directory.

mod console;
mod debian;
mod error;
mod guest;
mod initramfs;
mod qemu;

pub use debian::{CACHE_ENV, KernelTree};
pub use error::{Error, Result};
pub use guest::{DEFAULT_TIMEOUT, GUEST_ENV, GUEST_TIMEOUT_SCALE, Guest, GuestRun, in_guest};

/// `ipvsadm -Ln` output (Debian's ipvsadm is in every guest) with each run of blanks as one
/// space, so tests compare lines without the column widths.
pub fn squeeze_columns(listing: &str) -> String {
    listing
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}
