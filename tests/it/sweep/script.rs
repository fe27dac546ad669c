//! The redeliver script, driven through `Store` against a real Redis, as one-line
//! cases.

use std::time::Duration;

use delayq_client::message::{Due, MessageId, NewMessage};
use delayq_client::store::{RedeliverOptions, Redelivered, ScheduleMode, Status, StoreError};

use super::{CONSUMER, GROUP};
use crate::support::{
    Bare, ack, claim, create_group, entries, let_pass, pending_ids, read_group, xadd,
};

const STREAM: &str = "s";

// Each case is a list of `(step, expected)` on stream `s`, group `g`, consumer `c`:
// - `opts K=V ...`: ack_timeout, max_attempts, backoff, backoff_max (ms), jitter,
//   random, retention (ms) (defaults 200, 2, 0, 0, 0, 0, 3600000)
// - `push ID [replace] [p=N] [ttl=MS]`: scheduled due now, fields k=ID n=1
// - `deliver`: forwards what is due and reads it as `c`; answers `ID@attempt` each
// - `wait MS`, `ack ID`, `claim ID` (XCLAIM to `c`, resetting idle), `xdel ID`
// - `sweep ID`: the redeliver script on each entry ID was delivered as, oldest first;
//   answers `rescheduled N in Ss` (due − now, rounded), `dead N`, `fresh`, ...
// - `scan`: message ids of the stale entries the store finds (`-` for foreign ones)
// - `foreign`: an entry delayq did not write, read by `c`
// - `other ID`: an entry as another deployment sharing `s` (another prefix) delivers
//   message ID, read by `c`
// - `fence N` raises the fences; `epoch N` is the sweeping leader's epoch (1)
// - `hurry ID`: reschedule to now; `get ID`: the state (scheduled: the attempt, and
//   the priority and whether it expires when they are set)
// - `dead`: the dead letters: `ID reason attempt=N first=#i last=#j k=..`, where #i
//   is which delivery of ID in `s` the time matches
// - `apart`: `s` is kept apart from here on (as with a `streams.max_rate`);
//   `held ID`: whether ID waits in `s`'s held set (`held` | `laid out`)
// - `replay`: replays every dead letter of `s` into it; answers each outcome

struct Case {
    bare: Bare,
    conn: redis::Connection,
    options: RedeliverOptions,
    random: f64,
    epoch: u64,
    /// Every entry delivered: (entry id, message id), in order.
    delivered: Vec<(String, String)>,
}

#[track_caller]
fn check(steps: &'static [(&'static str, &'static str)]) -> impl Future<Output = ()> {
    let caller = std::panic::Location::caller();
    async move {
        let bare = Bare::start("[redis]\nshards = 2\n").await;
        let mut conn = bare.redis.client();
        create_group(&mut conn, STREAM, GROUP);
        let mut case = Case {
            conn,
            options: RedeliverOptions {
                key_field: String::new(),
                ack_timeout: Duration::from_millis(200),
                max_attempts: 2,
                backoff_first: Duration::ZERO,
                backoff_max: Duration::ZERO,
                backoff_jitter: 0.0,
                dead_letter_stream: "s:dead".into(),
                id_field: "delayq-id".into(),
                attempt_field: "delayq-attempt".into(),
                retention: Duration::from_secs(3600),
            },
            random: 0.0,
            epoch: 1,
            delivered: Vec::new(),
            bare,
        };
        for (step, expected) in steps {
            let got = case.step(step).await;
            assert_eq!(&got, expected, "step {step:?} of the case at {caller}");
        }
    }
}

impl Case {
    fn entries_of(&self, id: &str) -> Vec<String> {
        self.delivered
            .iter()
            .filter(|(_, m)| m == id)
            .map(|(e, _)| e.clone())
            .collect()
    }

