//! A schedule call's messages as its arguments, after its head (the layout
//! schedule_batch.lua reads): what messages share goes once, as contexts (mode,
//! shard, [`SharedArgs`]), and each message names its context by number before its
//! own values. An argument costs Redis about 0.09 µs to take in before the script
//! runs (`bench/arg_cost.py`), more than most of a message's values are worth.

use std::collections::HashMap;

use super::ScheduleMode;
use super::scripts::Call;
use crate::message::NewMessage;
use crate::message::codec::SharedArgs;

/// One message of a schedule call: what [`super::BatchItem`] holds, borrowed.
pub(super) struct ToSchedule<'a> {
    pub msg: &'a NewMessage,
    pub mode: ScheduleMode,
    /// The inbox entry it came from ("" = none).
    pub inbox_entry: &'a str,
}

/// Writes `messages` into `inv`, each with its shard's place in the call's keys
/// (from 1): the count of contexts, each context, then each message: its context's
/// number, its inbox entry (only when the call acknowledges an inbox, `inbox`), then
/// [`NewMessage::script_args`]. Returns how many messages it wrote.
pub(super) fn write_messages<'a>(
    inv: &mut Call<'_>,
    messages: impl IntoIterator<Item = (usize, &'a ToSchedule<'a>)>,
    inbox: bool,
) -> usize {
    let mut numbers: HashMap<(ScheduleMode, usize, SharedArgs<'a>), usize> = HashMap::new();
    let mut contexts = Vec::new();
    let mut named = Vec::new();
    for (g, message) in messages {
        let context = (message.mode, g, message.msg.shared_args());
        let next = numbers.len() + 1;
        let number = *numbers.entry(context).or_insert_with(|| {
            contexts.push(context);
            next
        });
        named.push((number, message));
    }
    inv.arg(contexts.len());
    for (mode, g, shared) in &contexts {
        inv.arg(mode.as_arg())
            .arg(g)
            .arg(shared.due_kind)
            .arg(shared.priority)
            .arg(shared.ttl_ms)
            .arg(shared.stream);
    }
    for (number, message) in &named {
        inv.arg(number);
        if inbox {
            inv.arg(message.inbox_entry);
        }
        for arg in message.msg.script_args() {
            inv.arg(arg);
        }
    }
    named.len()
}
