//! One log line per condition, not one per retry.
//!
//! A loop that retries on error (16 shard loops, when Redis is gone) would log a
//! line per attempt. Every loop reporting the same condition shares one
//! [`Complaint`] instead, and logs only what it returns: the first failure at once,
//! then a summary of the failures since the last line at a slowing rate (after
//! 1 s, 2 s, 4 s … then every [`MAX_GAP`]) while failures go on, and one recovery
//! line when the condition is over. The call site logs, so that each line keeps its
//! module as target and its fields (`shard`, `error`, …), the latest failure's on a
//! summary line:
//!
//! ```text
//! WARN delayq::leader::forwarder: forward failed shard=2 error=Connection refused (os error 111)
//! WARN delayq::leader::forwarder: forward failed (143 times in the last 8s across 16 shards) shard=5 error=…
//! INFO delayq::leader::forwarder: forwarding works again after 171 failures over 12s
//! ```
//!
//! A complaint may be told where each failure happened (a shard, an election
//! group): a summary counts the places, and the condition is over once every place
//! that failed has worked again. Failures and the first success after them take a
//! small lock; any other success is one atomic load.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The gap between the first line of a condition and its first summary; each gap
/// after is twice the one before, up to [`MAX_GAP`].
pub const FIRST_GAP: Duration = Duration::from_secs(1);
pub const MAX_GAP: Duration = Duration::from_secs(60);
/// A failure this long after the one before starts a condition anew (its first line
/// said at once) even though no success ended the last one: the loops that failed
/// may have ended (their term did) without ever working again.
pub const QUIET: Duration = Duration::from_secs(300);

/// A condition that retrying loops report together. Usually a `static`, or shared
/// in an `Arc`.
pub struct Complaint {
    /// The condition, as its first line says it: `"forward failed"`.
    what: &'static str,
    /// What its end says: `"forwarding works again"`.
    working: &'static str,
    /// What a place is, for summaries (`"shard"`); None: places are not counted.
    unit: Option<&'static str>,
    /// Whether a condition is under way: successes look at this alone.
    failing: AtomicBool,
    state: Mutex<State>,
}

impl Complaint {
    pub const fn new(what: &'static str, working: &'static str) -> Complaint {
        Self::counting(None, what, working)
    }

    /// A complaint whose summaries count the places (of `unit`, say `"shard"`) that
    /// failed.
    pub const fn across(
        unit: &'static str,
        what: &'static str,
        working: &'static str,
    ) -> Complaint {
        Self::counting(Some(unit), what, working)
    }

    const fn counting(
        unit: Option<&'static str>,
        what: &'static str,
        working: &'static str,
    ) -> Complaint {
        Complaint {
            what,
            working,
            unit,
            failing: AtomicBool::new(false),
            state: Mutex::new(State { outage: None }),
        }
    }

    /// A failure: the line to log, if any (log it with the failure's own fields).
    #[must_use]
    pub fn failed(&self) -> Option<Said> {
        self.fail(None, Instant::now())
    }

    /// A failure at `place` (a shard, a group): the line to log, if any.
    #[must_use]
    pub fn failed_on(&self, place: u64) -> Option<Said> {
        self.fail(Some(place), Instant::now())
    }

    /// A success: the recovery line to log (at INFO), once, when failures came
    /// before it. Ends the condition wherever it failed.
    #[must_use]
    pub fn recovered(&self) -> Option<Said> {
        self.recover(None)
    }

    /// A success at `place`: ends the condition there, and the recovery line to
    /// log when no other place is failing any more.
    #[must_use]
    pub fn recovered_on(&self, place: u64) -> Option<Said> {
        self.recover(Some(place))
    }

    /// `place` is gone without having worked again (a lease that expired): it no
    /// longer keeps the condition going, and no line says so. The condition ends
    /// unsaid when no other place was failing.
    pub fn forget_on(&self, place: u64) {
        if !self.failing.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.forget(place);
        self.failing
            .store(state.outage.is_some(), Ordering::Release);
    }

