//! What every edge case checks once its messages arrived: a refusal one over a
//! limit, exactly once and verbatim, dead letters, and the records.

use std::collections::HashMap;

use futures::StreamExt;
use serde_json::Value;

use super::Planned;
use crate::support::{Api, Entry, Tally, entries};

/// A push that must be refused with a JSON 4xx whose detail mentions `part`.
pub(super) async fn assert_refused_push(
    api: &Api,
    path: &str,
    body: &Value,
    (what, part): (&str, &str),
) {
    let (status, answer) = api.post(path, body.clone()).await;
    let detail = answer["detail"].as_str().unwrap_or_default();
    assert!(
        (400..500).contains(&status) && answer["error"].is_string() && detail.contains(part),
        "{what}: want a JSON 4xx naming {part:?}, got {status} {answer:.300}"
    );
}

/// Checks every planned message is in its stream exactly once as `attempt` (other
/// attempts ignored), verbatim and not early; returns id → entry id.
pub(super) fn check_delivered(
    conn: &mut redis::Connection,
    streams: &[String],
    planned: &[Planned],
    attempt: u32,
    ctx: &dyn Fn(&str) -> String,
) -> HashMap<String, String> {
    let mut seen: Vec<(String, Entry)> = Vec::new();
    for s in streams {
        for e in entries(conn, s) {
            if e.get("delayq-id").is_none() {
                panic!("{}", ctx(&format!("entry without delayq-id in {s}: {e:?}")));
            }
            if e.get("delayq-attempt") == Some(&attempt.to_string()) {
                seen.push((s.clone(), e));
            }
        }
    }
    let tally = Tally::of_ids(
        planned.iter().map(|m| m.id.as_str()),
        &seen.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(),
    );
    tally.assert_exact(&ctx(&format!("attempt {attempt}")));
    let by_id: HashMap<&str, &Planned> = planned.iter().map(|m| (m.id.as_str(), m)).collect();
    let mut out = HashMap::new();
    for (stream, e) in &seen {
        let m = by_id[e.get("delayq-id").unwrap()];
        assert_eq!(
            stream,
            &m.stream,
            "{}",
            ctx(&format!("{} in the wrong stream", m.id))
        );
        let mut want = m.fields.clone();
        want.push(("delayq-id".into(), m.id.clone()));
        want.push(("delayq-attempt".into(), attempt.to_string()));
        if e.fields != want {
            let shown = |f: &[(String, String)]| format!("{:.300}", format!("{f:?}"));
            panic!(
                "{}",
                ctx(&format!(
                    "{} not verbatim: got {} want {}",
                    m.id,
                    shown(&e.fields),
                    shown(&want)
                ))
            );
        }
        assert!(
            e.ms() >= m.due_ms,
            "{}",
            ctx(&format!(
                "{} (attempt {attempt}) delivered at {} before its due time {}",
                m.id,
                e.ms(),
                m.due_ms
            ))
        );
        out.insert(m.id.clone(), e.id.clone());
    }
    out
}

/// Checks every planned message is in its dead-letter stream exactly once, for running
/// out of attempts; returns id → dead-letter entry id.
pub(super) fn check_dead(
    conn: &mut redis::Connection,
    dead: &[String],
    planned: &[Planned],
    ctx: &dyn Fn(&str) -> String,
) -> HashMap<String, String> {
    let letters: Vec<Entry> = dead.iter().flat_map(|s| entries(conn, s)).collect();
    Tally::of_ids(planned.iter().map(|m| m.id.as_str()), &letters)
        .assert_exact(&ctx("dead-lettered once each"));
    let by_id: HashMap<&str, &Entry> = letters
        .iter()
        .map(|e| (e.get("delayq-id").unwrap(), e))
        .collect();
    let mut out = HashMap::new();
    for m in planned {
        let e = by_id[m.id.as_str()];
        assert_eq!(
            e.fields[..m.fields.len()],
            m.fields[..],
            "{}",
            ctx(&format!("{} dead letter keeps the fields", m.id))
        );
        assert_eq!(
            e.get("delayq-reason"),
            Some("max_attempts"),
            "{}",
            ctx(&m.id)
        );
        out.insert(m.id.clone(), e.id.clone());
    }
    out
}

/// Every planned message's `GET /v1/messages/{id}` answer, 32 at a time. As any
/// client, it asks again when Redis did not answer in time (503, on a loaded
/// machine; `redis.timeout` may be at its 50 ms minimum), up to five times, backing off.
pub(super) async fn records(api: &Api, planned: &[Planned]) -> Vec<(String, u16, Value)> {
    futures::stream::iter(planned)
        .map(|m| async move {
            let path = format!("/v1/messages/{}", m.id);
            let mut answer = api.get(&path).await;
            for attempt in 1..5 {
                if answer.0 != 503 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                answer = api.get(&path).await;
            }
            (m.id.clone(), answer.0, answer.1)
        })
        .buffer_unordered(32)
        .collect()
        .await
}

/// `GET /v1/messages/{id}` of every planned message says `state`, with the entry id found.
pub(super) async fn check_records(
    api: &Api,
    planned: &[Planned],
    entry_ids: &HashMap<String, String>,
    state: &str,
    ctx: &dyn Fn(&str) -> String,
) {
    let answers = records(api, planned).await;
    let wrong: Vec<String> = answers
        .iter()
        .filter(|(id, status, got)| {
            *status != 200
                || got["state"] != state
                || got["entry_id"].as_str() != entry_ids.get(id).map(String::as_str)
        })
        .map(|(id, status, got)| format!("{id}: {status} {got} (entry {:?})", entry_ids.get(id)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{}",
        ctx(&format!(
            "{} of {} not on record as {state}, e.g. {:?}",
            wrong.len(),
            planned.len(),
            &wrong[..wrong.len().min(3)]
        ))
    );
}
