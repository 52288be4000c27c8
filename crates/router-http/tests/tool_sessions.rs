//! An agent's tool-calling session through a cache-aware router to simulated engines
//! that render chats with the Qwen3 chat template: the router renders each request as
//! the engine does (tools in the system prompt, tool calls with parsed arguments,
//! tool results, template arguments), so the cached prefix it predicts for every turn
//! is exactly the one the engine finds.

use crate::common;
use crate::python_env;

use std::path::PathBuf;

use common::{config, router, url};
use engine_sim::{RunningEngine, SimConfig};
use router_config::{EngineRole, ModelConfig};
use router_http::RunningRouter;
use router_policy::PolicyConfig;
use serde_json::{Value, json};

const MODEL: &str = "m";
const PAGE: u32 = 16;
/// Requests in the session: one a turn.
const TURNS: usize = 10;

/// Five function tools as an agent declares them, keys in the order a client writes
/// them (the prompt holds them in that order), with nested objects, enums, a float
/// and text beyond ASCII; one has no description.
const TOOLS: &str = r#"[
  {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather and forecast for a city, in °C or °F.",
    "parameters": {"type": "object", "properties": {
      "city": {"type": "string", "description": "City name, e.g. Zürich"},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
      "days": {"type": "integer", "minimum": 1, "maximum": 14}},
      "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {
    "name": "search_flights",
    "description": "Search one-way flights between two airports.",
    "parameters": {"type": "object", "properties": {
      "origin": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA code"},
      "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
      "date": {"type": "string", "format": "date"},
      "passengers": {"type": "integer", "minimum": 1, "maximum": 9, "default": 1},
      "cabin": {"type": "string", "enum": ["economy", "premium", "business", "first"]},
      "max_price": {"type": "number", "minimum": 0, "multipleOf": 0.01}},
      "required": ["origin", "destination", "date"]}}},
  {"type": "function", "function": {
    "name": "book_hotel",
    "parameters": {"type": "object", "properties": {
      "city": {"type": "string"},
      "check_in": {"type": "string", "format": "date"},
      "check_out": {"type": "string", "format": "date"},
      "guests": {"type": "integer", "minimum": 1},
      "amenities": {"type": "array", "items": {"type": "string",
        "enum": ["wifi", "breakfast", "parking", "pool", "gym"]}, "uniqueItems": true}},
      "required": ["city", "check_in", "check_out"]}}},
  {"type": "function", "function": {
    "name": "convert_currency",
    "description": "Convert an amount between currencies at today's rate (€, $, £, ¥).",
    "parameters": {"type": "object", "properties": {
      "amount": {"type": "number", "exclusiveMinimum": 0},
      "from": {"type": "string", "minLength": 3, "maxLength": 3},
      "to": {"type": "string", "minLength": 3, "maxLength": 3}},
      "required": ["amount", "from", "to"]}}},
  {"type": "function", "function": {
    "name": "create_calendar_event",
    "description": "Create an event in the user's calendar and invite attendees.",
    "parameters": {"type": "object", "properties": {
      "title": {"type": "string"},
      "start": {"type": "string", "format": "date-time"},
      "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 1440},
      "attendees": {"type": "array", "items": {"type": "object", "properties": {
        "email": {"type": "string", "format": "email"},
        "optional": {"type": "boolean", "default": false}}, "required": ["email"]}},
      "reminder": {"type": "object", "properties": {
        "minutes_before": {"type": "integer"},
        "method": {"type": "string", "enum": ["popup", "email"]}}}},
      "required": ["title", "start"]}}}
]"#;

/// The tool call the assistant makes on turn `turn` (an even one) and the result the
/// agent sends back.
fn tool_round(turn: usize) -> (Value, Value) {
    let (name, arguments, result) = match turn / 2 % 5 {
        0 => (
            "get_weather",
            json!({"city": "Zürich", "unit": "celsius", "days": 3}),
            json!({"temperature": 18.5, "conditions": "sunny", "wind_kmh": 12}),
        ),
        1 => (
            "search_flights",
            json!({"origin": "ZRH", "destination": "LIS", "date": "2025-06-14",
                   "passengers": 2, "cabin": "economy", "max_price": 350.5}),
            json!({"flights": [{"number": "TP 931", "departs": "07:05", "price": 189.9},
                               {"number": "LX 2084", "departs": "12:40", "price": 244.0}]}),
        ),
        2 => (
            "book_hotel",
            json!({"city": "Lisbon", "check_in": "2025-06-14", "check_out": "2025-06-18",
                   "guests": 2, "amenities": ["wifi", "breakfast"]}),
            json!({"confirmation": "HX-20931", "total_eur": 612.4}),
        ),
        3 => (
            "convert_currency",
            json!({"amount": 612.4, "from": "EUR", "to": "CHF"}),
            json!({"amount": 575.66, "rate": 0.94}),
        ),
        _ => (
            "create_calendar_event",
            json!({"title": "Lisbon trip ✈", "start": "2025-06-14T07:05:00+02:00",
                   "duration_minutes": 240,
                   "attendees": [{"email": "ana@example.com", "optional": false}],
                   "reminder": {"minutes_before": 120, "method": "popup"}}),
            json!({"event_id": "evt_77", "status": "created"}),
        ),
    };
    let id = format!("call_{turn}");
    let call = json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": result_text(&arguments)},
    });
    // Results come back as text, once as a list of text parts.
    let content = if turn == 4 {
        json!([{"type": "text", "text": "Result:"}, {"type": "text", "text": result_text(&result)}])
    } else {
        json!(result_text(&result))
    };
    (
        call,
        json!({"role": "tool", "tool_call_id": id, "content": content}),
    )
}

