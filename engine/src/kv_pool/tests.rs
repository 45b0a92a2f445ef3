use dolphin_cluster::block_hashes;

use super::*;

/// Admits a sequence with `hits` cached blocks and allocates `new` more; returns its table.
fn take(pool: &mut KvPool, hits: &[BlockHash], new: u32) -> Vec<BlockId> {
    let mut table = Vec::new();
    assert!(pool.admit(hits, new, &mut table), "admission refused");
    for _ in 0..new {
        table.push(pool.allocate().expect("reserved block"));
    }
    table
}

/// Commits every block of `table` under consecutive `hashes`; returns the blocks displaced by
/// cached copies (still referenced: the caller releases them).
fn commit_all(pool: &mut KvPool, table: &mut [BlockId], hashes: &[BlockHash]) -> Vec<BlockId> {
    let mut displaced = Vec::new();
    pool.commit_many(table, hashes, 0, &mut displaced);
    displaced
}

fn prompt(seed: u32, blocks: usize) -> Vec<u32> {
    (0..blocks as u32 * 4).map(|i| seed * 1000 + i).collect()
}

#[test]
fn allocation_counts_and_exhaustion() {
    let mut pool = KvPool::new(4, 4);
    assert_eq!((pool.available(), pool.referenced()), (4, 0));
    let t = take(&mut pool, &[], 3);
    assert_eq!(t, vec![0, 1, 2]);
    assert_eq!((pool.available(), pool.referenced()), (1, 3));
    let mut table = Vec::new();
    assert!(!pool.admit(&[], 2, &mut table), "only one block left");
    assert!(table.is_empty());
    assert!(pool.admit(&[], 1, &mut table));
    assert_eq!(pool.available(), 0);
    assert_eq!(pool.allocate(), Some(3));
    assert_eq!(pool.allocate(), None, "nothing reserved any more");
    pool.release(&t);
    pool.release(&[3]);
    assert_eq!((pool.available(), pool.referenced()), (4, 0));
    pool.check_invariants();
}

#[test]
fn reservation_is_held_until_allocated_or_returned() {
    let mut pool = KvPool::new(4, 4);
    let mut table = Vec::new();
    assert!(pool.admit(&[], 3, &mut table));
    assert_eq!(pool.available(), 1);
    assert!(!pool.admit(&[], 2, &mut Vec::new()));
    pool.unreserve(3);
    assert_eq!(pool.available(), 4);
    pool.check_invariants();
}

#[test]
fn prefix_hits_share_blocks_and_count_references() {
    let mut pool = KvPool::new(8, 4);
    let hashes = block_hashes(&prompt(1, 3), 4);
    let mut a = take(&mut pool, &[], 3);
    commit_all(&mut pool, &mut a, &hashes);
    assert_eq!(pool.match_prefix(&hashes), 3);

    // A second prompt sharing the first two blocks reuses them while `a` still holds them.
    let mut other = prompt(1, 3);
    other[9] = 7; // third block differs
    let other_hashes = block_hashes(&other, 4);
    assert_eq!(pool.match_prefix(&other_hashes), 2);
    let b = take(&mut pool, &other_hashes[..2], 1);
    assert_eq!(&b[..2], &a[..2]);
    assert_ne!(b[2], a[2]);
    assert_eq!(pool.referenced(), 4);

    pool.release(&a);
    assert_eq!(pool.referenced(), 3, "shared blocks still held by b");
    pool.release(&b);
    assert_eq!(pool.referenced(), 0);
    assert_eq!(pool.available(), 8);
    assert_eq!(pool.cached_len(), 3, "b's third block was never committed");
    pool.check_invariants();

    // Reviving an evictable block costs availability.
    let mut table = Vec::new();
    assert!(pool.admit(&hashes, 0, &mut table));
    assert_eq!(table, a);
    assert_eq!(pool.available(), 5);
    pool.check_invariants();
}

#[test]
fn admission_counts_revived_blocks_against_capacity() {
    let mut pool = KvPool::new(3, 4);
    let hashes = block_hashes(&prompt(2, 2), 4);
    let mut a = take(&mut pool, &[], 2);
    commit_all(&mut pool, &mut a, &hashes);
    pool.release(&a);
    // Both cached blocks are evictable: the 3 blocks are all available, but reviving the 2
    // hits leaves only 1 for new blocks.
    assert_eq!(pool.available(), 3);
    assert!(!pool.admit(&hashes, 2, &mut Vec::new()));
    assert!(pool.admit(&hashes, 1, &mut Vec::new()));
    pool.check_invariants();
}

