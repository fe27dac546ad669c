//! `/v1/messages`: push (one or a batch), look up, cancel, reschedule. Bodies are
//! read key by key, so that every refusal names its field and the rule; the request
//! types document them, and the keys they name are the only ones accepted.

pub(super) mod batch;
pub(super) mod by_id;
mod due;
mod given;
pub(super) mod history;
mod place;
mod plain;
pub(super) mod push;
