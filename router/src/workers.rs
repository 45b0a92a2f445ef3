//! The live worker registry: who is up, their load, their gRPC channels, their prefix index.
//!
//! Membership events (etcd or static discovery) add and remove workers. Each worker gets a slot in
//! its pool's [`PrefixIndex`], a lazily connected channel, and a subscriber task (the
//! `subscriber` module) that feeds the index and the load figures from its event stream.
//! The request path reads pools under a shared lock and load figures from atomics.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use dolphin_cluster::{KvCompat, KvMismatch, MembershipEvent, Role, WorkerId, WorkerRecord};
use dolphin_proto::v1;
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::dolphin::approx::ApproxIndex;
use crate::dolphin::split::Split;
use crate::metrics as m;
use crate::prefix_index::PrefixIndex;
use crate::prompt_blocks::PromptBlocks;
use crate::selection::{self, Candidate};
use crate::worker_channel::WorkerChannel;
pub use crate::worker_handle::{InflightGuard, WorkerHandle};

/// Settings shared by every worker of the registry.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// The model the router serves; workers serving another are refused.
    pub model: String,
    /// Tokens per block the router hashes with; workers using another size are refused.
    pub block_size: u32,
    /// Minimum interval between load reports asked of workers, in milliseconds.
    pub load_interval_ms: u32,
    /// How worker connections are made: TCP with a connect timeout, then mutual TLS when the
    /// router has it.
    pub connector: dolphin_tls::GrpcConnector,
}

/// One pool (all prefill or all decode workers): the index and the worker in each slot.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    pub(crate) index: PrefixIndex,
    /// Estimates for workers whose event stream is down.
    pub(crate) approx: ApproxIndex,
    slots: Vec<Option<Arc<WorkerHandle>>>,
}

impl Pool {
    /// The best worker of the pool for a prompt whose lookup gave `counts` (leading blocks
    /// held, per slot), among those `keep` accepts.
    fn choose(
        &self,
        role: Role,
        counts: &[u32],
        blocks: &mut PromptBlocks<'_, '_>,
        overlap_weight: f64,
        skip_unreachable: bool,
        mut keep: impl FnMut(&WorkerHandle) -> bool,
    ) -> Option<Routed> {
        let total = blocks.total() as u32;
        let candidates = self.slots.iter().enumerate().filter_map(|(slot, w)| {
            let w = w.as_ref()?;
            if !keep(w) {
                return None;
            }
            let exact = counts.get(slot).copied().unwrap_or(0);
            // A worker whose event stream is down: its last known state, or what was routed to
            // it since, whichever covers more of the prompt (which needs every block's hash).
            let cached_blocks = if w.events_live() {
                exact
            } else {
                let approx = self
                    .approx
                    .count(role, slot, &w.id, blocks.all(), Instant::now());
                exact.max(approx)
            };
            Some(Candidate {
                slot,
                cached_blocks,
                load: w.load_cost(),
                // Passed over like a draining worker: it may be dead but still listed.
                draining: w.draining() || (skip_unreachable && w.unreachable()),
            })
        });
        let choice =
            selection::with_rng(|rng| selection::select(candidates, total, overlap_weight, rng))?;
        let worker = self.slots.get(choice.slot)?.clone()?;
        Some(Routed {
            worker,
            cached_blocks: choice.cached_blocks,
        })
    }
}

/// The best prefill worker of `pool` whose KV may go to `decode` (same build, model, block size
/// and KV layout). Every compatible-looking candidate refused for a mismatch is counted in a
/// metric and named in one log line, so a rolling upgrade that leaves a decode worker without
/// partners is visible.
fn prefill_partner(
    pool: &Pool,
    decode: &WorkerHandle,
    counts: &[u32],
    blocks: &mut PromptBlocks<'_, '_>,
    overlap_weight: f64,
) -> Option<Routed> {
    let mut refused: Option<(WorkerId, KvMismatch)> = None;
    let mut refusals = 0u32;
    let routed = pool.choose(
        Role::Prefill,
        counts,
        blocks,
        overlap_weight,
        false,
        |p| match p.pairs_with(decode) {
            Ok(()) => true,
            Err(mismatch) => {
                metrics::counter!(m::PAIRS_REFUSED_TOTAL, "reason" => mismatch.as_str())
                    .increment(1);
                refusals += 1;
                refused.get_or_insert_with(|| (p.id.clone(), mismatch));
                false
            }
        },
    );
    if let Some((prefill, mismatch)) = refused {
        tracing::warn!(
            decode = %decode.id,
            %prefill,
            %mismatch,
            refused = refusals,
            chosen = routed.as_ref().map(|r| r.worker.id.as_str()),
            "prefill workers refused as partners of this decode worker: KV is never shipped \
             between incompatible builds or layouts"
        );
    }
    routed
}

