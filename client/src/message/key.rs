//! A message's business key: what a producer knows a message by beside its id
//! ("order-42"), so that it can list or cancel every message of one order at once.

use std::fmt;

use super::InvalidMessage;
use super::id::check_word;

/// Longest key a producer may give.
pub const MAX_KEY_LEN: usize = 128;

/// A business key: `[A-Za-z0-9._:-]{1,128}`, the rule for ids.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageKey(String);

impl MessageKey {
    pub fn parse(key: &str) -> Result<Self, InvalidMessage> {
        check_word("key", key, MAX_KEY_LEN).map_err(InvalidMessage::Key)?;
        Ok(MessageKey(key.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use delayq_harness::props::{expect, text};

    proptest! {
        #[test]
        fn words_of_the_id_alphabet_are_keys(key in "[A-Za-z0-9._:-]{1,128}") {
            expect(&key, MessageKey::parse(&key).map(|k| k.as_str().to_owned()), Some(key.clone()))?;
        }

        #[test]
        fn anything_else_is_refused_naming_the_key(key in text()) {
            let fits = !key.is_empty()
                && key.len() <= MAX_KEY_LEN
                && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
            match MessageKey::parse(&key) {
                Ok(parsed) => prop_assert!(fits && parsed.as_str() == key),
                Err(InvalidMessage::Key(why)) => {
                    prop_assert!(!fits);
                    prop_assert!(why.starts_with("key "), "{}", why);
                }
                Err(other) => prop_assert!(false, "{:?}", other),
            }
        }
    }

    #[test]
    fn the_ends_of_the_length() {
        assert!(MessageKey::parse("").is_err());
        assert!(MessageKey::parse("k").is_ok());
        assert!(MessageKey::parse(&"k".repeat(MAX_KEY_LEN)).is_ok());
        assert!(MessageKey::parse(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
        assert_eq!(
            MessageKey::parse("order 42").unwrap_err().to_string(),
            "key \"order 42\": character ' ' is not allowed (allowed: A-Z a-z 0-9 . _ : -)"
        );
    }
}
