//! `[[schedules]]` as the file spells it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One `[[schedules]]` entry: the fields of `POST /v1/schedules`, `id` required.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawSchedule {
    pub(in crate::config) id: String,
    pub(in crate::config) stream: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) payload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) fields: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) cron: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) every: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) start_at: Option<RawInstant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) end_at: Option<RawInstant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) jitter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) misfire: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) max_catch_up: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(in crate::config) paused: Option<bool>,
}

/// An instant in the file: epoch milliseconds, or RFC 3339 text.
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub(in crate::config) enum RawInstant {
    Ms(i64),
    Text(String),
}
