//! A model's chat template, rendered as transformers renders it: Jinja with
//! `trim_blocks`, `lstrip_blocks` and loop controls, Python's string methods, and
//! the globals and filters transformers adds (`raise_exception`, `strftime_now`, a
//! `tojson` that writes what Python's `json.dumps` writes).

mod clock;
mod json;
mod known;

pub use known::MAX_KEPT_TOOLS_BYTES;
pub(crate) use known::{KnownTool, KnownTools};

use minijinja::{Environment, ErrorKind, Value};
use serde_json::Value as Json;

use crate::chat::{Dialect, Rendering};

/// What the template wants a message's `content` to be, as the engines detect it:
/// a string, or the OpenAI list of parts (when the template loops over it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContentFormat {
    String,
    OpenAi,
}

/// A compiled chat template and the special tokens it is given.
#[derive(Debug)]
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// The named special tokens `tokenizer_config.json` sets, as transformers passes
    /// them.
    specials: Vec<(String, Value)>,
    /// Whether the template loops over a message's `content`.
    loops_over_content: bool,
    /// Whether it names a media kind (image, audio, video, vision).
    names_media: bool,
    developer: bool,
}

impl ChatTemplate {
    /// The template `tokenizer_config.json` holds (`None`: it has none).
    ///
    /// # Errors
    /// It is not a string or a list of named templates, or does not compile.
    pub(crate) fn load(config: &Json) -> Result<Option<Self>, String> {
        let source = match &config["chat_template"] {
            Json::String(t) => t.clone(),
            Json::Array(named) => match named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
            {
                Some(t) => t.to_owned(),
                None => return Ok(None),
            },
            Json::Null => return Ok(None),
            _ => return Err("chat_template must be a string or a list".to_owned()),
        };
        let loops_over_content = loops_over_content(&source);
        let names_media = ["image", "audio", "video", "vision"]
            .iter()
            .any(|kind| source.contains(kind));
        let developer = source.contains("\"developer\"") || source.contains("'developer'");
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |format: String| {
            clock::Moment::now().format(&format)
        });
        env.add_filter("tojson", json::tojson);
        env.add_template_owned("chat", source)
            .map_err(|e| format!("chat template: {e}"))?;
        Ok(Some(Self {
            env,
            specials: specials(config),
            loops_over_content,
            names_media,
            developer,
        }))
    }

    /// The content format `dialect`'s engine detects: vLLM looks for a loop over
    /// a message's content, SGLang first for a media kind's name anywhere.
    pub(crate) fn format(&self, dialect: Dialect) -> ContentFormat {
        let openai = match dialect {
            Dialect::Vllm => self.loops_over_content,
            Dialect::Sglang => self.names_media || self.loops_over_content,
        };
        if openai {
            ContentFormat::OpenAi
        } else {
            ContentFormat::String
        }
    }

    /// Whether the template names the `developer` role (vLLM turns developer
    /// messages into system ones for a template that does not).
    pub(crate) fn mentions_developer(&self) -> bool {
        self.developer
    }

    /// Renders `rendering`: its arguments over the request's
    /// `chat_template_kwargs` over the special tokens, as transformers merges them.
    /// A render past [`MAX_PROMPT_BYTES`] is stopped there and refused.
    pub(crate) fn render(&self, rendering: &Rendering) -> Result<String, minijinja::Error> {
        let template = self.env.get_template("chat")?;
        // A later entry of a name takes the place of an earlier one.
        let context = Value::from_iter(
            self.specials
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .chain(
                    rendering
                        .kwargs
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.clone())),
                )
                .chain(rendering.context.iter().map(|(k, v)| (*k, v.clone()))),
        );
        let mut out = Bounded {
            bytes: Vec::new(),
            over: false,
        };
        let rendered = template.render_captured_to(context, &mut out);
        if out.over {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("the rendered prompt is larger than {MAX_PROMPT_BYTES} bytes"),
            ));
        }
        rendered?;
        String::from_utf8(out.bytes).map_err(|_| {
            minijinja::Error::new(ErrorKind::InvalidOperation, "the prompt is not UTF-8")
        })
    }
}

/// The most bytes a rendered prompt may hold: twice the largest body a client may
/// send, past what any engine accepts, and a bound on what a template repeating a
/// long argument in every turn could make.
pub const MAX_PROMPT_BYTES: usize = 64 << 20;

/// A render's output, refused once past [`MAX_PROMPT_BYTES`].
struct Bounded {
    bytes: Vec<u8>,
    /// Whether a write would have gone past the bound.
    over: bool,
}

impl std::io::Write for Bounded {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + bytes.len() > MAX_PROMPT_BYTES {
            self.over = true;
            return Err(std::io::Error::other("the rendered prompt is too large"));
        }
        self.bytes.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The special tokens transformers (5) gives a template: each named `*_token` the
/// config sets (a string, or an added token's `content`); one it does not set is
/// undefined in the template.
fn specials(config: &Json) -> Vec<(String, Value)> {
    const NAMED: [&str; 7] = [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ];
    NAMED
        .iter()
        .filter_map(|key| {
            let text = match &config[key] {
                Json::String(s) => Some(s.clone()),
                v => v["content"].as_str().map(str::to_owned),
            }?;
            Some(((*key).to_owned(), Value::from(text)))
        })
        .collect()
}

/// Whether the template loops over a message's `content` (the engines' detection:
/// the template then wants the list of parts): a `for` over `message.content`,
/// `msg.content` or `m.content` (or `...['content']`).
fn loops_over_content(source: &str) -> bool {
    let words: Vec<&str> = source
        .split(|c: char| c.is_whitespace() || c == '%' || c == '{' || c == '}' || c == '-')
        .filter(|w| !w.is_empty())
        .collect();
    words.windows(4).any(|w| {
        let iterated = w[3]
            .strip_prefix("message")
            .or_else(|| w[3].strip_prefix("msg"))
            .or_else(|| w[3].strip_prefix('m'));
        w[0] == "for"
            && w[2] == "in"
            && iterated.is_some_and(|rest| {
                rest == ".content" || rest == "['content']" || rest == "[\"content\"]"
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loop_over_a_messages_content_asks_for_parts() {
        assert!(loops_over_content("{%- for part in message.content %}"));
        assert!(loops_over_content("{% for c in m['content'] -%}"));
        assert!(loops_over_content("{%for item in msg.content%}"));
        assert!(!loops_over_content(
            "{%- if '</think>' in message.content %}"
        ));
        assert!(!loops_over_content("{% for message in messages %}"));
    }
}
