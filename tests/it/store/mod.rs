//! The scripts and the stored data, driven through `Store` against a real Redis:
//!
//! - `cases`: every script as one-line cases of steps and expected answers;
//! - `clock`: Redis's clock, read apart from the scripts while the journal is on;
//! - `fresh`: ids a node has just made, stored without a lookup;
//! - `pending`: scheduled messages in both layouts and in the held sets;
//! - `placed`: messages under ids that name their score, which need no index entry;
//! - `inbox`: what leaves the inbox once acknowledged, and what stays;
//! - `marked`: marked reads of the inbox, settled, released and taken over;
//! - `index`: the pending index of the other ids, from its first buckets through its splits;
//! - `records`: terminal records in both layouts;
//! - `stored`: the stored message across the Rust/Lua boundary;
//! - `keys`: business keys: listed, cancelled together, on entries, pruned;
//! - `schedules`: schedules' definitions put, added once, deleted;
//! - `limits`: scripts at their limits (large batches, maxmemory, refusing targets).

mod cases;
mod clock;
mod counts;
mod finished;
mod fresh;
mod inbox;
mod index;
mod keys;
mod limits;
mod marked;
mod marker;
mod mixed;
mod pending;
mod placed;
mod records;
mod schedules;
mod stored;
