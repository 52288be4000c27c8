//! Tools seen before: an agent sends the same tool schemas on every turn, so each
//! distinct set is kept, made ready for the template once, with each tool's `tojson`
//! text written once (per set of `tojson` arguments) for every request that sends it.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectRepr};
use parking_lot::Mutex;

use super::json::Settings;

/// The most tool sets kept; past it the cache is emptied and filled again.
const MAX_SETS: usize = 64;

/// The most `tojson` texts kept of one tool: a template writes tools with one set of
/// arguments, but one taking them from a request's arguments could be given many.
const MAX_SETTINGS: usize = 4;

/// The longest `tools` text (with its `tool_choice`) kept.
pub const MAX_KEPT_TOOLS_BYTES: usize = 64 << 10;

/// One tool as the template is given it, with its `tojson` texts.
#[derive(Debug)]
pub(crate) struct KnownTool {
    tool: Value,
    /// `tojson`'s text of the tool, by the filter's arguments.
    json: Mutex<Vec<(Settings, Value)>>,
}

impl KnownTool {
    /// `tool` (a map) made a known tool.
    pub(crate) fn wrap(tool: Value) -> Value {
        Value::from_object(Self {
            tool,
            json: Mutex::new(Vec::new()),
        })
    }

    /// The `tojson` text for `settings`, written by `write` the first time.
    pub(crate) fn json(
        &self,
        settings: &Settings,
        write: impl FnOnce(&Value) -> Result<Value, minijinja::Error>,
    ) -> Result<Value, minijinja::Error> {
        if let Some((_, text)) = self.json.lock().iter().find(|(s, _)| s == settings) {
            return Ok(text.clone());
        }
        let text = write(&self.tool)?;
        let mut kept = self.json.lock();
        if kept.len() < MAX_SETTINGS {
            kept.push((settings.clone(), text.clone()));
        }
        Ok(text)
    }
}

impl Object for KnownTool {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.tool.get_item(key).ok().filter(|v| !v.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.tool
                .try_iter()
                .map(Iterator::collect)
                .unwrap_or_default(),
        )
    }
}

/// The tool sets seen, by their `tools` and `tool_choice` texts: each the list the
/// template is given.
#[derive(Debug, Default)]
pub(crate) struct KnownTools {
    sets: Mutex<HashMap<u64, Vec<KnownSet>>>,
    /// Keys drawn per process, so a client cannot make its sets share one.
    hasher: RandomState,
}

/// One tool set kept: its texts and its list.
#[derive(Debug)]
struct KnownSet {
    tools: String,
    choice: String,
    list: Value,
}

impl KnownTools {
    /// The key a set is kept under: a hash of its texts, so a lookup copies nothing.
    fn key(&self, tools: &str, choice: &str) -> u64 {
        self.hasher.hash_one((tools, choice))
    }

    /// The list kept for these texts.
    pub(crate) fn get(&self, tools: &str, choice: &str) -> Option<Value> {
        let sets = self.sets.lock();
        sets.get(&self.key(tools, choice))?
            .iter()
            .find(|set| set.tools == tools && set.choice == choice)
            .map(|set| set.list.clone())
    }

    /// Whether a list is kept for these texts.
    pub(crate) fn contains(&self, tools: &str, choice: &str) -> bool {
        let sets = self.sets.lock();
        sets.get(&self.key(tools, choice)).is_some_and(|kept| {
            kept.iter()
                .any(|set| set.tools == tools && set.choice == choice)
        })
    }

    /// Keeps `list` (a list of tools, each made a [`KnownTool`]) for these texts;
    /// returns it.
    pub(crate) fn keep(&self, tools: &str, choice: &str, list: Value) -> Value {
        if tools.len() + choice.len() > MAX_KEPT_TOOLS_BYTES {
            return list;
        }
        let mut sets = self.sets.lock();
        if sets.values().map(Vec::len).sum::<usize>() >= MAX_SETS {
            sets.clear();
        }
        let kept = sets.entry(self.key(tools, choice)).or_default();
        // Another request may have kept the same set meanwhile.
        if let Some(set) = kept
            .iter()
            .find(|set| set.tools == tools && set.choice == choice)
        {
            return set.list.clone();
        }
        kept.push(KnownSet {
            tools: tools.to_owned(),
            choice: choice.to_owned(),
            list: list.clone(),
        });
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_keeps_a_few_of_its_tojson_texts_however_many_settings_it_is_written_with() {
        let tool = KnownTool::wrap(Value::from_serialize(serde_json::json!({"name": "f"})));
        let tool = tool.downcast_object_ref::<KnownTool>().unwrap();
        for indent in 0..10 {
            let settings = Settings::indented(indent);
            let text = tool
                .json(&settings, |_| Ok(Value::from(format!("{indent}"))))
                .unwrap();
            assert_eq!(text.as_str(), Some(format!("{indent}").as_str()));
        }
        assert_eq!(tool.json.lock().len(), MAX_SETTINGS);
        let again = tool
            .json(&Settings::indented(1), |_| unreachable!("kept"))
            .unwrap();
        assert_eq!(again.as_str(), Some("1"), "a kept text is given back");
    }
}
