//! What the property tests of client-input parsers share: strategies for the
//! input and one check of a parser's answer (feature `props`).

use std::fmt::Debug;

use proptest::prelude::*;
use serde_json::Value;

/// Text a client could send: anything, or the characters parsers look at.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[0-9a-zA-Z :.+_-]{0,40}",
        "[0-9]{15,45}(-[0-9]{0,45})?",
    ]
}

/// A whole number in decimal that does not fit in 64 bits.
pub fn beyond_u64() -> impl Strategy<Value = String> {
    prop_oneof![
        (u128::from(u64::MAX) + 1..=u128::MAX).prop_map(|n| n.to_string()),
        "[1-9][0-9]{39,60}",
    ]
}

/// Any JSON value, with object keys drawn from `keys` or made up.
pub fn json(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    let key = prop_oneof![prop::sample::select(keys).prop_map(str::to_owned), text()];
    leaf.prop_recursive(3, 48, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(key.clone(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Checks a parser's answer to `input`: `Ok(want)` when `want` is given, an
/// error otherwise.
pub fn expect<T: PartialEq + Debug, E: Debug>(
    input: &str,
    got: Result<T, E>,
    want: Option<T>,
) -> Result<(), TestCaseError> {
    match (got, want) {
        (Ok(got), Some(want)) => prop_assert_eq!(got, want, "input {:?}", input),
        (Err(_), None) => {}
        (got, want) => prop_assert!(false, "input {input:?}: got {got:?}, expected {want:?}"),
    }
    Ok(())
}
