//! A flat map keyed by block hashes, laid out for the access pattern of prefix caches: many
//! independent lookups, inserts and removals of random keys in tables larger than the CPU's
//! caches.
//!
//! Open addressing with linear probing over one array of `(key, value)` slots, at most half
//! full, so a lookup almost always reads one cache line (std's `HashMap` reads a control group
//! and then a bucket, two lines for every miss). Removal shifts the following entries back
//! (no tombstones), so probe sequences stay short however many keys come and go. Key 0 marks an
//! empty slot; the entry whose key really is 0 is kept beside the array.
//!
//! [`touch`](BlockMap::touch) prefetches a key's home slot. A caller that walks a list of keys
//! touches a few keys ahead of the one it works on, so the cache misses of independent keys
//! overlap instead of being paid one after another: on a table far larger than the caches, a
//! dependent load costs about 160 ns on these machines and independent ones about 7 ns each
//! (`docs/dev/profiling.md`).

use crate::BlockHash;

/// How far ahead callers touch keys in a walk over many keys (see [`BlockMap::touch`]).
pub const TOUCH_AHEAD: usize = 32;

const EMPTY: BlockHash = 0;
/// The smallest table (slots); keeps tiny maps from rehashing on every insert.
const MIN_SLOTS: usize = 16;
/// Slots of a 64-byte cache line (for 16-byte slots; a wider value only prefetches nearer).
const SLOTS_PER_LINE: usize = 4;
/// Fibonacci hashing's multiplier: spreads keys that are not uniform (small integers in tests,
/// ids) over the table, and costs one multiply for keys that already are.
const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Clone, Copy, Debug, Default)]
struct Slot<V> {
    key: BlockHash,
    value: V,
}

/// In backward-shift deletion from a linearly probed table, whether the entry at `j` whose home
/// slot is `home` stays reachable once slot `hole` (before `j` in its run) is emptied: whether
/// `home` lies cyclically in `(hole, j]`. Otherwise the entry moves into the hole.
#[inline]
fn stays_reachable(hole: usize, home: usize, j: usize) -> bool {
    if hole <= j {
        hole < home && home <= j
    } else {
        hole < home || home <= j
    }
}

/// The home slot of `key` in a table of `2^(64 - shift)` slots: the top bits of `key * SPREAD`.
#[inline]
fn home_of(key: BlockHash, shift: u32) -> usize {
    (key.wrapping_mul(SPREAD) >> shift) as usize
}

/// Backward-shift deletion from a linearly probed table of a power-of-two length: empties slot
/// `hole` and moves back every later entry of its run that would no longer be reachable from
/// its home slot. `home` gives a full slot's home and `None` for an empty one (the run's end);
/// `empty` is what the last hole is left holding. [`BlockMap`] and the engine's KV pool map
/// (whose slots keep a tag, not the key) both delete with it.
#[inline]
pub fn backward_shift<T: Copy>(
    slots: &mut [T],
    mut hole: usize,
    empty: T,
    home: impl Fn(&T) -> Option<usize>,
) {
    let mask = slots.len() - 1;
    let mut j = hole;
    loop {
        j = (j + 1) & mask;
        let slot = slots[j];
        let Some(h) = home(&slot) else {
            break;
        };
        if !stays_reachable(hole, h, j) {
            slots[hole] = slot;
            hole = j;
        }
    }
    slots[hole] = empty;
}

/// A map from [`BlockHash`] to a small `Copy` value.
#[derive(Clone, Debug)]
pub struct BlockMap<V> {
    slots: Box<[Slot<V>]>,
    /// `64 - log2(slots.len())`: the home slot is the top bits of `key * SPREAD`.
    shift: u32,
    /// Entries in `slots` (not counting `zero`).
    len: usize,
    /// The entry whose key is 0, which cannot live in `slots`.
    zero: Option<V>,
}

