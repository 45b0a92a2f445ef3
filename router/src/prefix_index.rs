//! Prefix index of one worker pool: which worker holds which cached KV block.
//!
//! Fed by every worker's `Worker.Subscribe` events (blocks stored, removed, cleared). A lookup
//! answers, for every worker of the pool at once, how many leading blocks of a prompt it holds:
//! each chained block hash maps to the set of worker slots that hold it, and since every worker's
//! blocks are prefix-closed along a chain (a worker holding a block holds the blocks before it),
//! the set of workers holding block `i` only shrinks with `i`, and a lookup binary-searches where
//! it shrinks instead of probing every block.

use dolphin_cluster::block_map::TOUCH_AHEAD;
use dolphin_cluster::{BlockHash, BlockMap};

/// Most workers one pool's index tracks (the width of [`SlotSet`]).
pub const MAX_POOL_WORKERS: usize = 256;
const WORDS: usize = MAX_POOL_WORKERS / 64;

/// A set of worker slots, as a fixed bitset (no allocation, cheap to AND).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotSet([u64; WORDS]);

impl SlotSet {
    /// The empty set.
    pub const EMPTY: SlotSet = SlotSet([0; WORDS]);

    /// Adds `slot` (must be below [`MAX_POOL_WORKERS`]).
    pub fn insert(&mut self, slot: usize) {
        self.0[slot / 64] |= 1 << (slot % 64);
    }

    /// Removes `slot`.
    pub fn remove(&mut self, slot: usize) {
        self.0[slot / 64] &= !(1 << (slot % 64));
    }

    /// Whether `slot` is in the set.
    pub fn contains(&self, slot: usize) -> bool {
        slot < MAX_POOL_WORKERS && self.0[slot / 64] & (1 << (slot % 64)) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    fn and(&self, other: &SlotSet) -> SlotSet {
        let mut out = *self;
        for (o, w) in out.0.iter_mut().zip(other.0.iter()) {
            *o &= *w;
        }
        out
    }

    fn and_not(&self, other: &SlotSet) -> SlotSet {
        let mut out = *self;
        for (o, w) in out.0.iter_mut().zip(other.0.iter()) {
            *o &= !*w;
        }
        out
    }

    /// The slots in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &word)| {
            let mut w = word;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros() as usize;
                w &= w - 1;
                Some(i * 64 + bit)
            })
        })
    }
}

/// A set of slots as the index stores it per block.
trait Bits: Copy + Default + PartialEq {
    fn has(&self, slot: usize) -> bool;
    fn set(&mut self, slot: usize);
    fn unset(&mut self, slot: usize);
    fn none(&self) -> bool;
    fn both(&self, other: &Self) -> Self;
    fn only_self(&self, other: &Self) -> Self;
    fn each(&self, f: impl FnMut(usize));
    fn from_slots(s: &SlotSet) -> Self;
}

impl Bits for u64 {
    fn has(&self, slot: usize) -> bool {
        slot < 64 && self & (1 << slot) != 0
    }
    fn set(&mut self, slot: usize) {
        *self |= 1 << slot;
    }
    fn unset(&mut self, slot: usize) {
        if slot < 64 {
            *self &= !(1 << slot);
        }
    }
    fn none(&self) -> bool {
        *self == 0
    }
    fn both(&self, other: &Self) -> Self {
        self & other
    }
    fn only_self(&self, other: &Self) -> Self {
        self & !other
    }
    fn each(&self, mut f: impl FnMut(usize)) {
        let mut w = *self;
        while w != 0 {
            f(w.trailing_zeros() as usize);
            w &= w - 1;
        }
    }
    fn from_slots(s: &SlotSet) -> Self {
        s.0[0]
    }
}

impl Bits for SlotSet {
    fn has(&self, slot: usize) -> bool {
        self.contains(slot)
    }
    fn set(&mut self, slot: usize) {
        self.insert(slot);
    }
    fn unset(&mut self, slot: usize) {
        if slot < MAX_POOL_WORKERS {
            self.remove(slot);
        }
    }
    fn none(&self) -> bool {
        self.is_empty()
    }
    fn both(&self, other: &Self) -> Self {
        self.and(other)
    }
    fn only_self(&self, other: &Self) -> Self {
        self.and_not(other)
    }
    fn each(&self, f: impl FnMut(usize)) {
        self.iter().for_each(f);
    }
    fn from_slots(s: &SlotSet) -> Self {
        *s
    }
}

