//! CPU time of a process from `/proc/<pid>/stat` (user + system, all its threads).

use std::time::Duration;

use crate::BenchError;

/// Clock ticks per second of `/proc` times (`getconf CLK_TCK`; Linux's USER_HZ is 100 when
/// getconf is missing).
pub fn clock_ticks_per_sec() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// Reads one process's CPU time; build once, call [`cpu_time`](Self::cpu_time) per sample.
#[derive(Clone, Debug)]
pub struct CpuClock {
    pid: u32,
    ticks_per_sec: u64,
}

impl CpuClock {
    /// A clock for process `pid`.
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            ticks_per_sec: clock_ticks_per_sec(),
        }
    }

    /// utime + stime of the process so far (exited threads included, children not).
    pub fn cpu_time(&self) -> Result<Duration, BenchError> {
        let path = format!("/proc/{}/stat", self.pid);
        let text =
            std::fs::read_to_string(&path).map_err(BenchError::io(format!("read {path}")))?;
        let ticks = parse_stat_cpu_ticks(&text).ok_or_else(|| BenchError::Parse {
            what: path,
            detail: "no utime/stime fields".into(),
        })?;
        Ok(Duration::from_micros(
            ticks * 1_000_000 / self.ticks_per_sec,
        ))
    }

    /// The clock's resolution (one tick).
    pub fn resolution(&self) -> Duration {
        Duration::from_micros(1_000_000 / self.ticks_per_sec)
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line, in clock ticks. The command
/// name (field 2) is in parentheses and may hold spaces and parentheses, so fields are counted
/// from the last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so utime (14) is index 11, stime (15) 12.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields_after_an_odd_command_name() {
        let line = "4242 (we ird) name)) S 1 2 3 4 5 6 7 8 9 10 250 17 0 0 20 0 9 0 1000";
        assert_eq!(parse_stat_cpu_ticks(line), Some(267));
        assert_eq!(parse_stat_cpu_ticks("1 (x) S 1 2"), None);
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn reads_our_own_cpu_time() {
        let clock = CpuClock::new(std::process::id());
        let before = clock.cpu_time().expect("cpu");
        // Burn a little CPU so the counter cannot go backwards by accident of rounding.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(clock.cpu_time().expect("cpu") >= before);
        assert!(clock.resolution() > Duration::ZERO);
    }
}
