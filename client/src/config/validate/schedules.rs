//! `[scheduler]` and `[[schedules]]`: the horizon, the most schedules, and each
//! declared schedule checked as `POST /v1/schedules` checks one, refusals naming
//! it by place and id.

use std::time::Duration;

use super::super::raw::{RawInstant, RawSchedule, RawScheduler};
use super::super::schedules::{MAX_SCHEDULES_RANGE, SchedulerConfig};
use super::super::{ConfigError, ForwarderConfig, StreamsConfig, invalid};
use super::positive;
use crate::message::{check_field_names, parse_duration};
use crate::schedule::{DEFAULT_CATCH_UP, Misfire, ScheduleSpec};

impl RawScheduler {
    pub(in crate::config) fn validate(self) -> Result<SchedulerConfig, ConfigError> {
        let RawScheduler {
            horizon,
            max_schedules,
        } = self;
        if horizon < Duration::from_secs(1) || horizon > Duration::from_secs(3600) {
            return Err(invalid(
                "scheduler.horizon",
                format!("must be 1s to 1h (got {})", crate::human::duration(horizon)),
            ));
        }
        let (least, most) = MAX_SCHEDULES_RANGE;
        if max_schedules < least {
            return Err(invalid(
                "scheduler.max_schedules",
                format!("must be {least} to {most} (got {max_schedules})"),
            ));
        }
        let max_schedules = positive("scheduler.max_schedules", max_schedules, most)? as usize;
        Ok(SchedulerConfig {
            horizon,
            max_schedules,
        })
    }
}

/// The declared schedules, each checked and marked `declared`; ids unique, no
/// more than `scheduler.max_schedules`.
pub(in crate::config) fn declared(
    raw: Vec<RawSchedule>,
    scheduler: &SchedulerConfig,
    streams: &StreamsConfig,
    forwarder: &ForwarderConfig,
) -> Result<Vec<ScheduleSpec>, ConfigError> {
    if raw.len() > scheduler.max_schedules {
        return Err(invalid(
            "schedules",
            format!(
                "{} declared, more than scheduler.max_schedules ({})",
                raw.len(),
                scheduler.max_schedules
            ),
        ));
    }
    let own = super::super::fields::own_fields(forwarder, streams);
    let mut out: Vec<ScheduleSpec> = Vec::with_capacity(raw.len());
    for (i, schedule) in raw.into_iter().enumerate() {
        let place = format!("schedules[{i}] ({})", schedule.id);
        let spec = spec_of(schedule).map_err(|e| invalid(&place, e))?;
        if !streams.allows(&spec.stream) {
            return Err(invalid(
                &place,
                format!("stream {:?}: not in streams.allow", spec.stream),
            ));
        }
        spec.validate(|fields| {
            check_field_names(&spec.stream, fields, &own).map_err(|e| e.to_string())
        })
        .map_err(|e| invalid(&place, e))?;
        if out.iter().any(|s| s.id == spec.id) {
            return Err(invalid(&place, "declared twice"));
        }
        out.push(spec);
    }
    Ok(out)
}

/// One entry as a schedule (not yet checked against the rules `validate` holds).
fn spec_of(raw: RawSchedule) -> Result<ScheduleSpec, String> {
    let RawSchedule {
        id,
        stream,
        payload,
        fields,
        key,
        cron,
        timezone,
        every,
        start_at,
        end_at,
        jitter,
        misfire,
        max_catch_up,
        paused,
    } = raw;
    let fields = match (payload, fields) {
        (Some(_), Some(_)) => return Err("payload, fields: give one, not both".into()),
        (None, None) => return Err("fields: required (or payload)".into()),
        (Some(payload), None) => vec![("payload".to_owned(), payload)],
        (None, Some(fields)) if fields.is_empty() => {
            return Err("fields: must hold at least one field".into());
        }
        (None, Some(fields)) => fields.into_iter().collect(),
    };
    let duration = |name: &str, text: Option<String>| {
        text.map(|t| parse_duration(&t).map_err(|e| format!("{name}: {e}")))
            .transpose()
    };
    let misfire = match misfire {
        None => Misfire::Skip,
        Some(m) => {
            Misfire::parse(&m).ok_or_else(|| format!("misfire {m:?}: must be skip, once or all"))?
        }
    };
    let max_catch_up = match max_catch_up {
        None => DEFAULT_CATCH_UP,
        Some(n) => u32::try_from(n).map_err(|_| format!("max_catch_up {n}: must be 0 to 1000"))?,
    };
    Ok(ScheduleSpec {
        id,
        stream,
        fields,
        key,
        cron,
        timezone,
        every: duration("every", every)?,
        start_at: instant("start_at", start_at)?,
        end_at: instant("end_at", end_at)?,
        jitter: duration("jitter", jitter)?,
        misfire,
        max_catch_up,
        paused: paused.unwrap_or(false),
        declared: true,
        // Set when it is first stored (see the daemon's reconcile).
        created_at: 0,
        since: 0,
    })
}

fn instant(name: &str, raw: Option<RawInstant>) -> Result<Option<u64>, String> {
    match raw {
        None => Ok(None),
        Some(RawInstant::Ms(ms)) => u64::try_from(ms)
            .map(Some)
            .map_err(|_| format!("{name} {ms}: must be epoch milliseconds")),
        Some(RawInstant::Text(text)) => text
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|t| u64::try_from(t.as_millisecond()).ok())
            .map(Some)
            .ok_or_else(|| format!("{name} {text:?}: not an RFC 3339 time after 1970")),
    }
}