/// Block hash -> slots holding it, in a [`BlockMap`] (one cache line per probe, misses of a
/// walk over many hashes overlapped). One machine word per block while every slot is below 64
/// (pools of up to 64 workers): 16 bytes an entry instead of 40, so a large index takes 2.5x
/// less memory and a lookup misses cache less often; the full 256-slot set once a pool grows
/// past 64 workers (converted once, when slot 64 is first handed out).
#[derive(Debug)]
enum Holders {
    Narrow(BlockMap<u64>),
    Wide(BlockMap<SlotSet>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Narrow(BlockMap::default())
    }
}

/// Runs `$body` with `$map` bound to the index's map, whichever width it has.
macro_rules! with_map {
    ($holders:expr, $map:ident => $body:expr) => {
        match $holders {
            Holders::Narrow($map) => $body,
            Holders::Wide($map) => $body,
        }
    };
}

/// The prefix index of one pool.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    blocks: Holders,
    /// Per slot, how many hashes it holds. Membership itself is the slot's bit in `blocks`: one
    /// map operation per stored or removed block instead of two (a second per-slot set made the
    /// simulator's cache bookkeeping twice as slow), at the price of a scan over `blocks` in
    /// [`clear_slot`](Self::clear_slot), which runs only when a worker leaves or resubscribes.
    held: Vec<usize>,
    /// Slots in use.
    registered: SlotSet,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index that holds `blocks` distinct blocks without growing (a pool's workers
    /// times their KV blocks bounds what it can ever hold).
    pub fn with_capacity(blocks: usize) -> Self {
        Self {
            blocks: Holders::Narrow(BlockMap::with_capacity(blocks)),
            ..Self::default()
        }
    }

    /// Takes a free slot for a new worker; `None` when the pool already has
    /// [`MAX_POOL_WORKERS`] workers.
    pub fn allocate_slot(&mut self) -> Option<usize> {
        let slot = (0..MAX_POOL_WORKERS).find(|s| !self.registered.contains(*s))?;
        self.registered.insert(slot);
        if self.held.len() <= slot {
            self.held.resize(slot + 1, 0);
        }
        if slot >= 64
            && let Holders::Narrow(narrow) = &mut self.blocks
        {
            let mut wide = BlockMap::with_capacity(narrow.len());
            for (h, w) in narrow.iter() {
                let mut set = SlotSet::EMPTY;
                set.0[0] = w;
                wide.insert(h, set);
            }
            self.blocks = Holders::Wide(wide);
        }
        Some(slot)
    }

    /// Forgets a worker: drops its blocks and frees its slot.
    pub fn release_slot(&mut self, slot: usize) {
        self.clear_slot(slot);
        self.registered.remove(slot);
    }

    /// Number of slot positions a lookup writes (highest slot ever used + 1).
    pub fn slot_capacity(&self) -> usize {
        self.held.len()
    }

    /// Records that `slot` stored `hashes`.
    pub fn stored(&mut self, slot: usize, hashes: &[BlockHash]) {
        if !self.registered.contains(slot) {
            return;
        }
        let held = &mut self.held[slot];
        with_map!(&mut self.blocks, map => stored_in(map, slot, hashes, held));
    }

    /// Records that `slot` evicted `hashes`.
    pub fn removed(&mut self, slot: usize, hashes: &[BlockHash]) {
        let Some(held) = self.held.get_mut(slot) else {
            return;
        };
        with_map!(&mut self.blocks, map => removed_in(map, slot, hashes, held));
    }

    /// Drops every block of `slot` (the worker cleared its cache, or its event stream restarts
    /// with a fresh snapshot).
    pub fn clear_slot(&mut self, slot: usize) {
        let Some(held) = self.held.get_mut(slot) else {
            return;
        };
        if *held == 0 {
            return;
        }
        *held = 0;
        with_map!(&mut self.blocks, map => map.retain(|_, set: &mut _| {
            set.unset(slot);
            !set.none()
        }));
    }

    /// Blocks the index holds for `slot`.
    pub fn held_blocks(&self, slot: usize) -> usize {
        self.held.get(slot).copied().unwrap_or(0)
    }

    /// Distinct blocks in the index.
    pub fn distinct_blocks(&self) -> usize {
        with_map!(&self.blocks, map => map.len())
    }

    /// For every slot, the number of leading `hashes` it holds, written to `out[slot]`
    /// (`out` is resized to [`slot_capacity`](Self::slot_capacity); free slots get 0).
    /// One pass over `hashes`, stopping as soon as no worker matches.
    pub fn lookup(&self, hashes: &[BlockHash], out: &mut Vec<u32>) {
        out.clear();
        out.resize(self.held.len(), 0);
        with_map!(&self.blocks, map => lookup_in(map, &self.registered, hashes, out));
    }

    /// [`lookup`](Self::lookup) in two pools at once (`first` into `out_first`, `second` into
    /// `out_second`) while the prompt is hashed: `blocks` yields its chained block hashes, which
    /// are appended to `hashes` (cleared first) in chunks of [`TOUCH_AHEAD`] blocks, doubling
    /// up to [`MAX_CHUNK`], each looked up in both pools before the next is hashed. Where
    /// neither pool holds the prompt any further, nothing further is hashed: `hashes` then
    /// stops short of the prompt's blocks, at the end of the chunk where the last match ended,
    /// at most twice as many blocks as either pool holds, at most [`MAX_CHUNK`] more, and at
    /// least [`TOUCH_AHEAD`] (a prompt no worker holds costs 32 hashes, not all of them).
    /// Callers that need every hash extend `hashes` from the same `blocks`. (Where the pools
    /// hold the whole prompt, the walk takes about as long as hashing and then looking up:
    /// `routing_decision` times both.)
    pub fn lookup_pair(
        first: &PrefixIndex,
        second: &PrefixIndex,
        blocks: &mut impl Iterator<Item = BlockHash>,
        hashes: &mut Vec<BlockHash>,
        out_first: &mut Vec<u32>,
        out_second: &mut Vec<u32>,
    ) {
        for (index, out) in [(first, &mut *out_first), (second, &mut *out_second)] {
            out.clear();
            out.resize(index.held.len(), 0);
        }
        hashes.clear();
        let a = (&first.registered, out_first.as_mut_slice());
        let b = (&second.registered, out_second.as_mut_slice());
        with_map!(&first.blocks, ma => with_map!(&second.blocks, mb =>
            lookup_pair_in(ma, mb, a, b, blocks, hashes)))
    }
}