/// Per-slot match counts of both pools, reused across requests (a thread keeps one).
#[derive(Debug, Default)]
pub struct RouteScratch {
    decode: Vec<u32>,
    prefill: Vec<u32>,
}

/// A pool shared between the request path (readers) and subscriber tasks (writers).
pub(crate) type SharedPool = Arc<RwLock<Pool>>;

/// Why a worker was not admitted to the registry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RejectReason {
    /// It serves another model.
    #[error("worker serves model {worker:?}, the router serves {router:?}")]
    WrongModel {
        /// The worker's model.
        worker: String,
        /// The router's.
        router: String,
    },
    /// It uses another block size (prefix hashes would never match).
    #[error("worker block size {worker} differs from the router's {router}")]
    WrongBlockSize {
        /// The worker's block size.
        worker: u32,
        /// The router's.
        router: u32,
    },
    /// Its address is not a usable endpoint.
    #[error("bad worker address {0:?}")]
    BadAddress(String),
    /// The pool has no free slot.
    #[error("pool is full")]
    PoolFull,
}

/// The live workers of the cluster.
#[derive(Debug)]
pub struct WorkerRegistry {
    cfg: RegistryConfig,
    prefill: SharedPool,
    decode: SharedPool,
    /// Membership changes are rare; one lock keeps add/remove simple and ordered.
    members: Mutex<HashMap<WorkerId, (WorkerRecord, Arc<WorkerHandle>)>>,
    /// Live workers per role (prefill, decode), readable without the members lock: the live
    /// split selects the routing table on every request.
    live: [AtomicU32; 2],
    /// The shortest context any live worker reported (0: none reported one), kept beside the
    /// members so that requests read it without the lock.
    context: AtomicU32,
    /// A number per distinct [`KvCompat`] seen (never reused: a handful of builds per life).
    compat_ids: Mutex<HashMap<KvCompat, u32>>,
}

/// The worker chosen in one pool for a request.
#[derive(Clone, Debug)]
pub struct Routed {
    /// The worker.
    pub worker: Arc<WorkerHandle>,
    /// Leading prompt blocks it holds.
    pub cached_blocks: u32,
}

impl WorkerRegistry {
    /// An empty registry.
    pub fn new(cfg: RegistryConfig) -> Arc<Self> {
        Arc::new(Self {
            cfg,
            prefill: SharedPool::default(),
            decode: SharedPool::default(),
            members: Mutex::new(HashMap::new()),
            live: [AtomicU32::new(0), AtomicU32::new(0)],
            context: AtomicU32::new(0),
            compat_ids: Mutex::new(HashMap::new()),
        })
    }

    fn live_count(&self, role: Role) -> &AtomicU32 {
        match role {
            Role::Prefill => &self.live[0],
            Role::Decode => &self.live[1],
        }
    }

    /// The live split: workers registered per role (two atomic loads).
    pub fn split(&self) -> Split {
        Split::new(
            self.live[0].load(Ordering::Relaxed),
            self.live[1].load(Ordering::Relaxed),
        )
    }

