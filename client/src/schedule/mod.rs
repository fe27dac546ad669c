//! Recurring schedules: what a schedule is and when it fires. Pure (no I/O).
//!
//! - `when.rs`: [`When`], a cron expression in a time zone or a fixed interval,
//!   and its occurrences through daylight saving time;
//! - `misfire.rs`: [`Misfire`], which occurrences missed during an outage are sent;
//! - `spec.rs`: [`ScheduleSpec`], a schedule as it is kept, and its rules;
//! - `plan.rs`: [`plan`], what one round of the leader makes of a schedule.
//!
//! An occurrence becomes an ordinary delayed message whose id is the schedule's id
//! and the occurrence's instant ([`occurrence_id`]), so that pushing it again
//! (another leader, a restart) is a duplicate, never a second message.

mod misfire;
mod plan;
mod spec;
mod when;

pub use misfire::{Misfire, due_now};
pub use plan::{MAX_MISSED_PER_ROUND, MAX_PER_ROUND, Plan, plan};
pub use spec::{DEFAULT_CATCH_UP, MAX_CATCH_UP, MAX_SCHEDULE_ID_LEN, MIN_EVERY, ScheduleSpec};
pub use when::{When, WhenError, zoned};

/// The message id of a schedule's occurrence at `at` (epoch ms): `<schedule>.<at>`.
pub fn occurrence_id(schedule: &str, at: i64) -> String {
    format!("{schedule}.{at}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::MessageId;

    #[test]
    fn an_occurrence_s_id_is_a_message_id() {
        let id = occurrence_id("nightly-report", 1_798_761_600_000);
        assert_eq!(id, "nightly-report.1798761600000");
        assert!(MessageId::parse(&id).is_ok());
    }
}
