//! The simulated P/D cluster: the router's decision for every arrival, then the engines' steps
//! and KV transfers as events, on one thread.
//!
//! Routing is the router's own code: the prompt's block hashes are looked up in each pool (each
//! worker's cache, or with [`PrefixLookup::RouterIndex`] the pool's [`PrefixIndex`] fed by the
//! workers' cache events as they happen: the same answer), each pool's worker is
//! picked by [`selection::select`] (cache overlap against load, the load as the router knows it:
//! each worker's latest periodic load report, and for decode workers the router's own count of
//! prompts in flight there), and [`route`] (the function `Dispatcher::route` calls) computes the
//! four [`Features`] with the output classifier's length and decides local or remote by the
//! policy, or the compiled table under `Policy::Dolphin`.
//!
//! Remote path, as in DESIGN.md section 3: the decode worker reserves KV for the prompt (waiting
//! for admission if its pool is full), then the prefill worker computes what it does not hold,
//! then the blocks the decode worker lacks cross the link (`bytes per token x tokens /
//! bandwidth`, one transfer per request, not contended), then the decode worker emits the first
//! token and decodes.

use dolphin_router::dolphin::online::{self, Explorer, Neighbourhood, OnlineLearner};
use dolphin_router::dolphin::table::TableSlo;
use dolphin_router::dolphin::{CompiledTable, OutputClassifier};
use dolphin_router::policy::{Decision, Features, Policy, PrefillPath};
use dolphin_router::prefix_index::PrefixIndex;
use dolphin_router::route::{PrefillChoice, Route, RouteInput, TableRef, route};
use dolphin_router::selection::{self, Candidate, Choice};
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::config::{PrefixLookup, SchedulerModel, SimClusterConfig, SimError};
use crate::event::{Action, EventQueue, Pool};
use crate::report::{FlipRecord, OnlineRun, RequestRecord, SimReport};
use crate::request::SimRequest;
use crate::source::Source;
use crate::worker::{Kind, Outcome, Worker};

/// Per-request progress.
#[derive(Clone, Copy, Debug, Default)]
struct ReqState {
    decode: u32,
    prefill: Option<u32>,
    features: Features,
    cluster: Option<u32>,
    remote: bool,
    /// Sent remote, but the decode worker held the prompt up to its last block and prefilled it.
    held: bool,
    /// The online learner credits its outcome (see `online::learns_from`).
    learns: bool,
    explored: bool,
    /// Decode-side sequence of a remote request, and its cached blocks there.
    dseq: u32,
    skip_blocks: u32,
    /// Arrival at the router.
    sent_ms: f64,
    first_ms: f64,
    done_ms: f64,
}

impl ReqState {
    /// TTFT, TPOT and end-to-end latency in ms of a finished request of `output_len` tokens
    /// (TPOT 0 for one token): what the report records and the online learner judges.
    fn latencies(&self, output_len: u32) -> (f64, f64, f64) {
        let tpot = if output_len > 1 {
            (self.done_ms - self.first_ms) / f64::from(output_len - 1)
        } else {
            0.0
        };
        (
            self.first_ms - self.sent_ms,
            tpot,
            self.done_ms - self.sent_ms,
        )
    }

    /// The path the router chose.
    fn decision(&self) -> Decision {
        if self.remote {
            Decision::Remote
        } else {
            Decision::Local
        }
    }
}

/// A simulated cluster; [`run`](Self::run) replays a workload on it from a cold start.
#[derive(Debug)]
pub struct SimCluster {
    cfg: SimClusterConfig,
}

