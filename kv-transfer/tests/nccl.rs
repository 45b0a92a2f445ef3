//! The NCCL transport (feature `nccl`). Moving blocks needs two CUDA devices (NCCL refuses two
//! ranks on one GPU) with libcuda and libnccl loadable; elsewhere that test says it skipped. The
//! rest runs everywhere.
#![cfg(feature = "nccl")]

mod common;

use common::{blocks, cfg, collect, ready, receiver};
use dolphin_kv_transfer::nccl::{NcclId, NcclSender, probe};
use dolphin_kv_transfer::{KvTransport, TransferError};
use tokio::sync::mpsc;

#[test]
fn without_nccl_everything_fails_cleanly_instead_of_panicking() {
    match probe() {
        Ok(devices) => assert!(devices >= 1),
        Err(e) => {
            assert!(
                matches!(e, TransferError::Nccl { op: "probe", .. }),
                "{e:?}"
            );
            let id = NcclId::generate().expect_err("no NCCL here");
            assert!(id.to_string().contains("probe"), "{id}");
        }
    }
}

#[test]
fn ids_travel_as_128_bytes() {
    let id = NcclId::from_bytes(&[7u8; 128]).expect("128 bytes");
    assert_eq!(id.as_bytes(), &[7u8; 128]);
    let short = NcclId::from_bytes(&[0u8; 12]).expect_err("too short");
    assert!(short.to_string().contains("12 bytes"), "{short}");
}

#[tokio::test]
async fn a_target_without_a_communicator_is_an_error_naming_it() {
    let sender = NcclSender::new();
    let (_feed, source) = mpsc::unbounded_channel();
    let err = sender
        .send_stream("10.0.0.9:7000", 1, 1, source, ready(b""))
        .await
        .expect_err("no link");
    assert!(err.to_string().contains("10.0.0.9:7000"), "{err}");
    assert_eq!(sender.kind(), "nccl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_cross_between_two_gpus() {
    let devices = match probe() {
        Ok(n) if n >= 2 => n,
        Ok(n) => {
            eprintln!("skipped: {n} CUDA device(s); NCCL needs two for two ranks");
            return;
        }
        Err(e) => {
            eprintln!("skipped: NCCL cannot run here: {e}");
            return;
        }
    };
    eprintln!("running on {devices} CUDA devices");
    let rx = receiver(cfg()).await;
    let target = rx.local_addr().to_string();
    let sender = NcclSender::new();
    let id = NcclId::generate().expect("unique id");
    let (joined_rx, joined_tx) =
        tokio::join!(rx.accept_nccl(id, 1), sender.connect(&target, id, 0));
    joined_rx.expect("rank 1 joined");
    joined_tx.expect("rank 0 joined");
    for transfer in 1..=3u64 {
        let sent = blocks(transfer, 9);
        let mut slot = rx.expect(transfer, 9);
        let (feed, source) = mpsc::unbounded_channel();
        for b in &sent {
            feed.send(b.clone()).expect("open");
        }
        let stats = sender
            .send_stream(&target, transfer, 9, source, ready(b"first token"))
            .await
            .expect("acked");
        assert_eq!(stats.blocks, 9);
        assert_eq!(collect(&mut slot).await.expect("transfer"), sent);
        assert_eq!(slot.trailer().map(|t| &t[..]), Some(&b"first token"[..]));
    }
    // A source that stops early fails both sides, and the communicator stays in step.
    let mut slot = rx.expect(9, 4);
    let (feed, source) = mpsc::unbounded_channel();
    feed.send(blocks(9, 4)[0].clone()).expect("open");
    drop(feed);
    let err = sender
        .send_stream(&target, 9, 4, source, ready(b""))
        .await
        .expect_err("short");
    assert!(
        matches!(err, TransferError::SourceEnded { sent: 1, .. }),
        "{err:?}"
    );
    assert!(collect(&mut slot).await.is_err());
    let mut slot = rx.expect(10, 2);
    let (feed, source) = mpsc::unbounded_channel();
    for b in blocks(10, 2) {
        feed.send(b).expect("open");
    }
    sender
        .send_stream(&target, 10, 2, source, ready(b""))
        .await
        .expect("after abort");
    assert_eq!(
        collect(&mut slot).await.expect("after abort"),
        blocks(10, 2)
    );
}
