//! What a benchmark result or a measured profile records about the machine it ran on.

/// The CPU's model name from `/proc/cpuinfo` (`?` when unreadable).
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

/// Which of the SIMD flags candle's kernels care about the CPU has.
pub fn cpu_flags() -> Vec<&'static str> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    ["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni"]
        .into_iter()
        .filter(|f| flags.contains(f))
        .collect()
}

/// `/proc/loadavg` as it reads now, trimmed (`?` when unreadable): the 1, 5 and 15 minute load
/// averages, runnable and total tasks and the last pid. Results record it, since these
/// machines are shared.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(|_| "?".into(), |s| s.trim().to_string())
}

/// The kernel's transparent huge page mode, the bracketed word of
/// `/sys/kernel/mm/transparent_hugepage/enabled` (`always`, `madvise` or `never`; `?` when
/// unreadable). Memory results record it: mimalloc asks for huge pages (`madvise`), which
/// makes resident memory grow in 2 MiB steps where the kernel grants them.
pub fn transparent_huge_pages() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| thp_mode(&s).map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

fn thp_mode(s: &str) -> Option<&str> {
    s.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bracketed_thp_mode_is_the_active_one() {
        assert_eq!(super::thp_mode("always [madvise] never\n"), Some("madvise"));
        assert_eq!(super::thp_mode("[always] madvise never"), Some("always"));
        assert_eq!(super::thp_mode("always madvise never"), None);
    }
}
