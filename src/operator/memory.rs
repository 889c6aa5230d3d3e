//! `MEMORY_LIMIT`: upstream gives 90% of the container's memory limit to its garbage collector as
//! a soft limit. A Rust process has no collector to tune, so the controller watches its resident
//! memory instead and warns, once per crossing, when it passes 90% of the limit: the warning
//! comes before the kernel's OOM kill, with the figures an operator needs to raise the limit.

use std::time::Duration;

use tokio::sync::watch;

/// Share of the limit at which the warning comes.
const WARN_AT: f64 = 0.9;
/// Share of the limit below which a later crossing warns again.
const REARM_AT: f64 = 0.8;
/// How often the resident memory is read.
const EVERY: Duration = Duration::from_secs(10);

/// What a reading of the resident memory calls for.
#[derive(Debug, PartialEq, Eq)]
pub enum Notice {
    /// Resident memory passed [`WARN_AT`] of the limit.
    Near,
    /// It fell back below [`REARM_AT`] after a warning.
    Back,
}

/// The warning's state between readings.
#[derive(Debug)]
pub struct MemoryWatch {
    limit: u64,
    warned: bool,
}

impl MemoryWatch {
    /// A watch against `limit` bytes.
    pub fn new(limit: u64) -> Self {
        MemoryWatch { limit, warned: false }
    }

    /// Takes one reading of resident memory, in bytes.
    pub fn observe(&mut self, resident: u64) -> Option<Notice> {
        let share = resident as f64 / self.limit as f64;
        if !self.warned && share >= WARN_AT {
            self.warned = true;
            Some(Notice::Near)
        } else if self.warned && share < REARM_AT {
            self.warned = false;
            Some(Notice::Back)
        } else {
            None
        }
    }
}

/// The process's resident memory in bytes (Linux: `VmRSS` of /proc/self/status).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.trim_start_matches("VmRSS:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Reads resident memory every [`EVERY`] until `stop`, logging the crossings.
pub async fn run(limit: u64, mut stop: watch::Receiver<bool>) {
    let mut memory = MemoryWatch::new(limit);
    let mib = |b: u64| b / (1024 * 1024);
    loop {
        if let Some(resident) = resident_bytes() {
            match memory.observe(resident) {
                Some(Notice::Near) => tracing::warn!(
                    resident_mib = mib(resident),
                    limit_mib = mib(limit),
                    "memory use is above 90% of MEMORY_LIMIT; raise the container's memory limit before it is OOM-killed"
                ),
                Some(Notice::Back) => tracing::info!(
                    resident_mib = mib(resident),
                    limit_mib = mib(limit),
                    "memory use is back below 80% of MEMORY_LIMIT"
                ),
                None => {}
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_once_per_crossing() {
        let mut w = MemoryWatch::new(1000);
        assert_eq!(w.observe(500), None);
        assert_eq!(w.observe(900), Some(Notice::Near));
        assert_eq!(w.observe(950), None, "once");
        assert_eq!(w.observe(850), None, "between the two thresholds: still warned");
        assert_eq!(w.observe(799), Some(Notice::Back));
        assert_eq!(w.observe(920), Some(Notice::Near), "a second crossing warns again");
    }

    #[test]
    fn reads_vm_rss() {
        let status = "Name:\tkarpenter\nVmPeak:\t  200000 kB\nVmRSS:\t   54321 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Some(54321 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
        assert!(resident_bytes().is_some_and(|b| b > 0), "this process has a resident size");
    }
}
