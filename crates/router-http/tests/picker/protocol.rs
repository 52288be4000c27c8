//! The picker's side of the `ext_proc` protocol, driven by a gRPC client of the
//! test's own where Envoy cannot be made to misbehave: the subset hint, requests the
//! router answers itself, a gateway that breaks the protocol or falls silent.

use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value as Proto, value::Kind};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tonic::Streaming;

use super::{addresses, any_port, chat, config, counted, in_flight, released, within};
use crate::common::{self, metrics, sim};

/// One stream to the picker: what the test sends, what it gets.
struct Exchange {
    to: mpsc::Sender<ProcessingRequest>,
    from: Streaming<ProcessingResponse>,
}

impl Exchange {
    /// A stream with the picker's token.
    async fn open(picker: SocketAddr) -> Self {
        Self::with_token(picker, Some(&super::envoy::token()))
            .await
            .expect("the stream opens")
    }

    async fn with_token(picker: SocketAddr, token: Option<&str>) -> Result<Self, tonic::Status> {
        let mut client = ExternalProcessorClient::connect(format!("http://{picker}"))
            .await
            .expect("the picker accepts");
        let (to, mut outgoing) = mpsc::channel(8);
        let requests = futures_util::stream::poll_fn(move |cx| outgoing.poll_recv(cx));
        let mut request = tonic::Request::new(requests);
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().expect("a metadata value");
            request.metadata_mut().insert("authorization", value);
        }
        let from = client.process(request).await?.into_inner();
        Ok(Self { to, from })
    }

    async fn send(&self, request: Request, metadata: Option<Metadata>) {
        self.offer(request, metadata)
            .await
            .expect("the stream is open");
    }

    /// Sends a message the picker may no longer read: `Err` if it already ended the
    /// stream (it answers some requests from their headers alone).
    async fn offer(
        &self,
        request: Request,
        metadata: Option<Metadata>,
    ) -> Result<(), mpsc::error::SendError<ProcessingRequest>> {
        let message = ProcessingRequest {
            request: Some(request),
            metadata_context: metadata,
            ..ProcessingRequest::default()
        };
        self.to.send(message).await
    }

    /// Sends a request's headers (`POST path`) and, unless `body` is `None`, its body.
    async fn request(&self, path: &str, body: Option<&Value>, metadata: Option<Metadata>) {
        let header = |key: &str, value: &str| HeaderValue {
            key: key.to_owned(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        };
        let headers = HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    header(":method", "POST"),
                    header(":path", path),
                    header("content-type", "application/json"),
                ],
            }),
            end_of_stream: body.is_none(),
            ..HttpHeaders::default()
        };
        self.send(Request::RequestHeaders(headers), metadata).await;
        if let Some(body) = body {
            let body = HttpBody {
                body: body.to_string().into_bytes(),
                end_of_stream: true,
                ..HttpBody::default()
            };
            // A picker that answered from the headers has ended the stream; what it
            // answered is read as any other answer.
            let _ = self.offer(Request::RequestBody(body), None).await;
        }
    }

    /// The picker's next message.
    async fn next(&mut self) -> Result<Option<ProcessingResponse>, tonic::Status> {
        within("the picker's next message", self.from.message()).await
    }

    /// The engine the picker names, after the request's headers and body.
    async fn destination(&mut self) -> String {
        let message = self.next().await.expect("no error").expect("a message");
        let Some(Response::RequestHeaders(headers)) = message.response else {
            panic!("a headers response, not {message:?}");
        };
        let mutation = headers
            .response
            .and_then(|r| r.header_mutation)
            .expect("headers set");
        let destination = mutation
            .set_headers
            .iter()
            .filter_map(|h| h.header.as_ref())
            .find(|h| h.key == "x-gateway-destination-endpoint")
            .expect("the destination header");
        String::from_utf8(destination.raw_value.clone()).expect("an address")
    }

    /// The router's own answer, sent in the gateway's stead: its status and body.
    async fn immediate(&mut self) -> (i32, Value) {
        let message = self.next().await.expect("no error").expect("a message");
        let Some(Response::ImmediateResponse(answer)) = message.response else {
            panic!("an immediate response, not {message:?}");
        };
        let body = serde_json::from_slice(&answer.body).expect("a JSON body");
        let end = self.next().await.expect("the stream ends with OK");
        assert!(end.is_none(), "nothing after the answer: {end:?}");
        (answer.status.expect("a status").code, body)
    }
}