    fn fail(&self, place: Option<u64>, now: Instant) -> Option<Said> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.failing.store(true, Ordering::Release);
        state.fail(now, place).map(|line| self.say(line))
    }

    fn recover(&self, place: Option<u64>) -> Option<Said> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let line = state.recover(Instant::now(), place);
        self.failing
            .store(state.outage.is_some(), Ordering::Release);
        line.map(|line| self.say(line))
    }

    fn say(&self, line: Line) -> Said {
        Said {
            what: self.what,
            working: self.working,
            unit: self.unit,
            line,
        }
    }
}

/// A line a [`Complaint`] asks for; its `Display` is the line's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Said {
    what: &'static str,
    working: &'static str,
    unit: Option<&'static str>,
    line: Line,
}

impl Said {
    /// The failures the line counts: 1 on the first line, those since the last line
    /// on a summary, all of them on the recovery line.
    #[cfg(test)]
    fn failures(&self) -> u64 {
        match self.line {
            Line::First => 1,
            Line::Again { failures, .. } | Line::Recovered { failures, .. } => failures,
        }
    }
}

impl fmt::Display for Said {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let times = |n: u64| if n == 1 { "time" } else { "times" };
        match self.line {
            Line::First => f.write_str(self.what),
            Line::Again {
                failures,
                over,
                places,
            } => {
                write!(
                    f,
                    "{} ({failures} {} in the last {}",
                    self.what,
                    times(failures),
                    crate::human::roughly(over.as_millis() as u64)
                )?;
                if let Some(unit) = self.unit {
                    let s = if places == 1 { "" } else { "s" };
                    write!(f, " across {places} {unit}{s}")?;
                }
                f.write_str(")")
            }
            Line::Recovered { failures, over } => write!(
                f,
                "{} after {failures} {} over {}",
                self.working,
                if failures == 1 { "failure" } else { "failures" },
                crate::human::roughly(over.as_millis() as u64)
            ),
        }
    }
}

/// What a failure or a success calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// The first failure since things last worked.
    First,
    /// `failures` failures in the `over` since the last line, at `places` places.
    Again {
        failures: u64,
        over: Duration,
        places: usize,
    },
    /// Working again, after `failures` failures over `over` (first to last).
    Recovered { failures: u64, over: Duration },
}

/// The pure part: what a failure or success at `now` calls for.
#[derive(Debug)]
struct State {
    /// Since the first failure after the last success; None while things work.
    outage: Option<Outage>,
}

#[derive(Debug)]
struct Outage {
    began: Instant,
    /// Every failure of the outage, and the last one's time.
    failures: u64,
    last: Instant,
    /// The places that failed and have not worked since (None: failures given no
    /// place).
    failing: BTreeSet<Option<u64>>,
    /// When the last line was logged, the failures and places since, and the gap
    /// until the next summary.
    said_at: Instant,
    unsaid: u64,
    places: BTreeSet<u64>,
    gap: Duration,
}

impl State {
    fn fail(&mut self, now: Instant, place: Option<u64>) -> Option<Line> {
        if let Some(outage) = &self.outage
            && now.saturating_duration_since(outage.last) >= QUIET
        {
            self.outage = None;
        }
        let Some(outage) = &mut self.outage else {
            self.outage = Some(Outage {
                began: now,
                failures: 1,
                last: now,
                failing: BTreeSet::from([place]),
                said_at: now,
                unsaid: 0,
                places: BTreeSet::new(),
                gap: FIRST_GAP,
            });
            return Some(Line::First);
        };
        outage.failures += 1;
        outage.last = now;
        outage.failing.insert(place);
        outage.unsaid += 1;
        outage.places.extend(place);
        let over = now.saturating_duration_since(outage.said_at);
        if over < outage.gap {
            return None;
        }
        let line = Line::Again {
            failures: outage.unsaid,
            over,
            places: outage.places.len(),
        };
        outage.said_at = now;
        outage.unsaid = 0;
        outage.places.clear();
        outage.gap = (outage.gap * 2).min(MAX_GAP);
        Some(line)
    }

    fn recover(&mut self, now: Instant, place: Option<u64>) -> Option<Line> {
        let outage = self.outage.as_mut()?;
        match place {
            Some(place) => {
                outage.failing.remove(&Some(place));
            }
            None => outage.failing.clear(),
        }
        if !outage.failing.is_empty() {
            return None;
        }
        let outage = self.outage.take()?;
        Some(Line::Recovered {
            failures: outage.failures,
            over: now.saturating_duration_since(outage.began),
        })
    }

