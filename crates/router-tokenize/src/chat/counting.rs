//! Counting a JSON text's values against a budget without keeping any, before it is
//! parsed into a tree.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};

/// Counts the JSON values of `text` against `budget` (an object's entries count once
/// more, for their keys), keeping none, before a caller parses it into a tree.
///
/// # Errors
/// The budget ran out (then it is 0), or `text` is not JSON.
pub fn count_json_values(text: &str, budget: &mut usize) -> Result<(), serde_json::Error> {
    serde_json::Deserializer::from_str(text).deserialize_any(Count(budget))
}

/// Counts the values it visits against its budget; fails once the budget is spent.
struct Count<'b>(&'b mut usize);

impl Count<'_> {
    fn spend<E: Error>(&mut self) -> Result<(), E> {
        *self.0 = self
            .0
            .checked_sub(1)
            .ok_or_else(|| E::custom("too many values"))?;
        Ok(())
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: Error>(mut self, _: bool) -> Result<(), E> {
        self.spend()
    }

    fn visit_i64<E: Error>(mut self, _: i64) -> Result<(), E> {
        self.spend()
    }

    fn visit_u64<E: Error>(mut self, _: u64) -> Result<(), E> {
        self.spend()
    }

    fn visit_f64<E: Error>(mut self, _: f64) -> Result<(), E> {
        self.spend()
    }

    fn visit_str<E: Error>(mut self, _: &str) -> Result<(), E> {
        self.spend()
    }

    fn visit_unit<E: Error>(mut self) -> Result<(), E> {
        self.spend()
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.spend()?;
        while seq.next_element_seed(Count(&mut *self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.spend()?;
        while map.next_key_seed(Count(&mut *self.0))?.is_some() {
            map.next_value_seed(Count(&mut *self.0))?;
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}
