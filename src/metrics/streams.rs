//! The `stream` label of the per-stream series whose streams any push may name
//! (forwarded, replayed, purged): the first `metrics.max_streams` streams seen are
//! named, every later one is counted under [`OTHER_STREAMS`], so that `allow =
//! ["*"]` cannot grow the exporter without bound. The `schedule` label of the
//! schedules' series is bounded the same way, by the same number.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

/// The `stream` label of the streams past `metrics.max_streams`.
pub const OTHER_STREAMS: &str = "_other";

/// `metrics.max_streams` of this process (the default until the daemon sets it).
static MAX_STREAMS: AtomicUsize = AtomicUsize::new(100);

/// The streams named so far.
static NAMED: LazyLock<Mutex<BTreeSet<String>>> = LazyLock::new(Default::default);
/// The schedules named so far.
static NAMED_SCHEDULES: LazyLock<Mutex<BTreeSet<String>>> = LazyLock::new(Default::default);

/// Sets `metrics.max_streams`; streams named already stay named.
pub fn set_max_streams(max: usize) {
    MAX_STREAMS.store(max, Ordering::Relaxed);
}

/// The `stream` label for `stream`: its name while it is one of the first
/// `metrics.max_streams` seen, else [`OTHER_STREAMS`].
pub fn stream_label(stream: &str) -> String {
    label_in(
        &mut NAMED.lock().expect("named streams"),
        MAX_STREAMS.load(Ordering::Relaxed),
        stream,
    )
}

/// The `schedule` label for schedule `id`: its id while it is one of the first
/// `metrics.max_streams` schedules seen, else [`OTHER_STREAMS`].
pub fn schedule_label(id: &str) -> String {
    label_in(
        &mut NAMED_SCHEDULES.lock().expect("named schedules"),
        MAX_STREAMS.load(Ordering::Relaxed),
        id,
    )
}

fn label_in(named: &mut BTreeSet<String>, max: usize, stream: &str) -> String {
    if named.contains(stream) {
        return stream.to_owned();
    }
    if named.len() < max {
        named.insert(stream.to_owned());
        return stream.to_owned();
    }
    OTHER_STREAMS.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_streams_are_named_and_the_rest_counted_together() {
        for (max, streams, labels) in [
            (1, "a b a c", "a _other a _other"),
            (2, "a b c b a", "a b _other b a"),
            (3, "a b", "a b"),
        ] {
            let mut named = BTreeSet::new();
            let got: Vec<String> = streams
                .split(' ')
                .map(|s| label_in(&mut named, max, s))
                .collect();
            assert_eq!(got.join(" "), labels, "max {max}, streams {streams}");
            assert!(named.len() <= max);
        }
    }
}