/// The mutable state of one run.
struct Run<'a> {
    cfg: &'a SimClusterConfig,
    reqs: &'a [SimRequest],
    prefill: Vec<Worker>,
    decode: Vec<Worker>,
    /// The router's index of each pool, with [`PrefixLookup::RouterIndex`].
    indexes: Option<Indexes>,
    rng: SmallRng,
    source: Source,
    events: EventQueue,
    pending: Vec<Outcome>,
    /// Workers whose next step waits for the other arrivals of this instant
    /// ([`SchedulerModel::Vllm`]), and whether kicks are being held.
    held_kicks: Vec<(Pool, u32)>,
    hold_kicks: bool,
    counts: Vec<u32>,
    /// Per request, its leading blocks some other request also has ([`shared_prefixes`]):
    /// only these can ever be found in a pool, so with [`PrefixLookup::Pools`] only these
    /// enter the pools' maps, and lookups stop there (`u32::MAX`, every block, with the
    /// router's index).
    shared: Vec<u32>,
    state: Vec<ReqState>,
    now: f64,
    bytes_per_ms: f64,
    /// The table deciding now (the online learner replaces it at each flip).
    table: Option<CompiledTable>,
    online: Option<Online>,
}

/// The router's prefix index of each pool.
struct Indexes {
    prefill: PrefixIndex,
    decode: PrefixIndex,
}

impl Indexes {
    /// Empty indexes with a slot for every worker (slots are handed out in order, so worker i
    /// has slot i), sized for what the pools can hold: they never grow (rehashing a million
    /// entries mid-run costs more than the memory).
    fn new(cfg: &SimClusterConfig) -> Self {
        let index = |workers: u32| {
            let mut index =
                PrefixIndex::with_capacity(workers as usize * cfg.total_blocks as usize);
            for _ in 0..workers {
                index.allocate_slot();
            }
            index
        };
        Indexes {
            prefill: index(cfg.prefill),
            decode: index(cfg.decode),
        }
    }
}

/// The online learner of a run, as the router runs it (`dolphin::online`).
struct Online {
    learner: OnlineLearner,
    explorer: Explorer,
    neighbourhood: Neighbourhood<u32>,
    flips: Vec<FlipRecord>,
    explored: u64,
}

impl SimCluster {
    /// A cluster of `cfg` (validated).
    pub fn new(cfg: SimClusterConfig) -> Result<Self, SimError> {
        cfg.validate()?;
        Ok(SimCluster { cfg })
    }

    /// The configuration.
    pub fn config(&self) -> &SimClusterConfig {
        &self.cfg
    }

    /// Replaces the policy and the table (between runs, e.g. while learning a table).
    pub fn set_policy(
        &mut self,
        policy: Policy,
        table: Option<dolphin_router::dolphin::CompiledTable>,
    ) {
        self.cfg.policy = policy;
        self.cfg.table = table;
    }

    /// Replaces the output classifier.
    pub fn set_classifier(&mut self, classifier: OutputClassifier) {
        self.cfg.classifier = classifier;
    }

    /// Simulates `requests` (any order; ties in arrival keep input order) on a cold cluster and
    /// reports every request. Fails if a request could never fit a worker's KV pool.
    pub fn run(&mut self, requests: &[SimRequest]) -> Result<SimReport, SimError> {
        self.cfg.check_requests(requests, true)?;
        Ok(Run::new(&self.cfg, requests, Source::open(requests)).drive())
    }

    /// Simulates `requests` in closed loop on a cold cluster: the first `concurrency` start at
    /// 0, and each completion releases the next request, in input order, at that instant (their
    /// `arrival_ms` are ignored; the records hold the release times). Saturated load with at
    /// most `concurrency` requests in flight. Fails if `concurrency` is 0 or a request could
    /// never fit a worker's KV pool.
    pub fn run_closed(
        &mut self,
        requests: &[SimRequest],
        concurrency: u32,
    ) -> Result<SimReport, SimError> {
        if concurrency == 0 {
            return Err(SimError::Config(
                "closed-loop concurrency must be at least 1".into(),
            ));
        }
        self.cfg.check_requests(requests, false)?;
        let source = Source::closed(requests.len(), concurrency);
        Ok(Run::new(&self.cfg, requests, source).drive())
    }
}

