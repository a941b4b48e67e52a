//! The host ports the listeners use: upstream's port allocator (port_allocator.go) for
//! `--proxy-port-range`.
//!
//! With a range, ports are handed out from a random place in it, scanning upward and
//! wrapping, skipping those already ours and those another process holds (the bind fails
//! with "address in use", and the scan moves on, as upstream's proxier retries). Without
//! one the kernel picks (port 0). A random start keeps a restarted proxy from fighting
//! its previous instance's sockets in TIME_WAIT for the same few ports.

use std::collections::BTreeSet;
use std::io;
use std::ops::RangeInclusive;

/// Ports taken from `--proxy-port-range`, or the kernel's choice.
#[derive(Debug, Default)]
pub struct PortAllocator {
    range: Option<RangeInclusive<u16>>,
    used: BTreeSet<u16>,
}

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("no free port left in --proxy-port-range {low}-{high}")]
    Exhausted { low: u16, high: u16 },
    #[error(
        "no file descriptor left for another listener: the listeners hold {used} of the {limit} \
         set aside for them (half of the open-file limit; raise it, e.g. LimitNOFILE or ulimit -n)"
    )]
    Descriptors { used: usize, limit: usize },
    #[error("cannot listen on port {port}: {source}")]
    Bind {
        port: u16,
        #[source]
        source: io::Error,
    },
}

impl PortAllocator {
    /// `None`: the kernel picks each port.
    pub fn new(range: Option<RangeInclusive<u16>>) -> Self {
        Self {
            range,
            used: BTreeSet::new(),
        }
    }

    /// The ports to try, in order, for a scan starting at offset `start` of the range:
    /// only 0 without a range.
    pub fn candidates(&self, start: usize) -> Vec<u16> {
        let Some(range) = &self.range else {
            return vec![0];
        };
        let (low, high) = (*range.start(), *range.end());
        let size = usize::from(high - low) + 1;
        (0..size)
            .map(|i| low + u16::try_from((start + i) % size).unwrap_or(0))
            .filter(|port| !self.used.contains(port))
            .collect()
    }

    /// Binds the first candidate `bind` accepts (a port another process holds is skipped)
    /// and records the port it got (`bind` returns it: the kernel's choice for 0).
    pub fn allocate<T>(
        &mut self,
        start: usize,
        mut bind: impl FnMut(u16) -> io::Result<(T, u16)>,
    ) -> Result<(T, u16), AllocError> {
        for port in self.candidates(start) {
            match bind(port) {
                Ok((bound, actual)) => {
                    if self.range.is_some() {
                        self.used.insert(actual);
                    }
                    return Ok((bound, actual));
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && self.range.is_some() => continue,
                Err(source) => return Err(AllocError::Bind { port, source }),
            }
        }
        let range = self.range.clone().unwrap_or(0..=0);
        Err(AllocError::Exhausted {
            low: *range.start(),
            high: *range.end(),
        })
    }

    /// Gives a port back.
    pub fn release(&mut self, port: u16) {
        self.used.remove(&port);
    }

    /// Ports handed out and not given back.
    pub fn in_use(&self) -> usize {
        self.used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_use() -> io::Error {
        io::Error::from(io::ErrorKind::AddrInUse)
    }

    #[test]
    fn without_a_range_the_kernel_picks() {
        let mut ports = PortAllocator::new(None);
        assert_eq!(ports.candidates(7), [0]);
        let (_, port) = ports
            .allocate(7, |p| Ok(((), if p == 0 { 41234 } else { p })))
            .unwrap();
        assert_eq!(port, 41234);
        assert_eq!(ports.in_use(), 0, "nothing of a range to track");
    }

    #[test]
    fn a_scan_starts_anywhere_wraps_and_skips_ports_in_use() {
        let mut ports = PortAllocator::new(Some(40000..=40003));
        assert_eq!(ports.candidates(2), [40002, 40003, 40000, 40001]);
        let (_, first) = ports.allocate(2, |p| Ok(((), p))).unwrap();
        assert_eq!(first, 40002);
        // 40003 is held by someone else: skipped.
        let (_, second) = ports
            .allocate(2, |p| if p == 40003 { Err(in_use()) } else { Ok(((), p)) })
            .unwrap();
        assert_eq!(second, 40000);
        assert_eq!(ports.candidates(0), [40001, 40003]);
        ports.release(40002);
        assert_eq!(ports.candidates(0), [40001, 40002, 40003]);
    }

    #[test]
    fn a_full_range_says_so_and_other_errors_stop_the_scan() {
        let mut ports = PortAllocator::new(Some(40000..=40001));
        let error = ports.allocate(0, |_| Err::<((), u16), _>(in_use())).unwrap_err();
        assert_eq!(
            error.to_string(),
            "no free port left in --proxy-port-range 40000-40001"
        );
        let mut tried = Vec::new();
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let error = ports
            .allocate(0, |p| {
                tried.push(p);
                Err::<((), u16), _>(io::Error::from(denied.kind()))
            })
            .unwrap_err();
        assert!(matches!(error, AllocError::Bind { port: 40000, .. }), "{error}");
        assert_eq!(tried, [40000]);
        let single = PortAllocator::new(Some(40005..=40005));
        assert_eq!(single.candidates(9), [40005]);
    }
}
