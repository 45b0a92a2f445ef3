//! API keys and the admin listener, on the real binaries: the public APIs (HTTP and gRPC) take
//! only the API key, `RouterAdmin` lives on its own listener and takes only the admin key, and
//! dolphinctl passes each from its flags.

use dolphin_proto::v1::router_admin_client::RouterAdminClient;
use dolphin_proto::v1::{ListModelsRequest, ListWorkersRequest, PrefillMode};
use dolphin_tests::binaries::dolphinctl;
use dolphin_tests::{ClusterConfig, TestCluster, grpc, http};

const API_KEY: &str = "sk-dolphin-user-1";
const ADMIN_KEY: &str = "sk-dolphin-admin-1";

#[tokio::test]
async fn public_and_admin_apis_take_only_their_own_keys() -> anyhow::Result<()> {
    let cluster = TestCluster::start(ClusterConfig {
        api_key: Some(API_KEY.into()),
        admin_key: Some(ADMIN_KEY.into()),
        ..ClusterConfig::default()
    })
    .await?;

    // HTTP: 401 in OpenAI's shape without the key or with the admin key; 200 with it.
    let body = r#"{"model":"sim-model","prompt":"hello","max_tokens":3}"#;
    let resp = http::post_json(cluster.http_addr(), "/v1/completions", body).await?;
    assert_eq!(resp.status, 401, "{}", resp.text());
    assert_eq!(resp.json()?["error"]["code"], "invalid_api_key");
    let resp =
        http::post_json_auth(cluster.http_addr(), "/v1/completions", body, ADMIN_KEY).await?;
    assert_eq!(resp.status, 401, "the admin key is not an API key");
    let resp = http::post_json_auth(cluster.http_addr(), "/v1/completions", body, API_KEY).await?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    // /metrics and /health are on their own listener, without keys; not on the public port.
    assert_eq!(
        http::get(cluster.metrics_addr(), "/health").await?.status,
        200
    );
    assert_eq!(
        http::get(cluster.metrics_addr(), "/metrics").await?.status,
        200
    );
    let resp = http::get_auth(cluster.http_addr(), "/metrics", API_KEY).await?;
    assert_eq!(resp.status, 404);

    // gRPC Inference.
    let mut inference = cluster.inference().await?;
    let status = inference
        .list_models(ListModelsRequest {})
        .await
        .expect_err("no key");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let req = grpc::text_request("hello dolphins", 4, PrefillMode::Remote);
    let status = inference
        .generate(grpc::with_key(req.clone(), Some(ADMIN_KEY)))
        .await
        .expect_err("admin key");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let mut stream = inference
        .generate(grpc::with_key(req, Some(API_KEY)))
        .await?
        .into_inner();
    let mut tokens = 0;
    while let Some(msg) = stream.message().await? {
        tokens += msg.token_ids.len();
    }
    assert_eq!(tokens, 4);

    // RouterAdmin: only on the admin listener, only with the admin key.
    let mut admin = cluster.admin().await?;
    for key in [None, Some(API_KEY)] {
        let status = admin
            .list_workers(grpc::with_key(ListWorkersRequest {}, key))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{key:?}");
    }
    let workers = grpc::list_workers_with_key(&mut admin, Some(ADMIN_KEY)).await?;
    assert_eq!(workers.len(), 2);
    let mut on_public = RouterAdminClient::new(grpc::channel(cluster.grpc_addr()).await?);
    let status = on_public
        .list_workers(grpc::with_key(ListWorkersRequest {}, Some(ADMIN_KEY)))
        .await
        .expect_err("not on the public port");
    assert_eq!(status.code(), tonic::Code::Unimplemented);

    // dolphinctl: --admin-key for the admin listener, --api-key for requests.
    let admin_url = format!("http://{}", cluster.admin_addr());
    let out = dolphinctl(&["workers", "--router-admin", &admin_url]).await?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("admin key"),
        "{out:?}"
    );
    let out = dolphinctl(&[
        "--admin-key",
        ADMIN_KEY,
        "workers",
        "--router-admin",
        &admin_url,
    ])
    .await?;
    assert!(out.status.success(), "{out:?}");
    let grpc_url = format!("http://{}", cluster.grpc_addr());
    let request = [
        "request",
        "--router-grpc",
        &grpc_url,
        "--prompt",
        "hi",
        "--max-tokens",
        "3",
    ];
    let out = dolphinctl(&request).await?;
    assert!(!out.status.success(), "{out:?}");
    let mut with_key = vec!["--api-key", API_KEY];
    with_key.extend(request);
    let out = dolphinctl(&with_key).await?;
    assert!(out.status.success(), "{out:?}");
    cluster.passed();
    Ok(())
}
