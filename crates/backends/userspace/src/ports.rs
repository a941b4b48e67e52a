//! The host ports the listeners use: upstream's port allocator (port_allocator.go) for
//! `--proxy-port-range`, and the same scan over the kernel's ephemeral range without one.
//!
//! Ports are handed out from a random place in the range, scanning upward and wrapping,
//! skipping those already ours and those another process holds (the bind fails with
//! "address in use", and the scan moves on, as upstream's proxier retries). A random start
//! keeps a restarted proxy from fighting its previous instance's sockets in TIME_WAIT for
//! the same few ports.
//!
//! Without `--proxy-port-range`, upstream let the kernel pick (port 0). The kernel searches
//! its ephemeral range for a port no socket holds, and that search grows with the ports
//! taken: in a namespace with 10,000 listeners, the 10,000 binds to port 0 took 5.9 s (and
//! 14,000 took 10.3 s), the same binds to ports chosen here 0.09 s. So the scan here covers
//! the kernel's range (`net.ipv4.ip_local_port_range`, less `ip_local_reserved_ports`),
//! odd ports first as the kernel's own search for `bind` does (it leaves the even ones to
//! outgoing connections), and knows which ports are its own without asking the kernel.
//! Port 0 is no last resort: once no port of the range binds, the kernel's search finds
//! none free either, except by sharing a bound one where the sockets' options allow it (a
//! UDP socket with `SO_REUSEADDR` given port 0 in a full range got a port another socket
//! held), which would give two service ports one port. For the same reason a port the
//! kernel picks (when the range cannot be read) that is already ours is refused.

use std::collections::BTreeSet;
use std::io;
use std::ops::RangeInclusive;

/// Where the listeners' ports come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortSource {
    /// `--proxy-port-range`.
    Configured(RangeInclusive<u16>),
    /// The kernel's ephemeral range and the ports reserved in it.
    Ephemeral {
        range: RangeInclusive<u16>,
        reserved: Vec<RangeInclusive<u16>>,
    },
    /// Only port 0: the kernel's ephemeral range could not be read.
    Kernel,
}

const PORT_RANGE_SYSCTL: &str = "/proc/sys/net/ipv4/ip_local_port_range";
const RESERVED_PORTS_SYSCTL: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

impl PortSource {
    /// `--proxy-port-range` when given, else the ephemeral range of the calling thread's
    /// network namespace (the sysctls are per namespace; IPv6 uses the IPv4 ones).
    pub fn of(configured: Option<RangeInclusive<u16>>) -> Self {
        if let Some(range) = configured {
            return Self::Configured(range);
        }
        let read = |path| std::fs::read_to_string(path).ok();
        let Some(range) = read(PORT_RANGE_SYSCTL)
            .as_deref()
            .and_then(parse_local_port_range)
        else {
            tracing::warn!(
                path = PORT_RANGE_SYSCTL,
                "cannot read the ephemeral port range; the kernel picks each listener's port"
            );
            return Self::Kernel;
        };
        let reserved = read(RESERVED_PORTS_SYSCTL)
            .as_deref()
            .map(parse_reserved_ports)
            .unwrap_or_default();
        Self::Ephemeral { range, reserved }
    }
}

/// `ip_local_port_range`: two numbers, low and high.
fn parse_local_port_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut numbers = text.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(low)), Some(Ok(high)), None) = (numbers.next(), numbers.next(), numbers.next()) else {
        return None;
    };
    (low >= 1 && low <= high).then_some(low..=high)
}

/// `ip_local_reserved_ports`: ports and ranges, comma-separated (`8080,9000-9010`); an
/// entry that does not parse reserves nothing.
fn parse_reserved_ports(text: &str) -> Vec<RangeInclusive<u16>> {
    text.trim()
        .split(',')
        .filter_map(|entry| {
            let (low, high) = entry.split_once('-').unwrap_or((entry, entry));
            let (low, high) = (low.trim().parse().ok()?, high.trim().parse().ok()?);
            (low <= high).then_some(low..=high)
        })
        .collect()
}

/// Ports taken from a [`PortSource`].
#[derive(Debug)]
pub struct PortAllocator {
    source: PortSource,
    used: BTreeSet<u16>,
}

#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    #[error("no free port left in {range} {low}-{high}")]
    Exhausted {
        /// Which range: `--proxy-port-range` or the kernel's.
        range: &'static str,
        low: u16,
        high: u16,
    },
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

