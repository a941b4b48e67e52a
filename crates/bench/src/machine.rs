//! What the numbers were measured on: timings mean little without the machine, kernel and
//! iptables version next to them.

use std::fs;
use std::process::Command;

#[derive(Clone, Debug)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory: String,
    pub os: String,
    pub kernel: String,
    /// `iptables-legacy --version`, `iptables-nft --version` (or why not).
    pub iptables: Vec<String>,
}

impl Machine {
    pub fn detect() -> Self {
        let unknown = || "unknown".to_string();
        Self {
            cpu: fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|text| field(&text, "model name"))
                .unwrap_or_else(unknown),
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory: fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|text| field(&text, "MemTotal"))
                .and_then(|kib| kib.strip_suffix(" kB")?.trim().parse::<u64>().ok())
                .map_or_else(unknown, |kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0)),
            os: fs::read_to_string("/etc/os-release")
                .ok()
                .and_then(|text| os_name(&text))
                .unwrap_or_else(unknown),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| unknown(), |s| s.trim().to_string()),
            iptables: ["iptables-legacy", "iptables-nft"]
                .iter()
                .map(|program| version(program))
                .collect(),
        }
    }
}

/// The 1-minute load average, as /proc/loadavg shows it.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".to_string())
}

/// The value of the first `key : value` line (the /proc/cpuinfo and /proc/meminfo format).
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// `PRETTY_NAME` of /etc/os-release, unquoted.
fn os_name(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
}

fn version(program: &str) -> String {
    match Command::new(program).arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        Ok(out) => format!("{program}: --version failed ({})", out.status),
        Err(err) => format!("{program}: not available ({err})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_style_fields_and_os_release() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nmodel name\t: other\n";
        assert_eq!(field(cpuinfo, "model name").as_deref(), Some("Some CPU @ 2.0GHz"));
        assert_eq!(field(cpuinfo, "flags"), None);
        let os = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n";
        assert_eq!(os_name(os).as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
    }

    #[test]
    fn load_average_is_a_number() {
        let load = load_average();
        assert!(load.parse::<f64>().is_ok(), "{load}");
    }

    #[test]
    fn missing_programs_are_reported_not_fatal() {
        assert!(version("kpr-bench-no-such-program").contains("not available"));
    }
}
