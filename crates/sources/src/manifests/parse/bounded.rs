//! YAML documents to JSON values under a budget, so an alias bomb costs a rejection, not the
//! node's memory.
//!
//! A YAML alias (`*name`) repeats its anchored node wherever it appears, and serde_yaml_ng
//! replays the anchor's events for every alias. Its own guard counts alias *jumps* (at most
//! 100 per event of the document) and so stops the classic "billion laughs", but not a
//! quadratic bomb: an anchored list of N items followed by N aliases to it is about 2N events
//! and N² values, a few gigabytes from a one-megabyte file. So the values are built here,
//! each one and each character of every string paid from a budget of twice the file's size
//! (plus some slack): more than an alias-free file of that size can ever hold, and a
//! document that needs more is refused as soon as it overdraws. Nesting is bounded by
//! serde_yaml_ng's recursion limit (128 levels), which this visitor goes through.

use std::cell::Cell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Room for small files that use a few aliases on purpose.
const SLACK: usize = 64 * 1024;

/// What reading a file of `file_len` bytes may build, in values plus string characters.
pub(super) fn budget_for(file_len: usize) -> Cell<usize> {
    Cell::new(file_len.saturating_mul(2).saturating_add(SLACK))
}

/// Builds one [`Value`] (a whole document, or any node inside it), paying from `budget`.
#[derive(Clone, Copy)]
pub(super) struct BoundedValue<'b> {
    pub(super) budget: &'b Cell<usize>,
}

impl BoundedValue<'_> {
    pub(super) fn spend<E: de::Error>(self, cost: usize) -> Result<(), E> {
        let left = self.budget.get();
        if cost > left {
            return Err(E::custom(
                "the document expands to far more than its file's size (YAML aliases repeating \
                 large nodes?); refused",
            ));
        }
        self.budget.set(left - cost);
        Ok(())
    }

    fn number<E: de::Error>(self, number: Number) -> Result<Value, E> {
        self.spend(1)?;
        Ok(Value::Number(number))
    }

    fn string<E: de::Error>(self, text: String) -> Result<Value, E> {
        self.spend(1 + text.len())?;
        Ok(Value::String(text))
    }
}

impl<'de> DeserializeSeed<'de> for BoundedValue<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// The same values as `serde_json::Value`'s own visitor builds.
impl<'de> Visitor<'de> for BoundedValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        self.spend(1)?;
        Ok(Value::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
        self.number(value.into())
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
        self.number(value.into())
    }

    fn visit_i128<E: de::Error>(self, value: i128) -> Result<Value, E> {
        self.number(Number::deserialize(de::value::I128Deserializer::new(value))?)
    }

    fn visit_u128<E: de::Error>(self, value: u128) -> Result<Value, E> {
        self.number(Number::deserialize(de::value::U128Deserializer::new(value))?)
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        self.spend(1)?;
        // JSON has no NaN or infinity; serde_json turns them into null as well.
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
        self.string(value.to_owned())
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Value, E> {
        self.string(value)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.spend(1)?;
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.visit_none()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.spend(1)?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.spend(1)?;
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(BoundedKey(self))? {
            let value = map.next_value_seed(self)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A mapping key, read as a string the way `serde_json::Value` reads keys.
pub(super) struct BoundedKey<'b>(pub(super) BoundedValue<'b>);

impl<'de> DeserializeSeed<'de> for BoundedKey<'_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for BoundedKey<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<String, E> {
        self.0.spend(1 + value.len())?;
        Ok(value.to_owned())
    }
}

/// Implements every `Visitor` method except `visit_seq` and `visit_map` by building the
/// value with [`BoundedValue`] and wrapping it with `$wrap`: for visitors that treat only
/// lists or mappings specially and take any other value as it is.
macro_rules! forward_to_bounded_value {
    ($wrap:expr) => {
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_bool(self.bounded, v).map($wrap)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_i64(self.bounded, v).map($wrap)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_u64(self.bounded, v).map($wrap)
        }
        fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_i128(self.bounded, v).map($wrap)
        }
        fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_u128(self.bounded, v).map($wrap)
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_f64(self.bounded, v).map($wrap)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_str(self.bounded, v).map($wrap)
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_string(self.bounded, v).map($wrap)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_none(self.bounded).map($wrap)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            serde::de::Visitor::visit_unit(self.bounded).map($wrap)
        }
        fn visit_some<D: serde::de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    };
}
pub(super) use forward_to_bounded_value;