fn result_text(value: &Value) -> String {
    serde_json::to_string(value).expect("JSON")
}

/// What one request of the session showed.
#[derive(Debug)]
struct Turn {
    /// The router's predicted cached tokens (the metric's growth: requests go one
    /// at a time).
    predicted: u64,
    /// The cached tokens the engine reported.
    cached: u64,
    /// The prompt length the router counted.
    routed: u64,
    /// The prompt length the engine counted.
    counted: u64,
}

/// Sends one request of the session and waits until its KV events are applied;
/// returns the assistant's answer and what the turn showed.
async fn turn(h: &Harness, messages: &[Value]) -> (String, Turn) {
    let before = h.predicted().await;
    let body = format!(
        r#"{{"model": "{MODEL}", "messages": {}, "tools": {TOOLS}, "tool_choice": "auto",
            "chat_template_kwargs": {{"enable_thinking": false}}, "max_tokens": 12}}"#,
        Value::from(messages.to_vec()),
    );
    let response = h
        .client
        .post(url(&h.router, "/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the router answers");
    assert_eq!(response.status(), 200);
    let routed = response.headers()["x-switchyard-prompt-tokens"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a number");
    let body: Value = response.json().await.expect("a JSON body");
    h.caught_up().await;
    let predicted = h.predicted().await - before;
    let answer = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("an answer")
        .to_owned();
    let usage = &body["usage"];
    let turn = Turn {
        predicted: predicted as u64,
        cached: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens reported"),
        routed,
        counted: usage["prompt_tokens"].as_u64().expect("prompt tokens"),
    };
    (answer, turn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calling_session_gets_exactly_the_cache_hits_the_router_predicts() {
    let h = Harness::start(2).await;
    let mut messages = vec![
        json!({"role": "system", "content": "You are a travel agent. Use the tools to \
               answer; keep answers short."}),
        json!({"role": "user", "content": "Plan me a weekend in Lisbon from Zürich."}),
    ];
    let mut seen = Vec::new();
    for t in 0..TURNS {
        let (answer, seen_now) = turn(&h, &messages).await;
        seen.push(seen_now);
        if t % 2 == 0 {
            let (call, result) = tool_round(t);
            messages.push(json!({"role": "assistant", "content": answer, "tool_calls": [call]}));
            messages.push(result);
        } else {
            messages.push(json!({"role": "assistant", "content": answer}));
            messages.push(json!({"role": "user", "content": format!("Thanks. Next step {t}?")}));
        }
    }
    h.shutdown().await;
    let later = &seen[1..];
    assert!(
        later.iter().all(|t| t.cached > 0),
        "from the second turn on the engine finds the session's prefix: {seen:#?}"
    );
    assert!(
        later.iter().all(|t| t.predicted == t.cached),
        "the router predicts exactly the engine's hit on every turn: {seen:#?}"
    );
    assert!(
        seen.iter().all(|t| t.routed == t.counted),
        "the router counts each prompt as the engine does: {seen:#?}"
    );
}

/// A cache-aware router over engines that tokenize with the Qwen3 tokenizer, as the
/// router does.
struct Harness {
    router: RunningRouter,
    client: reqwest::Client,
    engines: Vec<RunningEngine>,
}

fn qwen3() -> PathBuf {
    python_env::ensure().join("qwen3/tokenizer.json")
}

impl Harness {
    async fn start(n: usize) -> Self {
        let mut engines = Vec::new();
        for _ in 0..n {
            let mut c = SimConfig::for_tests();
            c.model = MODEL.into();
            c.tokenizer = Some(qwen3());
            c.page_size = PAGE;
            c.kv_port = Some(0);
            c.replay_port = Some(0);
            engines.push(engine_sim::start(c).await.expect("the engine starts"));
        }
        let members = engines
            .iter()
            .enumerate()
            .map(|(i, e)| common::engine(&format!("E{i}"), e, EngineRole::Plain))
            .collect();
        let mut model = ModelConfig::new(MODEL, members);
        model.tokenizer = Some(qwen3());
        model.block_size = PAGE;
        model.policies.plain = Some(
            serde_json::from_value::<PolicyConfig>(
                json!({"type": "cache_aware", "min_matched_tokens": 64, "seed": 1}),
            )
            .expect("a policy"),
        );
        let router = router(config(vec![model])).await;
        Self {
            router,
            client: reqwest::Client::new(),
            engines,
        }
    }

    async fn shutdown(self) {
        self.router.shutdown().await;
        for engine in self.engines {
            engine.shutdown().await;
        }
    }

    /// Waits until the router has applied every KV batch the engines published.
    async fn caught_up(&self) {
        common::kv_caught_up(&self.router, &self.engines).await;
    }

    /// The router's predicted cached tokens so far.
    async fn predicted(&self) -> f64 {
        common::metric(
            &self.router,
            "switchyard_predicted_cached_tokens_total{model=\"m\",stage=\"plain\"}",
        )
        .await
    }
}