#[test]
fn lru_evicts_least_recent_and_tail_blocks_first() {
    let mut pool = KvPool::new(4, 4);
    let h1 = block_hashes(&prompt(1, 2), 4);
    let h2 = block_hashes(&prompt(2, 2), 4);
    let mut a = take(&mut pool, &[], 2);
    commit_all(&mut pool, &mut a, &h1);
    let mut b = take(&mut pool, &[], 2);
    commit_all(&mut pool, &mut b, &h2);
    pool.release(&a); // a's blocks become evictable first: tail (h1[1]) before head (h1[0])
    pool.release(&b);
    pool.drain_events().for_each(drop);

    let c = take(&mut pool, &[], 1);
    assert_eq!(c, vec![a[1]]);
    assert!(!pool.contains(&h1[..2]) && pool.contains(&h1[..1]));
    let d = take(&mut pool, &[], 2);
    assert_eq!(d, vec![a[0], b[1]]);
    let events: Vec<_> = pool.drain_events().collect();
    assert_eq!(
        events,
        vec![KvEvent::Removed {
            hashes: vec![h1[1], h1[0], h2[1]]
        }],
        "consecutive evictions coalesce into one event"
    );
    // A hit refreshes recency: h2[0] is now the only cached block and survives while held.
    assert_eq!(pool.match_prefix(&h2), 1);
    pool.check_invariants();
}

#[test]
fn commit_emits_coalesced_stored_events_and_skips_duplicates() {
    let mut pool = KvPool::new(8, 4);
    let hashes = block_hashes(&prompt(3, 3), 4);
    let mut a = take(&mut pool, &[], 3);
    commit_all(&mut pool, &mut a, &hashes);
    let events: Vec<_> = pool.drain_events().collect();
    assert_eq!(
        events,
        vec![KvEvent::Stored {
            parent: None,
            hashes: hashes.clone()
        }]
    );

    // The same prompt computed concurrently in other blocks: nothing new is cached, and the
    // sequence holds the cached copies instead of its own.
    let mut b = take(&mut pool, &[], 3);
    let own = b.clone();
    let displaced = commit_all(&mut pool, &mut b, &hashes);
    assert_eq!(pool.drain_events().count(), 0);
    assert_eq!((&b, &displaced), (&a, &own));
    assert_eq!(
        pool.referenced(),
        6,
        "b's own blocks wait for their release"
    );
    pool.release(&displaced);
    assert_eq!(
        pool.referenced(),
        3,
        "b's own blocks went back to the free list"
    );
    assert!(
        commit_all(&mut pool, &mut a, &hashes).is_empty(),
        "already cached"
    );
    assert_eq!(pool.drain_events().count(), 0);
    pool.release(&b);
    assert_eq!(pool.referenced(), 3, "a still holds its blocks");
    pool.check_invariants();
}

#[test]
fn snapshot_lists_parents_first_and_coalesces_chains() {
    let mut pool = KvPool::new(16, 4);
    let base = prompt(4, 3);
    let hashes = block_hashes(&base, 4);
    let mut a = take(&mut pool, &[], 3);
    commit_all(&mut pool, &mut a, &hashes);
    // A branch sharing the first block.
    let mut branch = base.clone();
    branch[4] = 99;
    let bh = block_hashes(&branch, 4);
    let mut b = take(&mut pool, &bh[..1], 2);
    assert_eq!(pool.commit_many(&mut b, &bh, 1, &mut Vec::new()), 2);
    let snap = pool.snapshot();
    // Replaying the snapshot rebuilds the cached set, and every parent precedes its child.
    let mut known = std::collections::HashSet::new();
    for ev in &snap {
        let KvEvent::Stored { parent, hashes } = ev else {
            panic!("snapshot has {ev:?}")
        };
        if let Some(p) = parent {
            assert!(known.contains(p), "parent listed after child");
        }
        known.extend(hashes.iter().copied());
    }
    assert_eq!(known.len(), 5);
    assert_eq!(snap.len(), 2, "two chains: {snap:?}");
}

