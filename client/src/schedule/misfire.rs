//! What a schedule sends for occurrences that passed while no leader made them (an
//! outage of every node, a long pause): Kubernetes CronJob's
//! `startingDeadlineSeconds` and Quartz's misfire instructions are the anchors.
//!
//! | policy | sends | like |
//! |---|---|---|
//! | `skip` | nothing for the missed ones; the next future occurrence as usual | Quartz `DO_NOTHING`; CronJob once the deadline has passed |
//! | `once` | one message, now, for all of them (the id of the latest) | Quartz `FIRE_ONCE_NOW`; CronJob's one late run |
//! | `all` | each missed one, now, at most `max_catch_up` (the latest) | Quartz `IGNORE_MISFIRE_POLICY` (bounded) |
//!
//! Where delayq differs: an occurrence counts as missed only when it is more than
//! a grace in the past when a leader first makes it;
//! CronJob counts a deadline per job and gives up after 100 missed runs, where
//! `all` keeps the latest `max_catch_up`, so that a long outage never floods a
//! stream.

/// The policy for missed occurrences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Misfire {
    Skip,
    Once,
    All,
}

impl Misfire {
    pub fn parse(text: &str) -> Option<Misfire> {
        match text {
            "skip" => Some(Misfire::Skip),
            "once" => Some(Misfire::Once),
            "all" => Some(Misfire::All),
            _ => None,
        }
    }
}

/// Of the occurrences `missed` (in order, all past the grace), those to send now
/// under `policy`: their instants (each keeps its own id).
pub fn due_now(missed: &[i64], policy: Misfire, max_catch_up: usize) -> Vec<i64> {
    match policy {
        Misfire::Skip => Vec::new(),
        Misfire::Once => missed.last().copied().into_iter().collect(),
        Misfire::All => missed[missed.len().saturating_sub(max_catch_up)..].to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_sends_what_it_promises() {
        let missed = [10, 20, 30, 40];
        assert_eq!(due_now(&missed, Misfire::Skip, 10), Vec::<i64>::new());
        assert_eq!(due_now(&missed, Misfire::Once, 10), [40]);
        assert_eq!(due_now(&missed, Misfire::All, 10), [10, 20, 30, 40]);
        assert_eq!(due_now(&missed, Misfire::All, 2), [30, 40]);
        assert_eq!(due_now(&missed, Misfire::All, 0), Vec::<i64>::new());
        assert_eq!(due_now(&[], Misfire::Once, 10), Vec::<i64>::new());
        for (text, policy) in [
            ("skip", Misfire::Skip),
            ("once", Misfire::Once),
            ("all", Misfire::All),
        ] {
            assert_eq!(Misfire::parse(text), Some(policy));
        }
        assert_eq!(Misfire::parse("sometimes"), None);
    }
}