fn stored_in<B: Bits>(map: &mut BlockMap<B>, slot: usize, hashes: &[BlockHash], held: &mut usize) {
    touch_first(hashes, |h| map.touch(h));
    for (i, &h) in hashes.iter().enumerate() {
        if let Some(&ahead) = hashes.get(i + TOUCH_AHEAD) {
            map.touch(ahead);
        }
        let (set, _) = map.entry(h);
        if !set.has(slot) {
            set.set(slot);
            *held += 1;
        }
    }
}

fn removed_in<B: Bits>(map: &mut BlockMap<B>, slot: usize, hashes: &[BlockHash], held: &mut usize) {
    touch_first(hashes, |h| map.touch(h));
    for (i, &h) in hashes.iter().enumerate() {
        if let Some(&ahead) = hashes.get(i + TOUCH_AHEAD) {
            map.touch(ahead);
        }
        map.update_or_remove(h, |set| {
            if set.has(slot) {
                set.unset(slot);
                *held -= 1;
            }
            !set.none()
        });
    }
}

/// Touches the first [`TOUCH_AHEAD`] hashes with `touch` (a walk touches the rest ahead of
/// itself).
fn touch_first(hashes: &[BlockHash], touch: impl Fn(BlockHash)) {
    for &h in hashes.iter().take(TOUCH_AHEAD) {
        touch(h);
    }
}

fn lookup_in<B: Bits>(
    map: &BlockMap<B>,
    registered: &SlotSet,
    hashes: &[BlockHash],
    out: &mut [u32],
) {
    let mut walk = Walk {
        map,
        live: B::from_slots(registered),
        out,
    };
    if walk.walk(0, hashes) {
        walk.finish(hashes.len());
    }
}

/// One pool's walk ([`lookup_in`], and each side of [`lookup_pair_in`]): the slots still
/// matching and where the rest dropped out.
struct Walk<'a, B: Bits> {
    map: &'a BlockMap<B>,
    live: B,
    out: &'a mut [u32],
}

