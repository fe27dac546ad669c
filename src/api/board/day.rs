//! A stream's last day on the Streams page (`GET /v1/streams?window=day`): its
//! deliveries, dead letters and worst lateness in each quarter hour, from the
//! nodes' quarter-hour rollups and, for the quarter hour under way, their samples.

use super::series::Series;
use super::*;
use crate::registry::rollup::{QUARTER_MS, quarter_end};

/// Quarter hours in a day: the points of a day's series.
const QUARTERS: usize = 96;

/// The day before `now_ms`, a quarter hour a point, oldest first (the last one
/// is the quarter hour under way), from `rollups` (finished quarter hours; a node
/// that stopped mid-quarter left its part of one, which adds to the others') and
/// `samples` (those of the quarter hour under way: none older than a quarter hour
/// are needed).
pub(super) fn day(rollups: &[SampleRecord], samples: &[SampleRecord], now_ms: u64) -> Series {
    let current = quarter_end(now_ms);
    let of_rollups = rollups
        .iter()
        .filter(|r| r.t_ms < current)
        .map(|r| (r.t_ms, r));
    let of_samples = samples
        .iter()
        .filter(|s| quarter_end(s.t_ms) == current)
        .map(|s| (current, s));
    let records: Vec<(u64, &SampleRecord)> = of_rollups.chain(of_samples).collect();
    Series::of(&records, current, QUARTER_MS, QUARTERS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(t_ms: u64, n: u64) -> SampleRecord {
        SampleRecord::of_stream_s(t_ms, n, n * 10)
    }

    #[test]
    fn finished_quarters_come_from_rollups_and_the_one_under_way_from_samples() {
        let q = QUARTER_MS;
        let now = 200 * q + 60_000;
        let rollups = [
            record(200 * q, 1),
            // Two nodes' parts of one quarter add up; the worst is the worst.
            record(199 * q, 2),
            record(199 * q, 3),
            record(106 * q, 4),
            // A day ago and more: not in the day.
            record(105 * q, 8),
            // A rollup of the quarter under way (a node stopped mid-quarter) is left
            // to the samples, which hold it too.
            record(201 * q, 16),
        ];
        let samples = [
            record(200 * q + 1, 32),
            record(now, 64),
            record(200 * q - 1, 128),
        ];
        let day = day(&rollups, &samples, now);
        let delivered = &day.delivered["s"];
        assert_eq!(delivered.len(), QUARTERS);
        assert_eq!(delivered[95], 96);
        assert_eq!(delivered[94], 1);
        assert_eq!(delivered[93], 5);
        assert_eq!(delivered[0], 4);
        assert_eq!(delivered.iter().sum::<u64>(), 106);
        assert_eq!(day.worst["s"][93], 30);
        assert!(day.dead.is_empty());
    }
}