    /// The registry's settings.
    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    pub(crate) fn pool(&self, role: Role) -> &SharedPool {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => &self.decode,
        }
    }

    /// Applies a membership event.
    pub fn apply(&self, ev: MembershipEvent) {
        match ev {
            MembershipEvent::Up(rec) => {
                let (id, role) = (rec.id.clone(), rec.role);
                if let Err(reason) = self.add(rec) {
                    metrics::counter!(m::WORKERS_REJECTED_TOTAL, "role" => role.as_str())
                        .increment(1);
                    tracing::error!(worker = %id, %reason, "worker refused");
                }
            }
            MembershipEvent::Down(id) => self.remove(&id),
        }
    }

    /// Adds (or updates) a worker and starts its subscriber task.
    pub fn add(&self, rec: WorkerRecord) -> Result<(), RejectReason> {
        if rec.model != self.cfg.model {
            return Err(RejectReason::WrongModel {
                worker: rec.model,
                router: self.cfg.model.clone(),
            });
        }
        if rec.block_size != self.cfg.block_size {
            return Err(RejectReason::WrongBlockSize {
                worker: rec.block_size,
                router: self.cfg.block_size,
            });
        }
        let channel = WorkerChannel::new(&rec.grpc_addr, &self.cfg.connector)
            .map_err(|_| RejectReason::BadAddress(rec.grpc_addr.clone()))?;
        let mut members = self.members.lock();
        if let Some((old, _)) = members.get(&rec.id) {
            if *old == rec {
                return Ok(());
            }
            // A changed record (restarted on another port, say): start over with fresh state.
            drop(members);
            self.remove(&rec.id);
            members = self.members.lock();
        }
        let compat_id = {
            let mut ids = self.compat_ids.lock();
            let next = ids.len() as u32;
            *ids.entry(rec.kv_compat()).or_insert(next)
        };
        let pool = self.pool(rec.role).clone();
        let handle = {
            let mut p = pool.write();
            let slot = p.index.allocate_slot().ok_or(RejectReason::PoolFull)?;
            let handle = Arc::new(WorkerHandle::new(&rec, slot, channel, compat_id));
            if p.slots.len() <= slot {
                p.slots.resize(slot + 1, None);
            }
            p.slots[slot] = Some(handle.clone());
            handle
        };
        tracing::info!(worker = %rec.id, role = %rec.role, addr = %rec.grpc_addr, "worker up");
        metrics::gauge!(m::WORKERS, "role" => rec.role.as_str()).increment(1.0);
        crate::subscriber::spawn(handle.clone(), pool, self.cfg.load_interval_ms);
        self.live_count(rec.role).fetch_add(1, Ordering::Relaxed);
        members.insert(rec.id.clone(), (rec, handle));
        self.note_context(&members);
        Ok(())
    }

    /// Recomputes the shortest context over `members` (called under their lock, after each
    /// change, so the value follows the membership in order).
    fn note_context(&self, members: &HashMap<WorkerId, (WorkerRecord, Arc<WorkerHandle>)>) {
        let shortest = members
            .values()
            .map(|(r, _)| r.context_length)
            .filter(|&c| c > 0)
            .min()
            .unwrap_or(0);
        self.context.store(shortest, Ordering::Relaxed);
    }

    /// The longest sequence (prompt plus generated tokens) every live worker takes: the
    /// shortest context any of them reported, since a request may be sent to any. `None` while
    /// no live worker reported one.
    pub fn context_length(&self) -> Option<u32> {
        Some(self.context.load(Ordering::Relaxed)).filter(|&c| c > 0)
    }

    /// Removes a worker: stops its subscriber and drops its index entries.
    pub fn remove(&self, id: &WorkerId) {
        let (rec, handle) = {
            let mut members = self.members.lock();
            let Some(removed) = members.remove(id) else {
                return;
            };
            self.note_context(&members);
            removed
        };
        handle.cancel.cancel();
        handle.set_events_live(true); // leaves the stale gauge as if it had never been counted
        self.live_count(rec.role).fetch_sub(1, Ordering::Relaxed);
        {
            let mut p = self.pool(rec.role).write();
            p.index.release_slot(handle.slot);
            p.approx.forget(handle.slot);
            if let Some(s) = p.slots.get_mut(handle.slot) {
                *s = None;
            }
            metrics::gauge!(m::INDEX_BLOCKS, "role" => rec.role.as_str())
                .set(p.index.distinct_blocks() as f64);
        }
        metrics::gauge!(m::WORKERS, "role" => rec.role.as_str()).decrement(1.0);
        tracing::info!(worker = %id, role = %rec.role, "worker down");
    }

    /// Removes every worker (shutdown).
    pub fn clear(&self) {
        let ids: Vec<WorkerId> = self.members.lock().keys().cloned().collect();
        for id in ids {
            self.remove(&id);
        }
    }

    /// Consumes a membership stream in a background task until it ends or `shutdown` fires.
    pub fn follow(
        self: &Arc<Self>,
        mut rx: mpsc::Receiver<MembershipEvent>,
        shutdown: CancellationToken,
    ) {
        let reg = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    ev = rx.recv() => match ev {
                        Some(ev) => reg.apply(ev),
                        None => break,
                    },
                }
            }
        });
    }

    /// Routes a prompt: the best decode worker (skipping `exclude`) and the best prefill
    /// worker whose KV may go to it, from one walk over the prompt's blocks in both pools'
    /// indexes (hashed as the walk goes). `None` when no decode worker is left.
    ///
    /// Lock order: the decode pool, then the prefill pool, both shared; nothing takes them the
    /// other way round, and writers take one pool at a time.
    pub fn route_pair(
        &self,
        blocks: &mut PromptBlocks<'_, '_>,
        overlap_weight: f64,
        exclude: &[WorkerId],
        scratch: &mut RouteScratch,
    ) -> Option<(Routed, Option<Routed>)> {
        let decode = self.decode.read();
        let prefill = self.prefill.read();
        let (rest, hashes) = blocks.parts();
        PrefixIndex::lookup_pair(
            &decode.index,
            &prefill.index,
            rest,
            hashes,
            &mut scratch.decode,
            &mut scratch.prefill,
        );
        // Workers a call recently found unreachable are passed over, unless nothing else is
        // left: then they are tried anyway (a burst of failures must not become "no workers").
        let keep = |w: &WorkerHandle| !exclude.contains(&w.id);
        let d = &scratch.decode;
        let routed = decode
            .choose(Role::Decode, d, blocks, overlap_weight, true, keep)
            .or_else(|| decode.choose(Role::Decode, d, blocks, overlap_weight, false, keep))?;
        let partner = prefill_partner(
            &prefill,
            &routed.worker,
            &scratch.prefill,
            blocks,
            overlap_weight,
        );
        Some((routed, partner))
    }

    /// Notes that a prompt was sent to `routed`: a worker whose event stream is down will
    /// likely cache it, which its approximate index remembers.
    pub fn note_routed(&self, role: Role, routed: &Routed, blocks: &mut PromptBlocks<'_, '_>) {
        if !routed.worker.events_live() {
            self.pool(role)
                .read()
                .approx
                .record(routed.worker.slot, blocks.all(), Instant::now());
        }
    }

    /// Live workers per role: (prefill, decode).
    pub fn counts(&self) -> (u32, u32) {
        let members = self.members.lock();
        let prefill = members
            .values()
            .filter(|(r, _)| r.role == Role::Prefill)
            .count() as u32;
        (prefill, members.len() as u32 - prefill)
    }

    /// Status of every worker, sorted by role then id.
    pub fn list(&self) -> Vec<v1::WorkerStatus> {
        let members: Vec<Arc<WorkerHandle>> = self
            .members
            .lock()
            .values()
            .map(|(_, h)| h.clone())
            .collect();
        let mut out: Vec<v1::WorkerStatus> = members
            .iter()
            .map(|h| {
                let indexed = self.pool(h.role).read().index.held_blocks(h.slot) as u64;
                h.status(indexed)
            })
            .collect();
        out.sort_by(|a, b| (a.role, &a.worker_id).cmp(&(b.role, &b.worker_id)));
        out
    }

    /// A worker by id.
    pub fn get(&self, id: &WorkerId) -> Option<Arc<WorkerHandle>> {
        self.members.lock().get(id).map(|(_, h)| h.clone())
    }
}