fn subset(endpoints: &[String]) -> Metadata {
    let values = endpoints
        .iter()
        .map(|e| Proto {
            kind: Some(Kind::StringValue(e.clone())),
        })
        .collect();
    let list = Proto {
        kind: Some(Kind::ListValue(ListValue { values })),
    };
    let hint = Struct {
        fields: [("x-gateway-destination-endpoint-subset".to_owned(), list)].into(),
    };
    Metadata {
        filter_metadata: [("envoy.lb.subset_hint".to_owned(), hint)].into(),
        ..Metadata::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subset_hint_narrows_the_pick_to_the_endpoints_it_lists() {
    let engines = [
        sim(|c| c.model = "m".into()).await,
        sim(|c| c.model = "m".into()).await,
        sim(|c| c.model = "m".into()).await,
    ];
    let router = common::router(config(&engines, json!({"type": "round_robin"}), any_port())).await;
    let picker = router.picker_addr().expect("the picker listens");
    let third = addresses(&engines)[2].to_string();
    for _ in 0..4 {
        let mut exchange = Exchange::open(picker).await;
        let hint = subset(std::slice::from_ref(&third));
        exchange
            .request("/v1/chat/completions", Some(&chat("hinted")), Some(hint))
            .await;
        assert_eq!(
            exchange.destination().await,
            third,
            "round robin, within the hint"
        );
    }
    let mut exchange = Exchange::open(picker).await;
    let nowhere = subset(&["10.255.0.1:80".to_owned()]);
    exchange
        .request(
            "/v1/chat/completions",
            Some(&chat("nowhere")),
            Some(nowhere),
        )
        .await;
    let (status, body) = exchange.immediate().await;
    assert_eq!(status, 503, "{body}");
    let mut exchange = Exchange::open(picker).await;
    let malformed = subset(&["pod-a".to_owned()]);
    exchange
        .request(
            "/v1/chat/completions",
            Some(&chat("malformed")),
            Some(malformed),
        )
        .await;
    let (status, body) = exchange.immediate().await;
    assert_eq!(status, 500, "a gateway's fault, not the client's: {body}");
    released(router.context(), &["E0", "E1", "E2"]).await;
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_moves_is_named_at_its_new_address() {
    let engines = [
        sim(|c| c.model = "m".into()).await,
        sim(|c| c.model = "m".into()).await,
    ];
    let router = common::router(config(&engines, json!({"type": "round_robin"}), any_port())).await;
    let picker = router.picker_addr().expect("the picker listens");
    let hinted = async |address: &str| {
        let mut exchange = Exchange::open(picker).await;
        let hint = subset(&[address.to_owned()]);
        exchange
            .request("/v1/chat/completions", Some(&chat("hinted")), Some(hint))
            .await;
        exchange.destination().await
    };
    let old = addresses(&engines)[1].to_string();
    assert_eq!(hinted(&old).await, old, "E1 at its address");
    // E1 moves: the same id at the address of a third engine started for it. The
    // picker names it there, not at the address it had.
    let moved = sim(|c| c.model = "m".into()).await;
    let new = moved.url().trim_start_matches("http://").to_owned();
    let spec = router_fleet::EngineSpec::new("E1", moved.url(), "m")
        .with_role(Some(router_state::Role::Plain));
    router
        .context()
        .fleet()
        .apply(router_fleet::Change::Upsert(spec))
        .await
        .expect("E1 moves");
    assert_eq!(hinted(&new).await, new, "E1 at its new address");
    router.shutdown().await;
    moved.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_router_cannot_route_are_answered_in_the_gateways_stead() {
    let engines = [sim(|c| c.model = "m".into()).await];
    let router = common::router(config(&engines, json!({"type": "round_robin"}), any_port())).await;
    let picker = router.picker_addr().expect("the picker listens");
    let mut exchange = Exchange::open(picker).await;
    exchange.request("/v1/models", None, None).await;
    let (status, body) = exchange.immediate().await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("unknown_endpoint"))
    );
    // A path of any length is repeated in the answer at most 256 bytes long.
    let mut exchange = Exchange::open(picker).await;
    let long = format!("/{}", "é".repeat(100_000));
    exchange.request(&long, None, None).await;
    let (status, body) = exchange.immediate().await;
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 404);
    assert!(
        message.ends_with(&long[..255]) && message.len() < 400,
        "{message}"
    );
    let mut exchange = Exchange::open(picker).await;
    exchange.request("/v1/chat/completions", None, None).await;
    let (status, body) = exchange.immediate().await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_body"))
    );
    let mut exchange = Exchange::open(picker).await;
    let unknown = common::chat("not-served", "hello");
    exchange
        .request("/v1/chat/completions", Some(&unknown), None)
        .await;
    let (status, body) = exchange.immediate().await;
    assert_eq!(status, 404, "{body}");
    let text = metrics(&router).await;
    assert!(
        common::has_line(
            &text,
            r#"switchyard_picker_streams_total{outcome="answered"} 4"#
        ),
        "{text}"
    );
    assert_eq!(engines[0].visits().answered, 0, "no engine was reached");
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_the_pickers_token_is_refused() {
    let engines = [sim(|c| c.model = "m".into()).await];
    let router = common::router(config(&engines, json!({"type": "round_robin"}), any_port())).await;
    let picker = router.picker_addr().expect("the picker listens");
    for token in [None, Some("not-the-token")] {
        let refused = Exchange::with_token(picker, token).await;
        let status = refused.err().expect("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    }
    let text = metrics(&router).await;
    assert!(
        common::has_line(
            &text,
            r#"switchyard_picker_streams_total{outcome="unauthenticated"} 2"#
        ),
        "{text}"
    );
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pickers_health_is_served_beside_it_without_its_token() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let engines = [sim(|c| c.model = "m".into()).await];
    let router = common::router(config(&engines, json!({"type": "round_robin"}), any_port())).await;
    let picker = router.picker_addr().expect("the picker listens");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{picker}"))
        .expect("an endpoint")
        .connect()
        .await
        .expect("the picker accepts");
    let mut client = HealthClient::new(channel);
    for service in ["", "envoy.service.ext_proc.v3.ExternalProcessor"] {
        let request = HealthCheckRequest {
            service: service.to_owned(),
        };
        let answer = client.check(request).await.expect("answered").into_inner();
        assert_eq!(answer.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = HealthCheckRequest {
        service: "grpc.unknown.Service".to_owned(),
    };
    let status = client.check(unknown).await.expect_err("not a service");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    // No stream held open for a caller that shows no token.
    let watched = client
        .watch(HealthCheckRequest::default())
        .await
        .expect_err("not watched");
    assert_eq!(watched.code(), tonic::Code::Unimplemented, "{watched:?}");
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_breaking_the_protocol_has_its_stream_ended() {
    let engines = [sim(|c| c.model = "m".into()).await];
    let router = common::router(config(&engines, json!({"type": "round_robin"}), any_port())).await;
    let mut exchange = Exchange::open(router.picker_addr().expect("the picker listens")).await;
    let body = HttpBody {
        body: b"{}".to_vec(),
        end_of_stream: true,
        ..HttpBody::default()
    };
    exchange.send(Request::RequestBody(body), None).await;
    let ended = exchange
        .next()
        .await
        .expect_err("the stream ends in an error");
    assert_eq!(ended.code(), tonic::Code::InvalidArgument, "{ended:?}");
    let text = metrics(&router).await;
    assert!(
        common::has_line(
            &text,
            r#"switchyard_picker_streams_total{outcome="invalid"} 1"#
        ),
        "{text}"
    );
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_falling_silent_after_the_pick_releases_the_engine() {
    let engines = [sim(|c| c.model = "m".into()).await];
    let mut config = config(&engines, json!({"type": "round_robin"}), any_port());
    config.timeouts.first_byte_ms = 500;
    let router = common::router(config).await;
    let mut exchange = Exchange::open(router.picker_addr().expect("the picker listens")).await;
    exchange
        .request("/v1/chat/completions", Some(&chat("then silence")), None)
        .await;
    exchange.destination().await;
    // The body goes back, then nothing comes: the answer's head never arrives.
    let ended = loop {
        match exchange.next().await {
            Ok(Some(_)) => continue,
            ended => break ended,
        }
    };
    let ended = ended.expect_err("the stream ends in an error");
    assert_eq!(ended.code(), tonic::Code::DeadlineExceeded, "{ended:?}");
    released(router.context(), &["E0"]).await;
    let text = metrics(&router).await;
    assert!(
        text.contains(
            r#"switchyard_requests_total{model="m",outcome="server_error",code="upstream_timeout"} 1"#
        ),
        "{text}"
    );
    assert!(
        common::has_line(
            &text,
            r#"switchyard_picker_streams_total{outcome="timeout"} 1"#
        ),
        "{text}"
    );
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_while_it_waits_in_the_queue_leaves_it() {
    let engine = sim(|c| {
        c.model = "m".into();
        c.decode_tokens_per_sec = 20.0;
    })
    .await;
    let engines = [engine];
    let capped = json!({"type": "round_robin", "admission": {"max_inflight_requests": 1}});
    let mut config = config(&engines, capped, any_port());
    config.models[0].flow =
        serde_json::from_value(json!({"queue": {"max_wait_ms": 60000}})).expect("a flow section");
    let router = common::router(config).await;
    let picker = router.picker_addr().expect("the picker listens");
    let mut holding = Exchange::open(picker).await;
    let mut long = chat("hold the slot");
    long["max_tokens"] = 1000.into();
    holding
        .request("/v1/chat/completions", Some(&long), None)
        .await;
    holding.destination().await;
    let waiting = Exchange::open(picker).await;
    waiting
        .request("/v1/chat/completions", Some(&chat("wait")), None)
        .await;
    let depth = r#"switchyard_queue_depth{model="m",band="0"} "#;
    within("the request queued", async {
        while common::metric(&router, depth).await < 1.0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The gateway gives up on it (its client went away).
    drop(waiting);
    within("the queue emptied", async {
        while common::metric(&router, depth).await > 0.0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    counted(
        &router,
        r#"switchyard_picker_streams_total{outcome="cancelled"} 1"#,
    )
    .await;
    let text = metrics(&router).await;
    assert!(
        text.contains(
            r#"switchyard_requests_total{model="m",outcome="cancelled",code="client_disconnected"} 1"#
        ),
        "{text}"
    );
    assert_eq!(
        in_flight(router.context(), &["E0"]),
        1,
        "only the first holds the engine"
    );
    drop(holding);
    released(router.context(), &["E0"]).await;
    router.shutdown().await;
}

/// A body chunk the picker sends on: its bytes and whether it ends the body.
fn chunk(message: ProcessingResponse) -> (Vec<u8>, bool) {
    let Some(Response::RequestBody(body)) = message.response else {
        panic!("a body response, not {message:?}");
    };
    let mutation = body
        .response
        .and_then(|r| r.body_mutation)
        .and_then(|b| b.mutation);
    let Some(Mutation::StreamedResponse(streamed)) = mutation else {
        panic!("a streamed body, not {mutation:?}");
    };
    (streamed.body, streamed.end_of_stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_bound_is_refused_and_trailers_are_answered_after_the_body() {
    let engines = [sim(|c| c.model = "m".into()).await];
    let router = common::router(config(&engines, json!({"type": "round_robin"}), any_port())).await;
    let picker = router.picker_addr().expect("the picker listens");
    // 33 chunks of 1 MiB: past the 32 MiB a request body may have.
    let mut exchange = Exchange::open(picker).await;
    let headers = HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                HeaderValue {
                    key: ":method".into(),
                    raw_value: b"POST".to_vec(),
                    ..HeaderValue::default()
                },
                HeaderValue {
                    key: ":path".into(),
                    raw_value: b"/v1/chat/completions".to_vec(),
                    ..HeaderValue::default()
                },
            ],
        }),
        ..HttpHeaders::default()
    };
    exchange
        .send(Request::RequestHeaders(headers.clone()), None)
        .await;
    let sending = {
        let to = exchange.to.clone();
        tokio::spawn(async move {
            for _ in 0..33 {
                let body = HttpBody {
                    body: vec![b' '; 1 << 20],
                    ..HttpBody::default()
                };
                let message = ProcessingRequest {
                    request: Some(Request::RequestBody(body)),
                    ..ProcessingRequest::default()
                };
                if to.send(message).await.is_err() {
                    return;
                }
            }
        })
    };
    let (status, body) = exchange.immediate().await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("body_too_large")),
        "{body}"
    );
    sending.abort();
    // A body that trailers end: the body goes on unended, the trailers' answer after it.
    let mut exchange = Exchange::open(picker).await;
    exchange.send(Request::RequestHeaders(headers), None).await;
    let body = HttpBody {
        body: chat("with trailers").to_string().into_bytes(),
        ..HttpBody::default()
    };
    exchange.send(Request::RequestBody(body), None).await;
    exchange
        .send(Request::RequestTrailers(HttpTrailers::default()), None)
        .await;
    exchange.destination().await;
    let mut sent = Vec::new();
    let last = loop {
        let message = exchange.next().await.expect("no error").expect("a message");
        if matches!(message.response, Some(Response::RequestTrailers(_))) {
            break message;
        }
        let (bytes, end) = chunk(message);
        assert!(!end, "the trailers end the body, not a chunk");
        sent.extend(bytes);
    };
    assert!(matches!(last.response, Some(Response::RequestTrailers(_))));
    let sent: Value = serde_json::from_slice(&sent).expect("the body, whole");
    assert_eq!(sent["messages"], chat("with trailers")["messages"]);
    let text = metrics(&router).await;
    assert!(
        common::has_line(
            &text,
            r#"switchyard_picker_streams_total{outcome="answered"} 1"#
        ),
        "the body past the bound is answered by the router: {text}"
    );
    drop(exchange);
    released(router.context(), &["E0"]).await;
    router.shutdown().await;
}
