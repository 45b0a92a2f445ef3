//! OpenTelemetry traces: spans exported over OTLP/gRPC when an endpoint is configured, and the
//! W3C trace context (`traceparent`, `tracestate`) carried between processes in request headers.
//!
//! Spans meant for traces are `tracing` spans with target [`TARGET`] at TRACE level: the log
//! output (RUST_LOG, default info) never enables them, so with no endpoint they are disabled at
//! their call sites and cost nothing on the request path. With an endpoint, a
//! `tracing-opentelemetry` layer takes exactly those spans and a batch processor exports them.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of every span exported as part of a trace.
pub const TARGET: &str = "dolphin_trace";

/// The standard variables that name an OTLP endpoint; traces are exported when one is set.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Flushes and shuts the exporter down when dropped (at process exit), so the last spans leave.
#[derive(Debug, Default)]
pub struct TraceGuard(pub(crate) Option<SdkTracerProvider>);

impl Drop for TraceGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("OpenTelemetry exporter shutdown: {e}");
        }
    }
}

/// The OTLP endpoint from the environment, if traces are to be exported.
pub fn endpoint() -> Option<String> {
    ENDPOINT_VARS
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
}

/// A tracer provider exporting to the configured endpoint as `service` (OTEL_SERVICE_NAME
/// overrides it), or `None` without an endpoint. Must run inside a tokio runtime: the gRPC
/// exporter's channel lives on it.
pub(crate) fn provider(service: &str) -> Result<Option<SdkTracerProvider>, String> {
    if endpoint().is_none() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    let name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service.to_owned());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .build();
    Ok(Some(
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build(),
    ))
}

/// The `tracing` layer that turns [`TARGET`] spans into OpenTelemetry spans of `provider`.
pub(crate) fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    let filter =
        tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE);
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("dolphin"))
        .with_filter(filter)
}

/// The trace context a request carries (`get` reads one header or metadata value).
fn extract(get: &dyn Fn(&str) -> Option<String>) -> Context {
    /// The two W3C headers, read up front.
    struct Carrier(Vec<(&'static str, String)>);
    impl Extractor for Carrier {
        fn get(&self, key: &str) -> Option<&str> {
            self.0
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.as_str())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(k, _)| *k).collect()
        }
    }
    let carrier = ["traceparent", "tracestate"]
        .into_iter()
        .filter_map(|k| get(k).map(|v| (k, v)))
        .collect();
    TraceContextPropagator::new().extract(&Carrier(carrier))
}

/// Makes the trace context a request carries the parent of `span` (nothing without one).
pub fn set_parent(span: &tracing::Span, get: &dyn Fn(&str) -> Option<String>) {
    if span.is_disabled() {
        return;
    }
    let cx = extract(get);
    use opentelemetry::trace::TraceContextExt;
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The headers (`traceparent`, and `tracestate` when set) that make `span` the parent of the
/// next process's spans; empty when the span is not exported.
pub fn headers(span: &tracing::Span) -> Vec<(&'static str, String)> {
    if span.is_disabled() {
        return Vec::new();
    }
    struct Put(Vec<(&'static str, String)>);
    impl Injector for Put {
        fn set(&mut self, key: &str, value: String) {
            let key = match key {
                "traceparent" => "traceparent",
                "tracestate" => "tracestate",
                _ => return,
            };
            self.0.push((key, value));
        }
    }
    let mut put = Put(Vec::new());
    TraceContextPropagator::new().inject_context(&span.context(), &mut put);
    put.0
}