    async fn step(&mut self, step: &str) -> String {
        let store = self.bare.store.clone();
        let words: Vec<&str> = step.split_whitespace().collect();
        let id = |i: usize| MessageId::parse(words[i]).unwrap();
        match words[0] {
            "opts" => {
                for opt in &words[1..] {
                    let (k, v) = opt.split_once('=').unwrap();
                    let ms = || Duration::from_millis(v.parse().unwrap());
                    match k {
                        "ack_timeout" => self.options.ack_timeout = ms(),
                        "max_attempts" => self.options.max_attempts = v.parse().unwrap(),
                        "backoff" => self.options.backoff_first = ms(),
                        "backoff_max" => self.options.backoff_max = ms(),
                        "jitter" => self.options.backoff_jitter = v.parse().unwrap(),
                        "random" => self.random = v.parse().unwrap(),
                        "retention" => self.options.retention = ms(),
                        _ => panic!("bad option {opt}"),
                    }
                }
                String::new()
            }
            "push" => {
                let msg = NewMessage {
                    key: None,
                    id: id(1),
                    stream: STREAM.into(),
                    fields: vec![("k".into(), words[1].into()), ("n".into(), "1".into())],
                    due: Due::In(Duration::ZERO),
                    priority: 0,
                    ttl: None,
                };
                let mut msg = msg;
                let mut mode = ScheduleMode::New;
                for opt in &words[2..] {
                    match opt.split_once('=') {
                        Some(("p", n)) => msg.priority = n.parse().unwrap(),
                        Some(("ttl", n)) => {
                            msg.ttl = Some(Duration::from_millis(n.parse().unwrap()))
                        }
                        None if *opt == "replace" => mode = ScheduleMode::Replace,
                        _ => panic!("bad option {opt}"),
                    }
                }
                format!(
                    "{:?}",
                    store
                        .schedule(&msg, mode, Duration::from_secs(60))
                        .await
                        .unwrap()
                )
                .split_whitespace()
                .next()
                .unwrap()
                .to_lowercase()
            }
            "deliver" => {
                let options = self.bare.config.forward_options();
                for shard in 0..store.shards() {
                    match store.forward(shard, self.epoch, &options).await {
                        Ok(_) => {}
                        Err(StoreError::Fenced { .. }) => return "fenced".into(),
                        Err(e) => panic!("forward: {e}"),
                    }
                }
                let got = read_group(&mut self.conn, STREAM, GROUP, CONSUMER);
                let mut out = Vec::new();
                for e in got {
                    let m = e.get("delayq-id").unwrap_or("-").to_owned();
                    out.push(format!("{m}@{}", e.get("delayq-attempt").unwrap_or("-")));
                    self.delivered.push((e.id.clone(), m));
                }
                out.join(",")
            }
            "wait" => {
                let_pass(Duration::from_millis(words[1].parse().unwrap())).await;
                String::new()
            }
            "ack" => {
                for e in self.entries_of(words[1]) {
                    ack(&mut self.conn, STREAM, GROUP, &e);
                }
                String::new()
            }
            "claim" => {
                for e in self.entries_of(words[1]) {
                    claim(&mut self.conn, STREAM, GROUP, CONSUMER, &e);
                }
                String::new()
            }
            "xdel" => {
                for e in self.entries_of(words[1]) {
                    let _: u64 = redis::cmd("XDEL")
                        .arg(STREAM)
                        .arg(&e)
                        .query(&mut self.conn)
                        .unwrap();
                }
                String::new()
            }
            "other" => {
                let fields = [
                    ("k", words[1]),
                    ("n", "1"),
                    ("delayq-id", words[1]),
                    ("delayq-attempt", "1"),
                ];
                let entry = xadd(&mut self.conn, STREAM, &fields);
                self.delivered.push((entry, words[1].to_owned()));
                read_group(&mut self.conn, STREAM, GROUP, CONSUMER)
                    .len()
                    .to_string()
            }
            "foreign" => {
                xadd(&mut self.conn, STREAM, &[("x", "1")]);
                read_group(&mut self.conn, STREAM, GROUP, CONSUMER)
                    .len()
                    .to_string()
            }
            "fence" => {
                store.raise_fences(words[1].parse().unwrap()).await.unwrap();
                String::new()
            }
            "epoch" => {
                self.epoch = words[1].parse().unwrap();
                String::new()
            }
            "hurry" => {
                store
                    .reschedule(&id(1), Due::In(Duration::ZERO), Duration::from_secs(60))
                    .await
                    .unwrap();
                String::new()
            }
            "get" => match store.get(&id(1)).await.unwrap() {
                Status::Scheduled(s) => {
                    let mut out = format!("scheduled attempt={}", s.attempt);
                    if s.priority > 0 {
                        out += &format!(" p={}", s.priority);
                    }
                    if s.expire_at_ms.is_some() {
                        out += " expires";
                    }
                    out
                }
                Status::Done(r) => r.state.as_str().to_owned(),
                other => format!("{other:?}"),
            },
            "scan" => {
                let found = store
                    .stale_entries(STREAM, GROUP, None, 100, &self.options)
                    .await
                    .unwrap();
                match found {
                    None => "nogroup".into(),
                    Some(found) => found
                        .iter()
                        .map(|p| {
                            p.message_id
                                .as_ref()
                                .map_or("-".to_owned(), |m| m.as_str().to_owned())
                        })
                        .collect::<Vec<_>>()
                        .join(","),
                }
            }
            "sweep" => {
                let mut out = Vec::new();
                for entry in self.entries_of(words[1]) {
                    let now = store.now_ms().await.unwrap();
                    let outcome = store
                        .redeliver(
                            self.epoch,
                            STREAM,
                            GROUP,
                            &entry,
                            &id(1),
                            &self.options,
                            self.random,
                        )
                        .await;
                    out.push(match outcome {
                        Ok(Redelivered::Rescheduled { attempt, due_ms }) => {
                            format!(
                                "rescheduled {attempt} in {}s",
                                (due_ms.saturating_sub(now) + 500) / 1000
                            )
                        }
                        Ok(Redelivered::DeadLettered { attempts, .. }) => {
                            format!("dead {attempts}")
                        }
                        Ok(other) => format!("{other:?}").to_lowercase(),
                        Err(StoreError::Fenced { .. }) => "fenced".into(),
                        Err(e) => panic!("redeliver: {e}"),
                    });
                }
                out.join(",")
            }
            "dead" => {
                let dead = entries(&mut self.conn, "s:dead");
                dead.iter()
                    .map(|d| {
                        let id = d.get("delayq-id").unwrap();
                        let times: Vec<u64> = self
                            .entries_of(id)
                            .iter()
                            .map(|e| e.split('-').next().unwrap().parse().unwrap())
                            .collect();
                        let which = |name: &str| {
                            let t: u64 = d.get(name).unwrap().parse().unwrap();
                            times
                                .iter()
                                .position(|&x| x == t)
                                .map_or("?".to_owned(), |i| format!("#{}", i + 1))
                        };
                        let fields: Vec<String> = d
                            .producer_fields()
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect();
                        format!(
                            "{id} {} attempt={} first={} last={} group={} consumer={} {}",
                            d.get("delayq-reason").unwrap(),
                            d.get("delayq-attempt").unwrap(),
                            which("delayq-first-delivery"),
                            which("delayq-last-delivery"),
                            d.get("delayq-group").unwrap(),
                            d.get("delayq-consumer").unwrap(),
                            fields.join(" "),
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            }
            "apart" => {
                store.keep_apart([STREAM.to_owned()]);
                String::new()
            }
            "held" => {
                let shard = id(1).shard(store.shards());
                let key = store.keys().shard(shard).held_of(STREAM);
                let score: Option<f64> = redis::cmd("ZSCORE")
                    .arg(key)
                    .arg(words[1])
                    .query(&mut self.conn)
                    .unwrap();
                let laid_out = matches!(store.get(&id(1)).await.unwrap(), Status::Scheduled(_));
                match (score.is_some(), laid_out) {
                    (true, _) => "held".into(),
                    (false, true) => "laid out".into(),
                    (false, false) => "not scheduled".into(),
                }
            }
            "replay" => {
                let (id_field, attempt_field) =
                    (&self.options.id_field, &self.options.attempt_field);
                let letters = store
                    .dead_letters("s:dead", None, 100, id_field, attempt_field, "")
                    .await
                    .unwrap();
                let mut out = Vec::new();
                for letter in &letters {
                    let replayed = store
                        .replay_dead_letter("s:dead", letter, STREAM, id_field, attempt_field, "")
                        .await
                        .unwrap();
                    out.push(
                        format!("{replayed:?}")
                            .split_whitespace()
                            .next()
                            .unwrap()
                            .to_lowercase(),
                    );
                }
                out.join(",")
            }
            "pending" => {
                let now = pending_ids(&mut self.conn, STREAM, GROUP);
                self.delivered
                    .iter()
                    .filter(|(e, _)| now.contains(e))
                    .map(|(_, m)| m.clone())
                    .collect::<Vec<_>>()
                    .join(",")
            }
            other => panic!("unknown step {other}"),
        }
    }
}

#[tokio::test]
async fn an_unacknowledged_entry_is_redelivered_then_dead_lettered_once() {
    check(&[
        ("push a", "scheduled"),
        ("deliver", "a@1"),
        ("sweep a", "fresh"),
        ("wait 250", ""),
        ("scan", "a"),
        ("sweep a", "rescheduled 2 in 0s"),
        // Again for the same entry (a crash after the script, before its caller
        // knew): no longer pending, nothing happens.
        ("sweep a", "fresh"),
        ("pending", ""),
        ("get a", "scheduled attempt=2"),
        ("deliver", "a@2"),
        ("wait 250", ""),
        ("sweep a", "fresh,dead 2"),
        ("sweep a", "fresh,fresh"),
        ("get a", "dead"),
        (
            "dead",
            "a max_attempts attempt=2 first=#1 last=#2 group=g consumer=c k=a n=1",
        ),
        ("pending", ""),
        ("deliver", ""),
    ])
    .await;
}

/// A stream kept apart (rate-limited) gets its messages back into its held set
/// whichever way they come back: a reschedule, a redelivery, a dead letter replayed;
/// each is sent from there once, as attempt 1, 2, then 1 again.
#[tokio::test]
async fn a_stream_kept_apart_keeps_its_redeliveries_reschedules_and_replays_apart() {
    check(&[
        ("push a", "scheduled"),
        ("held a", "laid out"),
        ("apart", ""),
        ("hurry a", ""),
        ("held a", "held"),
        ("deliver", "a@1"),
        ("held a", "not scheduled"),
        ("wait 250", ""),
        ("sweep a", "rescheduled 2 in 0s"),
        ("held a", "held"),
        ("deliver", "a@2"),
        ("wait 250", ""),
        ("sweep a", "fresh,dead 2"),
        ("replay", "replayed"),
        ("held a", "held"),
        ("get a", "scheduled attempt=1"),
        ("deliver", "a@1"),
        ("held a", "not scheduled"),
        ("deliver", ""),
    ])
    .await;
}

#[tokio::test]
async fn a_redelivery_keeps_the_priority_and_the_expiry() {
    check(&[
        ("opts max_attempts=3", ""),
        ("push a p=7 ttl=2000", "scheduled"),
        ("push b", "scheduled"),
        ("deliver", "a@1,b@1"),
        ("wait 250", ""),
        ("sweep a", "rescheduled 2 in 0s"),
        ("sweep b", "rescheduled 2 in 0s"),
        ("get a", "scheduled attempt=2 p=7 expires"),
        ("get b", "scheduled attempt=2"),
        ("deliver", "a@2,b@2"),
        // Past due + ttl, the next redelivery is dead-lettered as expired.
        ("wait 1900", ""),
        ("sweep a", "fresh,rescheduled 3 in 0s"),
        ("deliver", ""),
        ("get a", "expired"),
    ])
    .await;
}

#[tokio::test]
async fn acknowledged_or_reclaimed_entries_are_left_alone() {
    check(&[
        ("push a", "scheduled"),
        ("push b", "scheduled"),
        ("deliver", "a@1,b@1"),
        ("wait 250", ""),
        ("ack a", ""),
        ("claim b", ""),
        ("scan", ""),
        ("sweep a", "fresh"),
        ("sweep b", "fresh"),
        ("pending", "b"),
        ("get a", "delivered"),
    ])
    .await;
}

#[tokio::test]
async fn a_message_pushed_again_supersedes_its_stale_entry() {
    check(&[
        ("push a", "scheduled"),
        ("deliver", "a@1"),
        ("push a replace", "replaced"),
        ("wait 250", ""),
        ("sweep a", "superseded"),
        ("pending", ""),
        ("deliver", "a@1"),
        ("push a replace", "replaced"),
        ("deliver", "a@1"),
        ("wait 250", ""),
        // The older entry is not the message's latest delivery: only acknowledged.
        ("sweep a", "fresh,superseded,rescheduled 2 in 0s"),
        ("deliver", "a@2"),
    ])
    .await;
}

#[tokio::test]
async fn entries_not_written_by_delayq_or_deleted_are_not_redelivered() {
    check(&[
        ("foreign", "1"),
        ("push a", "scheduled"),
        ("deliver", "a@1"),
        ("wait 250", ""),
        ("scan", "-,a"),
        ("xdel a", ""),
        ("scan", "-,-"),
        ("sweep a", "gone"),
        ("scan", "-"),
        ("deliver", ""),
    ])
    .await;
}

#[tokio::test]
async fn an_entry_another_deployment_delivered_is_left_to_it() {
    check(&[
        ("other a", "1"),
        ("push b", "scheduled"),
        ("deliver", "b@1"),
        ("wait 250", ""),
        ("scan", "a,b"),
        ("sweep a", "foreign"),
        ("sweep b", "rescheduled 2 in 0s"),
        ("pending", "a"),
        ("get a", "Unknown"),
        // Older than the retention, its record could be gone: taken as one's own.
        ("opts retention=100", ""),
        ("sweep a", "rescheduled 2 in 0s"),
        ("pending", ""),
    ])
    .await;
}

#[tokio::test]
async fn a_deposed_leader_cannot_sweep() {
    check(&[
        ("push a", "scheduled"),
        ("deliver", "a@1"),
        ("wait 250", ""),
        ("fence 5", ""),
        ("sweep a", "fenced"),
        ("pending", "a"),
        ("epoch 5", ""),
        ("sweep a", "rescheduled 2 in 0s"),
        ("sweep a", "fresh"),
    ])
    .await;
}

#[tokio::test]
async fn backoff_doubles_up_to_its_cap_less_jitter() {
    check(&[
        ("opts max_attempts=9 backoff=10000 backoff_max=15000", ""),
        ("push a", "scheduled"),
        ("deliver", "a@1"),
        ("wait 250", ""),
        ("sweep a", "rescheduled 2 in 10s"),
        ("hurry a", ""),
        ("deliver", "a@2"),
        ("wait 250", ""),
        ("sweep a", "fresh,rescheduled 3 in 15s"),
        ("opts jitter=0.5 random=0.6", ""),
        ("push b", "scheduled"),
        ("deliver", "b@1"),
        ("wait 250", ""),
        ("sweep b", "rescheduled 2 in 7s"),
    ])
    .await;
}