#[test]
fn forgetting_a_block_takes_it_out_of_the_cache_whoever_holds_it() {
    let mut pool = KvPool::new(4, 4);
    let hashes = block_hashes(&prompt(1, 2), 4);
    let mut t = take(&mut pool, &[], 2);
    commit_all(&mut pool, &mut t, &hashes);
    pool.drain_events().for_each(drop);
    // Held: it leaves the cache now and is freed on release, not kept as evictable.
    pool.forget(t[1]);
    assert_eq!(pool.match_prefix(&hashes), 1);
    assert_eq!(
        pool.drain_events().collect::<Vec<_>>(),
        vec![KvEvent::Removed {
            hashes: vec![hashes[1]]
        }]
    );
    pool.release(&t);
    assert_eq!((pool.cached_len(), pool.referenced()), (1, 0));
    pool.check_invariants();
    // Unreferenced (evictable): it leaves the evictable queue for the free list.
    pool.forget(t[0]);
    assert_eq!((pool.cached_len(), pool.available()), (0, 4));
    pool.check_invariants();
    // Not cached: nothing happens.
    pool.forget(t[0]);
    assert!(pool.drain_events().eq([KvEvent::Removed {
        hashes: vec![hashes[0]]
    }]));
    pool.check_invariants();
}

#[test]
fn extending_a_hit_trades_reserved_blocks_for_cached_ones() {
    let mut pool = KvPool::new(8, 4);
    let hashes = block_hashes(&prompt(3, 3), 4);
    let mut a = take(&mut pool, &[], 3);
    commit_all(&mut pool, &mut a, &hashes);
    // A sequence admitted before those were cached reserved 4 blocks of its own.
    let mut table = Vec::new();
    assert!(pool.admit(&[], 4, &mut table));
    assert_eq!(pool.reserved(), 4);
    assert_eq!(pool.extend_hit(&hashes[..2], 0, &mut table), 2);
    assert_eq!(table, a[..2]);
    assert_eq!(pool.reserved(), 2);
    // Nothing cached past them: nothing changes.
    let other = block_hashes(&prompt(4, 1), 4);
    assert_eq!(pool.extend_hit(&other, 0, &mut table), 0);
    assert_eq!((table.len(), pool.reserved()), (2, 2));
    pool.release(&table);
    pool.unreserve(2);
    pool.release(&a);
    pool.check_invariants();
}

#[test]
fn a_silenced_pool_caches_and_evicts_without_queueing_events() {
    let mut pool = KvPool::new(2, 4);
    pool.record_events(false);
    let a = block_hashes(&prompt(1, 2), 4);
    let mut t = take(&mut pool, &[], 2);
    commit_all(&mut pool, &mut t, &a);
    pool.release(&t);
    assert_eq!(pool.match_prefix(&a), 2, "cached as before");
    let b = block_hashes(&prompt(2, 1), 4);
    let mut t = take(&mut pool, &[], 1);
    commit_all(&mut pool, &mut t, &b);
    assert_eq!(
        pool.match_prefix(&a),
        1,
        "a's tail block was evicted for b's"
    );
    assert_eq!(pool.drain_events().count(), 0);
    pool.check_invariants();
    pool.record_events(true);
    pool.release(&t);
    let t = take(&mut pool, &[], 2);
    assert!(matches!(
        pool.drain_events().next(),
        Some(KvEvent::Removed { .. })
    ));
    drop(t);
}

#[test]
fn unindexed_blocks_are_cached_and_evicted_in_turn_but_never_found() {
    // Three blocks: a's first block indexed, its second unindexed; then b needs two blocks
    // and takes the free one and the least recently used: a's tail, the unindexed block.
    let mut pool = KvPool::new(3, 4);
    let a = block_hashes(&prompt(1, 2), 4);
    let mut t = take(&mut pool, &[], 2);
    assert_eq!(pool.commit_many(&mut t, &a[..1], 0, &mut Vec::new()), 1);
    pool.commit_many_unindexed(&t, &a, 1);
    assert_eq!(pool.match_prefix(&a), 1, "the unindexed block is not found");
    assert_eq!(pool.cached_len(), 1);
    // It is announced as any cached block is, continuing its chain.
    let stored: Vec<KvEvent> = pool.drain_events().collect();
    assert_eq!(
        stored,
        vec![KvEvent::Stored {
            parent: None,
            hashes: a.clone(),
        }]
    );
    pool.check_invariants();
    pool.release(&t);
    assert_eq!((pool.unreferenced(), pool.available()), (3, 3));
    pool.check_invariants();
    let b = block_hashes(&prompt(2, 2), 4);
    let mut u = take(&mut pool, &[], 2);
    assert_eq!(
        u,
        vec![2, t[1]],
        "the free block, then the LRU's front: a's tail"
    );
    assert_eq!(
        pool.drain_events().collect::<Vec<_>>(),
        vec![KvEvent::Removed { hashes: vec![a[1]] }]
    );
    commit_all(&mut pool, &mut u, &b);
    assert_eq!(pool.match_prefix(&b), 2);
    assert_eq!(pool.match_prefix(&a), 1, "a's head stays");
    pool.check_invariants();
    pool.release(&u);
    pool.check_invariants();
}

