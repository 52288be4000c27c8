//! The router's own spans, exported over OTLP/HTTP to an in-process collector: a
//! server span per request continuing the client's trace, with `prepare`, `select`
//! (a `bucket_attempt` span under it per bucket) and one `dispatch` span per engine
//! leg, whose id the engine receives as its parent.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use prost::Message;
use router_config::{EngineRole, ModelConfig, TracesConfig};

use crate::common::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP collector on a port of its own, keeping every span it receives.
async fn collector() -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                |State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes| async move {
                    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                    let mut kept = spans.lock();
                    for resource in request.resource_spans {
                        for scope in resource.scope_spans {
                            kept.extend(scope.spans);
                        }
                    }
                    Bytes::new()
                },
            ),
        )
        .with_state(Arc::clone(&spans));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1/traces"), spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn attribute(span: &Span, key: &str) -> String {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .map(|v| format!("{:?}", v.value))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_exports_its_spans_and_the_engine_gets_the_dispatch_span_as_parent() {
    let (endpoint, exported) = collector().await;
    let a = sim(|_| {}).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.traces = Some(TracesConfig::new(endpoint));
    let router = router(config).await;
    let client = reqwest::Client::new();
    let traced = client
        .post(url(&router, "/v1/chat/completions"))
        .header("traceparent", format!("00-{TRACE}-{CLIENT_SPAN}-01"))
        .header("tracestate", "congo=t61rcWkgMzE")
        .json(&chat("m", "hello"))
        .send()
        .await
        .unwrap();
    assert_eq!(traced.status(), 200);
    traced.bytes().await.unwrap();
    let sent = recent_requests(&a).await.last().unwrap().clone();
    let untraced = post(&router, &chat("m", "hello again")).await;
    assert_eq!(untraced.status(), 200);
    untraced.bytes().await.unwrap();
    let unknown = post(&router, &chat("other", "hello")).await;
    assert_eq!(unknown.status(), 404);
    // Five spans each for the routed requests (the request, prepare, select, one
    // bucket attempt, dispatch), two for the refused one (no selection, no
    // dispatch); a request's span ends with its answer's body.
    let ended = "switchyard_spans_total{outcome=\"ended\"} 12";
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while !metrics(&router).await.contains(ended) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("twelve spans ended");
    // Shutting down exports what is queued.
    router.shutdown().await;

    let spans = exported.lock().clone();
    assert_eq!(spans.len(), 12, "every span ended was exported");
    let requests = named(&spans, "switchyard.request");
    assert_eq!(requests.len(), 3, "{spans:#?}");
    let root = requests
        .iter()
        .find(|s| hex(&s.trace_id) == TRACE)
        .expect("the client's trace continued");
    assert_eq!(hex(&root.parent_span_id), CLIENT_SPAN);
    assert!(
        attribute(root, "http.response.status_code").contains("200"),
        "{root:?}"
    );
    let children = |name: &str| -> Vec<&Span> {
        named(&spans, name)
            .into_iter()
            .filter(|s| s.parent_span_id == root.span_id)
            .collect()
    };
    assert_eq!(children("prepare").len(), 1);
    let select = children("select");
    assert_eq!(select.len(), 1);
    let attempts: Vec<&Span> = named(&spans, "bucket_attempt")
        .into_iter()
        .filter(|s| s.parent_span_id == select[0].span_id)
        .collect();
    assert_eq!(attempts.len(), 1, "one bucket, tried once: {attempts:?}");
    assert!(attribute(attempts[0], "switchyard.outcome").contains("picked"));
    assert!(
        select[0].start_time_unix_nano <= attempts[0].start_time_unix_nano
            && attempts[0].end_time_unix_nano <= select[0].end_time_unix_nano,
        "the attempt lies within the selection"
    );
    let dispatch = children("dispatch");
    assert_eq!(dispatch.len(), 1);
    assert!(attribute(dispatch[0], "switchyard.engine").contains('A'));
    assert_eq!(
        sent["traceparent"],
        format!("00-{TRACE}-{}-01", hex(&dispatch[0].span_id)),
        "the engine's parent is the dispatch span"
    );
    assert!(
        root.start_time_unix_nano <= dispatch[0].start_time_unix_nano
            && dispatch[0].end_time_unix_nano <= root.end_time_unix_nano
    );

    let others: Vec<&&Span> = requests
        .iter()
        .filter(|s| hex(&s.trace_id) != TRACE)
        .collect();
    assert!(
        others.iter().all(|s| s.parent_span_id.is_empty()),
        "new traces start at the router"
    );
    assert!(
        others.iter().any(|s| s
            .status
            .as_ref()
            .is_some_and(|st| st.message.contains("model_not_found"))),
        "{others:?}"
    );
}

