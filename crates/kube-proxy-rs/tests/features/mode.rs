//! The proxy modes the suite runs in, and what differs between them for a test: the flags
//! that select a mode, and how to show what it programmed when a scenario fails.
//!
//! Everything a scenario asserts is traffic (or, once, the absence of an address from the
//! programmed rules), so the same scenarios hold for every mode. Where a mode plays differs:
//! ipvs mode needs IPVS, which this host's kernel lacks, so its scenarios play inside a
//! throw-away guest booting Debian's kernel (kpr-vm), the same test binary running there.

use std::net::SocketAddr;

use kpr_netns::Netns;

use crate::traffic::Sender;

/// A proxy mode the suite runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    /// The proxy process carries the traffic; its portals are iptables rules.
    Userspace,
    /// IPVS virtual servers, played inside a guest (see the module docs).
    Ipvs,
}

impl Mode {
    /// The mode's name, as `--proxy-mode` and `/proxyMode` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables => "iptables",
            Mode::Nftables => "nftables",
            Mode::Userspace => "userspace",
            Mode::Ipvs => "ipvs",
        }
    }

    /// The flags that make kube-proxy-rs run in this mode.
    pub fn flags(self) -> Vec<String> {
        vec![format!("--proxy-mode={}", self.name())]
    }

    /// Everything the mode programmed in `node`, as its own tools print it: for a failed
    /// scenario's reader, and for "this address appears in no rule".
    pub fn ruleset(self, node: &Netns) -> kpr_netns::Result<String> {
        let dump = match self {
            Mode::Iptables | Mode::Userspace => "iptables-save",
            // Map elements hold the addresses in this mode, and the listing shows them.
            Mode::Nftables => "nft list ruleset",
            // Virtual servers hold the addresses, the sets their ports; the rules match sets.
            Mode::Ipvs => "ipvsadm -Ln && ipset list && iptables-save",
        };
        node.sh(dump)
    }
}

impl Mode {
    /// Asserts what `sender` sees from `to`, a Service address whose traffic policy leaves
    /// it no endpoint: iptables and nftables modes drop it (upstream's rules do), ipvs mode
    /// refuses it (a virtual server without real servers, as upstream's ipvs mode leaves it).
    #[track_caller]
    pub fn assert_turned_away(self, sender: &Sender<'_>, to: SocketAddr) {
        match self {
            Mode::Ipvs => sender.wait_refused(to),
            _ => sender.assert_dropped(to),
        }
    }
}

/// Plays `scenario` in `mode`: here, or for ipvs mode inside a guest that runs this same
/// test (`module` is the calling test module's `module_path!()`, `name` the test's name).
pub fn play(mode: Mode, module: &str, name: &str, scenario: fn(Mode)) {
    if mode != Mode::Ipvs {
        return scenario(mode);
    }
    // libtest names a test by its path without the crate.
    let (_crate, path) = module.split_once("::").expect("a test module inside the crate");
    kpr_vm::Guest::new()
        .binary(crate::support::proxy_binary())
        .in_guest(&format!("{path}::{name}"), || scenario(mode));
}

/// A scenario as [`play_in_one_ipvs_guest`] takes it: its name and its body.
pub type NamedScenario<'a> = (&'a str, fn(Mode));

/// Plays `scenarios` in ipvs mode, one after the other, in one guest that runs this same
/// test (`module` and `name` as for [`play`]): a guest boot and the emulator's slow start
/// of every process cost a minute per guest, which a test per scenario would pay again and
/// again. Each scenario's start and end are printed with its name in the guest, so a
/// failure's console says which one failed; after a pass the host prints those lines in the
/// test's output.
pub fn play_in_one_ipvs_guest(module: &str, name: &str, scenarios: &[NamedScenario<'_>]) {
    const MARK: &str = "ipvs scenario ";
    let (_crate, path) = module.split_once("::").expect("a test module inside the crate");
    let console = kpr_vm::Guest::new()
        .binary(crate::support::proxy_binary())
        .in_guest_console(&format!("{path}::{name}"), || {
            for (scenario, play) in scenarios {
                println!("{MARK}{scenario}: started");
                let started = std::time::Instant::now();
                play(Mode::Ipvs);
                println!("{MARK}{scenario}: passed in {:.1?}", started.elapsed());
            }
        });
    for line in console
        .iter()
        .flat_map(|c| c.lines())
        .filter(|l| l.contains(MARK))
    {
        println!("{}", line.trim());
    }
}