/// A prompt computed by two sequences at once: the later one's duplicates give way to the
/// cached copies, which it holds from then on, so its blocks past the other's end are cached as
/// their children and no eviction leaves one without its parent (a lookup that assumes
/// closure, as the router's index does, would count the whole chain across such a hole).
#[test]
fn concurrent_duplicates_hold_the_cached_copies_and_chains_stay_prefix_closed() {
    let mut pool = KvPool::new(6, 4);
    let long = block_hashes(&prompt(5, 3), 4);
    // Both admitted before either computed anything: `a` the first two blocks, `b` all three.
    let mut a = take(&mut pool, &[], 2);
    let mut b = take(&mut pool, &[], 3);
    assert!(commit_all(&mut pool, &mut a, &long[..2]).is_empty());
    let own = b.clone();
    let displaced = commit_all(&mut pool, &mut b, &long);
    assert_eq!(displaced, own[..2], "b's duplicates give way");
    assert_eq!(b, [a[0], a[1], own[2]], "b holds the cached copies");
    assert_eq!(pool.cached_len(), 3);
    pool.release(&displaced);
    pool.release(&a);
    assert_eq!(pool.referenced(), 3, "b holds the whole chain");
    pool.check_invariants();
    // Pressure once b is gone evicts the chain tail first: it shrinks and never splits.
    pool.release(&b);
    let c = take(&mut pool, &[], 4);
    assert_eq!(pool.match_prefix(&long), 2);
    let d = take(&mut pool, &[], 1);
    assert_eq!(pool.match_prefix(&long), 1);
    pool.check_invariants();
    pool.release(&c);
    pool.release(&d);
    pool.check_invariants();
}

/// A copy that is evictable is held only if reviving it fits beside the reservations; when it
/// does not, the duplicate stays private and so do the blocks after it.
#[test]
fn a_duplicate_whose_copy_cannot_be_revived_stays_private_with_its_children() {
    let mut pool = KvPool::new(5, 4);
    let long = block_hashes(&prompt(6, 3), 4);
    let mut a = take(&mut pool, &[], 1);
    assert!(commit_all(&mut pool, &mut a, &long[..1]).is_empty());
    pool.release(&a);
    // b computed the same first block and two more; the last free block is reserved.
    let mut b = take(&mut pool, &[], 3);
    assert!(pool.admit(&[], 2, &mut Vec::new()));
    assert_eq!(pool.available(), 0);
    let own = b.clone();
    assert!(commit_all(&mut pool, &mut b, &long).is_empty());
    assert_eq!(b, own, "nothing adopted");
    assert_eq!(pool.cached_len(), 1, "only a's copy is cached");
    assert!(!pool.contains(&long[..2]));
    pool.check_invariants();
    pool.release(&b);
    pool.unreserve(2);
    assert_eq!(pool.available(), 5);
    pool.check_invariants();
}

/// `match_prefix` binary-searches a chain: exact wherever the cached run ends, for a query the
/// length of the chain or longer, as the chain's tail is evicted block by block.
#[test]
fn match_prefix_finds_where_a_long_chain_ends_as_its_tail_is_evicted() {
    let mut pool = KvPool::new(40, 4);
    let hashes = block_hashes(&prompt(9, 40), 4);
    let longer = block_hashes(&prompt(9, 45), 4);
    let mut t = take(&mut pool, &[], 40);
    assert!(commit_all(&mut pool, &mut t, &hashes).is_empty());
    pool.release(&t);
    let mut pressure = Vec::new();
    for cached in (0..=40).rev() {
        assert_eq!(pool.match_prefix(&hashes), cached);
        assert_eq!(pool.match_prefix(&longer), cached);
        assert_eq!(pool.walk_cached(&longer, 0, |_| {}), cached);
        if cached > 0 {
            pressure.extend(take(&mut pool, &[], 1));
        }
    }
    pool.release(&pressure);
    pool.check_invariants();
}
