//! vLLM's prefill/decode hand-over, shaped as its NIXL connector shapes it: a prefill
//! engine asked for a remote decode (`kv_transfer_params.do_remote_decode`) answers
//! its one token with `kv_transfer_params` naming its blocks and its side channel; a
//! decode engine given those params takes the blocks from that side channel (once)
//! before it generates, and refuses params no prefill offered.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::bootstrap::Transfer;
use super::state::AppState;

/// How long a decode engine waits for a prefill's side channel.
const SIDE_CHANNEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks a request to a vLLM prefill engine the way vLLM's proxy must send it:
/// asking for a remote decode, not streamed (a stream carries no
/// `kv_transfer_params`), for one token.
///
/// # Errors
/// What the request lacks, for a 400.
pub(crate) fn check_prefill(
    params: Option<&Value>,
    stream: bool,
    max_tokens: Option<u64>,
) -> Result<(), String> {
    if params.and_then(|p| p.get("do_remote_decode")) != Some(&Value::Bool(true)) {
        return Err(
            "a vLLM prefill engine needs kv_transfer_params with do_remote_decode: true".into(),
        );
    }
    if stream {
        return Err(
            "a prefill leg must not be streamed: its kv_transfer_params would be lost".into(),
        );
    }
    if max_tokens != Some(1) {
        return Err("a prefill leg generates one token (max_tokens: 1)".into());
    }
    Ok(())
}

/// Offers the blocks of a computed prompt of `prompt_tokens` and returns the
/// `kv_transfer_params` the prefill answers with.
pub(crate) fn offer(app: &AppState, prompt_tokens: u64) -> Value {
    let Some(rooms) = &app.rooms else {
        return Value::Null;
    };
    let n = app.next_id();
    let id = format!("sim-transfer-{n}");
    let blocks = prompt_tokens.div_ceil(u64::from(app.config.page_size));
    let block_ids: Vec<u64> = (0..blocks).map(|i| (n << 20) | i).collect();
    rooms.offer(
        id.clone(),
        Transfer {
            engine_id: app.engine_id(),
            block_ids: block_ids.clone(),
            prompt_tokens,
        },
    );
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": app.engine_id(),
        "remote_block_ids": [block_ids],
        "remote_request_id": id,
        "remote_host": app.config.host.to_string(),
        "remote_port": app.ports().bootstrap,
        "tp_size": 1,
    })
}

/// The fields of `kv_transfer_params` a decode engine reads.
#[derive(Debug, Deserialize)]
struct Remote {
    do_remote_prefill: bool,
    remote_engine_id: String,
    remote_block_ids: Vec<Vec<u64>>,
    remote_request_id: String,
    remote_host: String,
    remote_port: u16,
}

/// Takes the blocks `params` name from the prefill's side channel.
///
/// # Errors
/// Why the params did not come from a prefill (or were used already), for a 400.
pub(crate) async fn receive(app: &AppState, params: &Value) -> Result<(), String> {
    let invalid = |why: String| format!("invalid KVTransferParams: {why}");
    let remote = Remote::deserialize(params).map_err(|e| invalid(e.to_string()))?;
    if !remote.do_remote_prefill {
        return Err(invalid("do_remote_prefill is not set".into()));
    }
    let host = if remote.remote_host.contains(':') {
        format!("[{}]", remote.remote_host)
    } else {
        remote.remote_host.clone()
    };
    let url = format!(
        "http://{host}:{}/transfers/{}",
        remote.remote_port, remote.remote_request_id
    );
    let response = app
        .client
        .post(&url)
        .timeout(SIDE_CHANNEL_TIMEOUT)
        .send()
        .await
        .map_err(|e| invalid(format!("the prefill's side channel is unreachable: {e}")))?;
    if !response.status().is_success() {
        return Err(invalid(format!(
            "no prefill offered {} (or it was taken already)",
            remote.remote_request_id
        )));
    }
    let transfer: Transfer = response
        .json()
        .await
        .map_err(|e| invalid(format!("the side channel answered garbage: {e}")))?;
    if transfer.engine_id != remote.remote_engine_id
        || remote.remote_block_ids.first() != Some(&transfer.block_ids)
    {
        return Err(invalid(
            "the engine id or block ids differ from what the prefill offered".into(),
        ));
    }
    Ok(())
}
