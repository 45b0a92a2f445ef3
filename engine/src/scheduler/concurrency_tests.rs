//! The scheduler while a step computes: a backend whose step waits at a gate the test holds
//! shut, so the step is "running" for as long as the test needs. The scheduler runs on its own
//! thread (spawned outside any runtime), as the candle engine's does.
//!
//! Nothing here asserts on wall time. Calls that would wait for the step (the bug this guards
//! against) would wait forever with the gate shut, so a watchdog opens the gate after a long
//! while; the test then fails on the order of events instead of hanging.
//!
//! The backend (`gated.rs`) checks every sequence's KV before each step, so KV overwritten by
//! someone else fails the sequence that owns it.

use std::sync::Arc;
use std::time::Duration;

use super::gated::{BS, Event, Gate, Gated, Slots, engine, watchdog};
use super::*;
use crate::types::{FinishReason, KvEvent, Sampling, SeqOutput};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

fn req(id: &str, prompt: Vec<u32>, max_tokens: u32) -> SeqRequest {
    SeqRequest {
        request_id: id.into(),
        prompt,
        sampling: Sampling {
            max_tokens,
            ..Sampling::default()
        },
    }
}

fn prompt(len: u32, salt: u32) -> Vec<u32> {
    (0..len).map(|i| 10 + (i * 7 + salt) % 80).collect()
}

/// Imports a reservation's blocks with their true content.
fn import_all(engine: &Scheduler<Gated>, r: &Reservation, prompt: &[u32]) {
    for i in 0..r.blocks_expected {
        let start = ((r.cached_blocks + i) * BS) as usize;
        let end = (start + BS as usize).min(prompt.len());
        engine
            .import(r.seq, i, &Slots::bytes(&prompt[start..end]))
            .expect("import");
    }
}

async fn collect(mut rx: OutputStream) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    while let Some(out) = rx.recv().await {
        match out {
            SeqOutput::Token(t) => tokens.push(t.id),
            SeqOutput::Finished { reason, .. } => return (tokens, reason),
            SeqOutput::Error(e) => panic!("stream failed after {tokens:?}: {e}"),
        }
    }
    panic!("stream ended without Finished after {tokens:?}");
}

