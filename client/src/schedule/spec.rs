//! A recurring schedule as it is kept: the messages it makes and when, checked once
//! with errors that name the field.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Misfire, When};
use crate::message::{Fields, MessageId, MessageKey, validate_stream};

/// Longest schedule id: its occurrences' ids add a dot and up to 20 digits.
pub const MAX_SCHEDULE_ID_LEN: usize = 100;
/// The shortest `every`.
pub const MIN_EVERY: Duration = Duration::from_secs(1);
/// The most missed occurrences `misfire = "all"` sends.
pub const MAX_CATCH_UP: u32 = 1000;
/// `max_catch_up` when left out.
pub const DEFAULT_CATCH_UP: u32 = 10;

/// A schedule: a stream, the fields and key of the messages it makes, and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub id: String,
    pub stream: String,
    pub fields: Fields,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A cron expression (5 fields, or 6 with seconds), read in `timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA zone of `cron` (UTC when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Instead of `cron`: a fixed interval, from `start_at` (or the creation) on.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub every: Option<Duration>,
    /// No occurrence before this (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<u64>,
    /// No occurrence after this (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<u64>,
    /// Each occurrence's message is due up to this much later, the same amount for
    /// the same occurrence whoever makes it.
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub jitter: Option<Duration>,
    pub misfire: Misfire,
    pub max_catch_up: u32,
    #[serde(default)]
    pub paused: bool,
    /// Declared in the configuration file (`[[schedules]]`): changed only there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub declared: bool,
    /// When it was created (epoch ms): an `every` without `start_at` counts from it.
    pub created_at: u64,
    /// Its occurrences count from here (epoch ms): its creation, its last change or
    /// its resumption; none before is made, or missed.
    pub since: u64,
}

impl ScheduleSpec {
    /// The first occurrence a leader makes when it has made none yet.
    pub fn first(&self, when: &When) -> Option<i64> {
        let from = self.since.max(self.start_at.unwrap_or(0));
        when.next_after(from as i64 - 1)
    }
}

impl ScheduleSpec {
    /// Checks every rule that needs no clock: the id, the stream, the fields (against
    /// `field_rule`, the message rules of the deployment), the key, exactly one of
    /// `cron` and `every`, the zone, the bounds and the catch-up.
    pub fn validate(
        &self,
        field_rule: impl Fn(&Fields) -> Result<(), String>,
    ) -> Result<When, String> {
        if self.id.len() > MAX_SCHEDULE_ID_LEN || MessageId::parse(&self.id).is_err() {
            return Err(format!(
                "id {:?}: must be 1 to {MAX_SCHEDULE_ID_LEN} characters of A-Z a-z 0-9 . _ : -",
                self.id
            ));
        }
        validate_stream(&self.stream).map_err(|e| e.to_string())?;
        field_rule(&self.fields)?;
        if let Some(key) = &self.key {
            MessageKey::parse(key).map_err(|e| e.to_string())?;
        }
        if let (Some(start), Some(end)) = (self.start_at, self.end_at)
            && end < start
        {
            return Err(format!("end_at {end}: before start_at {start}"));
        }
        if self.max_catch_up > MAX_CATCH_UP {
            return Err(format!(
                "max_catch_up {}: must be 0 to {MAX_CATCH_UP}",
                self.max_catch_up
            ));
        }
        let when = match (&self.cron, self.every) {
            (Some(_), Some(_)) => return Err("cron, every: give one, not both".into()),
            (None, None) => return Err("cron or every: required".into()),
            (Some(cron), None) => {
                When::cron(cron, self.timezone.as_deref().unwrap_or("UTC")).map_err(|e| e.0)?
            }
            (None, Some(every)) => {
                if self.timezone.is_some() {
                    return Err("timezone: only with cron (every counts real time)".into());
                }
                if every < MIN_EVERY {
                    return Err(format!(
                        "every {}: must be at least 1s",
                        crate::human::duration(every)
                    ));
                }
                let anchor = self.start_at.unwrap_or(self.created_at);
                When::Every {
                    every,
                    anchor: i64::try_from(anchor).map_err(|_| "start_at: too far")?,
                }
            }
        };
        // A cron that matches no date left (`0 0 31 2 *`) never fires.
        let from = self
            .start_at
            .unwrap_or(self.created_at)
            .max(self.created_at);
        if when.next_after(from as i64 - 1).is_none() {
            return Err(format!(
                "cron {:?}: never fires",
                self.cron.as_deref().unwrap_or_default()
            ));
        }
        Ok(when)
    }

    /// The occurrence's delay past its instant, by `jitter`: a hash of the schedule
    /// and the instant, so every leader gives the same one.
    pub fn jitter_of(&self, at: i64) -> u64 {
        let Some(jitter) = self.jitter.filter(|j| !j.is_zero()) else {
            return 0;
        };
        let hash = crc32fast::hash(super::occurrence_id(&self.id, at).as_bytes());
        u64::from(hash) % (jitter.as_millis() as u64 + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ScheduleSpec {
        ScheduleSpec {
            id: "nightly".into(),
            stream: "reports".into(),
            fields: vec![("kind".into(), "nightly".into())],
            key: None,
            cron: Some("0 3 * * *".into()),
            timezone: Some("Europe/Berlin".into()),
            every: None,
            start_at: None,
            end_at: None,
            jitter: None,
            misfire: Misfire::Skip,
            max_catch_up: 10,
            paused: false,
            declared: false,
            created_at: 1_798_761_600_000,
            since: 1_798_761_600_000,
        }
    }

    fn ok(_: &Fields) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn each_bad_field_is_refused_by_name() {
        let refused = |s: ScheduleSpec| s.validate(ok).unwrap_err();
        assert!(spec().validate(ok).is_ok());
        assert!(
            refused(ScheduleSpec {
                id: "a b".into(),
                ..spec()
            })
            .starts_with("id \"a b\"")
        );
        assert!(
            refused(ScheduleSpec {
                id: "x".repeat(101),
                ..spec()
            })
            .starts_with("id ")
        );
        assert!(
            refused(ScheduleSpec {
                stream: "".into(),
                ..spec()
            })
            .starts_with("stream")
        );
        assert!(
            refused(ScheduleSpec {
                key: Some("a b".into()),
                ..spec()
            })
            .starts_with("key \"a b\"")
        );
        assert_eq!(
            refused(ScheduleSpec {
                cron: Some("0 0 31 2 *".into()),
                ..spec()
            }),
            "cron \"0 0 31 2 *\": never fires"
        );
        assert!(
            refused(ScheduleSpec {
                timezone: Some("Mars/Base".into()),
                ..spec()
            })
            .starts_with("timezone \"Mars/Base\"")
        );
        assert_eq!(
            refused(ScheduleSpec {
                every: Some(Duration::from_secs(5)),
                ..spec()
            }),
            "cron, every: give one, not both"
        );
        assert_eq!(
            refused(ScheduleSpec {
                cron: None,
                ..spec()
            }),
            "cron or every: required"
        );
        let every = |d: Duration| ScheduleSpec {
            cron: None,
            timezone: None,
            every: Some(d),
            ..spec()
        };
        assert_eq!(
            refused(every(Duration::from_millis(999))),
            "every 999ms: must be at least 1s"
        );
        assert!(every(Duration::from_secs(1)).validate(ok).is_ok());
        assert_eq!(
            refused(ScheduleSpec {
                start_at: Some(10),
                end_at: Some(5),
                ..spec()
            }),
            "end_at 5: before start_at 10"
        );
        assert!(
            refused(ScheduleSpec {
                max_catch_up: MAX_CATCH_UP + 1,
                ..spec()
            })
            .starts_with("max_catch_up")
        );
        assert!(
            ScheduleSpec {
                max_catch_up: MAX_CATCH_UP,
                ..spec()
            }
            .validate(ok)
            .is_ok()
        );
        let fields = |_: &Fields| Err("fields: no".to_owned());
        assert_eq!(spec().validate(fields).unwrap_err(), "fields: no");
    }

    #[test]
    fn jitter_is_the_same_for_an_occurrence_and_within_its_bound() {
        let jittered = ScheduleSpec {
            jitter: Some(Duration::from_secs(10)),
            ..spec()
        };
        for at in [0, 1_000, 1_798_761_600_000] {
            let j = jittered.jitter_of(at);
            assert!(j <= 10_000);
            assert_eq!(j, jittered.jitter_of(at));
        }
        assert_eq!(spec().jitter_of(5), 0);
    }

    #[test]
    fn a_schedule_reads_back_as_it_was_kept() {
        let every = ScheduleSpec {
            cron: None,
            timezone: None,
            every: Some(Duration::from_secs(90)),
            jitter: Some(Duration::from_millis(250)),
            key: Some("report".into()),
            ..spec()
        };
        for s in [spec(), every] {
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(
                serde_json::from_str::<ScheduleSpec>(&text).unwrap(),
                s,
                "{text}"
            );
        }
    }
}