impl<'a> Run<'a> {
    fn new(cfg: &'a SimClusterConfig, reqs: &'a [SimRequest], source: Source) -> Self {
        let indexes = (cfg.prefix_lookup == PrefixLookup::RouterIndex).then(|| Indexes::new(cfg));
        let worker = |i: u32| {
            let mut w = Worker::new(i, cfg.total_blocks, cfg.block_size, cfg.step_limits());
            if indexes.is_none() {
                w.silence_events();
            }
            w
        };
        let online = match (&cfg.policy, &cfg.table) {
            (Policy::Dolphin(d), Some(t)) if d.online.enabled => Some(Online {
                learner: OnlineLearner::new(d.online, d.trust, t.table().clone()),
                explorer: Explorer::new(&d.online, t.k()),
                neighbourhood: Neighbourhood::default(),
                flips: Vec::new(),
                explored: 0,
            }),
            _ => None,
        };
        Run {
            table: cfg.table.clone(),
            online,
            cfg,
            reqs,
            prefill: (0..cfg.prefill).map(worker).collect(),
            decode: (0..cfg.decode).map(worker).collect(),
            indexes,
            rng: SmallRng::seed_from_u64(cfg.seed),
            source,
            events: EventQueue::default(),
            pending: Vec::new(),
            held_kicks: Vec::new(),
            hold_kicks: false,
            counts: Vec::new(),
            // The reference path keeps every block findable, as the engine does.
            shared: match cfg.prefix_lookup {
                PrefixLookup::Pools => shared_prefixes(reqs),
                PrefixLookup::RouterIndex => vec![u32::MAX; reqs.len()],
            },
            state: vec![ReqState::default(); reqs.len()],
            now: 0.0,
            bytes_per_ms: cfg.link_gbps * 1e9 / 8.0 / 1e3,
        }
    }

    /// Runs until every request has arrived and finished: the earlier of the next arrival and
    /// the next event first (an event first on a tie).
    fn drive(mut self) -> SimReport {
        if self.cfg.load_interval_ms > 0.0 {
            self.events
                .push(self.cfg.load_interval_ms, Action::LoadReport);
        }
        loop {
            let arrival = self.source.peek(self.reqs);
            match (self.events.peek_time(), arrival) {
                (None, None) => break,
                (Some(t), Some(a)) if a < t => {}
                (None, Some(_)) => {}
                _ => {
                    match self.events.pop() {
                        // Not a change of the cluster: `now` stays the last one's time (the
                        // makespan).
                        Some(ev) if ev.action == Action::LoadReport => self.load_report(ev.time),
                        Some(ev) => {
                            self.now = ev.time;
                            self.handle(ev.action);
                        }
                        None => {}
                    }
                    continue;
                }
            }
            let Some((at, req)) = self.source.pop(self.reqs) else {
                break;
            };
            self.now = at;
            // vLLM's engines take every request that arrived at one instant into their next
            // step; Dolphin's starts a step on the first.
            self.hold_kicks = self.cfg.scheduler == SchedulerModel::Vllm
                && self.source.peek(self.reqs) == Some(at);
            self.arrive(req);
            if !self.hold_kicks {
                self.release_kicks();
            }
        }
        self.report()
    }

    /// Every worker reports its load (at `time`), and the next reports are scheduled while
    /// anything is left to happen.
    fn load_report(&mut self, time: f64) {
        for w in self.prefill.iter_mut().chain(&mut self.decode) {
            w.report();
        }
        if !self.events.is_empty() || self.source.peek(self.reqs).is_some() {
            self.events
                .push(time + self.cfg.load_interval_ms, Action::LoadReport);
        }
    }

    /// Picks a worker of one pool for `hashes`, as the router does. `inflight`: the router
    /// counts its own in-flight prompts on this pool's workers (it does on decode workers).
    fn select(
        index: Option<&PrefixIndex>,
        workers: &mut [Worker],
        (hashes, shared): (&[u64], u32),
        counts: &mut Vec<u32>,
        (overlap_weight, inflight): (f64, bool),
        rng: &mut SmallRng,
    ) -> Option<Choice> {
        if workers.is_empty() {
            return None;
        }
        match index {
            Some(index) => index.lookup(hashes, counts),
            // Past the shared prefix no pool holds a block: its hashes are this request's own.
            None => lookup_pools(
                workers,
                &hashes[..(shared as usize).min(hashes.len())],
                counts,
            ),
        }
        let candidates = workers.iter().enumerate().map(|(slot, w)| Candidate {
            slot,
            cached_blocks: counts.get(slot).copied().unwrap_or(0),
            load: w.load_cost(inflight),
            draining: false,
        });
        selection::select(candidates, hashes.len() as u32, overlap_weight, rng)
    }

