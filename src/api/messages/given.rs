//! A key's value in a request body, as the rules read it ([`Given`]), from a body
//! that answers by key ([`Keyed`]): a JSON tree, or a push of the common shape read
//! straight from its bytes (`push::Plain`). One set of rules reads both.

use std::fmt;

use serde_json::{Map, Value};

/// A key's value.
#[derive(Clone, Copy, Debug)]
pub(super) enum Given<'a> {
    /// A string.
    Text(&'a str),
    /// A number that is a whole, non-negative 64-bit integer.
    Whole(u64),
    /// `true` or `false`.
    Flag(bool),
    /// Anything else (null, another number, an array, an object), as the tree holds it.
    Tree(&'a Value),
}

impl<'a> Given<'a> {
    pub(super) fn of(value: &'a Value) -> Given<'a> {
        match value {
            Value::String(s) => Given::Text(s),
            Value::Bool(b) => Given::Flag(*b),
            Value::Number(n) => n.as_u64().map_or(Given::Tree(value), Given::Whole),
            _ => Given::Tree(value),
        }
    }

    pub(super) fn is_null(self) -> bool {
        matches!(self, Given::Tree(Value::Null))
    }

    /// Whether it is a number of any kind.
    pub(super) fn is_number(self) -> bool {
        matches!(self, Given::Whole(_) | Given::Tree(Value::Number(_)))
    }
}

/// As JSON text, as the tree's value would print.
impl fmt::Display for Given<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Given::Text(s) => write!(f, "{}", Value::from(*s)),
            Given::Whole(n) => write!(f, "{n}"),
            Given::Flag(b) => write!(f, "{b}"),
            Given::Tree(v) => write!(f, "{v}"),
        }
    }
}

/// A request body that answers by key.
pub(super) trait Keyed {
    /// The value of `key`, None when the body does not hold it.
    fn get(&self, key: &str) -> Option<Given<'_>>;

    /// The value of `key` when it holds one: an optional key given as null is not
    /// given.
    fn given(&self, key: &str) -> Option<Given<'_>> {
        self.get(key).filter(|v| !v.is_null())
    }
}

impl Keyed for Map<String, Value> {
    fn get(&self, key: &str) -> Option<Given<'_>> {
        Map::get(self, key).map(Given::of)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// A value prints as the tree's value prints, whatever form it was read in.
        #[test]
        fn a_value_prints_as_its_json(value in delayq_harness::props::json(&["a"])) {
            prop_assert_eq!(Given::of(&value).to_string(), value.to_string());
        }
    }
}
