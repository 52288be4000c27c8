//! Bodies built to make the router hold much (huge arrays, a million messages):
//! refused, and within a memory bound while they are read.

use bytes::Bytes;

use super::tiny_tokenizer;
use crate::error::ApiError;
use crate::prepare::{CHAT, COMPLETIONS, Endpoint, GENERATE, Prepared, Tokenize, chat, prepare};

/// The peak resident memory of this process so far, in bytes (each test runs in a
/// process of its own under nextest, so the peak is this test's).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// Prepares `body` for `endpoint` with the tiny tokenizer, running the tokenization
/// it hands over, and returns the error with the growth of the peak memory it took.
fn refused_within(endpoint: &'static Endpoint, body: String) -> (ApiError, u64) {
    let body = Bytes::from(body);
    assert!(body.len() > 28 << 20, "a body near the largest accepted");
    let before = peak_rss();
    let outcome = prepare(endpoint, &body, |_| Ok(Some(tiny_tokenizer())))
        .and_then(|(_, t)| t.map(Tokenize::run).transpose());
    let grown = peak_rss().saturating_sub(before);
    (outcome.expect_err("refused"), grown)
}

/// Far less than one tree node per element of a 30 MiB array (which took 600 MiB
/// and more).
const NO_TREE: u64 = 48 << 20;

#[test]
fn a_scalar_field_sent_as_a_huge_array_is_refused_without_being_held() {
    let body = format!(
        r#"{{"model":"m","prompt":"hi","temperature":[{}[]]}}"#,
        "[],".repeat(10 << 20)
    );
    let (error, grown) = refused_within(&COMPLETIONS, body);
    assert_eq!(error.code(), "invalid_parameter", "{}", error.message());
    assert!(grown < NO_TREE, "peak memory grew {} MiB", grown >> 20);
}

#[test]
fn a_huge_list_of_sampling_params_is_refused_without_being_held() {
    let body = format!(
        r#"{{"text":"hi","sampling_params":[{}{{}}]}}"#,
        "{},".repeat(10 << 20)
    );
    let (error, grown) = refused_within(&GENERATE, body);
    assert!(
        error.message().contains("more than 65536 elements"),
        "{}",
        error.message()
    );
    assert!(grown < NO_TREE, "peak memory grew {} MiB", grown >> 20);
}

#[test]
fn a_chat_of_a_million_tiny_messages_is_refused_before_its_template_is_rendered() {
    let message = r#"{"role":"user","content":""},"#;
    let body = format!(
        r#"{{"model":"m","messages":[{}{{"role":"user","content":""}}]}}"#,
        message.repeat(1_080_000)
    );
    let (error, grown) = refused_within(&CHAT, body);
    assert!(
        error.message().contains("more than 65536 elements"),
        "{}",
        error.message()
    );
    assert!(grown < NO_TREE, "peak memory grew {} MiB", grown >> 20);
}

#[test]
fn the_messages_values_are_bounded_in_all() {
    let content = format!("[{}1]", "1,".repeat(chat::MAX_MESSAGE_VALUES));
    let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":{content}}}]}}"#);
    let error = run_raw(&body).expect_err("too many values");
    assert_eq!(error.code(), "invalid_messages");
    assert!(
        error.message().contains("JSON values in all"),
        "{}",
        error.message()
    );
}

fn run_raw(body: &str) -> Result<Prepared, ApiError> {
    let bytes = Bytes::from(body.to_owned());
    prepare(&CHAT, &bytes, |_| Ok(None)).map(|(prepared, _)| prepared)
}