impl<B: Bits> Walk<'_, B> {
    /// Narrows the live slots by `chunk`, the hashes of blocks `start..`; false once none is
    /// left. A worker's blocks are prefix-closed along every chain (its pool keeps them so,
    /// `KvPool::commit_many`, and its events arrive in order), so a slot holding a block holds
    /// every block before it: the chunk's last block tells which live slots hold all of it,
    /// and only where some drop out does a binary search find where ([`Walk::search`]). A
    /// lookup of an 8k-token prompt over 16 workers that all hold most of it costs a few dozen
    /// probes instead of one per block. Inlined into both callers: left to the compiler, the
    /// walks measured 2-4% slower in `routing_decision` than with each caller's own loop.
    #[inline(always)]
    fn walk(&mut self, start: usize, chunk: &[BlockHash]) -> bool {
        if self.live.none() {
            return false;
        }
        let Some(&last) = chunk.last() else {
            return true;
        };
        let through = self.holding(last, self.live);
        if through != self.live {
            self.search(start, chunk, self.live, through);
        }
        self.live = through;
        !self.live.none()
    }

    /// The slots of `of` that hold `h`.
    #[inline(always)]
    fn holding(&self, h: BlockHash, of: B) -> B {
        match self.map.get(h) {
            Some(set) => of.both(&set),
            None => B::default(),
        }
    }

    /// Records where each slot of `before` (those holding every block before `chunk`, the
    /// hashes of blocks `start..`) but not of `through` (those holding its last block, hence
    /// all of it) drops out: halves the chunk, probes the first half's last block, and goes on
    /// in each half where some slot drops out. The next probes of both halves are fetched
    /// before this one, so their misses overlap it.
    fn search(&mut self, start: usize, chunk: &[BlockHash], before: B, through: B) {
        if chunk.len() == 1 {
            before
                .only_self(&through)
                .each(|slot| self.out[slot] = start as u32);
            return;
        }
        let mid = chunk.len() / 2;
        let (first, second) = chunk.split_at(mid);
        for half in [first, second] {
            if half.len() > 1 {
                self.map.touch_home(half[half.len() / 2 - 1]);
            }
        }
        let middle = self.holding(first[mid - 1], before);
        if middle != before {
            self.search(start, first, before, middle);
        }
        if middle != through {
            self.search(start + mid, second, middle, through);
        }
    }

    /// The slots still matching after `len` blocks hold all of them.
    fn finish(self, len: usize) {
        self.live.each(|slot| self.out[slot] = len as u32);
    }
}

/// The most blocks [`lookup_pair_in`] hashes at once once past the first chunks.
const MAX_CHUNK: usize = 128;

