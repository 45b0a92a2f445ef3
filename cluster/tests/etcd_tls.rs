//! TLS and client-certificate auth to a real etcd (`/usr/bin/etcd`, `--client-cert-auth`),
//! certificates made for the test (rcgen).

use std::time::Duration;

use dolphin_cluster::testing::{EtcdServer, EtcdServerTls};
use dolphin_cluster::{
    DiscoveryError, EtcdConfig, EtcdTls, MembershipEvent, Registration, Role, WorkerId,
    WorkerRecord, watch_workers,
};
use dolphin_tls::TlsArgs;
use dolphin_tls::testing::TestPki;

const PATIENCE: Duration = Duration::from_secs(45);

fn config(etcd: &EtcdServer, args: &TlsArgs) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![etcd.endpoint()],
        cluster: "tls".into(),
        lease_ttl_secs: 10,
        tls: Some(EtcdTls {
            ca: args.tls_ca.clone().expect("CA"),
            identity: args.tls_cert.clone().zip(args.tls_key.clone()),
            domain: None,
        }),
    }
}

fn record() -> WorkerRecord {
    WorkerRecord {
        id: WorkerId::from("decode-tls"),
        role: Role::Decode,
        grpc_addr: "127.0.0.1:7000".into(),
        kv_addr: Some("127.0.0.1:7001".into()),
        model: "sim-model".into(),
        block_size: 16,
        version: dolphin_cluster::BUILD_VERSION.into(),
        kv_layout: String::new(),
        context_length: 0,
    }
}

async fn start(pki: &TestPki) -> EtcdServer {
    let server = pki.member("etcd");
    EtcdServer::start_tls(EtcdServerTls {
        cert: server.tls_cert.expect("cert"),
        key: server.tls_key.expect("key"),
        client_ca: server.tls_ca.expect("CA"),
    })
    .await
}

#[tokio::test]
async fn members_with_a_client_certificate_register_and_watch() {
    let pki = TestPki::new();
    let etcd = start(&pki).await;
    let cfg = config(&etcd, &pki.member("worker"));
    let mut watcher = watch_workers(&cfg).await.expect("watch over TLS");
    let registration = Registration::register(&cfg, record())
        .await
        .expect("register over TLS");
    let event = tokio::time::timeout(PATIENCE, async {
        loop {
            match watcher.recv().await.expect("stream open") {
                MembershipEvent::Up(r) if r.id == record().id => return r,
                _ => {}
            }
        }
    })
    .await
    .expect("the registration is seen");
    assert_eq!(event, record());
    registration.shutdown().await.expect("revoke");
}

#[tokio::test]
async fn etcd_refuses_clients_without_a_certificate_from_its_ca() {
    let pki = TestPki::new();
    let etcd = start(&pki).await;
    for (who, args) in [
        ("no certificate", pki.anonymous("anonymous")),
        ("another CA's certificate", pki.stranger("stranger")),
    ] {
        let result = tokio::time::timeout(
            PATIENCE,
            Registration::register(&config(&etcd, &args), record()),
        )
        .await
        .expect("refused in time, not hung");
        assert!(
            matches!(
                result,
                Err(DiscoveryError::Etcd(_) | DiscoveryError::Timeout { .. })
            ),
            "{who}: {result:?}"
        );
    }
}

#[tokio::test]
async fn plaintext_and_tls_endpoints_must_match_the_settings() {
    let pki = TestPki::new();
    let mut cfg = config_for("http://127.0.0.1:2379", Some(&pki.member("w")));
    assert!(matches!(
        cfg.connect_options(),
        Err(DiscoveryError::InvalidConfig(why)) if why.contains("https://")
    ));
    cfg = config_for("https://127.0.0.1:2379", None);
    assert!(matches!(
        cfg.connect_options(),
        Err(DiscoveryError::InvalidConfig(why)) if why.contains("--etcd-ca")
    ));
    let missing = TlsArgs {
        tls_ca: Some(pki.dir().join("missing.crt")),
        ..TlsArgs::default()
    };
    cfg = config_for("https://127.0.0.1:2379", Some(&missing));
    assert!(matches!(
        cfg.connect_options(),
        Err(DiscoveryError::Io { path, .. }) if path.ends_with("missing.crt")
    ));
}

fn config_for(endpoint: &str, args: Option<&TlsArgs>) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![endpoint.into()],
        cluster: "tls".into(),
        lease_ttl_secs: 10,
        tls: args.map(|a| EtcdTls {
            ca: a.tls_ca.clone().expect("CA"),
            identity: a.tls_cert.clone().zip(a.tls_key.clone()),
            domain: None,
        }),
    }
}
