//! `/v1/messages`: push (one or a batch), look up, cancel, reschedule. Bodies are
//! read key by key, so that every refusal names its field and the rule; the request
//! types document them, and the keys they name are the only ones accepted.

pub(super) mod batch;
pub(super) mod by_id;
mod due;
pub(super) mod history;
mod place;
pub(super) mod push;
