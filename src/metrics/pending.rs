//! The per-stream pending gauge's series, bounded.

use std::collections::{BTreeMap, BTreeSet};

/// The `stream` label of what [`PendingStreams`] does not show by name. Stream
/// names have no spaces, so no stream is called this.
pub const REST_OF_STREAMS: &str = "(the rest)";

/// Keeps `delayq_pending_stream_messages` to a bounded set of series: the `top`
/// largest streams of each count by name, the rest summed under
/// [`REST_OF_STREAMS`]. A stream that drops out of the top reads 0 (the exporter
/// cannot remove a series); once `ever` streams have had a series, newcomers are
/// counted in the rest.
pub struct PendingStreams {
    top: usize,
    ever: usize,
    named: BTreeSet<String>,
}

impl PendingStreams {
    pub fn new(top: usize, ever: usize) -> PendingStreams {
        PendingStreams {
            top,
            ever,
            named: BTreeSet::new(),
        }
    }

    /// The gauge values for one count: `counted` per stream (possibly a part of
    /// the messages; "" for bodies that could not be read) out of `total` scheduled.
    /// The rest comes last: set in this order, a scrape that shows this count's
    /// rest shows every stream of it.
    pub fn values(&mut self, counted: &BTreeMap<String, u64>, total: u64) -> Vec<(String, u64)> {
        let mut ranked: Vec<(&String, u64)> = counted
            .iter()
            .filter(|(stream, n)| !stream.is_empty() && **n > 0)
            .map(|(stream, n)| (stream, *n))
            .collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let mut shown: BTreeMap<String, u64> = BTreeMap::new();
        for (stream, n) in ranked.into_iter().take(self.top) {
            if self.named.contains(stream) || self.named.len() < self.ever {
                self.named.insert(stream.clone());
                shown.insert(stream.clone(), n);
            }
        }
        let rest = total.saturating_sub(shown.values().sum());
        let mut values: Vec<(String, u64)> = self
            .named
            .iter()
            .map(|stream| (stream.clone(), shown.get(stream).copied().unwrap_or(0)))
            .collect();
        values.push((REST_OF_STREAMS.to_owned(), rest));
        values
    }

    /// Every series at 0: this node no longer leads.
    pub fn zeroes(&self) -> Vec<(String, u64)> {
        self.named
            .iter()
            .map(String::as_str)
            .chain([REST_OF_STREAMS])
            .map(|stream| (stream.to_owned(), 0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    }

    fn get(values: &[(String, u64)], stream: &str) -> Option<u64> {
        values.iter().find(|(s, _)| s == stream).map(|(_, n)| *n)
    }

    #[test]
    fn the_largest_streams_are_shown_and_the_rest_is_summed() {
        let mut p = PendingStreams::new(2, 10);
        let v = p.values(&counts(&[("a", 5), ("b", 1), ("c", 3), ("", 2)]), 20);
        assert_eq!(v.len(), 3, "{v:?}");
        assert_eq!(get(&v, "a"), Some(5));
        assert_eq!(get(&v, "c"), Some(3));
        // b, the unreadable and the 9 not counted.
        assert_eq!(get(&v, REST_OF_STREAMS), Some(12));
        // Equal counts rank by name: the same streams from one count to the next.
        let v = p.values(&counts(&[("x", 1), ("a", 1), ("m", 1)]), 3);
        assert_eq!(get(&v, "a"), Some(1));
        assert_eq!(get(&v, "m"), Some(1));
        assert_eq!(get(&v, "x"), None);
        assert_eq!(get(&v, "c"), Some(0), "dropped out: 0");
        assert_eq!(get(&v, REST_OF_STREAMS), Some(1));
    }

    #[test]
    fn the_streams_ever_shown_are_bounded() {
        let mut p = PendingStreams::new(2, 3);
        p.values(&counts(&[("a", 2), ("b", 1)]), 3);
        p.values(&counts(&[("c", 2), ("d", 1)]), 3);
        let v = p.values(&counts(&[("e", 5), ("a", 1)]), 6);
        let names: Vec<&str> = v.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", REST_OF_STREAMS]);
        assert_eq!(get(&v, "a"), Some(1));
        assert_eq!(
            get(&v, REST_OF_STREAMS),
            Some(5),
            "e is a newcomer past the cap"
        );
        let zeroes = p.zeroes();
        assert_eq!(zeroes.len(), 4);
        assert!(zeroes.iter().all(|(_, n)| *n == 0));
    }
}
