//! Tools seen before: an agent sends the same tool schemas on every turn, so each
//! distinct set is kept, made ready for the template once, with each tool's `tojson`
//! text written once (per set of `tojson` arguments) for every request that sends it.

use std::collections::HashMap;
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectRepr};
use parking_lot::Mutex;

use super::json::Settings;

/// The most tool sets kept; past it the cache is emptied and filled again.
const MAX_SETS: usize = 64;

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
        self.json.lock().push((settings.clone(), text.clone()));
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
pub(crate) struct KnownTools(Mutex<HashMap<u64, Vec<KnownSet>>>);

/// One tool set kept: its texts and its list.
#[derive(Debug)]
struct KnownSet {
    tools: String,
    choice: String,
    list: Value,
}

/// The key a set is kept under: a hash of its texts, so a lookup copies nothing.
fn key(tools: &str, choice: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one((tools, choice))
}

impl KnownTools {
    /// The list kept for these texts.
    pub(crate) fn get(&self, tools: &str, choice: &str) -> Option<Value> {
        let sets = self.0.lock();
        sets.get(&key(tools, choice))?
            .iter()
            .find(|set| set.tools == tools && set.choice == choice)
            .map(|set| set.list.clone())
    }

    /// Whether a list is kept for these texts.
    pub(crate) fn contains(&self, tools: &str, choice: &str) -> bool {
        let sets = self.0.lock();
        sets.get(&key(tools, choice)).is_some_and(|kept| {
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
        let mut sets = self.0.lock();
        if sets.values().map(Vec::len).sum::<usize>() >= MAX_SETS {
            sets.clear();
        }
        let kept = sets.entry(key(tools, choice)).or_default();
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
