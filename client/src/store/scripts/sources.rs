//! Every script the store runs, what each does to Redis, and the handles the
//! store calls them by.

use super::{Functions, Lua, lua};

/// What a script does to Redis, which sets its function's flags. A flagged
/// function is checked by Redis once, before it runs; an `EVALSHA` is checked at
/// each command, so these flags keep what each script could do at `maxmemory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Reads only (`no-writes`): runs at `maxmemory` and on a replica.
    Reads,
    /// Adds to Redis (no flags): refused whole at `maxmemory`, where its first
    /// write (an `XADD`, `ZADD`, `SET`, ...) was refused as an `EVALSHA`.
    Writes,
    /// Takes away, and writes at most a record of what it took (`allow-oom`): runs
    /// at `maxmemory`, as its deletions did as an `EVALSHA`, so that trimming,
    /// acknowledging and cancelling can free memory there.
    Frees,
}

/// Every script: its name (the file `lua/<name>.lua`), body and kind.
pub(super) const SOURCES: [(&str, &str, Kind); 26] = [
    (
        "reschedule",
        include_str!("../lua/reschedule.lua"),
        Kind::Writes,
    ),
    ("cancel", include_str!("../lua/cancel.lua"), Kind::Frees),
    (
        "cancel_key",
        include_str!("../lua/cancel_key.lua"),
        Kind::Frees,
    ),
    (
        "key_messages",
        include_str!("../lua/key_messages.lua"),
        Kind::Reads,
    ),
    ("get", include_str!("../lua/get.lua"), Kind::Reads),
    ("finished", include_str!("../lua/finished.lua"), Kind::Reads),
    ("forward", include_str!("../lua/forward.lua"), Kind::Writes),
    ("trim", include_str!("../lua/trim.lua"), Kind::Frees),
    (
        "raise_fence",
        include_str!("../lua/raise_fence.lua"),
        Kind::Writes,
    ),
    (
        "redeliver",
        include_str!("../lua/redeliver.lua"),
        Kind::Writes,
    ),
    (
        "replay_dead",
        include_str!("../lua/replay_dead.lua"),
        Kind::Writes,
    ),
    (
        "schedule_batch",
        include_str!("../lua/schedule_batch.lua"),
        Kind::Writes,
    ),
    (
        "reject_inbox",
        include_str!("../lua/reject_inbox.lua"),
        Kind::Writes,
    ),
    (
        "ack_inbox",
        include_str!("../lua/ack_inbox.lua"),
        Kind::Frees,
    ),
    (
        "inbox_take",
        include_str!("../lua/inbox_take.lua"),
        Kind::Frees,
    ),
    (
        "inbox_release",
        include_str!("../lua/inbox_release.lua"),
        Kind::Frees,
    ),
    (
        "inbox_reclaim",
        include_str!("../lua/inbox_reclaim.lua"),
        Kind::Frees,
    ),
    (
        "pending_streams",
        include_str!("../lua/pending_streams.lua"),
        Kind::Reads,
    ),
    (
        "pending_count",
        include_str!("../lua/pending_count.lua"),
        Kind::Reads,
    ),
    (
        "journal_ack",
        include_str!("../lua/journal_ack.lua"),
        Kind::Frees,
    ),
    (
        "due_histogram",
        include_str!("../lua/due_histogram.lua"),
        Kind::Reads,
    ),
    (
        "clear_switchover",
        include_str!("../lua/clear_switchover.lua"),
        Kind::Frees,
    ),
    (
        "confirm_marker",
        include_str!("../lua/confirm_marker.lua"),
        Kind::Writes,
    ),
    ("upcoming", include_str!("../lua/upcoming.lua"), Kind::Reads),
    (
        "advance_schedule",
        include_str!("../lua/advance_schedule.lua"),
        Kind::Writes,
    ),
    (
        "restore_schedule",
        include_str!("../lua/restore_schedule.lua"),
        Kind::Writes,
    ),
];

/// The scripts, compiled into the binary and loaded lazily: as a library of Redis
/// Functions where Redis allows it, else each by `EVALSHA` (see `scripts`).
pub(in crate::store) struct Scripts {
    pub(in crate::store) reschedule: Lua,
    pub(in crate::store) cancel: Lua,
    pub(in crate::store) cancel_key: Lua,
    pub(in crate::store) key_messages: Lua,
    pub(in crate::store) get: Lua,
    pub(in crate::store) finished: Lua,
    pub(in crate::store) forward: Lua,
    pub(in crate::store) trim: Lua,
    pub(in crate::store) raise_fence: Lua,
    pub(in crate::store) redeliver: Lua,
    pub(in crate::store) replay_dead: Lua,
    pub(in crate::store) schedule_batch: Lua,
    pub(in crate::store) reject_inbox: Lua,
    pub(in crate::store) ack_inbox: Lua,
    pub(in crate::store) inbox_take: Lua,
    pub(in crate::store) inbox_release: Lua,
    pub(in crate::store) inbox_reclaim: Lua,
    pub(in crate::store) pending_streams: Lua,
    pub(in crate::store) pending_count: Lua,
    pub(in crate::store) journal_ack: Lua,
    pub(in crate::store) due_histogram: Lua,
    pub(in crate::store) clear_switchover: Lua,
    pub(in crate::store) confirm_marker: Lua,
    pub(in crate::store) upcoming: Lua,
    pub(in crate::store) advance_schedule: Lua,
    pub(in crate::store) restore_schedule: Lua,
}

impl Scripts {
    pub(in crate::store) fn new() -> Self {
        let f = Functions::new();
        Scripts {
            reschedule: lua("reschedule", &f),
            cancel: lua("cancel", &f),
            cancel_key: lua("cancel_key", &f),
            key_messages: lua("key_messages", &f),
            get: lua("get", &f),
            finished: lua("finished", &f),
            forward: lua("forward", &f),
            trim: lua("trim", &f),
            raise_fence: lua("raise_fence", &f),
            redeliver: lua("redeliver", &f),
            replay_dead: lua("replay_dead", &f),
            schedule_batch: lua("schedule_batch", &f),
            reject_inbox: lua("reject_inbox", &f),
            ack_inbox: lua("ack_inbox", &f),
            inbox_take: lua("inbox_take", &f),
            inbox_release: lua("inbox_release", &f),
            inbox_reclaim: lua("inbox_reclaim", &f),
            pending_streams: lua("pending_streams", &f),
            pending_count: lua("pending_count", &f),
            journal_ack: lua("journal_ack", &f),
            due_histogram: lua("due_histogram", &f),
            clear_switchover: lua("clear_switchover", &f),
            confirm_marker: lua("confirm_marker", &f),
            upcoming: lua("upcoming", &f),
            advance_schedule: lua("advance_schedule", &f),
            restore_schedule: lua("restore_schedule", &f),
        }
    }
}
