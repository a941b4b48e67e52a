//! What a failed guest's console says, in the few lines a reader (or a CI log cut to its
//! first hundred lines after a failure) sees first: the payload's panics, the watchdog's
//! thread list, and how the console ended. The whole console follows it in every error.

/// Lines kept after a `panicked at` line: the assertion's message and its values.
const PANIC_CONTEXT: usize = 4;
/// Enough for a test binary, the proxy and the tools they wait on; more are counted.
const MAX_THREADS: usize = 24;
const TAIL: usize = 12;

/// The console's headlines, each section under its own heading; empty sections left out.
pub(crate) fn digest(console: &str) -> String {
    let lines: Vec<&str> = console.lines().collect();
    let mut out = String::new();
    section(&mut out, "the payload panicked:", &panics(&lines));
    section(&mut out, "the watchdog found these threads:", &threads(&lines));
    let tail = &lines[lines.len().saturating_sub(TAIL)..];
    section(&mut out, "the console ended with:", tail);
    out
}

fn section(out: &mut String, heading: &str, lines: &[&str]) {
    if lines.is_empty() {
        return;
    }
    out.push_str(heading);
    out.push('\n');
    for line in lines {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
}

fn panics<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    let mut kept = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.contains("panicked at") {
            kept.extend(lines.iter().skip(i).take(PANIC_CONTEXT + 1));
        }
    }
    kept
}

/// The watchdog's one line per thread (`init.sh` writes `KPR-VM: pid/task/tid comm [state]
/// wchan=…: cmdline`), not the kernel stacks indented under each.
fn threads<'a>(lines: &[&'a str]) -> Vec<&'a str> {
    let Some(start) = lines
        .iter()
        .position(|l| l.contains("KPR-VM: the payload still runs"))
    else {
        return Vec::new();
    };
    let listed: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| !l.contains("KPR-VM: end of the watchdog's report"))
        .filter(|l| l.starts_with("KPR-VM: ") && !l.starts_with("KPR-VM:  "))
        .copied()
        .collect();
    let mut kept: Vec<&str> = listed.iter().take(MAX_THREADS).copied().collect();
    if listed.len() > MAX_THREADS {
        kept.push("… and more threads: see the console");
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    const HUNG: &str = "\
KPR-VM: guest up: kernel 6.1.0-56-amd64, uptime 1.2 s
running 1 test
KPR-VM: the payload still runs at 120 s of uptime; every thread, its state and its kernel stack:
KPR-VM: 54/task/54 ipvs_vm-1234 [S (sleeping)] wchan=do_wait: ./bin/ipvs_vm-1234 --exact t
KPR-VM:     [<0>] do_wait+0x1/0x2
KPR-VM: 80/task/81 tokio-runtime-w [D (disk sleep)] wchan=nfnl_lock: kube-proxy-rs --proxy-mode=ipvs
KPR-VM:     [<0>] nfnetlink_rcv+0x1/0x2
KPR-VM: end of the watchdog's report
";

    #[test]
    fn a_hang_is_summed_up_by_its_threads_without_their_stacks() {
        let digest = digest(HUNG);
        let (threads, tail) = digest
            .split_once("the console ended with:")
            .expect("the tail follows the threads");
        assert!(
            threads.starts_with("the watchdog found these threads:\n"),
            "{digest}"
        );
        assert!(
            threads.contains("  KPR-VM: 80/task/81 tokio-runtime-w [D (disk sleep)] wchan=nfnl_lock"),
            "{digest}"
        );
        assert!(!threads.contains("nfnetlink_rcv"), "{digest}");
        assert!(
            tail.contains("nfnetlink_rcv"),
            "the tail is the console's end:\n{digest}"
        );
    }

    #[test]
    fn a_panic_is_shown_with_its_message_and_values() {
        let console = "boot\nthread 'x' panicked at tests/a.rs:1:2:\nassertion failed\n  left: 1\n right: 2\nmore\nlater\n";
        let digest = digest(console);
        assert!(
            digest.starts_with(
                "the payload panicked:\n  thread 'x' panicked at tests/a.rs:1:2:\n  assertion failed\n    left: 1\n   right: 2\n  more\n"
            ),
            "{digest}"
        );
        assert!(!digest.contains("watchdog"), "{digest}");
    }

    #[test]
    fn a_long_thread_list_is_cut_and_says_so() {
        let mut console = String::from("KPR-VM: the payload still runs at 1 s of uptime\n");
        for i in 0..30 {
            console.push_str(&format!("KPR-VM: {i}/task/{i} t [S (sleeping)] wchan=x: t\n"));
        }
        let digest = digest(&console);
        assert_eq!(digest.matches("wchan=x").count(), MAX_THREADS + TAIL, "{digest}");
        assert!(digest.contains("… and more threads: see the console"), "{digest}");
    }
}
