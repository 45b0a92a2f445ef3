//! A network link of a given rate on one machine: a private network namespace whose loopback
//! is shaped by a token bucket (`tc qdisc ... tbf`), so a benchmark run inside it (`ip netns
//! exec`) sees a NIC's rate instead of memory-copy speed. Needs root and iproute2. The
//! namespace is removed on drop.

use std::process::Command;

use crate::BenchError;

/// Token-bucket depth in seconds of the link's rate (2 ms): deep enough that the qdisc's
/// timer is not what limits, shallow against a benchmark's hundreds of milliseconds.
const BURST_SECS: f64 = 0.002;
/// The smallest bucket: a 64 KiB loopback segment must always fit, with room to spare.
const MIN_BURST_BYTES: u64 = 1 << 20;

/// A network namespace whose loopback runs at `gbit` Gbit/s.
#[derive(Debug)]
pub struct ShapedLoopback {
    netns: String,
    gbit: f64,
}

fn run(program: &str, args: &[&str]) -> Result<(), BenchError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(BenchError::io(format!("run {program}")))?;
    if !out.status.success() {
        return Err(BenchError::Setup(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The bucket for a link of `gbit` Gbit/s, bytes.
pub fn burst_bytes(gbit: f64) -> u64 {
    ((gbit * 1e9 / 8.0 * BURST_SECS) as u64).max(MIN_BURST_BYTES)
}

impl ShapedLoopback {
    /// Makes the namespace `name` with its loopback up and shaped to `gbit` Gbit/s.
    pub fn create(name: &str, gbit: f64) -> Result<Self, BenchError> {
        if !(gbit.is_finite() && gbit > 0.0) {
            return Err(BenchError::Setup(format!(
                "a link rate must be a positive number of Gbit/s, not {gbit}"
            )));
        }
        run("ip", &["netns", "add", name]).map_err(|e| {
            BenchError::Setup(format!("{e} (a shaped link needs root and iproute2)"))
        })?;
        // From here on, Drop removes the namespace, also on an error below.
        let link = ShapedLoopback {
            netns: name.to_owned(),
            gbit,
        };
        run("ip", &["-n", name, "link", "set", "lo", "up"])?;
        let (rate, burst) = (format!("{gbit}gbit"), burst_bytes(gbit).to_string());
        run(
            "ip",
            &[
                "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate",
                &rate, "burst", &burst, "latency", "20ms",
            ],
        )?;
        Ok(link)
    }

    /// The link's rate, Gbit/s.
    pub fn gbit(&self) -> f64 {
        self.gbit
    }

    /// `program` to be run inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).arg(program);
        c
    }
}

impl Drop for ShapedLoopback {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.netns]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_holds_two_milliseconds_of_the_rate_and_at_least_a_mebibyte() {
        assert_eq!(burst_bytes(10.0), 2_500_000);
        assert_eq!(burst_bytes(25.0), 6_250_000);
        assert_eq!(burst_bytes(1.0), 1 << 20);
    }

    #[test]
    fn the_namespace_has_a_shaped_loopback_and_goes_away_on_drop() {
        let name = format!("dolphin-link-test-{}", std::process::id());
        let link = match ShapedLoopback::create(&name, 1.5) {
            Ok(link) => link,
            Err(e) => {
                // Namespaces need root and iproute2; CI has both.
                eprintln!("skipped: {e}");
                return;
            }
        };
        let out = link
            .command(std::path::Path::new("tc"))
            .args(["qdisc", "show", "dev", "lo"])
            .output()
            .expect("tc runs");
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("tbf") && shown.contains("rate 1500Mbit"),
            "{shown}"
        );
        drop(link);
        let list = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip runs");
        assert!(!String::from_utf8_lossy(&list.stdout).contains(&name));
    }

    #[test]
    fn a_rate_must_be_positive() {
        for bad in [0.0, -1.0, f64::NAN] {
            let e = ShapedLoopback::create("dolphin-never-made", bad).unwrap_err();
            assert!(e.to_string().contains("positive"), "{e}");
        }
    }
}
