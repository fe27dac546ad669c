//! Reading Redis replies into Rust values; a reply of the wrong shape is a
//! [`StoreError::Reply`].

use redis::Value;

use super::{Result, StoreError};

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
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::Int(n) => Ok(n.to_string()),
        other => Err(StoreError::Reply(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

pub(super) fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(n) => Ok(*n),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StoreError::Reply(format!("expected a number, got {b:?}"))),
        other => Err(StoreError::Reply(format!(
            "expected a number, got {other:?}"
        ))),
    }
}

pub(super) fn string_at(items: &[Value], i: usize) -> Result<String> {
    text(items.get(i).unwrap_or(&Value::Nil))
}

pub(super) fn int_signed_at(items: &[Value], i: usize) -> Result<i64> {
    int(items.get(i).unwrap_or(&Value::Nil))
}

pub(super) fn int_at(items: &[Value], i: usize) -> Result<u64> {
    Ok(int_signed_at(items, i)?.max(0) as u64)
}
