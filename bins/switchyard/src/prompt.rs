//! `switchyard prompt`: the token ids the router routes requests on, for a model's
//! tokenizer and serving engine, so an operator (or a test against the engine's own
//! libraries) sees the prompt the router computes.
//!
//! It reads one JSON request body per line on stdin and writes one JSON line per
//! body on stdout: `{"ids": [...]}`, or `{"error": "..."}` with the message the
//! router's 400 would carry.

use std::io::{BufRead, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use router_tokenize::{ChatTokenizer, Dialect};
use serde_json::json;

/// The longest line read: the router's own body limit.
const MAX_LINE_BYTES: usize = router_http::MAX_BODY_BYTES;

/// `switchyard prompt`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct PromptArgs {
    /// The model's `tokenizer.json` (its chat template is in the
    /// `tokenizer_config.json` beside it).
    #[arg(long)]
    tokenizer: PathBuf,
    /// The engine serving the model, whose way of rendering chats is followed.
    #[arg(long, value_enum, default_value = "sglang")]
    served_by: Engine,
    /// The endpoint the bodies are sent to.
    #[arg(long, default_value = "/v1/chat/completions")]
    endpoint: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Engine {
    Sglang,
    Vllm,
}

pub(crate) fn run(args: &PromptArgs) -> anyhow::Result<()> {
    let dialect = match args.served_by {
        Engine::Sglang => Dialect::Sglang,
        Engine::Vllm => Dialect::Vllm,
    };
    // As the router keeps it: with its default prefix cache.
    let tokenizer = ChatTokenizer::load(&args.tokenizer)
        .context("loading the tokenizer")?
        .with_prefix_cache(router_config::DEFAULT_TOKENIZE_CACHE_BYTES)
        .with_dialect(dialect);
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut line = Vec::new();
    let mut input = stdin.take(0);
    loop {
        line.clear();
        // The bound, its newline, and one byte more to tell a line too long.
        input.set_limit(MAX_LINE_BYTES as u64 + 2);
        let read = input.read_until(b'\n', &mut line)?;
        if read == 0 {
            return Ok(());
        }
        let body = line.strip_suffix(b"\n").unwrap_or(&line);
        let answer = if body.len() > MAX_LINE_BYTES {
            if !line.ends_with(b"\n") {
                input.set_limit(u64::MAX);
                skip_line(&mut input)?;
            }
            json!({"error": format!("the body is larger than {MAX_LINE_BYTES} bytes")})
        } else {
            match router_http::prompt_ids(&args.endpoint, body.trim_ascii(), &tokenizer) {
                Ok(ids) => json!({"ids": ids}),
                Err(e) => json!({"error": e.message()}),
            }
        };
        writeln!(stdout, "{answer}")?;
        stdout.flush()?;
    }
}

/// Reads past the end of the current line without keeping it.
fn skip_line(input: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let buffer = input.fill_buf()?;
        if buffer.is_empty() {
            return Ok(());
        }
        match buffer.iter().position(|&b| b == b'\n') {
            Some(end) => {
                input.consume(end + 1);
                return Ok(());
            }
            None => {
                let len = buffer.len();
                input.consume(len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_skipped_without_being_kept() {
        let mut input = std::io::BufReader::with_capacity(4, &b"0123456789abcdef\nnext\n"[..]);
        skip_line(&mut input).unwrap();
        let mut rest = String::new();
        input.read_line(&mut rest).unwrap();
        assert_eq!(rest, "next\n");
    }
}
