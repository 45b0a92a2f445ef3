//! Property test: under random admit / allocate / release / lookup sequences the pool never
//! leaks or double-frees a block, reference counts match the holders, reservations add up, and
//! replaying the emitted events always rebuilds exactly the set of cached hashes.

use std::collections::{HashMap, HashSet};

use dolphin_cluster::block_hashes;
use proptest::prelude::*;

use super::*;

const BS: u32 = 4;

#[derive(Clone, Debug)]
enum Op {
    /// Admit a prompt whose block `j` is variant `choices[j]` (few variants: prefixes collide),
    /// with `extra` blocks reserved for generation; `resolved`: its hits found as blocks
    /// (`cached_blocks` with the latest lookup's answer as the hint, then `admit_blocks`);
    /// `computed`: its prompt blocks committed at once, else by a later `Compute` (so
    /// sequences admitted meanwhile compute the same blocks concurrently).
    Admit {
        choices: Vec<u8>,
        extra: u32,
        resolved: bool,
        computed: bool,
    },
    /// Commit a live sequence's prompt blocks (its prefill finished).
    Compute { seq: usize },
    /// Allocate one reserved block of a live sequence (a block filled by generation).
    Grow { seq: usize, commit: bool },
    /// Release a live sequence.
    Release { seq: usize },
    /// Look up a prompt's cached prefix (both ways: `match_prefix`, and `cached_blocks` with
    /// the previous answer as its hint, `junk` ids appended to it).
    Lookup {
        choices: Vec<u8>,
        junk: Vec<BlockId>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    // Up to 13 blocks, mostly the same choice: prompts share long prefixes, and chains cross
    // the map's runs of 8 blocks (`tag_map::tag_at`).
    let choices = prop::collection::vec(prop_oneof![4 => Just(0u8), 1 => Just(1u8)], 1..14);
    prop_oneof![
        3 => (choices.clone(), 0u32..3, any::<bool>(), any::<bool>())
            .prop_map(|(choices, extra, resolved, computed)| {
                Op::Admit { choices, extra, resolved, computed }
            }),
        2 => any::<usize>().prop_map(|seq| Op::Compute { seq }),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(seq, commit)| Op::Grow { seq, commit }),
        2 => any::<usize>().prop_map(|seq| Op::Release { seq }),
        1 => (choices, prop::collection::vec(0u32..40, 0..3))
            .prop_map(|(choices, junk)| Op::Lookup { choices, junk }),
    ]
}

fn tokens(choices: &[u8]) -> Vec<u32> {
    choices
        .iter()
        .enumerate()
        .flat_map(|(j, &c)| (0..BS).map(move |k| (j as u32) * 16 + u32::from(c) * 4 + k))
        .collect()
}

/// What the test believes a live sequence holds.
struct Held {
    table: Vec<BlockId>,
    hashes: Vec<BlockHash>,
    reserved: u32,
    /// Blocks committed (or hit) so far.
    committed: usize,
}

/// Commits `held`'s blocks from `committed` through its last hash, releasing what cached
/// copies displace.
fn commit_held(pool: &mut KvPool, held: &mut Held) {
    let mut displaced = Vec::new();
    pool.commit_many(
        &mut held.table,
        &held.hashes,
        held.committed,
        &mut displaced,
    );
    pool.release(&displaced);
    held.committed = held.hashes.len();
}

