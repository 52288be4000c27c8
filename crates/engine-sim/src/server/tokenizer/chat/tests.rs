//! The chat template's variables as SGLang and transformers make them, seen through
//! small templates that write them out with `tojson`.

use minijinja::Value;
use serde_json::json;

use super::super::template::ChatTemplate;
use super::{Chat, check};

/// A template of `source` with the tiny tokenizer's special tokens.
fn template(source: &str) -> ChatTemplate {
    ChatTemplate::load(&json!({"chat_template": source, "bos_token": "<s>"})).expect("compiles")
}

/// Renders `template` over a request body's chat fields (JSON text, so keys keep
/// the client's order as a body's do).
fn render(template: &ChatTemplate, body: &str) -> Result<String, String> {
    let body: Value = serde_json::from_str(body).expect("JSON");
    let field = |name: &str| body.get_attr(name).ok().filter(|v| !v.is_undefined());
    let messages: Vec<Value> = field("messages")
        .expect("messages")
        .try_iter()
        .expect("a list")
        .collect();
    let (tools, tool_choice, kwargs) = (
        field("tools"),
        field("tool_choice"),
        field("chat_template_kwargs"),
    );
    let chat = Chat {
        messages: &messages,
        tools: tools.as_ref(),
        tool_choice: tool_choice.as_ref(),
        template_kwargs: kwargs.as_ref(),
    };
    check(&chat)?;
    template.render(&chat)
}

const WEATHER: &str = r#"{"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}"#;

const DUMP: &str = "{{ messages | tojson }}\n{{ tools | tojson }}\n{{ enable_thinking }}";

#[test]
fn messages_tools_and_template_arguments_are_given_as_sglang_gives_them() {
    let body = format!(
        r#"{{"messages": [
            {{"role": "system", "content": "Be brief.", "name": null, "extra": 1}},
            {{"role": "user", "name": "ann", "content": [
                {{"type": "text", "text": "a"}},
                {{"type": "image_url", "image_url": {{"url": "http://x/y.png"}}}},
                {{"type": "text", "text": "b"}}]}},
            {{"role": "assistant", "content": null, "reasoning_content": "think",
              "tool_calls": [{{"id": "call_1", "type": "function", "function": {{
                  "name": "get_weather",
                  "arguments": "{{\"city\": \"Zürich\", \"days\": 1.5}}"}}}}]}},
            {{"role": "tool", "tool_call_id": "call_1", "content": [
                {{"type": "text", "text": "18"}}, {{"type": "text", "text": "C"}}]}},
            {{"role": "assistant", "content": "Sunny."}}],
          "tools": [{WEATHER}],
          "chat_template_kwargs": {{"enable_thinking": false}}}}"#
    );
    let rendered = render(&template(DUMP), &body).unwrap();
    let lines: Vec<&str> = rendered.lines().collect();
    assert_eq!(
        lines[0],
        concat!(
            r#"[{"role": "system", "content": "Be brief."}, "#,
            r#"{"role": "user", "content": "a b"}, "#,
            r#"{"thinking": "think", "role": "assistant", "content": "", "#,
            r#""reasoning_content": "think", "tool_calls": [{"id": "call_1", "index": null, "#,
            r#""type": "function", "function": {"name": "get_weather", "#,
            r#""arguments": {"city": "Zürich", "days": 1.5}}}]}, "#,
            r#"{"role": "tool", "content": "18 C", "tool_call_id": "call_1"}, "#,
            r#"{"role": "user", "content": "Sunny."}]"#,
        ),
        "nulls and unknown fields dropped, parts joined, arguments parsed, \
         the final assistant message a user one"
    );
    assert_eq!(
        lines[1],
        concat!(
            r#"[{"type": "function", "function": {"name": "get_weather", "parameters": "#,
            r#"{"type": "object", "properties": {"city": {"type": "string"}}, "#,
            r#""required": ["city"]}, "description": null}, "defer_loading": null}]"#,
        ),
        "the function's fields in the client's order, description added"
    );
    assert_eq!(lines[2], "False", "chat_template_kwargs are variables");
}

#[test]
fn tool_choice_none_drops_the_tools_and_a_named_choice_keeps_its_tool() {
    let time = WEATHER.replace("get_weather", "get_time");
    let names = template("{% for t in tools or [] %}{{ t.function.name }};{% endfor %}");
    let with = |choice: &str| {
        let body = format!(
            r#"{{"messages": [{{"role": "user", "content": "hi"}}],
                 "tools": [{WEATHER}, {time}], "tool_choice": {choice}}}"#
        );
        render(&names, &body).unwrap()
    };
    assert_eq!(with(r#""auto""#), "get_weather;get_time;");
    assert_eq!(with(r#""none""#), "");
    assert_eq!(
        with(r#"{"type": "function", "function": {"name": "get_time"}}"#),
        "get_time;"
    );
}

#[test]
fn a_template_looping_over_content_gets_the_parts() {
    let source = "{% if false %}{% for part in message.content %}{% endfor %}{% endif %}\
                  {{ messages | tojson }}";
    let body = r#"{"messages": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "hi"},
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]},
        {"role": "tool", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}],
         "tool_call_id": "c"}]}"#;
    assert_eq!(
        render(&template(source), body).unwrap(),
        concat!(
            r#"[{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}, "#,
            r#"{"role": "tool", "tool_call_id": "c", "content": "x y"}]"#,
        ),
        "a tool's text parts joined all the same, after its other fields"
    );
}

#[test]
fn malformed_chats_are_refused() {
    let dump = template(DUMP);
    let bad = [
        r#"{"messages": [{"content": "no role"}]}"#,
        r#"{"messages": [{"role": "user", "content": 3}]}"#,
        r#"{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}"#,
        r#"{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]}"#,
        r#"{"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "[1]"}}]}, {"role": "user", "content": "x"}]}"#,
    ];
    for body in bad {
        assert!(render(&dump, body).is_err(), "{body}");
    }
}