fn lookup_pair_in<A: Bits, B: Bits>(
    ma: &BlockMap<A>,
    mb: &BlockMap<B>,
    (ra, oa): (&SlotSet, &mut [u32]),
    (rb, ob): (&SlotSet, &mut [u32]),
    blocks: &mut impl Iterator<Item = BlockHash>,
    hashes: &mut Vec<BlockHash>,
) {
    let mut a = Walk {
        map: ma,
        live: A::from_slots(ra),
        out: oa,
    };
    let mut b = Walk {
        map: mb,
        live: B::from_slots(rb),
        out: ob,
    };
    if a.live.none() && b.live.none() {
        return;
    }
    // In chunks that double from TOUCH_AHEAD up to MAX_CHUNK blocks: each chunk hashed in one
    // tight loop, then walked in one pool and then the other, each walk touching ahead in its
    // own map. Interleaving the three per block measured 9-11% slower than hashing everything
    // first on an AVX2-only EPYC (probably a probe's mispredicted branch discarding the hash
    // chain's work in flight, and both maps' prefetches competing for the miss buffers); chunks
    // keep each loop apart and still stop hashing soon after the last match.
    let mut start = 0;
    loop {
        let len = start.clamp(TOUCH_AHEAD, MAX_CHUNK);
        hashes.extend(blocks.by_ref().take(len));
        let chunk = &hashes[start..];
        if chunk.is_empty() {
            break;
        }
        // Both walks start at the chunk's last block: fetch it in both maps at once.
        let last = chunk[chunk.len() - 1];
        if !a.live.none() {
            ma.touch_home(last);
        }
        if !b.live.none() {
            mb.touch_home(last);
        }
        let more_a = a.walk(start, chunk);
        let more_b = b.walk(start, chunk);
        if !more_a && !more_b {
            return;
        }
        start = hashes.len();
    }
    a.finish(start);
    b.finish(start);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slot_set_basics() {
        let mut s = SlotSet::EMPTY;
        assert!(s.is_empty());
        for slot in [0, 63, 64, 200, 255] {
            s.insert(slot);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 63, 64, 200, 255]);
        s.remove(64);
        assert!(!s.contains(64));
        assert!(s.contains(200));
        assert!(!s.contains(1000));
    }

    #[test]
    fn lookup_counts_leading_blocks_per_worker() {
        let mut idx = PrefixIndex::new();
        let a = idx.allocate_slot().expect("slot");
        let b = idx.allocate_slot().expect("slot");
        let c = idx.allocate_slot().expect("slot");
        idx.stored(a, &[1, 2, 3]);
        idx.stored(b, &[1, 2]);
        idx.stored(c, &[7, 8]); // another chain: holds no leading prefix
        let mut out = Vec::new();
        idx.lookup(&[1, 2, 3, 4], &mut out);
        assert_eq!(out, vec![3, 2, 0]);
        idx.lookup(&[9], &mut out);
        assert_eq!(out, vec![0, 0, 0]);
        idx.lookup(&[], &mut out);
        assert_eq!(out, vec![0, 0, 0]);
    }

    #[test]
    fn a_prompt_no_worker_holds_is_hashed_only_as_far_as_the_look_ahead() {
        let (mut a, mut b) = (PrefixIndex::new(), PrefixIndex::new());
        let (sa, _) = (a.allocate_slot().expect("slot"), b.allocate_slot());
        a.stored(sa, &[1, 2, 3]);
        let prompt: Vec<BlockHash> = (100..612).collect();
        let (mut hashes, mut oa, mut ob) = (Vec::new(), Vec::new(), Vec::new());
        let mut blocks = prompt.iter().copied();
        PrefixIndex::lookup_pair(&a, &b, &mut blocks, &mut hashes, &mut oa, &mut ob);
        assert_eq!((oa, ob), (vec![0], vec![0]));
        assert_eq!(hashes, prompt[..TOUCH_AHEAD]);
        // Pools without workers hash nothing.
        let (empty, none) = (PrefixIndex::new(), PrefixIndex::new());
        PrefixIndex::lookup_pair(
            &empty,
            &none,
            &mut prompt.iter().copied(),
            &mut hashes,
            &mut Vec::new(),
            &mut Vec::new(),
        );
        assert!(hashes.is_empty());
    }

    #[test]
    fn an_evicted_tail_ends_the_prefix() {
        let mut idx = PrefixIndex::new();
        let a = idx.allocate_slot().expect("slot");
        idx.stored(a, &[1, 2, 3]);
        idx.removed(a, &[3, 2]);
        let mut out = Vec::new();
        idx.lookup(&[1, 2, 3], &mut out);
        assert_eq!(out, vec![1]);
        assert_eq!(idx.held_blocks(a), 1);
    }

    #[test]
    fn workers_dropping_out_at_every_depth_are_each_found() {
        // 40 workers over one 300-block chain, worker `w` holding its first `7 * w` blocks
        // (the last one all of it, the first none): the search finds every drop.
        let chain: Vec<BlockHash> = (1..=300).collect();
        let mut idx = PrefixIndex::new();
        for w in 0..40 {
            let slot = idx.allocate_slot().expect("slot");
            idx.stored(slot, &chain[..(7 * w).min(300)]);
        }
        let mut out = Vec::new();
        idx.lookup(&chain, &mut out);
        let expect: Vec<u32> = (0..40).map(|w| (7 * w).min(300) as u32).collect();
        assert_eq!(out, expect);
    }

    #[test]
    fn release_frees_entries_and_slot_reuse_starts_empty() {
        let mut idx = PrefixIndex::new();
        let a = idx.allocate_slot().expect("slot");
        idx.stored(a, &[1, 2]);
        idx.release_slot(a);
        assert_eq!(idx.distinct_blocks(), 0);
        let again = idx.allocate_slot().expect("slot");
        assert_eq!(again, a);
        let mut out = Vec::new();
        idx.lookup(&[1, 2], &mut out);
        assert_eq!(out, vec![0]);
        // Events for a released slot are ignored.
        idx.release_slot(again);
        idx.stored(again, &[1]);
        assert_eq!(idx.distinct_blocks(), 0);
    }

    #[test]
    fn a_pool_past_64_workers_widens_and_keeps_what_it_held() {
        let mut idx = PrefixIndex::new();
        for _ in 0..64 {
            idx.allocate_slot();
        }
        idx.stored(3, &[1, 2, 3]);
        idx.stored(63, &[1, 2]);
        assert!(matches!(idx.blocks, Holders::Narrow(_)));
        assert_eq!(idx.allocate_slot(), Some(64));
        assert!(matches!(idx.blocks, Holders::Wide(_)));
        idx.stored(64, &[1]);
        let mut out = Vec::new();
        idx.lookup(&[1, 2, 3], &mut out);
        assert_eq!((out[3], out[63], out[64], out[0]), (3, 2, 1, 0));
        idx.removed(3, &[3, 2]);
        idx.clear_slot(63);
        idx.lookup(&[1, 2, 3], &mut out);
        assert_eq!((out[3], out[63], out[64]), (1, 0, 1));
        assert_eq!(
            idx.distinct_blocks(),
            1,
            "blocks 2 and 3 are held by nobody now"
        );
    }

    #[test]
    fn pool_is_bounded() {
        let mut idx = PrefixIndex::new();
        for _ in 0..MAX_POOL_WORKERS {
            assert!(idx.allocate_slot().is_some());
        }
        assert!(idx.allocate_slot().is_none());
        idx.release_slot(17);
        assert_eq!(idx.allocate_slot(), Some(17));
    }

    /// A chain's block hashes: each hashed from the one before and the choice at its depth
    /// (few choices, mostly the first: chains share long prefixes), as a prompt's blocks chain.
    fn chain(choices: &[u8]) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = Vec::with_capacity(choices.len());
        for &c in choices {
            out.push(dolphin_cluster::chain_hash(
                out.last().copied(),
                &[u32::from(c)],
            ));
        }
        out
    }

    fn choices(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(prop_oneof![4 => Just(0u8), 1 => Just(1u8)], 0..max)
    }

    /// What a worker's pool can do to its blocks, in the events it sends: store a chain (its
    /// blocks already held included), evict up to `n` blocks of a chain from its tail (leaves
    /// only: a pool evicts a block only once no cached child needs it), clear, leave.
    #[derive(Clone, Debug)]
    enum Op {
        Store(usize, Vec<u8>),
        Evict(usize, Vec<u8>, usize),
        Clear(usize),
        Release(usize),
    }

    fn op(max: usize) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..6, choices(max)).prop_map(|(s, c)| Op::Store(s, c)),
            2 => (0usize..6, choices(max), 0usize..8).prop_map(|(s, c, n)| Op::Evict(s, c, n)),
            1 => (0usize..6).prop_map(Op::Clear),
            1 => (0usize..6).prop_map(Op::Release),
        ]
    }

    /// Per worker, the hashes it holds (None once it left), and every hash's parent.
    #[derive(Default)]
    struct Model {
        held: Vec<Option<std::collections::HashSet<BlockHash>>>,
        parent: std::collections::HashMap<BlockHash, BlockHash>,
    }

    impl Model {
        fn new() -> Self {
            Model {
                held: vec![Some(Default::default()); 6],
                ..Default::default()
            }
        }

        /// Applies `op` to the model and to `idx` (worker `w` at slot `base + w`).
        fn apply(&mut self, op: &Op, idx: &mut PrefixIndex, base: usize) {
            match op {
                Op::Store(w, c) => {
                    let hashes = chain(c);
                    for pair in hashes.windows(2) {
                        self.parent.insert(pair[1], pair[0]);
                    }
                    idx.stored(base + w, &hashes);
                    if let Some(set) = &mut self.held[*w] {
                        set.extend(hashes);
                    }
                }
                Op::Evict(w, c, n) => {
                    let Some(set) = &mut self.held[*w] else {
                        idx.removed(base + w, &chain(c));
                        return;
                    };
                    let mut evicted = Vec::new();
                    for h in chain(c).into_iter().rev().take(*n) {
                        let leaf = !set.iter().any(|x| self.parent.get(x) == Some(&h));
                        if !set.contains(&h) || !leaf {
                            break;
                        }
                        set.remove(&h);
                        evicted.push(h);
                    }
                    idx.removed(base + w, &evicted);
                }
                Op::Clear(w) => {
                    idx.clear_slot(base + w);
                    if let Some(set) = &mut self.held[*w] {
                        set.clear();
                    }
                }
                Op::Release(w) => {
                    idx.release_slot(base + w);
                    self.held[*w] = None;
                }
            }
        }

        /// How many leading `hashes` worker `w` holds.
        fn leading(&self, w: usize, hashes: &[BlockHash]) -> u32 {
            self.held[w].as_ref().map_or(0, |set| {
                hashes.iter().take_while(|h| set.contains(h)).count() as u32
            })
        }
    }

    /// An index of six workers at slots `base..base + 6`, after `ops`.
    fn build(ops: &[Op], base: usize) -> (PrefixIndex, Model) {
        let mut idx = PrefixIndex::new();
        for _ in 0..base + 6 {
            idx.allocate_slot();
        }
        let mut model = Model::new();
        for op in ops {
            model.apply(op, &mut idx, base);
        }
        (idx, model)
    }

    proptest! {
        #[test]
        fn matches_brute_force(
            ops in proptest::collection::vec(op(12), 0..60),
            queries in proptest::collection::vec(choices(14), 1..8),
            wide in any::<bool>(),
        ) {
            // Six workers: slots 0-5 (the narrow map), or 60-65 in a pool of 66 (the wide one,
            // across the 64-slot word boundary).
            let base = if wide { 60 } else { 0 };
            let (idx, model) = build(&ops, base);
            let mut out = Vec::new();
            for q in &queries {
                let hashes = chain(q);
                idx.lookup(&hashes, &mut out);
                for w in 0..6 {
                    let slot = base + w;
                    prop_assert_eq!(out[slot], model.leading(w, &hashes), "slot {} query {:?}", slot, q);
                    prop_assert_eq!(idx.held_blocks(slot), model.held[w].as_ref().map_or(0, |s| s.len()));
                }
            }
        }

        #[test]
        fn a_pair_lookup_equals_two_lookups_and_hashes_no_further_than_needed(
            first in proptest::collection::vec(op(40), 0..60),
            second in proptest::collection::vec(op(40), 0..60),
            wide in any::<bool>(),
            // Longer than the first chunks and MAX_CHUNK, so the walk may stop hashing before
            // the end after chunks of every size.
            query in choices(360),
            held_run in 0usize..320,
        ) {
            let query = chain(&query);
            let (mut a, model) = build(&first, 0);
            let (b, _) = build(&second, if wide { 60 } else { 0 });
            // One worker holding a long run of the query, so some walks go far.
            a.stored(0, &query[..held_run.min(query.len())]);
            let (mut one, mut two) = (Vec::new(), Vec::new());
            a.lookup(&query, &mut one);
            b.lookup(&query, &mut two);
            for (w, &n) in one.iter().enumerate().take(6).skip(1) {
                prop_assert_eq!(n, model.leading(w, &query));
            }
            let (mut hashes, mut pa, mut pb) = (vec![99], vec![7], Vec::new());
            let mut blocks = query.iter().copied();
            PrefixIndex::lookup_pair(&a, &b, &mut blocks, &mut hashes, &mut pa, &mut pb);
            prop_assert_eq!(&pa, &one);
            prop_assert_eq!(&pb, &two);
            prop_assert_eq!(&hashes[..], &query[..hashes.len()]);
            if hashes.len() < query.len() {
                let furthest = one.iter().chain(&two).copied().max().unwrap_or(0) as usize;
                prop_assert!(hashes.len() <= (2 * furthest).max(TOUCH_AHEAD), "hashed {} for {}", hashes.len(), furthest);
                prop_assert!(hashes.len() <= furthest + MAX_CHUNK, "hashed {} for {}", hashes.len(), furthest);
            }
            // What was not hashed is still there to hash.
            hashes.extend(blocks);
            prop_assert_eq!(hashes, query);
        }
    }
}
