//! The cluster with TLS everywhere (real processes, a real etcd with client-certificate auth,
//! certificates from a CA made for the test): it serves over HTTPS and gRPC with TLS, a remote
//! prefill moves its KV over mutual TLS, and the workers refuse every client that is not a
//! member: no certificate, another CA's, an expired one, or no TLS at all.

use std::sync::Arc;
use std::time::Duration;

use dolphin_proto::v1::worker_client::WorkerClient;
use dolphin_proto::v1::{InfoRequest, PrefillMode};
use dolphin_tests::{ClusterConfig, TestCluster, grpc, http};
use dolphin_tls::TlsArgs;
use dolphin_tls::testing::TestPki;

const PROMPT: &str = "Dolphins sleep with one half of the brain at a time, so they can keep \
                      swimming and surface to breathe while they rest.";

fn load(args: &TlsArgs) -> dolphin_tls::Tls {
    args.load().expect("load TLS files").expect("TLS on")
}

/// Whether `Worker.Info` on `addr` answers a client with `tls` (plaintext without).
async fn info_answers(addr: &str, tls: Option<&dolphin_tls::Tls>) -> bool {
    let call = async {
        let channel = grpc::channel_with(addr, tls).await?;
        WorkerClient::new(channel).info(InfoRequest {}).await?;
        anyhow::Ok(())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(30), call).await,
        Ok(Ok(()))
    )
}

#[tokio::test]
async fn the_cluster_serves_with_mutual_tls_and_refuses_strangers() -> anyhow::Result<()> {
    let pki = Arc::new(TestPki::new());
    let cluster = TestCluster::start(ClusterConfig {
        etcd: true,
        time_scale: 0.5,
        tls: Some(pki.clone()),
        ..ClusterConfig::default()
    })
    .await?;

    // gRPC over TLS through the router; the remote path's KV crosses the KV listener's mTLS.
    let mut client = cluster.inference().await?;
    let remote = grpc::generate(
        &mut client,
        grpc::text_request(PROMPT, 16, PrefillMode::Remote),
    )
    .await?;
    let local = grpc::generate(
        &mut client,
        grpc::text_request(PROMPT, 16, PrefillMode::Local),
    )
    .await?;
    let routing = remote.last_routing.clone().expect("routing");
    assert_eq!(routing.mode, PrefillMode::Remote as i32, "{routing:?}");
    assert!(
        !routing.fell_back,
        "the remote prefill fell back: {routing:?}"
    );
    assert_eq!(remote.tokens.len(), 16);
    assert_eq!(remote.tokens, local.tokens, "the paths disagree");

    // The OpenAI API over HTTPS.
    let tls = cluster.client_tls().expect("client TLS");
    let body = r#"{"model":"sim-model","prompt":"hello dolphins","max_tokens":4}"#;
    let resp = http::post_json_tls(cluster.http_addr(), "/v1/completions", body, tls).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()?["usage"]["completion_tokens"], 4);
    // Plain HTTP to the TLS listener gets no answer.
    assert!(
        http::post_json(cluster.http_addr(), "/v1/completions", body)
            .await
            .is_err()
    );

    // The workers take only members.
    let decode = cluster.decode[0].grpc_addr();
    let prefill = cluster.prefill[0].grpc_addr();
    for addr in [decode, prefill] {
        assert!(info_answers(addr, Some(&load(&pki.member("test-member")))).await);
        assert!(!info_answers(addr, None).await, "{addr}: plaintext");
        for (who, args) in [
            ("no certificate", pki.anonymous("anonymous")),
            ("another CA's certificate", pki.stranger("stranger")),
            ("an expired certificate", pki.expired("expired")),
        ] {
            assert!(
                !info_answers(addr, Some(&load(&args))).await,
                "{addr}: {who}"
            );
        }
    }
    // So does the decode worker's KV listener.
    let kv_addr = cluster.decode[0].ready.kv_addr.clone().expect("KV address");
    let cfg = dolphin_kv_transfer::TransferConfig::default();
    let sender = dolphin_kv_transfer::KvSender::with_tls(cfg, Some(&load(&pki.anonymous("kv"))))?;
    let pushed = sender
        .send(
            &kv_addr,
            42,
            &[dolphin_kv_transfer::KvBlock::from(&b"kv"[..])],
        )
        .await;
    assert!(pushed.is_err(), "a KV sender without a certificate got in");

    // dolphinctl reaches the router over TLS with the CA, and refuses https:// without one.
    let ctl = dolphin_tests::binaries::binary(dolphin_tests::binaries::DOLPHINCTL)?;
    let router = format!("https://{}", cluster.admin_addr());
    let ca = pki.anonymous("ctl").tls_ca.expect("CA");
    let listed = tokio::process::Command::new(&ctl)
        .arg("--tls-ca")
        .arg(&ca)
        .args(["workers", "--json", "--router-admin", &router])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(stdout.contains(cluster.decode[0].id()), "{stdout}");
    let refused = tokio::process::Command::new(&ctl)
        .args(["workers", "--router-admin", &router])
        .output()
        .await?;
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--tls-ca"));

    // After all of that, the cluster still serves.
    let again = grpc::generate(
        &mut client,
        grpc::text_request(PROMPT, 16, PrefillMode::Remote),
    )
    .await?;
    assert_eq!(again.tokens, remote.tokens);
    cluster.passed();
    Ok(())
}
