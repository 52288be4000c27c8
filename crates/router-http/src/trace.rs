//! W3C trace context from a client (`traceparent`, `tracestate`), checked and passed
//! on to every engine a request is sent to (both legs of a PD pair), so an engine's
//! spans join the client's trace: unchanged when the router records no spans of its
//! own, and naming the router's `dispatch` span as the parent when it does
//! (`spans.rs`); `tracestate` is passed on as the client sent it.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::KeyValue;

use crate::spans::{ChildSpan, RequestSpan};

/// `traceparent`.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `tracestate`.
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
/// The longest `tracestate` passed on: what the specification asks every hop to keep.
const MAX_TRACESTATE_BYTES: usize = 512;
/// The longest `traceparent` of a later version read (version 00 is 55 bytes).
const MAX_TRACEPARENT_BYTES: usize = 256;

/// A client's trace context, valid as the W3C Trace Context specification says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceContext {
    parent: HeaderValue,
    state: Option<HeaderValue>,
}

impl TraceContext {
    /// The context of a request's headers: `None` without a valid `traceparent`
    /// (then `tracestate` is ignored too, as the specification says); a
    /// `tracestate` sent twice or over 512 bytes is left out.
    pub(crate) fn of(headers: &HeaderMap) -> Option<Self> {
        let mut parents = headers.get_all(TRACEPARENT).iter();
        let parent = parents.next().filter(|_| parents.next().is_none())?;
        if !valid_parent(parent.as_bytes()) {
            return None;
        }
        let mut states = headers.get_all(TRACESTATE).iter();
        let state = states
            .next()
            .filter(|_| states.next().is_none())
            .filter(|s| s.len() <= MAX_TRACESTATE_BYTES && s.to_str().is_ok())
            .cloned();
        Some(Self {
            parent: parent.clone(),
            state,
        })
    }

    /// The trace id, parent id and flags of version 00's fields (a later version
    /// starts with the same fields).
    pub(crate) fn ids(&self) -> Option<(&str, &str, &str)> {
        let value = self.parent.to_str().ok()?;
        Some((value.get(3..35)?, value.get(36..52)?, value.get(53..55)?))
    }
}

/// What a request's legs carry of its trace: the client's context, and the request's
/// span when the router records spans.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tracing {
    /// The client's valid context, if any.
    pub(crate) client: Option<TraceContext>,
    /// The request's span, when `traces` is configured.
    pub(crate) span: Option<Arc<RequestSpan>>,
}

impl Tracing {
    /// The trace of one leg to `engine` at `stage`: with spans, a `dispatch` span and
    /// a `traceparent` naming it; without, the client's context.
    pub(crate) fn leg(&self, stage: &'static str, engine: &str) -> LegTrace {
        let span = self.span.as_ref().map(|request| {
            request.child(
                "dispatch",
                vec![
                    KeyValue::new("switchyard.stage", stage),
                    KeyValue::new("switchyard.engine", engine.to_owned()),
                ],
            )
        });
        let parent = match &span {
            Some(span) => span.traceparent(),
            None => self.client.as_ref().map(|c| c.parent.clone()),
        };
        let state = self.client.as_ref().and_then(|c| c.state.clone());
        LegTrace {
            headers: parent
                .map(|p| (TRACEPARENT, p))
                .into_iter()
                .chain(state.map(|s| (TRACESTATE, s)))
                .collect(),
            span,
        }
    }
}

/// One leg's trace headers, and its span while it is sent.
#[derive(Debug)]
pub(crate) struct LegTrace {
    headers: Vec<(HeaderName, HeaderValue)>,
    /// The leg's `dispatch` span, when the router records spans.
    pub(crate) span: Option<ChildSpan>,
}

impl LegTrace {
    /// The headers to send the engine.
    pub(crate) fn headers(&self) -> impl Iterator<Item = (HeaderName, &HeaderValue)> {
        self.headers
            .iter()
            .map(|(name, value)| (name.clone(), value))
    }
}

/// `version-traceparent`: `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`,
/// lowercase, ids not all zeros; a later version (not `ff`) may append `-...`.
fn valid_parent(value: &[u8]) -> bool {
    let hex = |s: &[u8]| {
        s.iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    let nonzero = |s: &[u8]| s.iter().any(|&b| b != b'0');
    if value.len() < 55 || value.len() > MAX_TRACEPARENT_BYTES {
        return false;
    }
    let (version, trace, parent, flags) =
        (&value[..2], &value[3..35], &value[36..52], &value[53..55]);
    let dashes = value[2] == b'-' && value[35] == b'-' && value[52] == b'-';
    let tail_ok = match version {
        b"00" => value.len() == 55,
        _ => value.len() == 55 || value[55] == b'-',
    };
    dashes
        && tail_ok
        && hex(version)
        && version != b"ff"
        && hex(trace)
        && nonzero(trace)
        && hex(parent)
        && nonzero(parent)
        && hex(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn context(pairs: &[(&'static str, &str)]) -> Option<TraceContext> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).unwrap());
        }
        TraceContext::of(&headers)
    }

    /// What a leg sends when the router records no spans.
    fn sent(context: &TraceContext) -> Vec<(String, String)> {
        let tracing = Tracing {
            client: Some(context.clone()),
            span: None,
        };
        tracing
            .leg("plain", "A")
            .headers()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn a_valid_context_is_passed_on_unchanged() {
        let c = context(&[("traceparent", PARENT), ("tracestate", "congo=t61rcWkgMzE")]).unwrap();
        assert_eq!(
            sent(&c),
            [
                ("traceparent".to_owned(), PARENT.to_owned()),
                ("tracestate".to_owned(), "congo=t61rcWkgMzE".to_owned())
            ]
        );
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(
            context(&[("traceparent", later)]).is_some(),
            "a later version"
        );
    }

    #[test]
    fn invalid_contexts_are_not_passed_on() {
        for parent in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(
                context(&[("traceparent", parent), ("tracestate", "a=b")]),
                None,
                "{parent:?}"
            );
        }
        let long = format!(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-{}",
            "x".repeat(300)
        );
        assert_eq!(context(&[("traceparent", &long)]), None);
        assert_eq!(
            context(&[("traceparent", PARENT), ("traceparent", PARENT)]),
            None,
            "two parents"
        );
    }

    #[test]
    fn an_unusable_tracestate_is_left_out() {
        for state in [&"k=v,".repeat(200)[..], "a=b"] {
            let c = context(&[("traceparent", PARENT), ("tracestate", state)]).unwrap();
            let names: Vec<String> = sent(&c).into_iter().map(|(n, _)| n).collect();
            assert_eq!(
                names.len(),
                if state.len() > 512 { 1 } else { 2 },
                "{state:?}"
            );
        }
        let c = context(&[
            ("traceparent", PARENT),
            ("tracestate", "a=b"),
            ("tracestate", "c=d"),
        ])
        .unwrap();
        assert_eq!(sent(&c).len(), 1, "two tracestate headers are left out");
    }
}
