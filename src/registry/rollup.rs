//! Quarter-hour rollups of a node's forwarding samples, so that the dashboard can
//! show a stream's day: the samples themselves are kept two hours at most. A
//! rollup is a [`SampleRecord`] whose `t_ms` is the end of its quarter hour, its
//! counts the sums of the node's samples in it, its worst lateness their worst.

use std::collections::BTreeMap;

use super::SampleRecord;

/// A quarter of an hour, in ms: the step of a day's series.
pub const QUARTER_MS: u64 = 15 * 60_000;

/// The end of the quarter hour a sample taken at `t_ms` belongs to.
pub fn quarter_end(t_ms: u64) -> u64 {
    (t_ms / QUARTER_MS + 1) * QUARTER_MS
}

/// The rollup of the quarter hour under way, of one node's samples.
#[derive(Debug, Default)]
pub struct Rollup {
    current: Option<SampleRecord>,
}

impl Rollup {
    /// Takes in `sample`; returns the finished rollup of an earlier quarter hour
    /// when `sample` is the first of a new one.
    pub fn add(&mut self, sample: &SampleRecord) -> Option<SampleRecord> {
        let end = quarter_end(sample.t_ms);
        match &mut self.current {
            Some(r) if r.t_ms == end => {
                fold(r, sample);
                None
            }
            _ => {
                let mut fresh = SampleRecord {
                    t_ms: end,
                    node_id: sample.node_id.clone(),
                    forwarded: 0,
                    streams: BTreeMap::new(),
                    p50_ms: None,
                    p99_ms: None,
                    worst_ms: BTreeMap::new(),
                    dead: BTreeMap::new(),
                };
                fold(&mut fresh, sample);
                self.current.replace(fresh)
            }
        }
    }

    /// The rollup of the quarter hour under way so far (a node that stops keeps
    /// what it forwarded in it), if any.
    pub fn take(&mut self) -> Option<SampleRecord> {
        self.current.take()
    }
}

/// Adds `sample` into `rollup`: counts summed, the worst lateness and the worst
/// p99 kept (a percentile of percentiles is not one: it reads as "at worst").
fn fold(rollup: &mut SampleRecord, sample: &SampleRecord) {
    rollup.forwarded += sample.forwarded;
    for (stream, n) in &sample.streams {
        *rollup.streams.entry(stream.clone()).or_default() += n;
    }
    for (stream, n) in &sample.dead {
        *rollup.dead.entry(stream.clone()).or_default() += n;
    }
    for (stream, &ms) in &sample.worst_ms {
        let worst = rollup.worst_ms.entry(stream.clone()).or_default();
        *worst = (*worst).max(ms);
    }
    rollup.p50_ms = rollup.p50_ms.max(sample.p50_ms);
    rollup.p99_ms = rollup.p99_ms.max(sample.p99_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: u64, n: u64, worst: u64) -> SampleRecord {
        SampleRecord {
            p99_ms: Some(worst),
            dead: [("s".to_owned(), 1)].into(),
            ..SampleRecord::of_stream_s(t_ms, n, worst)
        }
    }

    #[test]
    fn samples_add_up_by_quarter_hour_and_a_new_quarter_hands_over_the_last() {
        let mut rollup = Rollup::default();
        let q = QUARTER_MS;
        assert_eq!(rollup.add(&sample(q + 5_000, 2, 30)), None);
        assert_eq!(rollup.add(&sample(2 * q - 1, 3, 10)), None);
        // The first sample of the next quarter hands the last one over.
        let done = rollup
            .add(&sample(2 * q, 4, 7))
            .expect("a finished quarter");
        assert_eq!(done.t_ms, 2 * q);
        assert_eq!((done.forwarded, done.streams["s"]), (5, 5));
        assert_eq!(
            (done.worst_ms["s"], done.dead["s"], done.p99_ms),
            (30, 2, Some(30))
        );
        // A gap of quarters without samples hands over the last one with samples.
        let done = rollup
            .add(&sample(5 * q + 1, 1, 1))
            .expect("a finished quarter");
        assert_eq!((done.t_ms, done.forwarded), (3 * q, 4));
        let left = rollup.take().expect("the quarter under way");
        assert_eq!((left.t_ms, left.forwarded), (6 * q, 1));
        assert_eq!(rollup.take(), None);
    }

    #[test]
    fn a_sample_at_a_quarter_s_end_begins_the_next() {
        assert_eq!(quarter_end(0), QUARTER_MS);
        assert_eq!(quarter_end(QUARTER_MS - 1), QUARTER_MS);
        assert_eq!(quarter_end(QUARTER_MS), 2 * QUARTER_MS);
    }
}
