//! Transfers that succeed: content, order, pooling, concurrency and backpressure.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{block, blocks, cfg, collect, collect_after, receiver};
use dolphin_kv_transfer::{KvBlock, KvSender, TransferConfig};
use tokio::sync::Barrier;

#[tokio::test]
async fn many_blocks_arrive_intact_and_in_order() {
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(cfg());
    let sent = blocks(7, 257);
    let mut slot = rx.expect(7, 257);
    assert_eq!((slot.id(), slot.n_blocks()), (7, 257));
    let consumer = tokio::spawn(async move { collect(&mut slot).await });
    let stats = tx.send(&target, 7, &sent).await.expect("send");
    let got = consumer.await.expect("consumer").expect("transfer");
    assert_eq!(got, sent);
    assert_eq!(stats.blocks, 257);
    assert_eq!(
        stats.bytes,
        sent.iter().map(|b| b.len() as u64).sum::<u64>()
    );
}

#[tokio::test]
async fn empty_transfer_completes() {
    let rx = receiver(cfg()).await;
    let tx = KvSender::new(cfg());
    let mut slot = rx.expect(1, 0);
    tx.send(&rx.local_addr().to_string(), 1, &[])
        .await
        .expect("send");
    assert!(collect(&mut slot).await.expect("transfer").is_empty());
}

#[tokio::test]
async fn sequential_transfers_reuse_one_connection() {
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(cfg());
    for id in 0..5 {
        let sent = blocks(id, 6);
        let mut slot = rx.expect(id, 6);
        let consumer = tokio::spawn(async move { collect(&mut slot).await });
        tx.send(&target, id, &sent).await.expect("send");
        assert_eq!(consumer.await.expect("consumer").expect("transfer"), sent);
        assert_eq!(tx.idle_connections(&target), 1);
    }
}

#[tokio::test]
async fn concurrent_transfers_use_separate_connections() {
    const N: u64 = 6;
    // One block in flight per slot, and every consumer waits for all transfers to have started
    // before reading on: this only finishes if the transfers really run at the same time.
    let small = TransferConfig {
        channel_blocks: 1,
        ..cfg()
    };
    let rx = receiver(small.clone()).await;
    let target = rx.local_addr().to_string();
    let senders = [KvSender::new(small.clone()), KvSender::new(small)];
    let barrier = Arc::new(Barrier::new(N as usize));
    let mut tasks = Vec::new();
    for id in 0..N {
        let sent = blocks(100 + id, 40);
        let mut slot = rx.expect(100 + id, 40);
        let barrier = Arc::clone(&barrier);
        let consumer = tokio::spawn(async move {
            let first = slot.recv().await.expect("a block").expect("intact");
            barrier.wait().await;
            assert_eq!(first.0, 0);
            collect_after(&mut slot, vec![KvBlock::new(first.1)])
                .await
                .expect("transfer")
        });
        let tx = senders[id as usize % 2].clone();
        let target = target.clone();
        let producer = tokio::spawn(async move {
            tx.send(&target, 100 + id, &sent).await.expect("send");
            sent
        });
        tasks.push((producer, consumer));
    }
    let run = async {
        for (producer, consumer) in tasks {
            assert_eq!(
                consumer.await.expect("consumer"),
                producer.await.expect("producer")
            );
        }
    };
    // Only a deadlock guard (a transport that serialized transfers would hang here).
    tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("concurrent transfers deadlocked");
    for tx in &senders {
        assert!(tx.idle_connections(&target) >= 1);
    }
}

#[tokio::test]
async fn slow_consumer_holds_back_the_sender() {
    let small = TransferConfig {
        channel_blocks: 2,
        ..cfg()
    };
    let rx = receiver(small.clone()).await;
    let target = rx.local_addr().to_string();
    // 128 MiB: far more than the channel plus both sockets' buffers can hold.
    let sent: Vec<_> = (0..128).map(|i| block(5, i, 1 << 20)).collect();
    let mut slot = rx.expect(5, 128);
    let tx = KvSender::new(small);
    let send = tokio::spawn({
        let sent = sent.clone();
        async move { tx.send(&target, 5, &sent).await }
    });
    let first = slot.recv().await.expect("a block").expect("intact");
    assert_eq!(first, (0, sent[0].bytes().clone()));
    // Give an unbounded transport ample time to finish. The assertion cannot fail spuriously:
    // with backpressure the send cannot complete while the consumer does not read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !send.is_finished(),
        "send completed while the consumer was stalled"
    );
    let got = collect_after(&mut slot, vec![KvBlock::new(first.1)])
        .await
        .expect("transfer");
    assert_eq!(got, sent);
    send.await.expect("task").expect("send");
}

#[tokio::test]
async fn sender_reconnects_after_the_receiver_restarts() {
    let rx = receiver(cfg()).await;
    let addr = rx.local_addr();
    let target = addr.to_string();
    let tx = KvSender::new(cfg());
    let mut slot = rx.expect(1, 3);
    tx.send(&target, 1, &blocks(1, 3))
        .await
        .expect("first send");
    collect(&mut slot).await.expect("first transfer");
    assert_eq!(tx.idle_connections(&target), 1);
    drop(slot);
    rx.shutdown().await;
    // A new receiver on the same port: the pooled connection is dead.
    let rx = dolphin_kv_transfer::KvReceiver::bind(addr, cfg())
        .await
        .expect("rebind");
    let mut slot = rx.expect(2, 3);
    let sent = blocks(2, 3);
    let consumer = tokio::spawn(async move { collect(&mut slot).await });
    tx.send(&target, 2, &sent)
        .await
        .expect("send after restart");
    assert_eq!(consumer.await.expect("consumer").expect("transfer"), sent);
}

#[tokio::test]
async fn sender_replaces_connections_the_receiver_closed_when_idle() {
    let rx = receiver(TransferConfig {
        idle_timeout: Duration::from_millis(50),
        ..cfg()
    })
    .await;
    let target = rx.local_addr().to_string();
    // The sender believes connections stay open for minutes.
    let tx = KvSender::new(cfg());
    for id in 0..3 {
        let sent = blocks(id, 4);
        let mut slot = rx.expect(id, 4);
        let consumer = tokio::spawn(async move { collect(&mut slot).await });
        tx.send(&target, id, &sent).await.expect("send");
        assert_eq!(consumer.await.expect("consumer").expect("transfer"), sent);
        // Long enough for the receiver to close the pooled connection (or not: the send must
        // succeed either way).
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
