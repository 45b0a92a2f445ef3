//! Transfers that fail: each side gets a clear error and the receiver keeps serving.

mod common;

use std::time::Duration;

use common::{blocks, cfg, collect, corrupting_proxy, raw_client, read_frame, receiver};
use dolphin_kv_transfer::frame::{
    AckCode, Frame, FrameError, HEADER_LEN, PREFACE_LEN, Preface, TRAILER_INDEX, block_checksum,
    end_frame,
};
use dolphin_kv_transfer::{KvBlock, KvReceiver, KvSender, TransferConfig, TransferError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A transfer that must succeed, proving the receiver still serves.
async fn assert_serves(rx: &KvReceiver, tx: &KvSender, id: u64) {
    let sent = blocks(id, 7);
    let mut slot = rx.expect(id, 7);
    let consumer = tokio::spawn(async move { collect(&mut slot).await });
    tx.send(&rx.local_addr().to_string(), id, &sent)
        .await
        .expect("healthy transfer");
    assert_eq!(consumer.await.expect("consumer").expect("transfer"), sent);
}

#[tokio::test]
async fn corrupted_block_fails_both_sides_and_the_connection_survives() {
    let rx = receiver(cfg()).await;
    let sent = blocks(3, 5); // lengths 0, 1, 4096, 100003, 1 MiB
    // Flip a byte inside block 2's payload: after the preface, begin frame, three headers and
    // the payloads of blocks 0 and 1.
    let offset = (PREFACE_LEN + 4 * HEADER_LEN + 1 + 1000) as u64;
    let proxy = corrupting_proxy(rx.local_addr(), offset).await;
    let target = proxy.to_string();
    let tx = KvSender::new(cfg());

    let mut slot = rx.expect(3, 5);
    let consumer = tokio::spawn(async move { collect(&mut slot).await });
    let err = tx
        .send(&target, 3, &sent)
        .await
        .expect_err("corrupted transfer");
    assert!(
        matches!(
            err,
            TransferError::Refused {
                id: 3,
                code: AckCode::ChecksumMismatch,
                index: 2
            }
        ),
        "{err:?}"
    );
    let slot_err = consumer.await.expect("consumer").expect_err("slot error");
    assert!(
        matches!(
            slot_err,
            TransferError::ChecksumMismatch { id: 3, index: 2 }
        ),
        "{slot_err:?}"
    );

    // The refused transfer left the pooled connection (through the proxy) usable.
    assert_eq!(tx.idle_connections(&target), 1);
    let sent = blocks(4, 5);
    let mut slot = rx.expect(4, 5);
    let consumer = tokio::spawn(async move { collect(&mut slot).await });
    tx.send(&target, 4, &sent)
        .await
        .expect("transfer after corruption");
    assert_eq!(consumer.await.expect("consumer").expect("transfer"), sent);
    assert_serves(&rx, &KvSender::new(cfg()), 5).await;
}

#[tokio::test]
async fn raw_corrupt_frame_is_answered_with_checksum_mismatch() {
    let rx = receiver(cfg()).await;
    let mut slot = rx.expect(9, 1);
    let mut s = raw_client(rx.local_addr()).await;
    let payload = b"kv bytes";
    let bad = block_checksum(9, 0, payload) ^ 1;
    s.write_all(&Frame::Begin { id: 9, n_blocks: 1 }.encode())
        .await
        .unwrap();
    s.write_all(
        &Frame::Block {
            id: 9,
            index: 0,
            len: 8,
            checksum: bad,
        }
        .encode(),
    )
    .await
    .unwrap();
    s.write_all(payload).await.unwrap();
    s.write_all(&end_frame(9, 1, &[]).encode()).await.unwrap();
    assert_eq!(
        read_frame(&mut s).await,
        Frame::Ack {
            id: 9,
            code: AckCode::ChecksumMismatch,
            index: 0
        }
    );
    assert!(matches!(
        slot.recv().await,
        Some(Err(TransferError::ChecksumMismatch { id: 9, index: 0 }))
    ));
    assert_serves(&rx, &KvSender::new(cfg()), 10).await;
}

#[tokio::test]
async fn corrupt_trailer_fails_the_slot_and_the_connection_survives() {
    let rx = receiver(cfg()).await;
    let mut slot = rx.expect(11, 1);
    let mut s = raw_client(rx.local_addr()).await;
    let payload = b"kv bytes";
    s.write_all(
        &Frame::Begin {
            id: 11,
            n_blocks: 1,
        }
        .encode(),
    )
    .await
    .unwrap();
    let block = Frame::Block {
        id: 11,
        index: 0,
        len: 8,
        checksum: block_checksum(11, 0, payload),
    };
    s.write_all(&block.encode()).await.unwrap();
    s.write_all(payload).await.unwrap();
    let Frame::End {
        len, checksum: sum, ..
    } = end_frame(11, 1, b"result")
    else {
        unreachable!()
    };
    let bad = Frame::End {
        id: 11,
        n_blocks: 1,
        len,
        checksum: sum ^ 1,
    };
    s.write_all(&bad.encode()).await.unwrap();
    s.write_all(b"result").await.unwrap();
    assert_eq!(
        read_frame(&mut s).await,
        Frame::Ack {
            id: 11,
            code: AckCode::ChecksumMismatch,
            index: TRAILER_INDEX
        }
    );
    assert!(slot.recv().await.expect("the block").is_ok());
    assert!(matches!(
        slot.recv().await,
        Some(Err(TransferError::ChecksumMismatch {
            id: 11,
            index: TRAILER_INDEX
        }))
    ));
    assert!(slot.trailer().is_none());
    // Same connection, next transfer.
    let mut slot = rx.expect(12, 0);
    s.write_all(
        &Frame::Begin {
            id: 12,
            n_blocks: 0,
        }
        .encode(),
    )
    .await
    .unwrap();
    s.write_all(&end_frame(12, 0, b"ok").encode())
        .await
        .unwrap();
    s.write_all(b"ok").await.unwrap();
    assert_eq!(
        read_frame(&mut s).await,
        Frame::Ack {
            id: 12,
            code: AckCode::Ok,
            index: 0
        }
    );
    assert!(slot.recv().await.is_none());
    assert_eq!(slot.trailer().map(|t| &t[..]), Some(&b"ok"[..]));
}

#[tokio::test]
async fn unknown_transfer_is_drained_and_refused() {
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(cfg());
    let err = tx
        .send(&target, 99, &blocks(99, 12))
        .await
        .expect_err("unknown id");
    assert!(
        matches!(
            err,
            TransferError::Refused {
                id: 99,
                code: AckCode::UnknownTransfer,
                ..
            }
        ),
        "{err:?}"
    );
    // Drained: the same connection carries the next transfer.
    assert_eq!(tx.idle_connections(&target), 1);
    assert_serves(&rx, &tx, 1).await;
    assert_eq!(tx.idle_connections(&target), 1);
}

#[tokio::test]
async fn transfer_ids_are_delivered_once() {
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(cfg());
    assert_serves(&rx, &tx, 1).await;
    let err = tx
        .send(&target, 1, &blocks(1, 7))
        .await
        .expect_err("replayed id");
    assert!(matches!(
        err,
        TransferError::Refused {
            code: AckCode::UnknownTransfer,
            ..
        }
    ));
}

#[tokio::test]
async fn dropping_the_slot_mid_transfer_rejects_it() {
    let small = TransferConfig {
        channel_blocks: 1,
        ..cfg()
    };
    let rx = receiver(small.clone()).await;
    let target = rx.local_addr().to_string();
    let tx = KvSender::new(small);
    let mut slot = rx.expect(2, 40);
    let send = tokio::spawn({
        let tx = tx.clone();
        let target = target.clone();
        async move { tx.send(&target, 2, &blocks(2, 40)).await }
    });
    slot.recv().await.expect("a block").expect("intact");
    drop(slot);
    let err = send.await.expect("task").expect_err("rejected");
    assert!(
        matches!(
            err,
            TransferError::Refused {
                id: 2,
                code: AckCode::Rejected,
                ..
            }
        ),
        "{err:?}"
    );
    assert_serves(&rx, &tx, 3).await;
}

#[tokio::test]
async fn dropping_the_slot_before_the_transfer_rejects_it() {
    let rx = receiver(cfg()).await;
    drop(rx.expect(4, 2));
    let tx = KvSender::new(cfg());
    let err = tx
        .send(&rx.local_addr().to_string(), 4, &blocks(4, 2))
        .await
        .expect_err("rejected");
    assert!(
        matches!(
            err,
            TransferError::Refused {
                code: AckCode::Rejected,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn wrong_block_count_fails_both_sides() {
    let rx = receiver(cfg()).await;
    let mut slot = rx.expect(6, 3);
    let tx = KvSender::new(cfg());
    let err = tx
        .send(&rx.local_addr().to_string(), 6, &blocks(6, 2))
        .await
        .expect_err("count mismatch");
    assert!(
        matches!(
            err,
            TransferError::Refused {
                code: AckCode::Rejected,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(matches!(
        slot.recv().await,
        Some(Err(TransferError::BlockCountMismatch {
            expected: 3,
            announced: 2,
            ..
        }))
    ));
}

#[tokio::test]
async fn dead_address_fails_fast_with_a_connect_error() {
    // A port that was just free: nothing listens there.
    let listener = tokio::net::TcpListener::bind(common::localhost())
        .await
        .unwrap();
    let target = listener.local_addr().unwrap().to_string();
    drop(listener);
    // An hour-long timeout: the test finishing at all shows the failure does not wait for it.
    let tx = KvSender::new(TransferConfig {
        io_timeout: Duration::from_secs(3600),
        ..cfg()
    });
    let err = tx
        .send(&target, 1, &blocks(1, 2))
        .await
        .expect_err("dead address");
    assert!(
        matches!(&err, TransferError::Connect { target: t, .. } if *t == target),
        "{err:?}"
    );
    let chain = format!("{err}: {}", std::error::Error::source(&err).expect("cause"));
    assert!(
        chain.contains(&target) && chain.to_lowercase().contains("refused"),
        "{chain}"
    );
}

#[tokio::test]
async fn oversized_frame_is_refused_before_allocation() {
    let rx = receiver(cfg()).await; // 1 MiB limit
    let mut slot = rx.expect(8, 1);
    let mut s = raw_client(rx.local_addr()).await;
    s.write_all(&Frame::Begin { id: 8, n_blocks: 1 }.encode())
        .await
        .unwrap();
    // Announces 4 GiB and sends none of it.
    let huge = Frame::Block {
        id: 8,
        index: 0,
        len: u32::MAX,
        checksum: 0,
    };
    s.write_all(&huge.encode()).await.unwrap();
    assert_eq!(
        read_frame(&mut s).await,
        Frame::Ack {
            id: 8,
            code: AckCode::FrameTooLarge,
            index: 0
        }
    );
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.expect("closed cleanly");
    assert!(rest.is_empty());
    let slot_err = slot
        .recv()
        .await
        .expect("an outcome")
        .expect_err("too large");
    assert!(
        matches!(
            slot_err,
            TransferError::Frame(FrameError::TooLarge { len: u32::MAX, .. })
        ),
        "{slot_err:?}"
    );
    assert_serves(&rx, &KvSender::new(cfg()), 9).await;
}

#[tokio::test]
async fn sender_refuses_oversized_blocks_locally() {
    let tx = KvSender::new(cfg());
    let big = vec![
        KvBlock::from(Vec::new()),
        KvBlock::from(vec![0u8; (1 << 20) + 1]),
    ];
    // Nothing listens on port 9 of this address; the check comes before connecting.
    let err = tx
        .send("127.0.0.1:9", 1, &big)
        .await
        .expect_err("too large");
    assert!(
        matches!(err, TransferError::BlockTooLarge { index: 1, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn version_mismatch_is_reported_both_ways() {
    let rx = receiver(cfg()).await;
    let mut s = tokio::net::TcpStream::connect(rx.local_addr())
        .await
        .unwrap();
    s.write_all(&Preface { version: 99 }.encode())
        .await
        .unwrap();
    let mut p = [0u8; PREFACE_LEN];
    s.read_exact(&mut p).await.unwrap();
    assert_eq!(Preface::decode(&p), Ok(Preface::CURRENT));
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.expect("closed");
    assert!(rest.is_empty());

    // A fake receiver of the previous version (no trailers): the sender says so.
    let fake = tokio::net::TcpListener::bind(common::localhost())
        .await
        .unwrap();
    let addr = fake.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut c, _) = fake.accept().await.unwrap();
        let mut p = [0u8; PREFACE_LEN];
        c.read_exact(&mut p).await.unwrap();
        c.write_all(&Preface { version: 1 }.encode()).await.unwrap();
        let _ = c.read_to_end(&mut Vec::new()).await;
    });
    let err = KvSender::new(cfg())
        .send(&addr.to_string(), 1, &blocks(1, 1))
        .await
        .expect_err("version mismatch");
    assert!(
        matches!(err, TransferError::VersionMismatch { ours: 2, theirs: 1 }),
        "{err:?}"
    );
}

#[tokio::test]
async fn out_of_order_block_closes_the_connection_with_malformed() {
    let rx = receiver(cfg()).await;
    let mut slot = rx.expect(5, 2);
    let mut s = raw_client(rx.local_addr()).await;
    s.write_all(&Frame::Begin { id: 5, n_blocks: 2 }.encode())
        .await
        .unwrap();
    s.write_all(
        &Frame::Block {
            id: 5,
            index: 1,
            len: 0,
            checksum: block_checksum(5, 1, &[]),
        }
        .encode(),
    )
    .await
    .unwrap();
    assert_eq!(
        read_frame(&mut s).await,
        Frame::Ack {
            id: 5,
            code: AckCode::Malformed,
            index: 0
        }
    );
    assert!(matches!(
        slot.recv().await,
        Some(Err(TransferError::UnexpectedFrame { id: 5, .. }))
    ));
    assert_serves(&rx, &KvSender::new(cfg()), 6).await;
}
