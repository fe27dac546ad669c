//! Reading Redis replies into Rust values; a reply of the wrong shape is a
//! [`StoreError::Reply`].

use redis::Value;

use super::{Result, StoreError};
use crate::message::codec;

pub(super) fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(StoreError::Reply(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

pub(super) fn text(v: &Value) -> Result<String> {
    codec::text(v).map_err(StoreError::Reply)
}

pub(super) fn int(v: &Value) -> Result<i64> {
    codec::int(v).map_err(StoreError::Reply)
}

/// A string reply's bytes as they are (a cursor of raw bucket names, say); Nil is empty.
pub(super) fn bytes(v: &Value) -> Result<Vec<u8>> {
    match v {
        Value::BulkString(b) => Ok(b.clone()),
        Value::SimpleString(s) => Ok(s.as_bytes().to_vec()),
        Value::Nil => Ok(Vec::new()),
        other => Err(StoreError::Reply(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

pub(super) fn string_at(items: &[Value], i: usize) -> Result<String> {
    text(items.get(i).unwrap_or(&Value::Nil))
}

/// A number sent as text, "" (or nothing) for none.
pub(super) fn number_text_at(items: &[Value], i: usize) -> Result<Option<u64>> {
    let text = string_at(items, i)?;
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| StoreError::Reply(format!("expected a number, got {text:?}")))
}

pub(super) fn int_signed_at(items: &[Value], i: usize) -> Result<i64> {
    int(items.get(i).unwrap_or(&Value::Nil))
}

pub(super) fn int_at(items: &[Value], i: usize) -> Result<u64> {
    Ok(int_signed_at(items, i)?.max(0) as u64)
}
