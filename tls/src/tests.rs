//! Mutual TLS with certificates made here (rcgen): who gets in, who does not, and reloading.

use std::path::PathBuf;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::testing::{Ca, write_files as files};

fn tls(paths: &(PathBuf, PathBuf, PathBuf), identity: bool) -> Tls {
    let id = identity.then(|| (paths.0.clone(), paths.1.clone()));
    Tls::load(id, Some(paths.2.clone()), Some("dolphin.test".into())).expect("load")
}

/// A mutual-TLS echo server; returns its address.
async fn server(tls: &Tls) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = tls
        .server_config(ClientAuth::Required, &[])
        .expect("server config");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let config = config.clone();
            tokio::spawn(async move {
                if let Ok(mut s) = accept_tls(tcp, Some(config)).await {
                    let mut b = [0u8; 4];
                    if s.read_exact(&mut b).await.is_ok() {
                        let _ = s.write_all(&b).await;
                    }
                }
            });
        }
    });
    addr
}

/// Whether a client with `tls` completes a round trip with the server at `addr`.
async fn round_trip(tls: &Tls, addr: std::net::SocketAddr) -> bool {
    let config = tls.client_config(&[]).expect("client config");
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let Ok(mut s) = tls.connect(config, tcp, "127.0.0.1").await else {
        return false;
    };
    // With TLS 1.3 the server checks the client's certificate after the client considers the
    // handshake done: a refusal shows up on the first read.
    if s.write_all(b"ping").await.is_err() {
        return false;
    }
    let mut b = [0u8; 4];
    s.read_exact(&mut b).await.is_ok() && &b == b"ping"
}

#[tokio::test]
async fn mutual_tls_admits_members_and_refuses_the_rest() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = Ca::new("dolphin test CA");
    let other = Ca::new("another CA");
    let server_paths = files(
        dir.path(),
        "server",
        &ca.leaf(&["dolphin.test"], false),
        &ca.pem(),
    );
    let addr = server(&tls(&server_paths, true)).await;

    let member = files(
        dir.path(),
        "member",
        &ca.leaf(&["dolphin.test"], false),
        &ca.pem(),
    );
    assert!(
        round_trip(&tls(&member, true), addr).await,
        "a member gets in"
    );

    assert!(
        !round_trip(&tls(&member, false), addr).await,
        "a client without a certificate is refused"
    );
    let stranger = files(
        dir.path(),
        "stranger",
        &other.leaf(&["dolphin.test"], false),
        &ca.pem(),
    );
    assert!(
        !round_trip(&tls(&stranger, true), addr).await,
        "a certificate from another CA is refused"
    );
    let expired = files(
        dir.path(),
        "expired",
        &ca.leaf(&["dolphin.test"], true),
        &ca.pem(),
    );
    assert!(
        !round_trip(&tls(&expired, true), addr).await,
        "an expired certificate is refused"
    );
    // The client checks the server too: one that trusts only another CA refuses it.
    let wary = files(
        dir.path(),
        "wary",
        &ca.leaf(&["dolphin.test"], false),
        &other.pem(),
    );
    assert!(!round_trip(&tls(&wary, true), addr).await);
}

#[tokio::test]
async fn a_changed_certificate_is_used_by_new_handshakes() {
    let dir = tempfile::tempdir().expect("dir");
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let paths = files(
        dir.path(),
        "server",
        &old_ca.leaf(&["dolphin.test"], false),
        &old_ca.pem(),
    );
    let server_tls = tls(&paths, true);
    server_tls.watch(
        std::time::Duration::from_millis(50),
        tokio_util::sync::CancellationToken::new(),
    );
    let addr = server(&server_tls).await;
    let old_client = files(
        dir.path(),
        "old",
        &old_ca.leaf(&["dolphin.test"], false),
        &old_ca.pem(),
    );
    let new_client = files(
        dir.path(),
        "new",
        &new_ca.leaf(&["dolphin.test"], false),
        &new_ca.pem(),
    );
    assert!(round_trip(&tls(&old_client, true), addr).await);
    assert!(!round_trip(&tls(&new_client, true), addr).await);

    // Rotate the server to the new CA's certificate and trust: as a secret mount would.
    files(
        dir.path(),
        "server",
        &new_ca.leaf(&["dolphin.test"], false),
        &new_ca.pem(),
    );
    let mut rotated = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        if server_tls.reloads() > 0 {
            rotated = true;
            break;
        }
    }
    assert!(rotated, "the watcher never reloaded");
    assert!(
        round_trip(&tls(&new_client, true), addr).await,
        "new clients get in"
    );
    assert!(
        !round_trip(&tls(&old_client, true), addr).await,
        "old ones no longer do"
    );
}

#[test]
fn bad_files_are_refused_with_their_path() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = Ca::new("ca");
    let paths = files(
        dir.path(),
        "x",
        &ca.leaf(&["dolphin.test"], false),
        &ca.pem(),
    );
    std::fs::write(&paths.1, "not a key").expect("write");
    let err = Tls::load(Some((paths.0.clone(), paths.1.clone())), None, None).expect_err("bad key");
    assert!(err.to_string().contains("x.key"), "{err}");
    let missing = dir.path().join("missing.crt");
    let err = Tls::load(None, Some(missing), None).expect_err("missing CA");
    assert!(err.to_string().contains("missing.crt"), "{err}");
    // A key that belongs to another certificate.
    let other = ca.leaf(&["dolphin.test"], false);
    std::fs::write(&paths.1, &other.1).expect("write");
    assert!(Tls::load(Some((paths.0.clone(), paths.1.clone())), None, None).is_err());
}
