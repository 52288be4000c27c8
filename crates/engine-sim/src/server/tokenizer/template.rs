//! A model's chat template compiled as transformers compiles it (what SGLang renders
//! with): blocks trimmed and left-stripped, loop controls, Python's string methods,
//! `raise_exception` and a `tojson` writing Python's `json.dumps`.

use minijinja::{Environment, ErrorKind, Value};

use super::chat::{Chat, ContentFormat, variables};
use super::json;

/// A compiled chat template and what it is rendered with.
#[derive(Debug)]
pub(super) struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    format: ContentFormat,
}

impl ChatTemplate {
    /// The chat template `tokenizer_config.json` holds (its text, or the one named
    /// `default` of a list).
    pub(super) fn load(config: &serde_json::Value) -> Result<Self, String> {
        let source = match &config["chat_template"] {
            serde_json::Value::String(t) => t.clone(),
            serde_json::Value::Array(named) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .ok_or("tokenizer_config.json has no default chat template")?
                .to_owned(),
            _ => return Err("tokenizer_config.json has no chat_template".into()),
        };
        let special = |key: &str| match &config[key] {
            serde_json::Value::String(s) => s.clone(),
            value => value["content"].as_str().unwrap_or_default().to_owned(),
        };
        let format = content_format(&source);
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
        env.add_filter("tojson", json::tojson);
        env.add_template_owned("chat", source)
            .map_err(|e| e.to_string())?;
        Ok(Self {
            env,
            bos_token: special("bos_token"),
            eos_token: special("eos_token"),
            format,
        })
    }

    /// Renders `chat` for generation: the special tokens, then the request's
    /// `chat_template_kwargs`, then the messages, tools and `add_generation_prompt`
    /// (a later name wins).
    pub(super) fn render(&self, chat: &Chat<'_>) -> Result<String, String> {
        let template = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let mut context: Vec<(String, Value)> = vec![
            ("bos_token".into(), Value::from(self.bos_token.as_str())),
            ("eos_token".into(), Value::from(self.eos_token.as_str())),
        ];
        for (name, value) in variables(chat, self.format)? {
            match context.iter_mut().find(|(k, _)| *k == name) {
                Some(entry) => entry.1 = value,
                None => context.push((name, value)),
            }
        }
        template
            .render(Value::from_iter(context))
            .map_err(|e| format!("rendering the chat template: {e}"))
    }
}

/// The content format SGLang detects in a template: the OpenAI list of parts when
/// the template names a media kind anywhere or loops over a message's `content`
/// (`for part in message.content`, also `msg` or `m`, `.content` or
/// `['content']`, filtered or sliced), else a string.
fn content_format(source: &str) -> ContentFormat {
    let media = ["image", "audio", "video", "vision"]
        .iter()
        .any(|kind| source.contains(kind));
    let loops = source
        .split("{%")
        .skip(1)
        .filter_map(|block| block.split("%}").next())
        .any(loops_over_content);
    if media || loops {
        ContentFormat::Parts
    } else {
        ContentFormat::String
    }
}

/// Whether a statement (the text between `{%` and `%}`) is a `for` over a message's
/// `content`.
fn loops_over_content(statement: &str) -> bool {
    let statement = statement.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
    let Some(rest) = statement.strip_prefix("for") else {
        return false;
    };
    if !rest.starts_with(char::is_whitespace) {
        return false;
    }
    let Some((_, iterated)) = rest.split_once(" in ") else {
        return false;
    };
    let iterated = iterated.trim_start();
    ["message", "msg", "m"].iter().any(|name| {
        iterated.strip_prefix(name).is_some_and(|access| {
            [".content", "['content']", "[\"content\"]"]
                .iter()
                .any(|field| {
                    access.strip_prefix(field).is_some_and(|after| {
                        after
                            .chars()
                            .next()
                            .is_none_or(|c| c.is_whitespace() || c == '|' || c == '[')
                    })
                })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loop_over_a_messages_content_or_a_media_kind_asks_for_parts() {
        let parts = [
            "{%- for part in message.content %}{% endfor %}",
            "{% for c in m['content'] | list -%}{% endfor %}",
            "{%for item in msg.content%}{%endfor%}",
            "{{ 'image' }}",
        ];
        for source in parts {
            assert_eq!(content_format(source), ContentFormat::Parts, "{source}");
        }
        let strings = [
            "{%- if '</think>' in message.content %}{% endif %}",
            "{% for message in messages %}{% endfor %}",
            "{% for p in message.content_parts %}{% endfor %}",
            "{% for w in message.content.split() %}{% endfor %}",
        ];
        for source in strings {
            assert_eq!(content_format(source), ContentFormat::String, "{source}");
        }
    }
}
