//! A stream's figures from the nodes' samples (or their rollups) as lines of equal
//! steps, oldest first, as the Streams page draws them: its deliveries and dead
//! letters added up in each step, its lateness the worst of each.

use super::*;

/// One figure, per stream: its value in each step, oldest first.
pub(super) type PerStream = BTreeMap<String, Vec<u64>>;

/// Each stream's deliveries, dead letters and worst lateness (ms), `points` steps.
pub(super) struct Series {
    points: usize,
    pub delivered: PerStream,
    pub dead: PerStream,
    pub worst: PerStream,
}

impl Series {
    /// The `points` steps of `step_ms` up to `until` from `records`, each at a time:
    /// one `step_ms` or less before `until` falls in the last step, and so on back.
    /// Records after `until`, or before the first step, are left out.
    pub(super) fn of(
        records: &[(u64, &SampleRecord)],
        until: u64,
        step_ms: u64,
        points: usize,
    ) -> Series {
        let mut series = Series {
            points,
            delivered: PerStream::new(),
            dead: PerStream::new(),
            worst: PerStream::new(),
        };
        let add = |n: &mut u64, v: u64| *n += v;
        let worst = |n: &mut u64, v: u64| *n = (*n).max(v);
        for &(at, record) in records {
            let Some(ago) = until.checked_sub(at).map(|ms| (ms / step_ms) as usize) else {
                continue;
            };
            if ago >= points {
                continue;
            }
            let step = points - 1 - ago;
            fold_into(&mut series.delivered, &record.streams, step, points, add);
            fold_into(&mut series.dead, &record.dead, step, points, add);
            fold_into(&mut series.worst, &record.worst_ms, step, points, worst);
        }
        series
    }

    /// `stream`'s line of `figure` (zeros when it has none).
    pub(super) fn line(&self, figure: &PerStream, stream: &str) -> Vec<u64> {
        figure
            .get(stream)
            .cloned()
            .unwrap_or_else(|| vec![0; self.points])
    }
}

/// Folds each stream's value in `of` into its line of `figure` at `step`.
fn fold_into(
    figure: &mut PerStream,
    of: &BTreeMap<String, u64>,
    step: usize,
    points: usize,
    fold: impl Fn(&mut u64, u64),
) {
    for (stream, &n) in of {
        let line = figure
            .entry(stream.clone())
            .or_insert_with(|| vec![0; points]);
        fold(&mut line[step], n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_fall_into_their_step_added_up_or_the_worst() {
        let sample = |t_ms: u64, stream: &str, n: u64| SampleRecord {
            streams: [(stream.to_owned(), n)].into(),
            worst_ms: [(stream.to_owned(), n * 10)].into(),
            ..SampleRecord::of_stream_s(t_ms, n, 0)
        };
        let now = 10_000_000;
        let samples = [
            sample(now, "a", 1),
            sample(now - 59_999, "a", 2),
            sample(now - 60_000, "a", 4),
            sample(now - 3_599_999, "b", 8),
            sample(now - 3_600_000, "b", 16),
            sample(now + 5, "a", 32),
        ];
        let records: Vec<(u64, &SampleRecord)> = samples.iter().map(|s| (s.t_ms, s)).collect();
        let got = Series::of(&records, now, 60_000, 60);
        assert_eq!(got.delivered["a"][59], 3);
        assert_eq!(got.delivered["a"][58], 4);
        assert_eq!(got.delivered["a"].iter().sum::<u64>(), 7);
        assert_eq!(got.delivered["b"][0], 8);
        assert_eq!(got.delivered["b"].iter().sum::<u64>(), 8);
        // The worst of a minute is the worst of its samples, not their sum.
        assert_eq!(got.worst["a"][59], 20);
        assert_eq!(got.line(&got.dead, "a"), vec![0; 60]);
        // A sample written before these figures existed reads as none.
        let old: SampleRecord = serde_json::from_str(
            r#"{"t_ms":1,"node_id":"n","forwarded":0,"streams":{},"p50_ms":null,"p99_ms":null}"#,
        )
        .unwrap();
        assert!(old.worst_ms.is_empty() && old.dead.is_empty());
    }
}
