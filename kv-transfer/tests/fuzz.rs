//! Arbitrary bytes on the KV receiver's socket, the decoder that faces the network: with or
//! without a valid preface, as raw bytes or as frame headers with arbitrary fields (so they
//! get past the header check into the transfer logic). The receiver never panics, answers or
//! closes, and a member's transfer still succeeds afterwards. A property test in place of
//! `cargo fuzz` (which needs a nightly toolchain): a fixed number of cases runs in CI.

mod common;

use std::time::Duration;

use common::{blocks, cfg, collect, receiver};
use dolphin_kv_transfer::KvSender;
use dolphin_kv_transfer::frame::{AckCode, Frame, Preface, end_frame};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One piece of what the attacker writes.
#[derive(Clone, Debug)]
enum Piece {
    Raw(Vec<u8>),
    Frame(Frame),
}

fn piece() -> impl Strategy<Value = Piece> {
    let code = prop_oneof![
        Just(AckCode::Ok),
        Just(AckCode::Rejected),
        Just(AckCode::Malformed),
    ];
    // Ids near the one the receiver expects, so some frames hit a live slot.
    let id = prop_oneof![0u64..4, any::<u64>()];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Piece::Raw),
        (id.clone(), 0u32..8)
            .prop_map(|(id, n_blocks)| Piece::Frame(Frame::Begin { id, n_blocks })),
        (id.clone(), 0u32..8, 0u32..4096, any::<u32>()).prop_map(|(id, index, len, checksum)| {
            Piece::Frame(Frame::Block {
                id,
                index,
                len,
                checksum,
            })
        }),
        (
            id.clone(),
            0u32..8,
            proptest::collection::vec(any::<u8>(), 0..32)
        )
            .prop_map(|(id, n, t)| Piece::Frame(end_frame(id, n, &t))),
        (id, code, any::<u32>()).prop_map(|(id, code, index)| Piece::Frame(Frame::Ack {
            id,
            code,
            index
        })),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_break_the_receiver(
        preface in any::<bool>(),
        pieces in proptest::collection::vec(piece(), 0..12),
    ) {
        runtime().block_on(async {
            let rx = receiver(cfg()).await;
            // A live slot for the attacker's ids to collide with.
            let victim = rx.expect(1, 2);
            let mut s = tokio::net::TcpStream::connect(rx.local_addr()).await.expect("connect");
            let mut bytes = Vec::new();
            if preface {
                bytes.extend_from_slice(&Preface::CURRENT.encode());
            }
            for p in pieces {
                match p {
                    Piece::Raw(b) => bytes.extend_from_slice(&b),
                    Piece::Frame(f) => bytes.extend_from_slice(&f.encode()),
                }
            }
            // The receiver may close early (that is an answer too): ignore write errors.
            let _ = s.write_all(&bytes).await;
            let _ = s.shutdown().await;
            let mut answer = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
            assert!(read.is_ok(), "the receiver neither answered nor closed");
            drop(victim);
            // A member's transfer still goes through.
            let sent = blocks(7, 3);
            let mut slot = rx.expect(7, 3);
            let consumer = tokio::spawn(async move { collect(&mut slot).await });
            KvSender::new(cfg())
                .send(&rx.local_addr().to_string(), 7, &sent)
                .await
                .expect("healthy transfer after the garbage");
            assert_eq!(consumer.await.expect("consumer").expect("transfer"), sent);
        });
    }
}
