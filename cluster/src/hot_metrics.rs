//! Metric handles for hot paths, looked up once per label set. `metrics::counter!` and its
//! kin find the handle in the recorder's registry on every call: they build the key, hash its
//! name and labels and compare them, about 800 instructions in the router, which records a
//! dozen metrics per request. A handle kept here is an atomic add.
//!
//! Handles are kept only once [`crate::telemetry::init_metrics`] has installed the global
//! recorder (which then never changes): before that, the macros' handles are no-ops and must
//! not be kept. Keys are the `&'static str`s' addresses and lengths, so a label value must be
//! a static string from a fixed set (the metric naming rule already); one value spelled at two
//! addresses gets two entries for the same metric, which is harmless.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use metrics::{Counter, Gauge, Histogram, Label};

/// At most this many labels per metric.
const MAX_LABELS: usize = 2;

/// A metric's name and labels, by address and length.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key([usize; 2 + 4 * MAX_LABELS]);

impl Hash for Key {
    /// Word by word: an array of integers hashes as one byte slice, which [`AddressHasher`]
    /// would take eight bytes at a time through a copy.
    fn hash<H: Hasher>(&self, state: &mut H) {
        for &word in &self.0 {
            state.write_usize(word);
        }
    }
}

/// Handles of one thread (the router serves each request on one shard thread).
#[derive(Default)]
struct Handles {
    counters: HashMap<Key, Counter, BuildHasherDefault<AddressHasher>>,
    gauges: HashMap<Key, Gauge, BuildHasherDefault<AddressHasher>>,
    histograms: HashMap<Key, Histogram, BuildHasherDefault<AddressHasher>>,
}

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::default();
}

/// The counter `name` with `labels`, as `metrics::counter!(name, labels)` gives it.
pub fn counter<const N: usize>(
    name: &'static str,
    labels: [(&'static str, &'static str); N],
) -> Counter {
    cached(
        name,
        labels,
        |h| &mut h.counters,
        |labels| metrics::counter!(name, labels),
    )
}

/// The gauge `name` with `labels`.
pub fn gauge<const N: usize>(
    name: &'static str,
    labels: [(&'static str, &'static str); N],
) -> Gauge {
    cached(
        name,
        labels,
        |h| &mut h.gauges,
        |labels| metrics::gauge!(name, labels),
    )
}

/// The histogram `name` with `labels`.
pub fn histogram<const N: usize>(
    name: &'static str,
    labels: [(&'static str, &'static str); N],
) -> Histogram {
    cached(
        name,
        labels,
        |h| &mut h.histograms,
        |labels| metrics::histogram!(name, labels),
    )
}

fn cached<const N: usize, H: Clone>(
    name: &'static str,
    labels: [(&'static str, &'static str); N],
    map: impl Fn(&mut Handles) -> &mut HashMap<Key, H, BuildHasherDefault<AddressHasher>>,
    register: impl Fn(Vec<Label>) -> H,
) -> H {
    const { assert!(N <= MAX_LABELS, "more labels than hot_metrics keys hold") };
    let owned = || {
        labels
            .iter()
            .map(|&(k, v)| Label::from_static_parts(k, v))
            .collect()
    };
    if !crate::telemetry::metrics_installed() {
        return register(owned());
    }
    let mut key = Key([0; 2 + 4 * MAX_LABELS]);
    key.0[0] = name.as_ptr() as usize;
    key.0[1] = name.len();
    for (i, (k, v)) in labels.iter().enumerate() {
        key.0[2 + 4 * i..6 + 4 * i].copy_from_slice(&[
            k.as_ptr() as usize,
            k.len(),
            v.as_ptr() as usize,
            v.len(),
        ]);
    }
    HANDLES.with_borrow_mut(|h| {
        map(h)
            .entry(key)
            .or_insert_with(|| register(owned()))
            .clone()
    })
}

/// Multiply-rotate hashing of the key's words (FxHash's): the keys are a few addresses, and
/// SipHash cost more than the registry lookup it replaces.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_count_into_the_installed_recorder() {
        let handle = crate::telemetry::init_metrics();
        let outcomes = ["ok", "error_overloaded"];
        for i in 0..5 {
            counter(
                "hot_metrics_test_total",
                [("api", "http"), ("outcome", outcomes[i % 2])],
            )
            .increment(1);
            histogram("hot_metrics_test_seconds", [("mode", "local")]).record(0.002);
            gauge("hot_metrics_test_gauge", []).increment(1.0);
        }
        let text = handle.render();
        assert!(
            text.contains(r#"hot_metrics_test_total{api="http",outcome="ok"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"hot_metrics_test_total{api="http",outcome="error_overloaded"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"hot_metrics_test_seconds_count{mode="local"} 5"#),
            "{text}"
        );
        assert!(text.contains("hot_metrics_test_gauge 5"), "{text}");
    }
}
