//! The KV transport over mutual TLS: members transfer, everyone else is refused, and pooled
//! connections are reused as they are in plaintext.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use common::{blocks, cfg, collect, localhost, ready};
use dolphin_kv_transfer::{KvReceiver, KvSender, TransferError};
use dolphin_tls::Tls;
use dolphin_tls::testing::TestPki;
use tokio::net::{TcpListener, TcpStream};

fn load(args: &dolphin_tls::TlsArgs) -> Tls {
    args.load().expect("load TLS files").expect("TLS on")
}

async fn tls_receiver(tls: &Tls) -> KvReceiver {
    KvReceiver::bind_with_tls(localhost(), cfg(), Some(tls))
        .await
        .expect("bind receiver")
}

fn sender(tls: &Tls) -> KvSender {
    KvSender::with_tls(cfg(), Some(tls)).expect("TLS sender")
}

/// Sends transfer `id` of a few blocks and checks what arrived.
async fn transfer(
    rx: &KvReceiver,
    tx: &KvSender,
    target: &str,
    id: u64,
) -> Result<(), TransferError> {
    let sent = blocks(id, 7);
    let mut slot = rx.expect(id, 7);
    let consumer = tokio::spawn(async move { collect(&mut slot).await });
    let result = tx.send(target, id, &sent).await;
    match &result {
        Ok(_) => assert_eq!(consumer.await.expect("consumer").expect("transfer"), sent),
        Err(_) => consumer.abort(),
    }
    result.map(drop)
}

/// A TCP proxy to `upstream` that counts the connections it carries (TLS passes through).
async fn counting_proxy(upstream: std::net::SocketAddr) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(localhost()).await.expect("bind proxy");
    let addr = listener.local_addr().expect("address").to_string();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut server = TcpStream::connect(upstream).await.expect("upstream");
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    (addr, count)
}

#[tokio::test]
async fn members_transfer_over_mutual_tls_on_one_pooled_connection() {
    let pki = TestPki::new();
    let rx = tls_receiver(&load(&pki.member("decode"))).await;
    let (target, connections) = counting_proxy(rx.local_addr()).await;
    let tx = sender(&load(&pki.member("prefill")));
    for id in 0..4 {
        transfer(&rx, &tx, &target, id)
            .await
            .expect("transfer over TLS");
    }
    assert_eq!(tx.idle_connections(&target), 1);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "the pooled TLS connection is reused, not mistaken for a closed one"
    );

    // Streamed, the result in the end frame, over the same connection.
    let sent = blocks(9, 3);
    let mut slot = rx.expect(9, 3);
    let (block_tx, block_rx) = tokio::sync::mpsc::unbounded_channel();
    for b in &sent {
        block_tx.send(b.clone()).expect("open");
    }
    let consumer = tokio::spawn(async move {
        let got = collect(&mut slot).await;
        (got, slot.trailer().cloned())
    });
    tx.send_stream(&target, 9, 3, block_rx, ready(b"result"))
        .await
        .expect("streamed over TLS");
    let (got, trailer) = consumer.await.expect("consumer");
    assert_eq!(got.expect("blocks"), sent);
    assert_eq!(trailer, Some(Bytes::from_static(b"result")));
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn strangers_are_refused_and_members_still_get_in() {
    let pki = TestPki::new();
    let rx = tls_receiver(&load(&pki.member("decode"))).await;
    let target = rx.local_addr().to_string();
    for (who, args) in [
        ("no certificate", pki.anonymous("anonymous")),
        ("another CA's certificate", pki.stranger("stranger")),
        ("an expired certificate", pki.expired("expired")),
    ] {
        let err = transfer(&rx, &sender(&load(&args)), &target, 1)
            .await
            .expect_err(who);
        assert!(
            matches!(
                err,
                TransferError::Io { .. }
                    | TransferError::Closed { .. }
                    | TransferError::Connect { .. }
            ),
            "{who}: {err:?}"
        );
    }
    // A plaintext sender speaks no TLS: refused in the handshake.
    let plain = KvSender::new(cfg());
    assert!(transfer(&rx, &plain, &target, 2).await.is_err());
    // The receiver still serves members.
    let member = sender(&load(&pki.member("prefill")));
    transfer(&rx, &member, &target, 3).await.expect("member");
}

#[tokio::test]
async fn a_tls_sender_does_not_talk_to_a_plaintext_receiver() {
    let pki = TestPki::new();
    let rx = KvReceiver::bind(localhost(), cfg()).await.expect("bind");
    let target = rx.local_addr().to_string();
    let tx = sender(&load(&pki.member("prefill")));
    assert!(transfer(&rx, &tx, &target, 1).await.is_err());
}

/// A transfer that fills the socket while the consumer is behind: TLS takes the last blocks
/// into its own buffer when the socket is full, and the sender must flush them before it
/// waits for the ack (without the flush it waited until the timeout).
#[tokio::test]
async fn a_transfer_held_back_by_a_slow_consumer_completes_over_tls() {
    let pki = TestPki::new();
    let cfg = dolphin_kv_transfer::TransferConfig {
        io_timeout: std::time::Duration::from_secs(10),
        ..cfg()
    };
    let rx = KvReceiver::bind_with_tls(localhost(), cfg.clone(), Some(&load(&pki.member("d"))))
        .await
        .expect("bind receiver");
    let tx = KvSender::with_tls(cfg, Some(&load(&pki.member("p")))).expect("TLS sender");
    let target = rx.local_addr().to_string();
    for id in 0..3 {
        let sent = blocks(id, 40);
        let mut slot = rx.expect(id, 40);
        let consumer = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(item) = slot.recv().await {
                let (_, b) = item.expect("intact");
                if got.len() % 10 == 9 {
                    // Behind: the channel fills, the receiver stops reading, the socket fills.
                    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
                }
                got.push(dolphin_kv_transfer::KvBlock::new(b));
            }
            got
        });
        let started = std::time::Instant::now();
        tx.send(&target, id, &sent)
            .await
            .expect("transfer over TLS");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(consumer.await.expect("consumer"), sent);
    }
}
