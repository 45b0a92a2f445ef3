//! OpenTelemetry traces across the three processes: a real OTLP/gRPC receiver (the collector's
//! trace service from the opentelemetry-proto definitions, served by tonic here) gets the
//! spans of a remote-prefill request from the router, the decode worker and the prefill worker,
//! and they form one trace under the client's own `traceparent`:
//!
//! client span → `dolphin.v1.Inference/Generate` (the router's server span) → router.request →
//! router.dispatch → `dolphin.v1.DecodeWorker/Decode` → decode.request → decode.remote_prefill →
//! `dolphin.v1.PrefillWorker/Prefill` → prefill.request → prefill.compute and
//! prefill.kv_transfer (router.tokenize and router.route under router.request, decode.admit and
//! decode.generate under decode.request). Each gRPC call's server span comes from
//! `ServerSpanLayer`; the decode worker's call to the prefill worker carries its trace context
//! through `PropagateTraceLayer`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dolphin_proto::v1::PrefillMode;
use dolphin_tests::{ClusterConfig, TestCluster, grpc};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use parking_lot::Mutex;

/// The server spans of the three calls, named `package.Service/Method`.
const GENERATE: &str = "dolphin.v1.Inference/Generate";
const DECODE: &str = "dolphin.v1.DecodeWorker/Decode";
const PREFILL: &str = "dolphin.v1.PrefillWorker/Prefill";

/// One received span: its service, name, ids.
#[derive(Clone, Debug)]
struct Span {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent: Vec<u8>,
}

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref())
                .map(|v| format!("{:?}", v.value))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push(Span {
                        service: service.clone(),
                        name: s.name,
                        trace_id: s.trace_id,
                        span_id: s.span_id,
                        parent: s.parent_span_id,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::test]
async fn one_trace_spans_router_decode_and_prefill_workers() -> anyhow::Result<()> {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint),
        // Export within a tenth of a second instead of the default five.
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
    ];
    let cluster = TestCluster::start(ClusterConfig {
        env,
        ..ClusterConfig::default()
    })
    .await?;

    // The client's own trace context: the request's trace continues it.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let mut req = tonic::Request::new(grpc::text_request(
        "Traces follow a request from the router through both workers and back.",
        4,
        PrefillMode::Remote,
    ));
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{client_span}-01").parse()?,
    );
    let mut client = cluster.inference().await?;
    let mut stream = client.generate(req).await?.into_inner();
    while stream.message().await?.is_some() {}

    let want = [
        GENERATE,
        DECODE,
        PREFILL,
        "router.request",
        "router.tokenize",
        "router.route",
        "router.dispatch",
        "decode.request",
        "decode.admit",
        "decode.remote_prefill",
        "decode.generate",
        "prefill.request",
        "prefill.compute",
        "prefill.kv_transfer",
    ];
    let trace_bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    let mut spans: HashMap<String, Span> = HashMap::new();
    for _ in 0..100 {
        spans = receiver
            .0
            .lock()
            .iter()
            .filter(|s| s.trace_id == trace_bytes)
            .map(|s| (s.name.clone(), s.clone()))
            .collect();
        if want.iter().all(|n| spans.contains_key(*n)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let missing: Vec<_> = want.iter().filter(|n| !spans.contains_key(**n)).collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?}; got {:?}; all received: {:?}",
        spans.keys(),
        receiver
            .0
            .lock()
            .iter()
            .map(|s| (&s.name, s.trace_id.len()))
            .collect::<Vec<_>>()
    );

    let parent_of = |child: &str, parent: &str| {
        assert_eq!(
            spans[child].parent, spans[parent].span_id,
            "{child} is not under {parent}"
        );
    };
    let client_bytes: Vec<u8> = (0..8)
        .map(|i| u8::from_str_radix(&client_span[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    assert_eq!(
        spans[GENERATE].parent, client_bytes,
        "under the client's span"
    );
    parent_of("router.request", GENERATE);
    parent_of("router.tokenize", "router.request");
    parent_of("router.route", "router.request");
    parent_of("router.dispatch", "router.request");
    parent_of(DECODE, "router.dispatch");
    parent_of("decode.request", DECODE);
    parent_of("decode.admit", "decode.request");
    parent_of("decode.remote_prefill", "decode.request");
    parent_of("decode.generate", "decode.request");
    parent_of(PREFILL, "decode.remote_prefill");
    parent_of("prefill.request", PREFILL);
    parent_of("prefill.compute", "prefill.request");
    parent_of("prefill.kv_transfer", "prefill.request");
    // Each process reports under its own service name.
    for (span, service) in [
        (GENERATE, "dolphin-router"),
        ("router.request", "dolphin-router"),
        (DECODE, "dolphin-decode-worker"),
        ("decode.request", "dolphin-decode-worker"),
        ("prefill.request", "dolphin-prefill-worker"),
    ] {
        assert!(
            spans[span].service.contains(service),
            "{span}: {:?}",
            spans[span].service
        );
    }
    cluster.passed();
    server.abort();
    Ok(())
}
