//! The messages of Envoy's external processing protocol as the endpoint picker
//! reads and writes them: a request's headers into an HTTP header map, the subset
//! hint a gateway may send, the destination (`x-gateway-destination-endpoint` as a
//! header and as `envoy.lb` dynamic metadata, as the Gateway API Inference
//! Extension's endpoint-picker protocol names it), a body sent back in chunks, and an
//! error as an immediate response.

use std::collections::HashSet;
use std::net::SocketAddr;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap as WireHeaders, HeaderValue as WireHeader, HeaderValueOption, Metadata,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation::Mutation,
    processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The header and `envoy.lb` metadata key naming the endpoint the gateway sends the
/// request to.
pub(super) const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The namespace of the destination's dynamic metadata.
const LB_NAMESPACE: &str = "envoy.lb";
/// The namespace and key of the endpoints a gateway allows (the subset hint).
const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The most endpoints a subset hint is read for; a longer one is refused.
pub(super) const MAX_SUBSET: usize = 4096;
/// The largest body chunk sent back in one message (Envoy's own streamed chunks are
/// 64 KiB at most; this leaves room for the message around it).
const CHUNK_BYTES: usize = 62_000;

/// What a request's headers say: its method, path and other headers.
#[derive(Debug, Default)]
pub(super) struct Head {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) status: Option<u16>,
    pub(super) headers: HeaderMap,
}

/// Reads `headers` (pseudo-headers into their fields; a header that is not valid
/// HTTP is left out).
pub(super) fn head(headers: Option<&WireHeaders>) -> Head {
    let mut head = Head::default();
    for header in headers.map_or(&[][..], |h| &h.headers) {
        let value: &[u8] = if header.raw_value.is_empty() {
            header.value.as_bytes()
        } else {
            &header.raw_value
        };
        match header.key.as_str() {
            ":method" => head.method = String::from_utf8_lossy(value).into_owned(),
            ":path" => head.path = String::from_utf8_lossy(value).into_owned(),
            ":status" => {
                head.status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
            }
            key if key.starts_with(':') => {}
            key => {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(key.as_bytes()),
                    HeaderValue::from_bytes(value),
                ) {
                    head.headers.append(name, value);
                }
            }
        }
    }
    head
}

/// The endpoints the gateway allows, when it sends a subset hint.
///
/// # Errors
/// A hint of more than [`MAX_SUBSET`] endpoints, or one that is not a list of
/// `ip:port` strings.
pub(super) fn subset(metadata: Option<&Metadata>) -> Result<Option<HashSet<SocketAddr>>, String> {
    let Some(hint) = metadata.and_then(|m| m.filter_metadata.get(SUBSET_NAMESPACE)) else {
        return Ok(None);
    };
    let Some(value) = hint.fields.get(SUBSET_KEY) else {
        return Ok(None);
    };
    let Some(Kind::ListValue(list)) = &value.kind else {
        return Err(format!("{SUBSET_NAMESPACE}.{SUBSET_KEY} is not a list"));
    };
    if list.values.len() > MAX_SUBSET {
        return Err(format!(
            "{SUBSET_NAMESPACE}.{SUBSET_KEY} lists {} endpoints, more than {MAX_SUBSET}",
            list.values.len()
        ));
    }
    list.values
        .iter()
        .map(|value| match &value.kind {
            Some(Kind::StringValue(endpoint)) => endpoint.parse().map_err(|_| {
                format!("{SUBSET_NAMESPACE}.{SUBSET_KEY} lists {endpoint:?}, not an ip:port")
            }),
            _ => Err(format!(
                "{SUBSET_NAMESPACE}.{SUBSET_KEY} lists a value that is not a string"
            )),
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A header the gateway sets, replacing one of the same name.
fn set(name: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(WireHeader {
            key: name.to_owned(),
            raw_value: value.to_vec(),
            ..WireHeader::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

/// The answer to the request's headers: the request goes to `address`, with
/// `headers` added. The body sent on is the router's (its length may differ), so the
/// client's `content-length` goes; Envoy sends it on chunked.
pub(super) fn destination(
    address: SocketAddr,
    headers: &[(HeaderName, HeaderValue)],
) -> ProcessingResponse {
    let address = address.to_string();
    let mut set_headers = vec![set(DESTINATION, address.as_bytes())];
    set_headers.extend(
        headers
            .iter()
            .map(|(name, value)| set(name.as_str(), value.as_bytes())),
    );
    let lb = Struct {
        fields: [(DESTINATION.to_owned(), string(address))].into(),
    };
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers: vec!["content-length".to_owned()],
                }),
                // The route is chosen again, by the header just set.
                clear_route_cache: true,
                ..CommonResponse::default()
            }),
        })),
        dynamic_metadata: Some(Struct {
            fields: [(
                LB_NAMESPACE.to_owned(),
                Value {
                    kind: Some(Kind::StructValue(lb)),
                },
            )]
            .into(),
        }),
        ..ProcessingResponse::default()
    }
}

fn string(value: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(value)),
    }
}

/// `body` sent back in chunks, the last one ending the request's (`request`) or the
/// answer's body.
pub(super) fn body_chunks(body: &Bytes, request: bool, end: bool) -> Vec<ProcessingResponse> {
    let chunks: Vec<&[u8]> = if body.is_empty() {
        vec![&[]]
    } else {
        body.chunks(CHUNK_BYTES).collect()
    };
    let last = chunks.len() - 1;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| body_response(chunk.to_vec(), request, end && i == last))
        .collect()
}

