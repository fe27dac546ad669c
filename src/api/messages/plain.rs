//! A push of the common shape read straight from its bytes, without a JSON tree:
//! less than half of what reading it through the tree costs (the tree's map, its
//! keys and its strings, each allocated). The rules it goes through are the tree's.

use std::borrow::Cow;

use serde::Deserialize;

use super::given::{Given, Keyed};

/// A push of the common shape, read straight from its bytes: a text payload, the
/// delay as text or milliseconds, and any of the other keys but `fields` and
/// `deliver_at`. A body of any other shape (or with a text it cannot borrow) is not
/// one, and is read through the tree, whose rules name what is wrong; the rules
/// here are the same (`push::parse_push_body`), and so are the keys (tested).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Plain<'a> {
    #[serde(borrow)]
    stream: Cow<'a, str>,
    #[serde(borrow)]
    payload: Cow<'a, str>,
    // The due time's keys are either absent or given: one given as null is not
    // this shape (the rules refuse it).
    #[serde(borrow, default, deserialize_with = "not_null")]
    delay: Option<&'a str>,
    #[serde(default, deserialize_with = "not_null")]
    delay_ms: Option<u64>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    priority: Option<u64>,
    #[serde(borrow, default)]
    ttl: Option<Cow<'a, str>>,
    #[serde(default)]
    ttl_ms: Option<u64>,
    #[serde(default)]
    replace: Option<bool>,
    #[serde(borrow, default)]
    key: Option<Cow<'a, str>>,
}

/// `bytes` as a `T` read from a JSON object, or None (for an array too: a struct
/// is read from an array by position).
pub(super) fn read_object<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    let object = bytes.trim_ascii_start().starts_with(b"{");
    object.then(|| serde_json::from_slice(bytes).ok())?
}

/// A key that, when present, holds a value (null is an error, not None).
fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

impl Keyed for Plain<'_> {
    fn get(&self, key: &str) -> Option<Given<'_>> {
        fn text<'b>(s: &'b Option<Cow<'_, str>>) -> Option<Given<'b>> {
            s.as_deref().map(Given::Text)
        }
        match key {
            "stream" => Some(Given::Text(&self.stream)),
            "payload" => Some(Given::Text(&self.payload)),
            "delay" => self.delay.map(Given::Text),
            "delay_ms" => self.delay_ms.map(Given::Whole),
            "id" => text(&self.id),
            "priority" => self.priority.map(Given::Whole),
            "ttl" => text(&self.ttl),
            "ttl_ms" => self.ttl_ms.map(Given::Whole),
            "replace" => self.replace.map(Given::Flag),
            "key" => text(&self.key),
            _ => None,
        }
    }
}
