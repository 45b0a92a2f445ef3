//! Transfers whose blocks are produced while they are sent (`KvSender::send_stream`): a
//! prefill worker pushes each chunk's KV as soon as it exists.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{blocks, cfg, collect, collect_after, ready, receiver};
use dolphin_kv_transfer::{KvBlock, KvSender, TransferError};
use tokio::sync::{mpsc, oneshot};

#[tokio::test]
async fn blocks_go_out_as_they_are_produced() {
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(cfg());
    let sent = blocks(1, 12);
    let mut slot = rx.expect(1, 12);
    let (feed, source) = mpsc::unbounded_channel();
    let (result, trailer) = oneshot::channel();
    let send = tokio::spawn({
        let tx = tx.clone();
        let target = target.clone();
        async move { tx.send_stream(&target, 1, 12, source, trailer).await }
    });
    // The first chunk's blocks reach the receiver before the second chunk exists.
    for b in &sent[..5] {
        feed.send(b.clone()).expect("sender alive");
    }
    let mut got = Vec::new();
    for i in 0..5 {
        let (index, b) = slot.recv().await.expect("a block").expect("intact");
        assert_eq!((index, &b), (i, sent[i as usize].bytes()));
        got.push(KvBlock::new(b));
    }
    for b in &sent[5..] {
        tokio::time::sleep(Duration::from_millis(2)).await;
        feed.send(b.clone()).expect("sender alive");
    }
    // Every block is out, but the transfer is not complete before its result is.
    for i in 5..12 {
        let (index, b) = slot.recv().await.expect("a block").expect("intact");
        assert_eq!((index, &b), (i, sent[i as usize].bytes()));
        got.push(KvBlock::new(b));
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(50), slot.recv())
            .await
            .is_err(),
        "the end frame waits for the trailer"
    );
    result
        .send(Bytes::from_static(b"first token 42"))
        .expect("sender alive");
    let all = collect_after(&mut slot, got).await.expect("transfer");
    assert_eq!(all, sent);
    assert_eq!(slot.trailer().map(|t| &t[..]), Some(&b"first token 42"[..]));
    let stats = send.await.expect("task").expect("acked");
    assert_eq!(stats.blocks, 12);
    assert_eq!(
        stats.bytes,
        sent.iter().map(|b| b.len() as u64).sum::<u64>()
    );
    // The connection went back to the pool and carries the next transfer.
    assert_eq!(tx.idle_connections(&target), 1);
    let mut slot = rx.expect(2, 3);
    let (feed, source) = mpsc::unbounded_channel();
    for b in blocks(2, 3) {
        feed.send(b).expect("open");
    }
    // The trailer is there with the last block: one write carries both.
    tx.send_stream(&target, 2, 3, source, ready(b"second"))
        .await
        .expect("second");
    assert_eq!(collect(&mut slot).await.expect("second"), blocks(2, 3));
    assert_eq!(slot.trailer().map(|t| &t[..]), Some(&b"second"[..]));
}

#[tokio::test]
async fn a_source_that_ends_early_breaks_the_transfer_on_both_sides() {
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(cfg());
    let mut slot = rx.expect(7, 6);
    let (feed, source) = mpsc::unbounded_channel();
    for b in &blocks(7, 6)[..2] {
        feed.send(b.clone()).expect("open");
    }
    drop(feed); // the prefill failed after two blocks
    let err = tx
        .send_stream(&target, 7, 6, source, ready(b"unused"))
        .await
        .expect_err("short source");
    assert!(
        matches!(
            err,
            TransferError::SourceEnded {
                id: 7,
                sent: 2,
                expected: 6
            }
        ),
        "{err:?}"
    );
    assert!(
        collect(&mut slot).await.is_err(),
        "the receiver must not see a complete transfer"
    );
    assert_eq!(
        tx.idle_connections(&target),
        0,
        "a broken link is not pooled"
    );
    // The receiver keeps serving.
    let mut slot = rx.expect(8, 2);
    tx.send(&target, 8, &blocks(8, 2)).await.expect("next");
    assert_eq!(collect(&mut slot).await.expect("next"), blocks(8, 2));
}

#[tokio::test]
async fn a_result_that_never_comes_breaks_the_transfer_on_both_sides() {
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(cfg());
    let mut slot = rx.expect(3, 2);
    let (feed, source) = mpsc::unbounded_channel();
    let (result, trailer) = oneshot::channel::<Bytes>();
    let all = blocks(3, 2);
    feed.send(all[0].clone()).expect("open");
    let send = tokio::spawn({
        let tx = tx.clone();
        let target = target.clone();
        async move { tx.send_stream(&target, 3, 2, source, trailer).await }
    });
    assert!(slot.recv().await.expect("block 0").is_ok());
    // Every block computed, then the prefill failed before its first token.
    drop(result);
    feed.send(all[1].clone()).expect("open");
    let err = send.await.expect("task").expect_err("no result");
    assert!(
        matches!(
            err,
            TransferError::SourceEnded {
                id: 3,
                sent: 2,
                expected: 2
            }
        ),
        "{err:?}"
    );
    assert!(
        collect(&mut slot).await.is_err(),
        "the receiver must not see a complete transfer"
    );
    assert!(slot.trailer().is_none());
    assert_eq!(tx.idle_connections(&target), 0);
}