/// One chunk of a body sent back.
pub(super) fn body_response(
    body: Vec<u8>,
    request: bool,
    end_of_stream: bool,
) -> ProcessingResponse {
    let response = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..StreamedBodyResponse::default()
                })),
            }),
            ..CommonResponse::default()
        }),
    };
    ProcessingResponse {
        response: Some(if request {
            Response::RequestBody(response)
        } else {
            Response::ResponseBody(response)
        }),
        ..ProcessingResponse::default()
    }
}

/// The answer to the answer's headers: `headers` added.
pub(super) fn answer_headers(headers: &HeaderMap) -> ProcessingResponse {
    let set_headers = headers
        .iter()
        .map(|(name, value)| set(name.as_str(), value.as_bytes()))
        .collect();
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers,
                    remove_headers: Vec::new(),
                }),
                ..CommonResponse::default()
            }),
        })),
        ..ProcessingResponse::default()
    }
}

/// The answer to trailers, of the request's (`request`) or the answer's.
pub(super) fn trailers(request: bool) -> ProcessingResponse {
    let trailers = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if request {
            Response::RequestTrailers(trailers)
        } else {
            Response::ResponseTrailers(trailers)
        }),
        ..ProcessingResponse::default()
    }
}

/// The router's answer, sent by the gateway instead of routing the request: an
/// error's status, headers and body.
pub(super) fn immediate(answer: http::response::Parts, body: Bytes) -> ProcessingResponse {
    let set_headers = answer
        .headers
        .iter()
        .map(|(name, value)| set(name.as_str(), value.as_bytes()))
        .collect();
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(answer.status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                remove_headers: Vec::new(),
            }),
            body: body.to_vec(),
            details: "switchyard".to_owned(),
            ..ImmediateResponse::default()
        })),
        ..ProcessingResponse::default()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::ListValue;

    use super::*;

    fn hint(values: Vec<Value>) -> Metadata {
        let list = Value {
            kind: Some(Kind::ListValue(ListValue { values })),
        };
        let hint = Struct {
            fields: [(SUBSET_KEY.to_owned(), list)].into(),
        };
        Metadata {
            filter_metadata: [(SUBSET_NAMESPACE.to_owned(), hint)].into(),
            ..Metadata::default()
        }
    }

    #[test]
    fn a_subset_hint_is_read_as_addresses_and_refused_when_malformed() {
        assert_eq!(subset(None), Ok(None));
        assert_eq!(subset(Some(&Metadata::default())), Ok(None));
        let two = hint(vec![
            string("10.0.0.1:8000".into()),
            string("[fd00::2]:8000".into()),
        ]);
        let read = subset(Some(&two)).unwrap().unwrap();
        assert!(read.contains(&"10.0.0.1:8000".parse().unwrap()));
        assert!(read.contains(&"[fd00::2]:8000".parse().unwrap()));
        assert!(subset(Some(&hint(vec![string("pod-a:8000".into())]))).is_err());
        let number = Value {
            kind: Some(Kind::NumberValue(1.0)),
        };
        assert!(subset(Some(&hint(vec![number]))).is_err());
        let long = (0..=MAX_SUBSET).map(|i| string(format!("10.0.{}.{}:80", i / 250, i % 250)));
        let error = subset(Some(&hint(long.collect()))).unwrap_err();
        assert!(error.contains("more than 4096"), "{error}");
    }

    #[test]
    fn headers_are_read_from_raw_values_and_pseudo_headers_kept_apart() {
        let header = |key: &str, raw: &[u8], value: &str| WireHeader {
            key: key.to_owned(),
            raw_value: raw.to_vec(),
            value: value.to_owned(),
        };
        let wire = WireHeaders {
            headers: vec![
                header(":method", b"POST", ""),
                header(":path", b"/v1/chat/completions?x=1", ""),
                header("x-session-id", b"abc", ""),
                header("x-old", b"", "from value"),
                header("bad header", b"x", ""),
                header("x-bad-value", b"a\nb", ""),
            ],
        };
        let head = head(Some(&wire));
        assert_eq!(head.method, "POST");
        assert_eq!(head.path, "/v1/chat/completions?x=1");
        assert_eq!(head.headers["x-session-id"], "abc");
        assert_eq!(head.headers["x-old"], "from value");
        assert_eq!(head.headers.len(), 2, "invalid headers are left out");
    }

    #[test]
    fn a_body_goes_back_in_bounded_chunks_the_last_ending_it() {
        let body = Bytes::from(vec![b'x'; CHUNK_BYTES * 2 + 1]);
        let chunks = body_chunks(&body, true, true);
        assert_eq!(chunks.len(), 3);
        let read: Vec<(usize, bool)> = chunks
            .iter()
            .map(|c| match &c.response {
                Some(Response::RequestBody(BodyResponse {
                    response: Some(common),
                })) => match &common.body_mutation {
                    Some(BodyMutation {
                        mutation: Some(Mutation::StreamedResponse(streamed)),
                    }) => (streamed.body.len(), streamed.end_of_stream),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            read,
            [(CHUNK_BYTES, false), (CHUNK_BYTES, false), (1, true)]
        );
        assert_eq!(
            body_chunks(&Bytes::new(), true, true).len(),
            1,
            "an empty body still ends"
        );
    }
}