#[cfg(test)]
mod tests {
    use dolphin_cluster::BlockHash;

    use super::*;
    use crate::testutil::worker_record as record;

    fn cfg() -> RegistryConfig {
        RegistryConfig {
            model: "sim-model".into(),
            block_size: 16,
            load_interval_ms: 50,
            connector: dolphin_tls::GrpcConnector::plain(std::time::Duration::from_millis(200)),
        }
    }

    /// A prompt of `blocks` full blocks (the registry's block size, 16).
    fn tokens(blocks: u32) -> Vec<u32> {
        (0..blocks * 16).collect()
    }

    fn hashes_of(tokens: &[u32]) -> Vec<BlockHash> {
        dolphin_cluster::block_hashes(tokens, 16)
    }

    /// Routes `tokens` as the dispatcher does.
    fn route(
        reg: &WorkerRegistry,
        tokens: &[u32],
        exclude: &[WorkerId],
    ) -> Option<(Routed, Option<Routed>)> {
        let mut hashes = Vec::new();
        let mut blocks = PromptBlocks::new(dolphin_cluster::ROOT_SEED, tokens, 16, &mut hashes);
        reg.route_pair(&mut blocks, 1.0, exclude, &mut RouteScratch::default())
    }

    #[tokio::test]
    async fn refuses_wrong_model_and_block_size() {
        let reg = WorkerRegistry::new(cfg());
        let mut r = record("d1", Role::Decode, "127.0.0.1:1");
        r.model = "other".into();
        assert!(matches!(reg.add(r), Err(RejectReason::WrongModel { .. })));
        let mut r = record("d1", Role::Decode, "127.0.0.1:1");
        r.block_size = 32;
        assert!(matches!(
            reg.add(r),
            Err(RejectReason::WrongBlockSize {
                worker: 32,
                router: 16
            })
        ));
        assert!(matches!(
            reg.add(record("d1", Role::Decode, "not an address")),
            Err(RejectReason::BadAddress(_))
        ));
        assert_eq!(reg.counts(), (0, 0));
    }