    /// A request reaches the router: route it and hand it to its decode worker.
    fn arrive(&mut self, req: u32) {
        let cfg = self.cfg;
        let r = &self.reqs[req as usize];
        let shared = self.shared[req as usize];
        let w = cfg.overlap_weight;
        let bs = cfg.block_size;
        if cfg.load_interval_ms == 0.0 {
            // Reports reach the router at every change: it sees the present load.
            for worker in self.prefill.iter_mut().chain(&mut self.decode) {
                worker.report();
            }
        }
        let Some(decode) = Self::select(
            self.indexes.as_ref().map(|i| &i.decode),
            &mut self.decode,
            (&r.hashes, shared),
            &mut self.counts,
            (w, true),
            &mut self.rng,
        ) else {
            return; // unreachable: validated to have decode workers
        };
        let prefill = Self::select(
            self.indexes.as_ref().map(|i| &i.prefill),
            &mut self.prefill,
            (&r.hashes, shared),
            &mut self.counts,
            (w, false),
            &mut self.rng,
        );
        let input = RouteInput {
            isl: r.prompt_len,
            block_size: bs,
            decode_cached_blocks: decode.cached_blocks,
            prefill: prefill.map(|p| {
                let worker = &self.prefill[p.slot];
                let (pending_tokens, max_batched_tokens) = worker.prefill_backlog();
                PrefillChoice {
                    cached_blocks: p.cached_blocks,
                    queue: worker.waiting(),
                    pending_tokens,
                    max_batched_tokens,
                }
            }),
            output_len_hint: cfg.classifier.predict(&r.admission).length,
            decode_kv_usage: Some(self.decode[decode.slot].kv_usage()),
        };
        let table = self.table.as_ref().map(|table| TableRef {
            table,
            version: None,
        });
        // Nothing is forced here, and a remote decision always has its prefill worker.
        let Ok(mut decided) = route(&input, &cfg.policy, table, None) else {
            return;
        };
        let explored = self.online.as_mut().is_some_and(|o| {
            let explored = online::explore(&mut decided, input.pool_state(), &o.explorer);
            o.explored += u64::from(explored);
            explored
        });
        let Route {
            features,
            decision,
            cluster,
            decided_by,
            ..
        } = decided;
        let d = decode.slot as u32;
        let remote = decision == Decision::Remote;
        self.state[req as usize] = ReqState {
            decode: d,
            prefill: prefill.filter(|_| remote).map(|p| p.slot as u32),
            features,
            cluster,
            remote,
            learns: online::learns_from(decided_by),
            explored,
            sent_ms: self.now,
            first_ms: f64::NAN,
            done_ms: f64::NAN,
            ..ReqState::default()
        };
        let kind = if remote { Kind::Remote } else { Kind::Local };
        let mut pending = std::mem::take(&mut self.pending);
        self.decode[d as usize].enqueue(req, self.reqs, (kind, shared), &mut pending);
        self.after(Pool::Decode, d, pending);
    }

    /// Publishes worker `w`'s cache changes, handles what it reported, and starts its next step
    /// if it is idle and has work.
    fn after(&mut self, pool: Pool, w: u32, mut pending: Vec<Outcome>) {
        self.publish(pool, w);
        let mut i = 0;
        while i < pending.len() {
            let o = pending[i];
            i += 1;
            self.outcome(o, &mut pending);
        }
        pending.clear();
        self.pending = pending;
        self.kick(pool, w);
    }

