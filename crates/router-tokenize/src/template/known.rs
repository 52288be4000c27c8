//! Tools seen before: an agent sends the same tool schemas on every turn, so each
//! distinct set is kept, made ready for the template once, with each tool's `tojson`
//! text written once (per set of `tojson` arguments) for every request that sends it.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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

/// The most bytes of `tojson` texts one tool set keeps: `tojson` with an indent can
/// write a deeply nested schema many times the size of its JSON, and a text past
/// what is left is written for each render instead of kept.
const MAX_KEPT_JSON_BYTES: usize = 4 * MAX_KEPT_TOOLS_BYTES;

/// One tool as the template is given it, with its `tojson` texts.
#[derive(Debug)]
pub(crate) struct KnownTool {
    tool: Value,
    /// `tojson`'s text of the tool, by the filter's arguments.
    json: Mutex<Vec<(Settings, Value)>>,
    /// The bytes its set may still keep of `tojson` texts.
    budget: Arc<AtomicUsize>,
}

impl KnownTool {
    /// Each of `tools` (maps) made a known tool, sharing one budget of `tojson`
    /// texts.
    pub(crate) fn wrap_all(tools: impl Iterator<Item = Value>) -> Vec<Value> {
        let budget = Arc::new(AtomicUsize::new(MAX_KEPT_JSON_BYTES));
        tools
            .map(|tool| {
                Value::from_object(Self {
                    tool,
                    json: Mutex::new(Vec::new()),
                    budget: Arc::clone(&budget),
                })
            })
            .collect()
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
        let size = text.as_str().map_or(0, str::len);
        let mut kept = self.json.lock();
        if kept.len() < MAX_SETTINGS
            && self
                .budget
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    left.checked_sub(size)
                })
                .is_ok()
        {
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
    /// Whether chats sending it still tokenize much anew (the template writes the
    /// tools where the prefix cache does not reach, or their `tojson` texts are
    /// large): such chats are not cheap, kept set or not.
    costly: AtomicBool,
}

impl KnownTools {
    /// The key a set is kept under: a hash of its texts, so a lookup copies nothing.
    fn key(&self, tools: &str, choice: &str) -> u64 {
        self.hasher.hash_one((tools, choice))
    }

    /// Calls `with` on the set kept for these texts, if any; a text too long to be
    /// kept is not hashed.
    fn find<T>(&self, tools: &str, choice: &str, with: impl FnOnce(&KnownSet) -> T) -> Option<T> {
        if tools.len() + choice.len() > MAX_KEPT_TOOLS_BYTES {
            return None;
        }
        let key = self.key(tools, choice);
        let sets = self.sets.lock();
        sets.get(&key)?
            .iter()
            .find(|set| set.tools == tools && set.choice == choice)
            .map(with)
    }

    /// The list kept for these texts.
    pub(crate) fn get(&self, tools: &str, choice: &str) -> Option<Value> {
        self.find(tools, choice, |set| set.list.clone())
    }

    /// Whether a list is kept for these texts and chats sending it were cheap.
    pub(crate) fn cheap(&self, tools: &str, choice: &str) -> bool {
        self.find(tools, choice, |set| !set.costly.load(Ordering::Relaxed))
            .unwrap_or(false)
    }

    /// Marks the set kept for these texts costly ([`KnownSet::costly`]).
    pub(crate) fn mark_costly(&self, tools: &str, choice: &str) {
        self.find(tools, choice, |set| {
            set.costly.store(true, Ordering::Relaxed)
        });
    }

    /// Keeps `list` (a list of tools, each made a [`KnownTool`]) for these texts;
    /// returns it.
    pub(crate) fn keep(&self, tools: &str, choice: &str, list: Value) -> Value {
        if tools.len() + choice.len() > MAX_KEPT_TOOLS_BYTES {
            return list;
        }
        let key = self.key(tools, choice);
        let mut sets = self.sets.lock();
        if sets.values().map(Vec::len).sum::<usize>() >= MAX_SETS {
            sets.clear();
        }
        let kept = sets.entry(key).or_default();
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
            costly: AtomicBool::new(false),
        });
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_keeps_a_few_of_its_tojson_texts_however_many_settings_it_is_written_with() {
        let tools = KnownTool::wrap_all(std::iter::once(Value::from_serialize(
            serde_json::json!({"name": "f"}),
        )));
        let tool = tools[0].downcast_object_ref::<KnownTool>().unwrap();
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
