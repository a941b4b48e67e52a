//! Documents read one list item at a time.
//!
//! `kubectl get -o yaml` writes a whole cluster as one `kind: List` document. Built as one
//! value tree, that document costs about eight times its file's size (147 MB for the
//! 18.5 MB file of 10k Services x 10 endpoints, measured with massif), and the tree was
//! the proxy's peak memory. So the `items` of a document are built one at a time and
//! handed to the decoder as soon as each is complete: only one item's tree is alive at
//! once, and what stays is the typed objects the proxy needs anyway.
//!
//! An item is decoded on the spot when it names its own `kind` and `apiVersion` (what
//! `kubectl get` writes), since a list's own kind and version would not change it. An item
//! that leans on the list's (items of a typed list as the API server returns them) waits
//! for the end of the document, where the list's `kind` is known: JSON keys are sorted, so
//! `kind` comes after `items`. If the document turns out not to be a list, its items'
//! results are dropped and it is decoded without them, as the API types ignore `items`.
//!
//! Every value is still paid from the file's budget (`bounded`), JSON included.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::bounded::{BoundedKey, BoundedValue, forward_to_bounded_value};
use super::{Decoder, Outcome};

/// One document as read: a plain value, or a mapping whose `items` list was read item by item.
pub(super) enum Document {
    Plain(Value),
    Listed {
        fields: Map<String, Value>,
        items: Vec<Item>,
    },
}

/// One item of a streamed `items` list.
pub(super) enum Item {
    /// Decoded while reading: what it contributes, in order.
    Decoded(Vec<Outcome>),
    /// Needs the list's kind or apiVersion, known only at the end of the document.
    Deferred(Value),
}

/// Where a file stopped being YAML/JSON: the document number (from 1), the position if
/// the parser knows it, and why.
pub(super) struct SyntaxError {
    pub document: usize,
    pub position: Option<(usize, usize)>,
    pub message: String,
}

/// Reads the YAML documents of `bytes`, handing each to `each` with its number (from 1).
pub(super) fn yaml_documents(
    bytes: &[u8],
    decoder: &Decoder<'_>,
    mut each: impl FnMut(usize, Document),
) -> Result<(), SyntaxError> {
    let budget = super::bounded::budget_for(bytes.len());
    for (index, document) in serde_yaml_ng::Deserializer::from_slice(bytes).enumerate() {
        let seed = DocumentSeed::new(&budget, decoder, index + 1);
        match seed.deserialize(document) {
            Ok(read) => each(index + 1, read),
            Err(error) => {
                let position = error.location().map(|at| (at.line(), at.column()));
                return Err(SyntaxError::new(index + 1, position, &error));
            }
        }
    }
    Ok(())
}

/// Reads one JSON object or a stream of them, as kubectl accepts.
pub(super) fn json_documents(
    bytes: &[u8],
    decoder: &Decoder<'_>,
    mut each: impl FnMut(usize, Document),
) -> Result<(), SyntaxError> {
    let budget = super::bounded::budget_for(bytes.len());
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let mut number = 0;
    // `end` succeeds when only whitespace is left, and consumes nothing else.
    while deserializer.end().is_err() {
        number += 1;
        match DocumentSeed::new(&budget, decoder, number).deserialize(&mut deserializer) {
            Ok(read) => each(number, read),
            Err(error) => {
                let position = Some((error.line(), error.column()));
                return Err(SyntaxError::new(number, position, &error));
            }
        }
    }
    Ok(())
}

impl SyntaxError {
    fn new(document: usize, position: Option<(usize, usize)>, error: &dyn fmt::Display) -> Self {
        Self {
            document,
            position,
            message: error.to_string(),
        }
    }
}

/// The label of document `number` (`document 2`), as rejections name it.
pub(super) fn document_label(number: usize) -> String {
    format!("document {number}")
}

/// The label of item `index` of the document labelled `document`.
pub(super) fn item_label(document: &str, index: usize) -> String {
    format!("{document}, items[{index}]")
}

#[derive(Clone, Copy)]
struct DocumentSeed<'a> {
    bounded: BoundedValue<'a>,
    decoder: &'a Decoder<'a>,
    number: usize,
}

impl<'a> DocumentSeed<'a> {
    fn new(budget: &'a Cell<usize>, decoder: &'a Decoder<'a>, number: usize) -> Self {
        Self {
            bounded: BoundedValue { budget },
            decoder,
            number,
        }
    }
}

impl<'de> DeserializeSeed<'de> for DocumentSeed<'_> {
    type Value = Document;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Document, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DocumentSeed<'_> {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML/JSON document")
    }

    forward_to_bounded_value!(Document::Plain);

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Document, A::Error> {
        self.bounded.visit_seq(seq).map(Document::Plain)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Document, A::Error> {
        self.bounded.spend(1)?;
        let mut fields = Map::new();
        let mut items = None;
        while let Some(key) = map.next_key_seed(BoundedKey(self.bounded))? {
            if key != "items" {
                fields.insert(key, map.next_value_seed(self.bounded)?);
                continue;
            }
            // A later `items` replaces an earlier one, as in a value tree.
            match map.next_value_seed(ItemsSeed(self))? {
                Items::Streamed(list) => {
                    fields.remove("items");
                    items = Some(list);
                }
                Items::Other(value) => {
                    items = None;
                    fields.insert(key, value);
                }
            }
        }
        Ok(match items {
            Some(items) => Document::Listed { fields, items },
            None => Document::Plain(Value::Object(fields)),
        })
    }
}

enum Items {
    Streamed(Vec<Item>),
    /// `items` is not a list: kept as a value, for the decoder to reject or ignore.
    Other(Value),
}

struct ItemsSeed<'a>(DocumentSeed<'a>);

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Items;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Items, D::Error> {
        deserializer.deserialize_any(ItemsVisitor {
            bounded: self.0.bounded,
            document: self.0,
        })
    }
}

struct ItemsVisitor<'a> {
    bounded: BoundedValue<'a>,
    document: DocumentSeed<'a>,
}

impl<'de> Visitor<'de> for ItemsVisitor<'_> {
    type Value = Items;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of objects")
    }

    forward_to_bounded_value!(Items::Other);

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Items, A::Error> {
        self.bounded.visit_map(map).map(Items::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
        self.bounded.spend(1)?;
        let label = document_label(self.document.number);
        let mut items = Vec::new();
        while let Some(value) = seq.next_element_seed(self.bounded)? {
            items.push(self.read_item(&label, items.len(), value));
        }
        Ok(Items::Streamed(items))
    }
}

impl ItemsVisitor<'_> {
    fn read_item(&self, document: &str, index: usize, value: Value) -> Item {
        if !names_own_type(&value) {
            return Item::Deferred(value);
        }
        let mut outcomes = Vec::new();
        let label = item_label(document, index);
        self.document.decoder.decode(&label, value, None, &mut outcomes);
        Item::Decoded(outcomes)
    }
}

/// Whether an item says its own kind and apiVersion, so that the list's cannot matter.
fn names_own_type(item: &Value) -> bool {
    let named = |field: &str| {
        item.get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    };
    named("kind") && named("apiVersion")
}