impl AllocError {
    /// The `limit` label of `kubeproxy_userspace_limit_reached_total` this error counts
    /// as, if it is a limit.
    pub fn limit(&self) -> Option<&'static str> {
        match self {
            Self::Exhausted { range, .. } if *range == CONFIGURED => Some("proxy_port_range"),
            Self::Exhausted { .. } => Some("ephemeral_ports"),
            Self::Descriptors { .. } => Some("listener_descriptors"),
            Self::Bind { .. } => None,
        }
    }
}

const CONFIGURED: &str = "--proxy-port-range";
const EPHEMERAL: &str = "the kernel's ephemeral port range (net.ipv4.ip_local_port_range)";

impl PortAllocator {
    pub fn new(source: PortSource) -> Self {
        Self {
            source,
            used: BTreeSet::new(),
        }
    }

    /// The ports to try, in order, for a scan starting at offset `start` of the range.
    pub fn candidates(&self, start: usize) -> impl Iterator<Item = u16> + '_ {
        let (configured, ephemeral, kernel) = match &self.source {
            PortSource::Configured(range) => (Some(wrapped(range, start, 1)), None, None),
            PortSource::Ephemeral { range, reserved } => {
                let odd_first = |parity: u16| {
                    let first = range.start() + u16::from(range.start() % 2 != parity);
                    let last = range.end() - u16::from(range.end() % 2 != parity);
                    (first <= last).then(|| wrapped(&(first..=last), start, 2))
                };
                let scan = odd_first(1)
                    .into_iter()
                    .flatten()
                    .chain(odd_first(0).into_iter().flatten())
                    .filter(move |port| !reserved.iter().any(|r| r.contains(port)));
                (None, Some(scan), None)
            }
            PortSource::Kernel => (None, None, Some(0)),
        };
        configured
            .into_iter()
            .flatten()
            .chain(ephemeral.into_iter().flatten())
            .filter(|port| !self.used.contains(port))
            .chain(kernel)
    }

    /// Binds the first candidate `bind` accepts (a port another process holds is skipped)
    /// and records the port it got (`bind` returns it: the kernel's choice for 0).
    pub fn allocate<T>(
        &mut self,
        start: usize,
        mut bind: impl FnMut(u16) -> io::Result<(T, u16)>,
    ) -> Result<(T, u16), AllocError> {
        let mut bound = None;
        for port in self.candidates(start) {
            match bind(port) {
                // Only the kernel's choice can be ours already (see the module docs).
                Ok((_, actual)) if self.used.contains(&actual) => break,
                Ok(got) => {
                    bound = Some(got);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(source) => return Err(AllocError::Bind { port, source }),
            }
        }
        let Some((socket, port)) = bound else {
            return Err(self.exhausted());
        };
        self.used.insert(port);
        Ok((socket, port))
    }

    fn exhausted(&self) -> AllocError {
        let (range, low, high) = match &self.source {
            PortSource::Configured(range) => (CONFIGURED, *range.start(), *range.end()),
            PortSource::Ephemeral { range, .. } => (EPHEMERAL, *range.start(), *range.end()),
            PortSource::Kernel => (EPHEMERAL, 0, 0),
        };
        AllocError::Exhausted { range, low, high }
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

/// Every `step`-th port of `range` (which starts and ends on that grid), from offset
/// `start` (in steps), wrapping.
fn wrapped(range: &RangeInclusive<u16>, start: usize, step: u16) -> impl Iterator<Item = u16> + use<> {
    let (low, high) = (*range.start(), *range.end());
    let size = usize::from((high - low) / step) + 1;
    (0..size).map(move |i| {
        let offset = u16::try_from((start + i) % size).unwrap_or(0);
        low + offset * step
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_use() -> io::Error {
        io::Error::from(io::ErrorKind::AddrInUse)
    }

    fn configured(range: RangeInclusive<u16>) -> PortAllocator {
        PortAllocator::new(PortSource::Configured(range))
    }

    fn candidates(ports: &PortAllocator, start: usize) -> Vec<u16> {
        ports.candidates(start).collect()
    }

    #[test]
    fn without_a_readable_range_the_kernel_picks() {
        let mut ports = PortAllocator::new(PortSource::Kernel);
        assert_eq!(candidates(&ports, 7), [0]);
        let (_, port) = ports
            .allocate(7, |p| Ok(((), if p == 0 { 41234 } else { p })))
            .unwrap();
        assert_eq!(port, 41234);
        let error = ports.allocate(7, |_| Err::<((), u16), _>(in_use())).unwrap_err();
        assert_eq!(error.limit(), Some("ephemeral_ports"), "{error}");
        let error = ports
            .allocate(7, |_| Ok(((), 41234)))
            .expect_err("a port already ours is not handed out twice");
        assert_eq!(error.limit(), Some("ephemeral_ports"), "{error}");
    }

    #[test]
    fn the_ephemeral_range_is_scanned_odd_ports_first_without_reserved_ones() {
        let mut ports = PortAllocator::new(PortSource::Ephemeral {
            range: 40000..=40007,
            reserved: vec![40003..=40003, 40008..=40009],
        });
        assert_eq!(
            candidates(&ports, 1),
            [40005, 40007, 40001, 40002, 40004, 40006, 40000]
        );
        let (_, first) = ports.allocate(1, |p| Ok(((), p))).unwrap();
        assert_eq!(first, 40005);
        // 40007 is held by someone else: skipped, and 40005 is known to be ours.
        let (_, second) = ports
            .allocate(1, |p| if p == 40007 { Err(in_use()) } else { Ok(((), p)) })
            .unwrap();
        assert_eq!(second, 40001);
        assert_eq!(candidates(&ports, 0), [40007, 40000, 40002, 40004, 40006]);
        let error = ports.allocate(0, |_| Err::<((), u16), _>(in_use())).unwrap_err();
        assert_eq!(
            error.to_string(),
            "no free port left in the kernel's ephemeral port range (net.ipv4.ip_local_port_range) 40000-40007"
        );
        ports.release(40005);
        assert_eq!(ports.in_use(), 1);
    }

    #[test]
    fn the_kernels_sysctls_parse_and_nonsense_reserves_nothing() {
        assert_eq!(parse_local_port_range("32768\t60999\n"), Some(32768..=60999));
        assert_eq!(parse_local_port_range("1024 1024"), Some(1024..=1024));
        for bad in ["", "60999 32768", "0 10", "1 2 3", "a b", "70000 70001"] {
            assert_eq!(parse_local_port_range(bad), None, "{bad:?}");
        }
        assert_eq!(parse_reserved_ports("\n"), []);
        assert_eq!(
            parse_reserved_ports("8080,9000-9010, 7 ,x,5-4\n"),
            [8080..=8080, 9000..=9010, 7..=7]
        );
    }

    #[test]
    fn a_namespaces_own_range_is_read() {
        // This test thread's namespace: whatever its sysctl says is what the scan covers.
        let text = std::fs::read_to_string(PORT_RANGE_SYSCTL).expect("the sysctl is readable");
        let range = parse_local_port_range(&text).expect("the kernel's range parses");
        match PortSource::of(None) {
            PortSource::Ephemeral { range: read, .. } => assert_eq!(read, range),
            other => panic!("not the ephemeral range: {other:?}"),
        }
        assert_eq!(PortSource::of(Some(100..=200)), PortSource::Configured(100..=200));
    }

    #[test]
    fn a_scan_starts_anywhere_wraps_and_skips_ports_in_use() {
        let mut ports = configured(40000..=40003);
        assert_eq!(candidates(&ports, 2), [40002, 40003, 40000, 40001]);
        let (_, first) = ports.allocate(2, |p| Ok(((), p))).unwrap();
        assert_eq!(first, 40002);
        // 40003 is held by someone else: skipped.
        let (_, second) = ports
            .allocate(2, |p| if p == 40003 { Err(in_use()) } else { Ok(((), p)) })
            .unwrap();
        assert_eq!(second, 40000);
        assert_eq!(candidates(&ports, 0), [40001, 40003]);
        ports.release(40002);
        assert_eq!(candidates(&ports, 0), [40001, 40002, 40003]);
    }

    #[test]
    fn a_full_range_says_so_and_other_errors_stop_the_scan() {
        let mut ports = configured(40000..=40001);
        let error = ports.allocate(0, |_| Err::<((), u16), _>(in_use())).unwrap_err();
        assert_eq!(
            error.to_string(),
            "no free port left in --proxy-port-range 40000-40001"
        );
        assert_eq!(error.limit(), Some("proxy_port_range"));
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
        let single = configured(40005..=40005);
        assert_eq!(candidates(&single, 9), [40005]);
    }
}