/// Applies queued events to `cached`, checking each is consistent with what came before.
fn replay(pool: &mut KvPool, cached: &mut HashSet<BlockHash>) {
    for ev in pool.drain_events() {
        match ev {
            KvEvent::Stored { parent, hashes } => {
                assert!(!hashes.is_empty());
                if let Some(p) = parent {
                    assert!(
                        cached.contains(&p),
                        "stored block's parent {p:x} is not cached"
                    );
                }
                for h in hashes {
                    assert!(cached.insert(h), "hash {h:x} stored twice");
                }
            }
            KvEvent::Removed { hashes } => {
                for h in hashes {
                    assert!(cached.remove(&h), "hash {h:x} removed but not cached");
                }
            }
            KvEvent::Cleared => cached.clear(),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pool_never_leaks_and_events_track_the_cache(ops in prop::collection::vec(op(), 1..80)) {
        let total = 32u32;
        let mut pool = KvPool::new(total, BS);
        let mut live: Vec<Held> = Vec::new();
        let mut cached: HashSet<BlockHash> = HashSet::new();
        // The latest `cached_blocks` answer: a hint that goes stale as the pool changes.
        let mut hint: Vec<BlockId> = Vec::new();

        for op in ops {
            match op {
                Op::Admit { choices, extra, resolved, computed } => {
                    let hashes = block_hashes(&tokens(&choices), BS as usize);
                    let hits = pool.match_prefix(&hashes);
                    let new = (hashes.len() - hits) as u32;
                    let before = (pool.available(), pool.referenced());
                    let mut table = Vec::new();
                    let admitted = if resolved {
                        let mut found = Vec::new();
                        prop_assert_eq!(pool.cached_blocks(&hashes, &hint, &mut found), hits);
                        pool.admit_blocks(&found, new + extra, &mut table)
                    } else {
                        pool.admit(&hashes[..hits], new + extra, &mut table)
                    };
                    if admitted {
                        for _ in hits..hashes.len() {
                            table.push(pool.allocate().expect("reserved"));
                        }
                        let mut held = Held { table, hashes, reserved: extra, committed: hits };
                        if computed {
                            commit_held(&mut pool, &mut held);
                        }
                        live.push(held);
                    } else {
                        prop_assert!(table.is_empty());
                        prop_assert_eq!(before, (pool.available(), pool.referenced()));
                    }
                }
                Op::Grow { seq, commit } => {
                    if live.is_empty() { continue; }
                    let n = live.len();
                    let held = &mut live[seq % n];
                    if held.reserved == 0 { continue; }
                    let b = pool.allocate().expect("reserved block must be available");
                    held.reserved -= 1;
                    held.table.push(b);
                    if commit && held.committed + 1 == held.table.len() {
                        // A generated block after a computed prompt and committed blocks:
                        // chain it onto the sequence's last hash.
                        let parent = held.hashes.last().copied();
                        let h = dolphin_cluster::chain_hash(parent, &[b, 0xdead, held.table.len() as u32, 1]);
                        held.hashes.push(h);
                        commit_held(&mut pool, held);
                    }
                }
                Op::Compute { seq } => {
                    if live.is_empty() { continue; }
                    let n = live.len();
                    commit_held(&mut pool, &mut live[seq % n]);
                }
                Op::Release { seq } => {
                    if live.is_empty() { continue; }
                    let n = live.len();
                    let held = live.swap_remove(seq % n);
                    pool.release(&held.table);
                    pool.unreserve(held.reserved);
                }
                Op::Lookup { choices, junk } => {
                    let hashes = block_hashes(&tokens(&choices), BS as usize);
                    replay(&mut pool, &mut cached);
                    let expect = hashes.iter().take_while(|h| cached.contains(h)).count();
                    prop_assert_eq!(pool.match_prefix(&hashes), expect);
                    hint.extend(junk);
                    let mut found = Vec::new();
                    prop_assert_eq!(pool.cached_blocks(&hashes, &hint, &mut found), expect);
                    for (&b, &h) in found.iter().zip(&hashes) {
                        prop_assert_eq!(pool.blocks[b as usize].hash(), Some(h));
                    }
                    hint = found;
                }
            }
            replay(&mut pool, &mut cached);
            pool.check_invariants();

            // Reference counts equal the number of holders; nothing leaks.
            let mut refs: HashMap<BlockId, u32> = HashMap::new();
            for held in &live {
                for &b in &held.table { *refs.entry(b).or_default() += 1; }
            }
            for (b, meta) in pool.blocks.iter().enumerate() {
                prop_assert_eq!(meta.refs, refs.get(&(b as BlockId)).copied().unwrap_or(0), "block {}", b);
            }
            prop_assert_eq!(pool.referenced() as usize, refs.len());
            prop_assert_eq!(pool.reserved(), live.iter().map(|h| h.reserved).sum::<u32>());
            let in_cache: HashSet<BlockHash> =
                pool.cached.blocks().filter_map(|b| pool.blocks[b as usize].hash()).collect();
            prop_assert_eq!(&in_cache, &cached);
        }

        // Releasing everything returns every block.
        for held in live.drain(..) {
            pool.release(&held.table);
            pool.unreserve(held.reserved);
        }
        prop_assert_eq!(pool.available(), total);
        prop_assert_eq!(pool.referenced(), 0);
        pool.check_invariants();
    }
}
