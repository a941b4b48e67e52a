//! The harness on a real guest: the kernel is Debian's (not this host's), the kernel
//! features the ipvs mode needs are there, the host tools run, results and failures come
//! back. Needs root, qemu-system-x86 and apt access to Debian's registry.

use std::process::Command;
use std::time::Duration;

use kpr_vm::{Error, Guest, in_guest};

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} could not run: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs each command of `commands` (words split on spaces).
fn each(commands: &[&str]) {
    for command in commands {
        let words: Vec<&str> = command.split(' ').collect();
        run(words[0], &words[1..]);
    }
}

#[test]
fn the_guest_runs_debians_kernel_with_ipvs_and_the_host_tools() {
    in_guest(
        "the_guest_runs_debians_kernel_with_ipvs_and_the_host_tools",
        || {
            // The tests' waits are stretched for the emulated guest.
            let scale = std::env::var(kpr_netns::TIMEOUT_SCALE_ENV);
            assert_eq!(scale, Ok(kpr_vm::GUEST_TIMEOUT_SCALE.to_string()));
            let release = run("uname", &["-r"]);
            assert!(release.trim().ends_with("-amd64"), "guest kernel {release}");
            // Loaded on demand through busybox's modprobe, as the kernel would for a netlink user.
            each(&["modprobe ip_vs", "modprobe ip_vs_rr", "modprobe ip_vs_sh"]);
            let ipvs = std::fs::read_to_string("/proc/net/ip_vs").expect("ip_vs is loaded");
            assert!(ipvs.starts_with("IP Virtual Server version"), "{ipvs}");
            each(&[
                "ip link add kube-ipvs0 type dummy",
                "ip addr add 10.96.0.1/32 dev kube-ipvs0",
                "ip netns add pod",
                "ip link add veth0 type veth peer name eth0 netns pod",
                "ip link add br0 type bridge",
                "ip link set veth0 master br0",
                "ipset create KUBE-CLUSTER-IP hash:ip,port",
                "ipset add KUBE-CLUSTER-IP 10.96.0.1,tcp:80",
                "iptables -t nat -N KUBE-SERVICES",
                "iptables -t nat -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
                "iptables-legacy -t nat -N KUBE-LEGACY",
                "ip6tables -t filter -N KUBE-V6",
                "nft add table ip kube-proxy",
                "conntrack -L",
            ]);
            assert!(run("iptables-save", &[]).contains("KUBE-CLUSTER-IP"));
            // `sh` is a shell that finds the host tools, not busybox's applets.
            let netns = run("sh", &["-c", "ip netns list"]);
            assert!(netns.contains("pod"), "{netns}");
        },
    );
}

#[test]
fn a_scripts_status_and_its_channel_come_back() {
    let run = Guest::new()
        .script("echo -n channel-bytes > /dev/ttyS1; exit 7")
        .run()
        .expect("the guest runs");
    assert_eq!(run.status, 7, "{}", run.console);
    assert_eq!(run.channel, b"channel-bytes");
}

#[test]
#[should_panic(expected = "did not finish")]
fn a_body_that_fails_in_the_guest_fails_on_the_host() {
    in_guest("a_body_that_fails_in_the_guest_fails_on_the_host", || {
        panic!("deliberately failing inside the guest");
    });
}

#[test]
fn a_guest_that_never_powers_off_is_a_timeout_that_says_what_still_ran() {
    let error = Guest::new()
        .script("sleep 600")
        .timeout(Duration::from_secs(30))
        .run()
        .expect_err("the guest cannot finish");
    let Error::Timeout { console, .. } = &error else {
        panic!("not a timeout: {error}");
    };
    let report = console
        .split_once("KPR-VM: the payload still runs at 20 s of uptime")
        .map(|(_, report)| report)
        .unwrap_or_else(|| panic!("no watchdog report in the console:\n{console}"));
    let sleeping = report
        .lines()
        .find(|line| line.ends_with(": sleep 600 "))
        .unwrap_or_else(|| panic!("the sleeping payload is not in the report:\n{report}"));
    assert!(sleeping.contains("[S (sleeping)]"), "{sleeping}");
    assert!(
        report.contains("KPR-VM: end of the watchdog's report"),
        "{report}"
    );
}