    fn publish(&mut self, pool: Pool, w: u32) {
        let Some(indexes) = &mut self.indexes else {
            return; // the pools are read directly
        };
        match pool {
            Pool::Prefill => self.prefill[w as usize].publish(&mut indexes.prefill, w as usize),
            Pool::Decode => self.decode[w as usize].publish(&mut indexes.decode, w as usize),
        }
    }

    /// Starts the steps held back while an instant's arrivals came in.
    fn release_kicks(&mut self) {
        let mut held = std::mem::take(&mut self.held_kicks);
        for (pool, w) in held.drain(..) {
            self.kick(pool, w);
        }
        self.held_kicks = held;
    }

    fn kick(&mut self, pool: Pool, w: u32) {
        if self.hold_kicks {
            if !self.held_kicks.contains(&(pool, w)) {
                self.held_kicks.push((pool, w));
            }
            return;
        }
        let worker = match pool {
            Pool::Prefill => &mut self.prefill[w as usize],
            Pool::Decode => &mut self.decode[w as usize],
        };
        if worker.busy {
            return;
        }
        if let Some(ms) = worker.build_batch(&self.cfg.profile, self.reqs) {
            worker.busy = true;
            self.events
                .push(self.now + ms, Action::StepEnd { pool, worker: w });
        }
        // Blocks allocated for the batch may have evicted cached ones.
        self.publish(pool, w);
    }

    fn outcome(&mut self, o: Outcome, pending: &mut Vec<Outcome>) {
        match o {
            Outcome::FirstToken { req } => self.state[req as usize].first_ms = self.now,
            Outcome::Finished { req } => {
                self.state[req as usize].done_ms = self.now;
                self.source.completed(self.now);
                self.learn(req);
            }
            Outcome::Reserved {
                worker,
                req,
                seq,
                cached_blocks,
            } => {
                let st = &mut self.state[req as usize];
                st.dseq = seq;
                st.skip_blocks = cached_blocks;
                debug_assert_eq!(st.decode, worker);
                let prompt_blocks = self.reqs[req as usize]
                    .prompt_len
                    .div_ceil(self.cfg.block_size);
                if cached_blocks > 0 && prompt_blocks - cached_blocks <= 1 {
                    // What the decode worker does with a prompt it holds: prefill it itself.
                    st.held = true;
                    st.prefill = None;
                    self.decode[worker as usize].resume_local(seq);
                    return;
                }
                let Some(p) = st.prefill else { return };
                // The prefill worker's own outcomes are handled in this same loop.
                let shared = self.shared[req as usize];
                self.prefill[p as usize].enqueue(
                    req,
                    self.reqs,
                    (Kind::PrefillOnly, shared),
                    pending,
                );
                self.publish(Pool::Prefill, p);
                self.kick(Pool::Prefill, p);
            }
            Outcome::Prefilled { req } => {
                let st = self.state[req as usize];
                let r = &self.reqs[req as usize];
                let tokens = r
                    .prompt_len
                    .saturating_sub(st.skip_blocks * self.cfg.block_size);
                let bytes = f64::from(tokens) * self.cfg.profile.kv_bytes_per_token as f64;
                self.events.push(
                    self.now + bytes / self.bytes_per_ms,
                    Action::KvArrived {
                        worker: st.decode,
                        seq: st.dseq,
                    },
                );
            }
        }
    }

    /// Credits a finished request to the online learner (with its neighbourhood reward), and
    /// swaps in the table of a flip.
    fn learn(&mut self, req: u32) {
        let st = self.state[req as usize];
        let Some(o) = self.online.as_mut() else {
            return;
        };
        let r = &self.reqs[req as usize];
        let (ttft, tpot, e2e) = st.latencies(r.output_len);
        let slo = TableSlo {
            ttft_ms: r.slo.ttft_ms,
            tpot_ms: r.slo.tpot_ms,
        };
        let reward = o.learner.table().provenance.reward;
        let met = online::met(slo, reward, ttft, tpot, e2e, r.output_len);
        let reward = o
            .neighbourhood
            .complete(st.decode, st.sent_ms, st.done_ms, met);
        let (Some(cluster), true) = (st.cluster, st.learns) else {
            return;
        };
        let flip = o.learner.observe(cluster, st.decision(), reward);
        o.explorer.set_share(cluster, o.learner.share(cluster));
        if let Some(flip) = flip {
            o.flips.push(FlipRecord {
                at_ms: self.now,
                cluster: flip.cluster,
                to: flip.to,
                gain: flip.gain,
                adopted: flip.adopted,
            });
            // The learner's table is valid: it is the loaded one with a bit changed.
            if let Ok(t) = CompiledTable::compile(o.learner.table().clone()) {
                self.table = Some(t);
            }
        }
    }