    fn forget(&mut self, place: u64) {
        if let Some(outage) = &mut self.outage {
            outage.failing.remove(&Some(place));
            if outage.failing.is_empty() {
                self.outage = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO: Duration = Duration::ZERO;
    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    /// A step of a table test: at `at` after the start, a failure (`Fail`) or
    /// success (`Work`) at a place (None: no place), and the line it should call for.
    enum Step {
        Fail(Duration, Option<u64>, Option<Line>),
        Work(Duration, Option<u64>, Option<Line>),
        /// The place is gone (no line).
        Gone(u64),
    }
    use Step::*;

    fn again(failures: u64, over: Duration, places: usize) -> Option<Line> {
        Some(Line::Again {
            failures,
            over,
            places,
        })
    }

    fn recovered(failures: u64, over: Duration) -> Option<Line> {
        Some(Line::Recovered { failures, over })
    }

    #[track_caller]
    fn check(name: &str, steps: &[Step]) {
        let start = Instant::now();
        let mut state = State { outage: None };
        for (i, step) in steps.iter().enumerate() {
            let (got, want) = match step {
                Fail(at, place, want) => (state.fail(start + *at, *place), want),
                Work(at, place, want) => (state.recover(start + *at, *place), want),
                Gone(place) => {
                    state.forget(*place);
                    continue;
                }
            };
            assert_eq!(got, *want, "{name}: step {i}");
        }
    }

    #[test]
    fn lines_called_for() {
        let shard = Some;
        check(
            "nothing failed: no recovery line",
            &[Work(ZERO, None, None), Work(S, shard(1), None)],
        );
        check(
            "the first failure at once, then nothing within the first second",
            &[
                Fail(ZERO, None, Some(Line::First)),
                Fail(100 * MS, None, None),
                Fail(999 * MS, None, None),
            ],
        );
        check(
            "a summary once the gap has passed, counting the failures since the last line",
            &[
                Fail(ZERO, None, Some(Line::First)),
                Fail(300 * MS, None, None),
                Fail(600 * MS, None, None),
                Fail(1100 * MS, None, again(3, 1100 * MS, 0)),
                Fail(1200 * MS, None, None),
            ],
        );
        check(
            "the recovery line once, counting every failure, only after failures",
            &[
                Fail(ZERO, None, Some(Line::First)),
                Fail(500 * MS, None, None),
                Fail(1500 * MS, None, again(2, 1500 * MS, 0)),
                Fail(2 * S, None, None),
                Work(2500 * MS, None, recovered(4, 2500 * MS)),
                Work(3 * S, None, None),
                Work(4 * S, None, None),
            ],
        );
        check(
            "after a recovery, the next failure is a first one again",
            &[
                Fail(ZERO, None, Some(Line::First)),
                Work(S, None, recovered(1, S)),
                Fail(2 * S, None, Some(Line::First)),
                Fail(2100 * MS, None, None),
            ],
        );
        check(
            "summaries count the places since the last line",
            &[
                Fail(ZERO, shard(0), Some(Line::First)),
                Fail(10 * MS, shard(1), None),
                Fail(20 * MS, shard(2), None),
                Fail(30 * MS, shard(1), None),
                Fail(S, shard(3), again(4, S, 3)),
                Fail(1500 * MS, shard(3), None),
                Fail(3 * S, shard(3), again(2, 2 * S, 1)),
            ],
        );
        check(
            "over only once every place that failed has worked again",
            &[
                Fail(ZERO, shard(0), Some(Line::First)),
                Fail(10 * MS, shard(1), None),
                Work(20 * MS, shard(2), None),
                Work(30 * MS, shard(0), None),
                Fail(40 * MS, shard(0), None),
                Work(50 * MS, shard(1), None),
                Work(60 * MS, shard(0), recovered(3, 60 * MS)),
                Work(70 * MS, shard(1), None),
            ],
        );
        check(
            "a place gone without working again no longer keeps it going",
            &[
                Fail(ZERO, shard(0), Some(Line::First)),
                Fail(10 * MS, shard(1), None),
                Gone(0),
                Work(20 * MS, shard(1), recovered(2, 20 * MS)),
                Fail(30 * MS, shard(0), Some(Line::First)),
                Gone(0),
                Work(40 * MS, shard(0), None),
                Fail(50 * MS, shard(0), Some(Line::First)),
            ],
        );
        check(
            "a failure long after the last one starts anew, even without a success",
            &[
                Fail(ZERO, shard(0), Some(Line::First)),
                Fail(10 * MS, shard(1), None),
                Work(20 * MS, shard(1), None),
                Fail(QUIET + 10 * MS, shard(1), Some(Line::First)),
                Work(QUIET + S, shard(1), recovered(1, S - 10 * MS)),
            ],
        );
        check(
            "a success given no place ends it everywhere",
            &[
                Fail(ZERO, shard(0), Some(Line::First)),
                Fail(10 * MS, shard(1), None),
                Work(20 * MS, None, recovered(2, 20 * MS)),
            ],
        );
    }

    #[test]
    fn the_gaps_double_up_to_the_cap() {
        let start = Instant::now();
        let mut state = State { outage: None };
        assert_eq!(state.fail(start, None), Some(Line::First));
        // A failure every 100 ms for 10 minutes: the times of the summaries.
        let mut said = Vec::new();
        for tenth in 1..=6000u32 {
            let now = start + Duration::from_millis(100) * tenth;
            if let Some(line) = state.fail(now, None) {
                said.push((now - start, line));
            }
        }
        let gaps: Vec<u64> = std::iter::once(Duration::ZERO)
            .chain(said.iter().map(|(at, _)| *at))
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs())
            .collect();
        assert_eq!(gaps[..8], [1, 2, 4, 8, 16, 32, 60, 60], "{gaps:?}");
        assert!(gaps.iter().all(|g| *g <= 60), "{gaps:?}");
        // Every failure is in exactly one line (the first, or a summary).
        let summed: u64 = said
            .iter()
            .map(|(_, line)| match line {
                Line::Again { failures, .. } => *failures,
                other => panic!("{other:?}"),
            })
            .sum();
        assert_eq!(summed + 1, 6001 - unsaid(&state));
    }

    fn unsaid(state: &State) -> u64 {
        state.outage.as_ref().map_or(0, |o| o.unsaid)
    }

    #[test]
    fn lines_read_as_sentences() {
        let forward = Complaint::across("shard", "forward failed", "forwarding works again");
        let say = |line| forward.say(line);
        assert_eq!(say(Line::First).to_string(), "forward failed");
        let line = Line::Again {
            failures: 143,
            over: Duration::from_millis(8_040),
            places: 16,
        };
        assert_eq!(
            say(line).to_string(),
            "forward failed (143 times in the last 8s across 16 shards)"
        );
        let line = Line::Again {
            failures: 1,
            over: S,
            places: 1,
        };
        assert_eq!(
            say(line).to_string(),
            "forward failed (1 time in the last 1s across 1 shard)"
        );
        let line = Line::Recovered {
            failures: 143,
            over: Duration::from_millis(12_340),
        };
        assert_eq!(
            say(line).to_string(),
            "forwarding works again after 143 failures over 12s"
        );
        let sweep = Complaint::new("sweep failed", "sweeping works again");
        let line = Line::Again {
            failures: 2,
            over: 2 * S,
            places: 0,
        };
        assert_eq!(
            sweep.say(line).to_string(),
            "sweep failed (2 times in the last 2s)"
        );
    }

    #[test]
    fn a_shared_complaint_says_the_first_failure_once_and_its_end_once() {
        static SHARED: Complaint = Complaint::across("shard", "forward failed", "forwarding works");
        assert_eq!(SHARED.recovered_on(0), None, "nothing failed");
        let lines: Vec<Said> = std::thread::scope(|s| {
            let loops: Vec<_> = (0..16u64)
                .map(|shard| s.spawn(move || SHARED.failed_on(shard)))
                .collect();
            loops
                .into_iter()
                .filter_map(|l| l.join().unwrap())
                .collect()
        });
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].to_string(), "forward failed");
        let ends: Vec<Said> = (0..16)
            .filter_map(|shard| SHARED.recovered_on(shard))
            .collect();
        assert_eq!(ends.len(), 1, "{ends:?}");
        assert_eq!(ends[0].failures(), 16);
        assert!(!SHARED.failing.load(Ordering::Relaxed));
        assert_eq!(SHARED.recovered(), None, "said once");
    }
}