impl<V: Copy + Default> Default for BlockMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Copy + Default> BlockMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty map that holds `capacity` entries without growing.
    pub fn with_capacity(capacity: usize) -> Self {
        let n = capacity
            .saturating_mul(2)
            .max(MIN_SLOTS)
            .checked_next_power_of_two()
            .expect("block map capacity overflows usize");
        Self {
            slots: vec![Slot::default(); n].into_boxed_slice(),
            shift: 64 - n.trailing_zeros(),
            len: 0,
            zero: None,
        }
    }

    /// Entries in the map.
    pub fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn home(&self, key: BlockHash) -> usize {
        home_of(key, self.shift)
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Slot of `key`, or `Err(first empty slot on its probe sequence)`. `key` is not 0.
    #[inline]
    fn find(&self, key: BlockHash) -> Result<usize, usize> {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].key;
            if k == key {
                return Ok(i);
            }
            if k == EMPTY {
                return Err(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// Prefetches `key`'s home slot and the cache line after it (probes and a removal's
    /// shift read on through the run of occupied slots that follows), for walks over many keys
    /// ([`TOUCH_AHEAD`]).
    #[inline]
    pub fn touch(&self, key: BlockHash) {
        let home = self.home(key);
        crate::prefetch::prefetch(&self.slots[home]);
        crate::prefetch::prefetch(&self.slots[(home + SLOTS_PER_LINE) & self.mask()]);
    }

    /// Prefetches `key`'s home slot only: for lookups, whose probe rarely leaves the home
    /// line in a map at most half full, where [`touch`](Self::touch)'s second line would hold a
    /// miss buffer for nothing.
    #[inline]
    pub fn touch_home(&self, key: BlockHash) {
        crate::prefetch::prefetch(&self.slots[self.home(key)]);
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: BlockHash) -> Option<V> {
        if key == EMPTY {
            return self.zero;
        }
        self.find(key).ok().map(|i| self.slots[i].value)
    }

    /// Whether `key` is in the map.
    #[inline]
    pub fn contains_key(&self, key: BlockHash) -> bool {
        self.get(key).is_some()
    }

    /// The value of `key`, to change in place.
    #[inline]
    pub fn get_mut(&mut self, key: BlockHash) -> Option<&mut V> {
        if key == EMPTY {
            return self.zero.as_mut();
        }
        match self.find(key) {
            Ok(i) => Some(&mut self.slots[i].value),
            Err(_) => None,
        }
    }

    /// The value of `key`, inserted as `V::default()` first if absent; the flag says whether it
    /// was inserted.
    #[inline]
    pub fn entry(&mut self, key: BlockHash) -> (&mut V, bool) {
        if key == EMPTY {
            let inserted = self.zero.is_none();
            return (self.zero.get_or_insert_with(V::default), inserted);
        }
        let i = match self.find(key) {
            Ok(i) => return (&mut self.slots[i].value, false),
            Err(i) if (self.len + 1) * 2 <= self.slots.len() => i,
            Err(_) => {
                self.grow();
                self.find(key).expect_err("key absent before growing")
            }
        };
        self.len += 1;
        self.slots[i] = Slot {
            key,
            value: V::default(),
        };
        (&mut self.slots[i].value, true)
    }

    /// Sets `key` to `value`; returns the previous value.
    #[inline]
    pub fn insert(&mut self, key: BlockHash, value: V) -> Option<V> {
        let (slot, inserted) = self.entry(key);
        let old = std::mem::replace(slot, value);
        (!inserted).then_some(old)
    }

    /// Changes `key`'s value in place with `f`, then removes the entry if `f` returned false;
    /// one probe for both. Returns `None` when `key` is absent, else `f`'s answer.
    #[inline]
    pub fn update_or_remove(
        &mut self,
        key: BlockHash,
        f: impl FnOnce(&mut V) -> bool,
    ) -> Option<bool> {
        if key == EMPTY {
            let keep = f(self.zero.as_mut()?);
            if !keep {
                self.zero = None;
            }
            return Some(keep);
        }
        let i = self.find(key).ok()?;
        let keep = f(&mut self.slots[i].value);
        if !keep {
            self.remove_at(i);
        }
        Some(keep)
    }

    /// Removes `key`; returns its value.
    #[inline]
    pub fn remove(&mut self, key: BlockHash) -> Option<V> {
        if key == EMPTY {
            return self.zero.take();
        }
        let i = self.find(key).ok()?;
        let value = self.slots[i].value;
        self.remove_at(i);
        Some(value)
    }

    /// Empties slot `hole` and moves back every later entry of the run that may no longer be
    /// reachable from its home slot (backward-shift deletion).
    fn remove_at(&mut self, hole: usize) {
        self.len -= 1;
        let shift = self.shift;
        let home = |slot: &Slot<V>| (slot.key != EMPTY).then(|| home_of(slot.key, shift));
        backward_shift(&mut self.slots, hole, Slot::default(), home);
    }

    /// Keeps the entries for which `keep` returns true; `keep` may change the value.
    pub fn retain(&mut self, mut keep: impl FnMut(BlockHash, &mut V) -> bool) {
        if let Some(v) = &mut self.zero
            && !keep(EMPTY, v)
        {
            self.zero = None;
        }
        let old = std::mem::take(&mut self.slots);
        let n = old.len();
        let mut kept = Vec::with_capacity(self.len);
        for mut slot in old.into_vec() {
            if slot.key != EMPTY && keep(slot.key, &mut slot.value) {
                kept.push(slot);
            }
        }
        self.slots = vec![Slot::default(); n].into_boxed_slice();
        self.len = 0;
        for slot in kept {
            let i = self.find(slot.key).expect_err("keys are distinct");
            self.slots[i] = slot;
            self.len += 1;
        }
    }

    /// Removes every entry (keeps the table's size).
    pub fn clear(&mut self) {
        self.slots.fill(Slot::default());
        self.len = 0;
        self.zero = None;
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (BlockHash, V)> + '_ {
        self.zero.map(|v| (EMPTY, v)).into_iter().chain(
            self.slots
                .iter()
                .filter(|s| s.key != EMPTY)
                .map(|s| (s.key, s.value)),
        )
    }

    fn grow(&mut self) {
        let n = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); n].into_boxed_slice());
        self.shift = 64 - n.trailing_zeros();
        for slot in old.iter().filter(|s| s.key != EMPTY) {
            let i = self.find(slot.key).expect_err("keys are distinct");
            self.slots[i] = *slot;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn basics_and_key_zero() {
        let mut m: BlockMap<u32> = BlockMap::new();
        assert!(m.is_empty());
        assert_eq!(m.insert(0, 5), None);
        assert_eq!(m.insert(7, 1), None);
        assert_eq!(m.insert(7, 2), Some(1));
        assert_eq!((m.get(0), m.get(7), m.get(8)), (Some(5), Some(2), None));
        assert_eq!(m.len(), 2);
        *m.get_mut(7).expect("present") += 1;
        assert_eq!(m.remove(7), Some(3));
        assert_eq!(m.remove(0), Some(5));
        assert!(m.is_empty());
        let (v, inserted) = m.entry(9);
        assert!(inserted);
        *v = 4;
        assert_eq!(m.entry(9), (&mut 4, false));
    }

    #[test]
    fn grows_past_its_capacity_and_keeps_everything() {
        let mut m: BlockMap<u64> = BlockMap::with_capacity(4);
        for k in 1..10_000u64 {
            m.insert(k * 0x1_0000_0001, k);
        }
        assert_eq!(m.len(), 9_999);
        assert!((1..10_000u64).all(|k| m.get(k * 0x1_0000_0001) == Some(k)));
        assert_eq!(m.iter().count(), 9_999);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Bump(u64),
        /// Add one; remove the entry if the result is even.
        BumpOrRemove(u64),
        RetainOdd,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys in a small table: long runs, wrap-around and many shifts.
        let key = prop_oneof![0u64..40, any::<u64>()];
        prop_oneof![
            4 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => key.clone().prop_map(Op::Remove),
            2 => key.clone().prop_map(Op::Bump),
            2 => key.prop_map(Op::BumpOrRemove),
            1 => Just(Op::RetainOdd),
        ]
    }

    proptest! {
        #[test]
        fn matches_std_hash_map(ops in proptest::collection::vec(op(), 0..400)) {
            let mut m: BlockMap<u32> = BlockMap::new();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for op in &ops {
                match *op {
                    Op::Insert(k, v) => prop_assert_eq!(m.insert(k, v), model.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(m.remove(k), model.remove(&k)),
                    Op::Bump(k) => {
                        let (v, inserted) = m.entry(k);
                        *v = v.wrapping_add(1);
                        prop_assert_eq!(inserted, !model.contains_key(&k));
                        let e = model.entry(k).or_default();
                        *e = e.wrapping_add(1);
                    }
                    Op::BumpOrRemove(k) => {
                        let got = m.update_or_remove(k, |v| {
                            *v = v.wrapping_add(1);
                            *v % 2 == 1
                        });
                        let want = model.get_mut(&k).map(|v| {
                            *v = v.wrapping_add(1);
                            *v % 2 == 1
                        });
                        if want == Some(false) {
                            model.remove(&k);
                        }
                        prop_assert_eq!(got, want);
                    }
                    Op::RetainOdd => {
                        m.retain(|_, v| *v % 2 == 1);
                        model.retain(|_, v| *v % 2 == 1);
                    }
                }
                prop_assert_eq!(m.len(), model.len());
            }
            for (&k, &v) in &model {
                prop_assert_eq!(m.get(k), Some(v));
            }
            let mut got: Vec<_> = m.iter().collect();
            got.sort_unstable();
            let mut want: Vec<_> = model.into_iter().collect();
            want.sort_unstable();
            prop_assert_eq!(got, want);
        }
    }
}