    fn handle(&mut self, action: Action) {
        let mut pending = std::mem::take(&mut self.pending);
        match action {
            Action::StepEnd { pool, worker } => {
                let w = match pool {
                    Pool::Prefill => &mut self.prefill[worker as usize],
                    Pool::Decode => &mut self.decode[worker as usize],
                };
                w.busy = false;
                w.apply(self.reqs, &mut pending);
                self.after(pool, worker, pending);
            }
            Action::KvArrived { worker, seq } => {
                self.decode[worker as usize].resume(seq, self.reqs, &mut pending);
                self.after(Pool::Decode, worker, pending);
            }
            Action::LoadReport => {
                self.pending = pending;
                self.load_report(self.now);
            }
        }
    }

    fn report(self) -> SimReport {
        let records = self
            .reqs
            .iter()
            .zip(&self.state)
            .map(|(r, st)| {
                let (ttft, tpot, e2e) = st.latencies(r.output_len);
                RequestRecord {
                    arrival_ms: st.sent_ms,
                    kind: r.kind,
                    decode_worker: st.decode,
                    prefill_worker: st.prefill,
                    features: st.features,
                    cluster: st.cluster,
                    decision: st.decision(),
                    path: match (st.remote, st.held) {
                        (false, _) => PrefillPath::Local,
                        (true, false) => PrefillPath::Remote,
                        (true, true) => PrefillPath::LocalHeld,
                    },
                    explored: st.explored,
                    output_tokens: r.output_len,
                    ttft_ms: ttft,
                    tpot_ms: tpot,
                    e2e_ms: e2e,
                    met: r.slo.met_e2e(e2e, r.output_len),
                    met_each: r.slo.met_each(ttft, tpot),
                }
            })
            .collect();
        let mut report = SimReport::from_records(records, self.now, self.events.pushed());
        report.online = self.online.map(|o| OnlineRun {
            table: o.learner.table().clone(),
            flips: o.flips,
            explored: o.explored,
        });
        report
    }
}

/// Per request, how many of its leading block hashes another request of `reqs` also has. The
/// hashes are chained, so a prompt shares a prefix or nothing: sorted by their hashes, each
/// request's longest common prefix with any other is the longer of its neighbours'.
pub(crate) fn shared_prefixes(reqs: &[SimRequest]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..reqs.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| reqs[a as usize].hashes.cmp(&reqs[b as usize].hashes));
    let lcp = |a: u32, b: u32| {
        let (a, b) = (&reqs[a as usize].hashes, &reqs[b as usize].hashes);
        a.iter().zip(b).take_while(|(x, y)| x == y).count() as u32
    };
    let mut shared = vec![0; reqs.len()];
    for pair in order.windows(2) {
        let n = lcp(pair[0], pair[1]);
        for &r in pair {
            shared[r as usize] = shared[r as usize].max(n);
        }
    }
    shared
}

/// For every worker of a pool, how many leading `hashes` it caches, into `out[slot]`: what the
/// pool's index answers when every cache event has reached it. The lines of the first and the
/// last hash are fetched for every worker at once, so their misses overlap.
fn lookup_pools(workers: &mut [Worker], hashes: &[u64], out: &mut Vec<u32>) {
    out.clear();
    if hashes.is_empty() {
        out.resize(workers.len(), 0);
        return;
    }
    for w in workers.iter() {
        w.touch_cached(hashes);
    }
    out.extend(workers.iter_mut().map(|w| w.cached_prefix(hashes)));
}
