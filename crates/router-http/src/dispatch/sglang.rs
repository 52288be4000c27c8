//! SGLang's prefill/decode hand-over: both legs sent at once, the same body with the
//! prefill engine's bootstrap address and one fresh bootstrap room (a room a prompt
//! for a batch), the room congruent to the prefill's rank. The decode leg's answer is
//! relayed; the prefill leg is read to its end beside it, and a prefill that fails
//! before the decode answers fails the request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use http::HeaderValue;
use router_policy::Pick;
use router_state::Engine;
use router_upstream::H1Body;

use super::leg::{Target, drain, send, with_fields};
use super::{Answering, Failed, Outgoing, Pair, ranks, relay};
use crate::app::AppContext;
use crate::relay::{Companion, Predicted};

/// A leg in flight, owned so it can outlive the handler as the relay's companion.
type LegFuture = Pin<Box<dyn Future<Output = Result<Response<H1Body>, Failed>> + Send>>;

/// Sends both legs and relays the decode leg's answer, the prefill leg its companion.
pub(super) async fn dispatch(
    ctx: &Arc<AppContext>,
    bucket: HeaderValue,
    prefill: Pick,
    decode: Pick,
    out: &Outgoing,
) -> Result<Response, Failed> {
    // SGLang's decode engine reports the cached tokens the prefill engine found: its
    // answer's usage is compared with the prefill pick's prediction.
    let predicted = Predicted::of(&prefill);
    let Pair {
        prefill,
        decode,
        prefill_rank,
        decode_rank,
        guards,
        headers,
    } = Pair::new(ctx, bucket, prefill, decode);
    let prefill_ranks = prefill.dp_size().get();
    let rooms: Vec<u64> = (0..out.batch.unwrap_or(1))
        .map(|_| ranks::room(ctx.next_room(), prefill_rank, prefill_ranks))
        .collect();
    let body = with_bootstrap(&out.body, &prefill, out.batch, &rooms);
    // The legs' copy: the relayed answer takes `headers` while they live.
    let routing = headers.clone();
    let mut prefill_leg = prefill_leg(
        ctx,
        Arc::clone(&prefill),
        prefill_rank,
        ranks::with_rank(&body, prefill_rank),
        out,
        routing.clone(),
    );
    let to = Target {
        engine: &decode,
        stage: "decode",
        rank: decode_rank,
        routing: &routing,
    };
    let body = ranks::with_rank(&body, decode_rank);
    let decode_leg = send(ctx, to, out.leg, body, &out.request_id, &out.trace);
    tokio::pin!(decode_leg);
    let mut prefill_response: Option<Response<H1Body>> = None;
    let decode_response = loop {
        tokio::select! {
            result = &mut prefill_leg, if prefill_response.is_none() => {
                // A failed prefill returns here, dropping (cancelling) the decode leg.
                prefill_response = Some(result?);
            }
            result = &mut decode_leg => break result?,
        }
    };
    let companion: Companion = match prefill_response {
        Some(response) => Box::pin(drain(response)),
        None => Box::pin(async move { drain(prefill_leg.await.map_err(|e| e.message())?).await }),
    };
    let answering = Answering {
        generating: Some(&decode),
        predicted,
    };
    Ok(relay(
        ctx,
        decode_response,
        Some(companion),
        headers,
        out,
        guards,
        answering,
    ))
}

/// The prefill leg, owned: it may outlive the handler as the relay's companion.
fn prefill_leg(
    ctx: &Arc<AppContext>,
    prefill: Arc<Engine>,
    rank: Option<u32>,
    body: Bytes,
    out: &Outgoing,
    routing: http::HeaderMap,
) -> LegFuture {
    let ctx = Arc::clone(ctx);
    let (request_id, trace, leg) = (out.request_id.clone(), out.trace.clone(), out.leg);
    Box::pin(async move {
        let to = Target {
            engine: &prefill,
            stage: "prefill",
            rank,
            routing: &routing,
        };
        send(&ctx, to, leg, body, &request_id, &trace).await
    })
}

/// The body with the bootstrap fields appended to its top-level object (the body
/// was validated as a JSON object; later keys win over any the client sent). A batch
/// of `n` prompts gets a list of `n` of each field, with a fresh room for every prompt,
/// as SGLang reads a batch's bootstrap fields item by item.
fn with_bootstrap(body: &Bytes, prefill: &Engine, batch: Option<usize>, rooms: &[u64]) -> Bytes {
    use std::fmt::Write;
    let host = prefill
        .url()
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
        .unwrap_or_default();
    let host = serde_json::Value::String(host).to_string();
    let port = prefill
        .bootstrap_port()
        .map_or_else(|| "null".to_owned(), |p| p.to_string());
    let mut fields = String::new();
    match batch {
        None => {
            let _ = write!(
                fields,
                r#""bootstrap_host":{host},"bootstrap_port":{port},"bootstrap_room":{}"#,
                rooms.first().copied().unwrap_or_default()
            );
        }
        Some(n) => {
            let list = |item: &str| vec![item; n].join(",");
            let rooms: Vec<String> = rooms.iter().map(u64::to_string).collect();
            let _ = write!(
                fields,
                r#""bootstrap_host":[{}],"bootstrap_port":[{}],"bootstrap_room":[{}]"#,
                list(&host),
                list(&port),
                rooms.join(",")
            );
        }
    }
    with_fields(body, &fields)
}

#[cfg(test)]
mod tests {
    use router_state::Role;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn bootstrap_fields_are_appended_to_the_object() {
        let prefill = Engine::new("P1", "http://10.0.0.5:30000", "m", Role::Prefill)
            .with_bootstrap_port(8998);
        let body = Bytes::from_static(br#"{"model":"m","messages":[],"bootstrap_room":1} "#);
        let spliced: Value =
            serde_json::from_slice(&with_bootstrap(&body, &prefill, None, &[42])).unwrap();
        assert_eq!(spliced["bootstrap_host"], "10.0.0.5");
        assert_eq!(spliced["bootstrap_port"], 8998);
        assert_eq!(
            spliced["bootstrap_room"], 42,
            "the router's room wins over the client's"
        );
        assert_eq!(spliced["model"], "m");
        let no_port = Engine::new("P2", "http://[::1]:1", "m", Role::Prefill);
        let spliced: Value = serde_json::from_slice(&with_bootstrap(
            &Bytes::from_static(b"{}"),
            &no_port,
            None,
            &[7],
        ))
        .unwrap();
        assert_eq!(
            spliced,
            json!({"bootstrap_host": "::1", "bootstrap_port": null, "bootstrap_room": 7})
        );
        let batch = Bytes::from_static(br#"{"text":["a","b","c"]}"#);
        let spliced: Value =
            serde_json::from_slice(&with_bootstrap(&batch, &prefill, Some(3), &[10, 11, 12]))
                .unwrap();
        assert_eq!(
            spliced,
            json!({
                "text": ["a", "b", "c"],
                "bootstrap_host": ["10.0.0.5", "10.0.0.5", "10.0.0.5"],
                "bootstrap_port": [8998, 8998, 8998],
                "bootstrap_room": [10, 11, 12],
            }),
            "a batch gets a list of each field and a room for every prompt"
        );
    }
}
