//! Engine cache events and load snapshots in their wire form.

use dolphin_engine::{KvEvent, LoadSnapshot};
use dolphin_proto::v1::{self, worker_event::Event};

/// The wire form of one KV cache event.
pub fn kv_event(event: KvEvent) -> Event {
    match event {
        KvEvent::Stored { parent, hashes } => Event::Stored(v1::BlocksStored {
            parent_hash: parent,
            block_hashes: hashes,
        }),
        KvEvent::Removed { hashes } => Event::Removed(v1::BlocksRemoved {
            block_hashes: hashes,
        }),
        KvEvent::Cleared => Event::Cleared(v1::AllBlocksCleared {}),
    }
}

/// The wire form of a load snapshot, with the engine's tokens per step (`EngineInfo`'s step
/// limits; 0: unknown), which load-aware policies compare the prefill backlog with.
pub fn load_report(load: LoadSnapshot, max_batched_tokens: u32, draining: bool) -> Event {
    Event::Load(v1::LoadReport {
        running: load.running,
        waiting: load.waiting,
        free_blocks: load.free_blocks,
        total_blocks: load.total_blocks,
        active_tokens: load.active_tokens,
        queued_prefill_tokens: load.queued_prefill_tokens,
        max_batched_tokens,
        draining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_events_keep_hashes_in_order() {
        let stored = kv_event(KvEvent::Stored {
            parent: Some(7),
            hashes: vec![1, 2, 3],
        });
        assert_eq!(
            stored,
            Event::Stored(v1::BlocksStored {
                parent_hash: Some(7),
                block_hashes: vec![1, 2, 3],
            })
        );
        let root = kv_event(KvEvent::Stored {
            parent: None,
            hashes: vec![9],
        });
        assert!(matches!(root, Event::Stored(s) if s.parent_hash.is_none()));
        assert_eq!(
            kv_event(KvEvent::Removed { hashes: vec![4, 5] }),
            Event::Removed(v1::BlocksRemoved {
                block_hashes: vec![4, 5]
            })
        );
        assert_eq!(
            kv_event(KvEvent::Cleared),
            Event::Cleared(v1::AllBlocksCleared {})
        );
    }

    #[test]
    fn load_report_copies_every_field() {
        let load = LoadSnapshot {
            running: 1,
            waiting: 2,
            free_blocks: 3,
            total_blocks: 4,
            active_tokens: 5,
            queued_prefill_tokens: 6,
        };
        assert_eq!(
            load_report(load, 7, true),
            Event::Load(v1::LoadReport {
                running: 1,
                waiting: 2,
                free_blocks: 3,
                total_blocks: 4,
                active_tokens: 5,
                queued_prefill_tokens: 6,
                max_batched_tokens: 7,
                draining: true,
            })
        );
    }
}
