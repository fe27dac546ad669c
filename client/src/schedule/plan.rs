//! One round of a schedule: which occurrences a leader makes now, given how far
//! the schedule is made, Redis's clock and the horizon. Pure, so that every rule
//! (the horizon, the grace, the misfire policy, the bounds) is tested on its own.

use super::{ScheduleSpec, When, due_now};

/// The most occurrences one schedule makes in a round (the rest in the next).
pub const MAX_PER_ROUND: usize = 1000;
/// The most missed occurrences one round walks through (a day of a per-second
/// schedule is 86,400); past it, the next round goes on and applies the policy
/// to those on their own.
pub const MAX_MISSED_PER_ROUND: usize = 1_000_000;

/// What a round makes of one schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Missed occurrences the policy sends, due now.
    pub late: Vec<i64>,
    /// Occurrences up to the horizon, each due at its time.
    pub coming: Vec<i64>,
    /// Occurrences missed (more than the grace in the past), sent or not.
    pub missed: usize,
    /// The first occurrence not made by this round (None: there is no other).
    pub next: Option<i64>,
    /// The last occurrence this round went through, if any.
    pub last: Option<i64>,
}

impl Plan {
    /// Whether the round has anything to record.
    pub fn is_empty(&self) -> bool {
        self.missed == 0 && self.coming.is_empty()
    }
}

/// The round of `spec` (firing at `when`) made from `next` (its first occurrence
/// not yet made) at `now`: occurrences more than `grace` ms before `now` are
/// missed, those up to `now + horizon` ms are coming.
pub fn plan(
    spec: &ScheduleSpec,
    when: &When,
    next: Option<i64>,
    now: i64,
    horizon: i64,
    grace: i64,
) -> Plan {
    let within = |at: i64| spec.end_at.is_none_or(|end| at <= end as i64);
    let late_before = now - grace;
    let keep = (spec.max_catch_up as usize).max(1);
    let mut plan = Plan {
        next,
        ..Plan::default()
    };
    let mut missed = std::collections::VecDeque::new();
    while let Some(at) = plan.next.filter(|&at| at < late_before && within(at)) {
        if plan.missed == MAX_MISSED_PER_ROUND {
            break;
        }
        plan.missed += 1;
        if missed.len() == keep {
            missed.pop_front();
        }
        missed.push_back(at);
        plan.last = Some(at);
        plan.next = when.next_after(at);
    }
    while let Some(at) = plan.next.filter(|&at| at <= now + horizon && within(at)) {
        if plan.coming.len() == MAX_PER_ROUND || plan.missed == MAX_MISSED_PER_ROUND {
            break;
        }
        plan.coming.push(at);
        plan.last = Some(at);
        plan.next = when.next_after(at);
    }
    // Past `end_at`: nothing more, ever.
    plan.next = plan.next.filter(|&at| within(at));
    let missed: Vec<i64> = missed.into();
    plan.late = due_now(&missed, spec.misfire, spec.max_catch_up as usize);
    plan
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::schedule::Misfire;

    fn spec(misfire: Misfire, max_catch_up: u32) -> ScheduleSpec {
        ScheduleSpec {
            id: "tick".into(),
            stream: "ticks".into(),
            fields: vec![("t".into(), "1".into())],
            key: None,
            cron: None,
            timezone: None,
            every: Some(Duration::from_secs(1)),
            start_at: None,
            end_at: None,
            jitter: None,
            misfire,
            max_catch_up,
            paused: false,
            declared: false,
            created_at: 0,
            since: 0,
        }
    }

    const EVERY_SECOND: When = When::Every {
        every: Duration::from_secs(1),
        anchor: 0,
    };

    #[test]
    fn a_steady_round_makes_what_falls_within_the_horizon() {
        let p = plan(
            &spec(Misfire::Skip, 10),
            &EVERY_SECOND,
            Some(10_000),
            10_200,
            2_000,
            5_000,
        );
        assert_eq!(
            (p.coming, p.late, p.missed),
            (vec![10_000, 11_000, 12_000], vec![], 0)
        );
        assert_eq!((p.next, p.last), (Some(13_000), Some(12_000)));
        // Nothing new within the horizon: nothing to record.
        assert!(
            plan(
                &spec(Misfire::Skip, 10),
                &EVERY_SECOND,
                Some(13_000),
                10_300,
                2_000,
                5_000
            )
            .is_empty()
        );
    }

    #[test]
    fn after_an_outage_each_policy_sends_what_it_promises() {
        // Made up to 10 s, back at 60 s: 10..54 s missed (45), 55..62 s coming.
        for (policy, catch_up, late) in [
            (Misfire::Skip, 10, vec![]),
            (Misfire::Once, 10, vec![54_000]),
            (Misfire::All, 3, vec![52_000, 53_000, 54_000]),
            (Misfire::All, 0, vec![]),
        ] {
            let p = plan(
                &spec(policy, catch_up),
                &EVERY_SECOND,
                Some(10_000),
                60_000,
                2_000,
                5_000,
            );
            assert_eq!(p.missed, 45, "{policy:?}");
            assert_eq!(p.late, late, "{policy:?}");
            assert_eq!(
                p.coming,
                (55..=62).map(|s| s * 1000).collect::<Vec<_>>(),
                "{policy:?}"
            );
            assert_eq!(p.next, Some(63_000));
        }
    }

    #[test]
    fn end_at_stops_it_and_a_round_is_bounded() {
        let ending = ScheduleSpec {
            end_at: Some(11_500),
            ..spec(Misfire::Skip, 10)
        };
        let p = plan(&ending, &EVERY_SECOND, Some(10_000), 10_000, 5_000, 5_000);
        assert_eq!((p.coming, p.next), (vec![10_000, 11_000], None));
        let p = plan(
            &spec(Misfire::Skip, 10),
            &EVERY_SECOND,
            Some(0),
            0,
            10_000_000,
            5_000,
        );
        assert_eq!(p.coming.len(), MAX_PER_ROUND);
        assert_eq!(p.next, Some(MAX_PER_ROUND as i64 * 1000));
    }
}
