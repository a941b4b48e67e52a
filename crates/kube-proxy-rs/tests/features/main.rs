//! Every Service feature a cluster relies on, proven with real packets, in every proxy mode.
//!
//! Each scenario is a story a user can replay on their own cluster: the Services and
//! EndpointSlices of one file in `examples/features/`, the real kube-proxy-rs binary in the
//! node of a namespace lab (`crates/testing/netns`), and real TCP from the outside client,
//! from pods and from the node. It asserts what a user would see: which pod answered, the
//! source address that pod saw, and whether a request was answered, refused or dropped
//! (timed out). Counts are large enough that a chance pass or fail is out of the question
//! (each scenario says how unlikely); deadlines are ceilings against hangs, never speed
//! checks.
//!
//! The scenarios are functions of the [`Mode`] they run in; [`every_mode!`] turns them into
//! one test per mode (`session_affinity::iptables::each_client_sticks_to_one_pod`). Adding a
//! mode to the suite is one line there, plus its [`Mode`] variant. Scenarios that depend on
//! the kernel translating packets (the pod seeing the client's own address, traffic
//! policies, source ranges) use [`kernel_modes!`] instead, which leaves out userspace mode,
//! where the proxy process opens a connection of its own to the pod; each such use says why.
//! Where upstream's ipvs mode behaves differently by design (its traffic-policy fallbacks,
//! a virtual server without real servers refusing instead of dropping, persistence outliving
//! the affinity timeout), a file lists its modes with [`in_mode!`] and says why; ipvs mode's
//! scenarios play inside a throw-away guest (see [`mode::play`]).
//!
//! The suite also plays upstream's own e2e scenarios for a node proxy, each test named after
//! its upstream `It(...)`, and upstream's bugs as regression tests (`services`, `conntrack`,
//! `traffic_distribution`, `upstream_bugs`, and additions to the files above; the map is
//! docs/upstream-e2e.md). They build their objects in code ([`objects`]), as each upstream
//! test creates its own, and play in the modes on this host ([`host_modes!`]); ipvs mode
//! plays a few of them in one guest ([`in_ipvs_guests!`]). A module lists each mode's
//! scenarios once: a mode's tests are one `mod` per file.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic fails the test

/// Turns each listed scenario `fn(Mode)` of the calling module into one `#[test]` per proxy
/// mode, in a submodule named after the mode. The list of modes lives here only.
macro_rules! every_mode {
    ($($scenario:ident),+ $(,)?) => {
        kernel_modes!($($scenario),+);
        in_mode!(userspace, $crate::mode::Mode::Userspace; $($scenario),+);
    };
}

/// Like [`every_mode!`], for the modes whose kernel rules translate the client's packets
/// (not userspace mode, where the proxy itself connects to the pod).
macro_rules! kernel_modes {
    ($($scenario:ident),+ $(,)?) => {
        netfilter_modes!($($scenario),+);
        in_mode!(ipvs, $crate::mode::Mode::Ipvs; $($scenario),+);
    };
}

/// The modes whose translation is netfilter NAT rules (iptables, nftables, and ebpf, which
/// is nftables mode's rules plus socket programs for local clients), for scenarios where
/// upstream's ipvs mode differs by design; the caller lists ipvs mode's own.
macro_rules! netfilter_modes {
    ($($scenario:ident),+ $(,)?) => {
        in_mode!(iptables, $crate::mode::Mode::Iptables; $($scenario),+);
        in_mode!(nftables, $crate::mode::Mode::Nftables; $($scenario),+);
        in_mode!(ebpf, $crate::mode::Mode::Ebpf; $($scenario),+);
    };
}

/// For upstream's e2e scenarios (docs/upstream-e2e.md): the modes that play on this host,
/// iptables, nftables and userspace. ipvs mode's guests cost a minute each, so ipvs mode
/// plays a chosen few of these scenarios in one guest ([`in_ipvs_guests!`]) and the doc
/// says why the others are left out.
macro_rules! host_modes {
    ($($scenario:ident),+ $(,)?) => {
        netfilter_modes!($($scenario),+);
        in_mode!(userspace, $crate::mode::Mode::Userspace; $($scenario),+);
    };
}

/// Tests `ipvs_guest::<name>`, one guest each, that play the listed scenarios (paths to
/// `fn(Mode)`) in ipvs mode one after the other, each reported by name on the guest's
/// console (see [`mode::play_in_one_ipvs_guest`]). A guest holds two or so: a guest's
/// watchdog (kpr_vm's default timeout) is sized for one boot and a couple of scenarios.
macro_rules! in_ipvs_guests {
    ($($name:ident: $($scenario:path),+);+ $(;)?) => {
        mod ipvs_guest {
            $(
                #[test]
                fn $name() {
                    $crate::mode::play_in_one_ipvs_guest(
                        module_path!(),
                        stringify!($name),
                        &[$((stringify!($scenario), $scenario as fn($crate::mode::Mode))),+],
                    )
                }
            )+
        }
    };
}

/// The tests of one mode: see [`every_mode!`].
macro_rules! in_mode {
    ($module:ident, $mode:expr; $($scenario:ident),+) => {
        mod $module {
            $(
                #[test]
                fn $scenario() {
                    $crate::mode::play($mode, module_path!(), stringify!($scenario), super::$scenario)
                }
            )+
        }
    };
}

#[path = "../support/mod.rs"]
mod support;

mod manifests;
mod mode;
mod objects;
mod stage;
mod traffic;

mod external_ips;
mod external_traffic_policy;
mod internal_traffic_policy;
mod load_balancer;
mod localhost_node_ports;
mod session_affinity;
mod socket_layer;
mod terminating_endpoints;
mod topology;

// Upstream's e2e scenarios and regression tests for upstream's bugs (docs/upstream-e2e.md).
mod conntrack;
mod repair;
mod services;
mod traffic_distribution;
mod upstream_bugs;
mod upstream_in_ipvs_mode;

use mode::Mode;