    #[tokio::test]
    async fn the_context_is_the_shortest_a_live_worker_reported() {
        let reg = WorkerRegistry::new(cfg());
        let with = |id: &str, role, ctx| {
            let mut r = record(id, role, "127.0.0.1:9");
            r.context_length = ctx;
            r
        };
        assert_eq!(reg.context_length(), None);
        reg.add(with("d1", Role::Decode, 0)).expect("add");
        assert_eq!(reg.context_length(), None, "0 is unknown, not a limit");
        reg.add(with("d2", Role::Decode, 8192)).expect("add");
        reg.add(with("p1", Role::Prefill, 4096)).expect("add");
        assert_eq!(reg.context_length(), Some(4096));
        // A worker restarted with a longer context replaces its old record.
        reg.add(with("p1", Role::Prefill, 16384)).expect("add");
        assert_eq!(reg.context_length(), Some(8192));
        reg.remove(&WorkerId::from("d2"));
        assert_eq!(reg.context_length(), Some(16384));
        reg.clear();
        assert_eq!(reg.context_length(), None);
    }

    #[tokio::test]
    async fn routes_by_index_and_load_and_forgets_removed_workers() {
        let reg = WorkerRegistry::new(cfg());
        // Unreachable ports: subscribers keep retrying in the background, which is fine here.
        reg.add(record("d1", Role::Decode, "127.0.0.1:9"))
            .expect("add");
        reg.add(record("d2", Role::Decode, "127.0.0.1:9"))
            .expect("add");
        reg.add(record("p1", Role::Prefill, "127.0.0.1:9"))
            .expect("add");
        assert_eq!(reg.counts(), (1, 2));
        assert_eq!(reg.split(), Split::new(1, 2));
        let d2 = reg.get(&WorkerId::from("d2")).expect("d2");
        let prompt = tokens(4);
        reg.pool(Role::Decode)
            .write()
            .index
            .stored(d2.slot, &hashes_of(&prompt)[..3]);
        let (r, p) = route(&reg, &prompt, &[]).expect("routed");
        assert_eq!((r.worker.id.as_str(), r.cached_blocks), ("d2", 3));
        let p = p.expect("a prefill partner");
        assert_eq!((p.worker.id.as_str(), p.cached_blocks), ("p1", 0));
        // Its event stream is not up (never connected): the approximate index remembers the
        // whole prompt as routed to it (every block hashed for it).
        assert!(!r.worker.events_live());
        let mut hashes = Vec::new();
        let mut blocks = PromptBlocks::new(dolphin_cluster::ROOT_SEED, &prompt, 16, &mut hashes);
        reg.note_routed(Role::Decode, &r, &mut blocks);
        let (r, _) = route(&reg, &prompt, &[]).expect("routed");
        assert_eq!((r.worker.id.as_str(), r.cached_blocks), ("d2", 4));
        // Excluding d2 leaves d1.
        let (r, _) = route(&reg, &prompt[..32], &[WorkerId::from("d2")]).expect("routed");
        assert_eq!(r.worker.id.as_str(), "d1");
        // Heavy in-flight load on d2 outweighs its cache.
        let _guard = d2.begin_request(16 * 100);
        let (r, _) = route(&reg, &prompt, &[]).expect("routed");
        assert_eq!(r.worker.id.as_str(), "d1");
        drop(_guard);
        // Draining d1 and removing d2 leaves nobody.
        reg.get(&WorkerId::from("d1"))
            .expect("d1")
            .apply_load(&v1::LoadReport {
                draining: true,
                ..Default::default()
            });
        reg.remove(&WorkerId::from("d2"));
        assert!(route(&reg, &prompt[..16], &[]).is_none());
        assert_eq!(reg.pool(Role::Decode).read().index.distinct_blocks(), 0);
        assert_eq!(reg.counts(), (1, 1));
        let listed = reg.list();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].worker_id, "p1");
        assert!(listed[1].draining);
        reg.clear();
        assert_eq!(reg.counts(), (0, 0));
        assert_eq!(reg.split(), Split::new(0, 0));
    }

    #[tokio::test]
    async fn prefill_workers_pair_only_with_decode_workers_of_their_build_and_layout() {
        let reg = WorkerRegistry::new(cfg());
        reg.add(record("d1", Role::Decode, "127.0.0.1:9"))
            .expect("add");
        let mut newer = record("p-new", Role::Prefill, "127.0.0.1:9");
        newer.version = "9.9.9".into();
        reg.add(newer).expect("add");
        let mut other_layout = record("p-f16", Role::Prefill, "127.0.0.1:9");
        other_layout.kv_layout = "candle/f16".into();
        reg.add(other_layout).expect("add");
        let d1 = reg.get(&WorkerId::from("d1")).expect("d1");
        let prompt = tokens(2);
        // Neither is a partner, however much of the prompt it caches.
        for p in ["p-new", "p-f16"] {
            let slot = reg.get(&WorkerId::from(p)).expect(p).slot;
            reg.pool(Role::Prefill)
                .write()
                .index
                .stored(slot, &hashes_of(&prompt));
        }
        let (r, p) = route(&reg, &prompt, &[]).expect("routed");
        assert_eq!(r.worker.id.as_str(), "d1");
        assert!(p.is_none());
        // A compatible one is chosen, even with nothing cached; and what it caches counts.
        reg.add(record("p-same", Role::Prefill, "127.0.0.1:9"))
            .expect("add");
        let p = route(&reg, &prompt, &[])
            .and_then(|(_, p)| p)
            .expect("routed");
        assert_eq!((p.worker.id.as_str(), p.cached_blocks), ("p-same", 0));
        reg.pool(Role::Prefill)
            .write()
            .index
            .stored(p.worker.slot, &hashes_of(&prompt)[..1]);
        let p = route(&reg, &prompt, &[])
            .and_then(|(_, p)| p)
            .expect("routed");
        assert_eq!((p.worker.id.as_str(), p.cached_blocks), ("p-same", 1));
        let p_new = reg.get(&WorkerId::from("p-new")).expect("p-new");
        assert_eq!(
            p_new.pairs_with(&d1).map_err(|m| m.as_str()),
            Err("version")
        );
    }

    #[tokio::test]
    async fn same_record_twice_is_a_no_op_and_a_changed_one_replaces() {
        let reg = WorkerRegistry::new(cfg());
        reg.add(record("d1", Role::Decode, "127.0.0.1:9"))
            .expect("add");
        let first = reg.get(&WorkerId::from("d1")).expect("d1");
        reg.add(record("d1", Role::Decode, "127.0.0.1:9"))
            .expect("add");
        assert!(Arc::ptr_eq(
            &first,
            &reg.get(&WorkerId::from("d1")).expect("d1")
        ));
        reg.add(record("d1", Role::Decode, "127.0.0.1:10"))
            .expect("add");
        let second = reg.get(&WorkerId::from("d1")).expect("d1");
        assert_eq!(second.grpc_addr, "127.0.0.1:10");
        assert!(first.cancel.is_cancelled());
        assert_eq!(reg.counts(), (0, 1));
    }
}
