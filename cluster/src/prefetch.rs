//! A software prefetch that safe code can issue.
//!
//! Walks over many random keys of a table larger than the CPU's caches (prefix caches, the
//! router's index) ask for the lines they will need a few steps ahead. A plain load does not
//! serve: it cannot retire before its line arrives, so after a few misses the core's reorder
//! window fills and the walk stalls anyway (measured: the simulator's commits spent 94% of their
//! time on such loads). A prefetch instruction retires at once. `std` offers it only as an
//! `unsafe` intrinsic; pulp (already the engine's SIMD layer) wraps it behind a token that
//! proves the CPU has SSE, which every x86-64 CPU has.

/// The cache line (of 64 bytes) `value` starts in: walks that touch runs of neighbours compare
/// it to fetch each line once.
#[inline(always)]
pub fn line_of<T>(value: &T) -> usize {
    std::ptr::from_ref(value) as usize / 64
}

/// Asks the CPU to bring `value`'s cache line into its caches; does nothing else.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    if let Some(sse) = pulp::core_arch::x86::Sse::try_new() {
        sse._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>((value as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