/// Polls `cond` on the engine's load until it holds (the loop applies a step soon after the
/// backend returns); bounded so a bug fails instead of spinning forever.
fn until(engine: &Scheduler<Gated>, cond: impl Fn(&LoadSnapshot) -> bool) {
    for _ in 0..10_000 {
        if cond(&engine.load()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("condition never held: {:?}", engine.load());
}

fn position(events: &[Event], event: &Event) -> usize {
    events
        .iter()
        .position(|e| e == event)
        .unwrap_or_else(|| panic!("no {event:?} in {events:?}"))
}

#[test]
fn calls_proceed_while_a_step_computes() {
    let gate = Arc::new(Gate::default());
    let engine = engine(16, &gate);
    let rt = runtime();
    gate.shut();
    let done = watchdog(&gate);
    let (pa, pc) = (prompt(8, 1), prompt(8, 2));
    let (a, c_stream) = rt.block_on(async {
        let a = engine.generate(req("a", pa, 4)).await.expect("admitted");
        gate.wait_entered(1); // a's prefill is computing, held at the gate

        // Every kind of call returns while that step computes.
        let load = engine.load();
        gate.assert_held("load");
        assert_eq!((load.running, load.free_blocks), (1, 13), "{load:?}");
        let b = engine
            .generate(req("b", prompt(4, 3), 2))
            .await
            .expect("ok");
        gate.assert_held("generate");
        engine.cancel("b");
        gate.assert_held("cancel");
        let (snapshot, _events) = engine.subscribe();
        gate.assert_held("subscribe");
        // a's prompt blocks were cached when its step was scheduled (vLLM's way: a prompt
        // scheduled after them shares them), before their KV exists.
        assert!(
            matches!(snapshot.as_slice(), [KvEvent::Stored { parent: None, hashes }] if hashes.len() == 2),
            "a's two prompt blocks: {snapshot:?}"
        );
        let r = engine.reserve(req("c", pc.clone(), 2)).await.expect("room");
        gate.assert_held("reserve");
        assert_eq!((r.cached_blocks, r.blocks_expected), (0, 2));
        // Its blocks are written while a's step runs: theirs are disjoint.
        import_all(&engine, &r, &pc);
        gate.assert_held("import");
        let c_stream = engine.resume(r.seq, 50.into()).await.expect("resumed");
        gate.assert_held("resume");
        gate.record(Event::Test("calls returned"));
        let _ = done.send(());

        let (tokens, reason) = collect(b).await;
        assert_eq!((tokens.len(), reason), (0, FinishReason::Cancelled));
        (a, c_stream)
    });
    gate.open();
    rt.block_on(async {
        let (ta, ra) = collect(a).await;
        assert_eq!((ta, ra), (vec![11, 12, 13, 14], FinishReason::Length));
        // c decodes over the KV imported during a's step: intact (the step checks it).
        let (tc, rc) = collect(c_stream).await;
        assert_eq!((tc, rc), (vec![50, 12], FinishReason::Length));
    });
    let events = gate.events();
    assert!(
        position(&events, &Event::Test("calls returned"))
            < position(&events, &Event::StepReturned(1)),
        "calls waited for the step: {events:?}"
    );
    until(&engine, |l| l.free_blocks == 16 && l.running == 0);
}

#[test]
fn a_sequence_cancelled_mid_step_keeps_its_blocks_until_the_step_returns() {
    // Six blocks: a holds four, so b (five) fits only once a's are back.
    let gate = Arc::new(Gate::default());
    let engine = engine(6, &gate);
    let rt = runtime();
    gate.shut();
    let done = watchdog(&gate);
    let pb = prompt(16, 5);
    let (a, b_reservation) = rt.block_on(async {
        let a = engine
            .generate(req("a", prompt(16, 4), 1))
            .await
            .expect("ok");
        gate.wait_entered(1);
        assert_eq!(engine.load().free_blocks, 2);
        engine.cancel("a");
        gate.assert_held("cancel");
        let load = engine.load();
        assert_eq!(
            (load.running, load.free_blocks),
            (0, 2),
            "a's blocks stay held while its step runs: {load:?}"
        );
        // b queues: a's blocks are not free yet.
        let mut reserve = Box::pin(engine.reserve(req("b", pb.clone(), 2)));
        tokio::select! {
            biased;
            r = &mut reserve => panic!("b admitted onto a's blocks mid-step: {:?}", r.map(|r| r.seq)),
            () = std::future::ready(()) => {}
        }
        assert_eq!(engine.load().waiting, 1);
        gate.assert_held("reserve");
        gate.record(Event::Test("b waits"));
        let _ = done.send(());
        (a, reserve)
    });
    gate.open();
    rt.block_on(async {
        let (tokens, reason) = collect(a).await;
        assert_eq!((tokens.len(), reason), (0, FinishReason::Cancelled));
        let r = b_reservation
            .await
            .expect("admitted once a's step returned");
        gate.record(Event::Test("b admitted"));
        import_all(&engine, &r, &pb);
        let (tb, rb) = collect(engine.resume(r.seq, 60.into()).await.expect("resumed")).await;
        // b's decode step checked its 16 prompt slots: a's late writes did not land in them.
        assert_eq!((tb, rb), (vec![60, 20], FinishReason::Length));
    });
    let events = gate.events();
    let returned = position(&events, &Event::StepReturned(1));
    assert!(
        position(&events, &Event::Test("b waits")) < returned,
        "{events:?}"
    );
    assert!(
        returned < position(&events, &Event::Test("b admitted")),
        "{events:?}"
    );
    until(&engine, |l| l.free_blocks == 6 && l.running == 0);
}