/// The request spans exported for four requests continuing a client's sampled trace,
/// through a router recording half of the requests.
async fn requests_exported(honor_client_sampling: bool) -> usize {
    let (endpoint, exported) = collector().await;
    let a = sim(|_| {}).await;
    let mut config = config(vec![ModelConfig::new(
        "m",
        vec![engine("A", &a, EngineRole::Plain)],
    )]);
    config.traces = Some(TracesConfig {
        sample_ratio: 0.5,
        honor_client_sampling,
        ..TracesConfig::new(endpoint)
    });
    let router = router(config).await;
    let client = reqwest::Client::new();
    for n in 0..4 {
        let traced = client
            .post(url(&router, "/v1/chat/completions"))
            .header("traceparent", format!("00-{TRACE}-{CLIENT_SPAN}-01"))
            .json(&chat("m", &format!("hello {n}")))
            .send()
            .await
            .unwrap();
        assert_eq!(traced.status(), 200);
        traced.bytes().await.unwrap();
    }
    // Each request recorded ends five spans, once its answer's body has ended.
    let recorded = if honor_client_sampling { 4 } else { 2 };
    let ended = |text: String| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix("switchyard_spans_total{outcome=\"ended\"} "))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while ended(metrics(&router).await) < 5 * recorded {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the spans of {recorded} requests ended"));
    // Shutting down exports what is queued.
    router.shutdown().await;
    a.shutdown().await;
    let spans = exported.lock().clone();
    named(&spans, "switchyard.request").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_sampled_flag_does_not_override_the_ratio_unless_honored() {
    assert_eq!(requests_exported(false).await, 2, "half of the requests");
    assert_eq!(
        requests_exported(true).await,
        4,
        "every request the client samples"
    );
}

#[tokio::test]
async fn an_endpoint_that_is_not_a_url_is_refused_by_path() {
    let mut config = config(vec![]);
    config.traces = Some(TracesConfig {
        sample_ratio: 0.0,
        ..TracesConfig::new("collector:4318")
    });
    let errors = router_http::ValidatedConfig::validate(config).unwrap_err();
    let paths: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        paths.iter().any(|p| p.starts_with("traces.otlp_endpoint"))
            && paths.iter().any(|p| p.starts_with("traces.sample_ratio")),
        "{paths:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_passed_over_has_its_own_span_before_the_one_that_picked() {
    let (endpoint, exported) = collector().await;
    let a = sim(|_| {}).await;
    let mut model = ModelConfig::new(
        "m",
        vec![
            engine("A", &a, EngineRole::Plain),
            // Nothing listens here: B starts unhealthy, so its bucket has no candidate.
            router_config::EngineConfig {
                role: Some(EngineRole::Plain),
                ..router_config::EngineConfig::new("B", "http://127.0.0.1:1")
            },
        ],
    );
    model.buckets = Some(
        serde_json::from_value(serde_json::json!([
            {"id": "first", "groups": {"plain": {"engine_ids": ["B"]}}},
            {"id": "second", "groups": {"plain": {"engine_ids": ["A"]}}},
        ]))
        .unwrap(),
    );
    let mut config = config(vec![model]);
    config.traces = Some(TracesConfig::new(endpoint));
    let router = router(config).await;
    let answer = post(&router, &chat("m", "hello")).await;
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap();
    router.shutdown().await;

    let spans = exported.lock().clone();
    let select = named(&spans, "select");
    assert_eq!(select.len(), 1);
    let mut attempts: Vec<&Span> = named(&spans, "bucket_attempt")
        .into_iter()
        .filter(|s| s.parent_span_id == select[0].span_id)
        .collect();
    attempts.sort_by_key(|s| s.start_time_unix_nano);
    let described: Vec<(String, String)> = attempts
        .iter()
        .map(|s| {
            (
                attribute(s, "switchyard.bucket"),
                attribute(s, "switchyard.outcome"),
            )
        })
        .collect();
    assert_eq!(described.len(), 2, "{described:?}");
    assert!(
        described[0].0.contains("first") && !described[0].1.contains("picked"),
        "{described:?}"
    );
    assert!(
        described[1].0.contains("second") && described[1].1.contains("picked"),
        "{described:?}"
    );
    assert!(attempts[0].end_time_unix_nano <= attempts[1].start_time_unix_nano);
}
