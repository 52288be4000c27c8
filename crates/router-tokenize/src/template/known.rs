//! Tools seen before: an agent sends the same tool schemas on every turn, so each
//! distinct set is kept, made ready for the template once, with each tool's `tojson`
//! text written once (per set of `tojson` arguments) for every request that sends it.

use std::collections::HashMap;
use std::sync::Arc;

use minijinja::Value;
use minijinja::value::{Enumerator, Object, ObjectRepr};
use parking_lot::Mutex;

/// The most tool sets kept; past it the cache is emptied and filled again.
const MAX_SETS: usize = 64;

/// The longest `tools` text (with its `tool_choice`) kept.
pub(crate) const MAX_KEPT_BYTES: usize = 64 << 10;

/// One tool as the template is given it, with its `tojson` texts.
#[derive(Debug)]
pub(crate) struct KnownTool {
    tool: Value,
    /// `tojson`'s text of the tool, by the filter's arguments.
    json: Mutex<Vec<(String, String)>>,
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
        settings: &str,
        write: impl FnOnce(&Value) -> Result<String, minijinja::Error>,
    ) -> Result<String, minijinja::Error> {
        if let Some((_, text)) = self.json.lock().iter().find(|(s, _)| s == settings) {
            return Ok(text.clone());
        }
        let text = write(&self.tool)?;
        self.json.lock().push((settings.to_owned(), text.clone()));
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
pub(crate) struct KnownTools(Mutex<HashMap<(String, String), Value>>);

impl KnownTools {
    /// The list kept for these texts.
    pub(crate) fn get(&self, tools: &str, choice: &str) -> Option<Value> {
        let sets = self.0.lock();
        sets.get(&(tools.to_owned(), choice.to_owned())).cloned()
    }

    /// Keeps `list` (a list of tools, each made a [`KnownTool`]) for these texts;
    /// returns it.
    pub(crate) fn keep(&self, tools: &str, choice: &str, list: Value) -> Value {
        if tools.len() + choice.len() > MAX_KEPT_BYTES {
            return list;
        }
        let mut sets = self.0.lock();
        if sets.len() >= MAX_SETS {
            sets.clear();
        }
        sets.insert((tools.to_owned(), choice.to_owned()), list.clone());
        list
    }
}
