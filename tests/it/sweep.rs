//! Redelivery of unacknowledged entries, and dead letters: the redeliver script as
//! one-line cases against a real Redis, then whole daemons (in-process, and real
//! processes killed with SIGKILL) with consumers that ack, never ack, or hold on.

use std::collections::BTreeMap;
use std::time::Duration;

use delayq::harness::{DelayqProcess, RedisServer};
use delayq::message::{Due, MessageId, NewMessage};
use delayq::store::{RedeliverOptions, Redelivered, ScheduleMode, Status, StoreError};
use redis::Value;
use serde_json::json;

use crate::support::{self, Bare, Entry, Env, delayq_bin, entries, eventually};

const STREAM: &str = "s";
const GROUP: &str = "g";
const CONSUMER: &str = "c";

// ---- consumer side, with a plain synchronous connection ---------------------------

fn create_group(conn: &mut redis::Connection, stream: &str, group: &str) {
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .arg("MKSTREAM")
        .query(conn)
        .expect("XGROUP CREATE");
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// XREADGROUP `>`: entries never handed to the group before, without blocking.
fn read_new(conn: &mut redis::Connection, stream: &str, group: &str, consumer: &str) -> Vec<Entry> {
    let reply: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(10_000)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query(conn)
        .expect("XREADGROUP");
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in streams {
        let Value::Array(parts) = s else {
            panic!("stream")
        };
        let Value::Array(items) = &parts[1] else {
            panic!("entries")
        };
        for item in items {
            let Value::Array(e) = item else {
                panic!("entry")
            };
            let Value::Array(kv) = &e[1] else {
                panic!("fields")
            };
            out.push(Entry {
                id: text(&e[0]),
                fields: kv.chunks(2).map(|p| (text(&p[0]), text(&p[1]))).collect(),
            });
        }
    }
    out
}

fn ack(conn: &mut redis::Connection, stream: &str, group: &str, entry: &str) {
    let _: u64 = redis::cmd("XACK")
        .arg(stream)
        .arg(group)
        .arg(entry)
        .query(conn)
        .unwrap();
}

/// Entry ids pending in the group, oldest first.
fn pending(conn: &mut redis::Connection, stream: &str, group: &str) -> Vec<String> {
    let reply: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(10_000)
        .query(conn)
        .unwrap();
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .iter()
        .map(|i| match i {
            Value::Array(p) => text(&p[0]),
            other => panic!("pending item {other:?}"),
        })
        .collect()
}

fn xlen(conn: &mut redis::Connection, stream: &str) -> usize {
    redis::cmd("XLEN").arg(stream).query(conn).unwrap()
}

/// The producer's fields of an entry: everything before delayq's own.
fn producer_fields(e: &Entry) -> Vec<(String, String)> {
    e.fields
        .iter()
        .filter(|(k, _)| !k.starts_with("delayq-"))
        .cloned()
        .collect()
}

// ---- the redeliver script, as one-line cases --------------------------------------
//
// Each case is a list of `(step, expected)` on stream `s`, group `g`, consumer `c`:
// - `opts K=V ...`: ack_timeout, max_attempts, backoff, backoff_max (ms), jitter,
//   random (defaults 200, 2, 0, 0, 0, 0)
// - `push ID [replace] [p=N] [ttl=MS]`: scheduled due now, fields k=ID n=1
// - `deliver`: forwards what is due and reads it as `c`; answers `ID@attempt` each
// - `wait MS`, `ack ID`, `claim ID` (XCLAIM to `c`, resetting idle), `xdel ID`
// - `sweep ID`: the redeliver script on each entry ID was delivered as, oldest first;
//   answers `rescheduled N in Ss` (due − now, rounded), `dead N`, `fresh`, ...
// - `scan`: message ids of the stale entries the store finds (`-` for foreign ones)
// - `foreign`: an entry delayq did not write, read by `c`
// - `fence N` raises the fences; `epoch N` is the sweeping leader's epoch (1)
// - `hurry ID`: reschedule to now; `get ID`: the state (scheduled: the attempt, and
//   the priority and whether it expires when they are set)
// - `dead`: the dead letters: `ID reason attempt=N first=#i last=#j k=..`, where #i
//   is which delivery of ID in `s` the time matches

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
                        _ => panic!("bad option {opt}"),
                    }
                }
                String::new()
            }
            "push" => {
                let msg = NewMessage {
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
                let got = read_new(&mut self.conn, STREAM, GROUP, CONSUMER);
                let mut out = Vec::new();
                for e in got {
                    let m = e.get("delayq-id").unwrap_or("-").to_owned();
                    out.push(format!("{m}@{}", e.get("delayq-attempt").unwrap_or("-")));
                    self.delivered.push((e.id.clone(), m));
                }
                out.join(",")
            }
            "wait" => {
                tokio::time::sleep(Duration::from_millis(words[1].parse().unwrap())).await;
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
                    let _: Value = redis::cmd("XCLAIM")
                        .arg(STREAM)
                        .arg(GROUP)
                        .arg(CONSUMER)
                        .arg(0)
                        .arg(&e)
                        .query(&mut self.conn)
                        .unwrap();
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
            "foreign" => {
                let _: String = redis::cmd("XADD")
                    .arg(STREAM)
                    .arg("*")
                    .arg("x")
                    .arg("1")
                    .query(&mut self.conn)
                    .unwrap();
                read_new(&mut self.conn, STREAM, GROUP, CONSUMER)
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
                        let fields: Vec<String> = producer_fields(d)
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
            "pending" => {
                let now = pending(&mut self.conn, STREAM, GROUP);
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

// ---- whole daemons -------------------------------------------------------------------

/// Delivery settings for tests: a fast sweep, a short ack timeout, short backoffs;
/// `extra` lines (`key = value`) add to or replace these.
fn delivery(streams: &[&str], extra: &str) -> String {
    let defaults = [
        format!("groups = [\"{GROUP}\"]"),
        "ack_timeout = \"500ms\"".to_owned(),
        "sweep_interval = \"50ms\"".to_owned(),
        "backoff = \"100ms\"".to_owned(),
        "backoff_max = \"200ms\"".to_owned(),
        "backoff_jitter = 0.0".to_owned(),
    ];
    let given: Vec<&str> = extra
        .lines()
        .filter_map(|l| l.split('=').next())
        .map(str::trim)
        .collect();
    let mut text = "[delivery]\n".to_owned();
    for line in defaults
        .iter()
        .filter(|d| !given.contains(&d.split('=').next().unwrap().trim()))
    {
        text.push_str(&format!("{line}\n"));
    }
    text.push_str(&format!("{extra}\n"));
    for s in streams {
        text.push_str(&format!("[delivery.streams.\"{s}\"]\n"));
    }
    text
}

/// What a consumer does with the first delivery of a message.
#[derive(Clone, Copy, Debug)]
enum Consumer {
    /// Reads and never acknowledges (it crashed).
    NeverAcks,
    /// Acknowledges at once.
    Acks,
    /// Works slowly, XCLAIMing the entry to itself every so often, then acknowledges.
    Claims(Duration),
}

/// Pushes one message to `stream`, lets a consumer handle its first delivery as
/// `consumer` says for 4 ack timeouts, and checks whether it was redelivered.
async fn consume(env: &Env, stream: &str, consumer: Consumer, redelivered: bool) {
    let mut conn = env.redis.client();
    create_group(&mut conn, stream, GROUP);
    let id = format!("{stream}-1");
    let (status, body) = env
        .post("/v1/messages", json!({ "stream": stream, "id": id, "fields": [["order", "42"], ["kind", "reminder"]], "delay_ms": 0 }))
        .await;
    assert_eq!(status, 201, "{body}");
    let first = eventually(Duration::from_secs(5), "first delivery", || {
        std::future::ready(read_new(&mut conn, stream, GROUP, CONSUMER).pop())
    })
    .await;
    assert_eq!(first.get("delayq-attempt"), Some("1"));
    if let Consumer::Acks = consumer {
        ack(&mut conn, stream, GROUP, &first.id);
    }
    let window = Duration::from_millis(2000);
    let started = std::time::Instant::now();
    let mut last_claim = started;
    let mut again = None;
    while started.elapsed() < window && again.is_none() {
        if let Consumer::Claims(every) = consumer
            && last_claim.elapsed() >= every
        {
            let _: Value = redis::cmd("XCLAIM")
                .arg(stream)
                .arg(GROUP)
                .arg(CONSUMER)
                .arg(0)
                .arg(&first.id)
                .query(&mut conn)
                .unwrap();
            last_claim = std::time::Instant::now();
        }
        again = read_new(&mut conn, stream, GROUP, CONSUMER).pop();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !redelivered {
        assert!(
            again.is_none(),
            "{stream} ({consumer:?}): redelivered: {again:?}"
        );
        assert_eq!(xlen(&mut conn, stream), 1, "{stream} ({consumer:?})");
        if let Consumer::Claims(_) = consumer {
            assert_eq!(
                pending(&mut conn, stream, GROUP),
                vec![first.id.clone()],
                "{stream}: the slow consumer still holds its entry"
            );
            ack(&mut conn, stream, GROUP, &first.id);
        }
        return;
    }
    let again = again
        .unwrap_or_else(|| panic!("{stream} ({consumer:?}): not redelivered within {window:?}"));
    assert_eq!(again.get("delayq-id"), Some(id.as_str()), "{stream}");
    assert_eq!(again.get("delayq-attempt"), Some("2"), "{stream}");
    assert_eq!(
        producer_fields(&again),
        producer_fields(&first),
        "{stream}: same fields, same order"
    );
    assert_eq!(
        again.fields.len(),
        first.fields.len(),
        "{stream}: {again:?}"
    );
    assert!(
        again.ms() >= first.ms() + 500,
        "{stream}: redelivered before ack_timeout: {} after",
        again.ms() - first.ms()
    );
    assert_eq!(
        pending(&mut conn, stream, GROUP),
        vec![again.id.clone()],
        "{stream}: the stale entry was acknowledged"
    );
    ack(&mut conn, stream, GROUP, &again.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_that_do_not_ack_in_time_get_the_message_again() {
    let env = Env::start(&delivery(&["never-acks", "acks", "claims"], "")).await;
    tokio::join!(
        consume(&env, "never-acks", Consumer::NeverAcks, true),
        consume(&env, "acks", Consumer::Acks, false),
        consume(
            &env,
            "claims",
            Consumer::Claims(Duration::from_millis(150)),
            false
        ),
    );
    let metrics = support::metrics(&env.http, env.url("/metrics"))
        .await
        .unwrap();
    assert!(
        metrics.contains("delayq_messages_redelivered_total{stream=\"never-acks\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("delayq_messages_redelivered_total{stream=\"acks\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("delayq_sweep_duration_seconds_count"),
        "{metrics}"
    );
}

/// Runs `delayq dead ...` against the daemon; returns exit code and stdout.
async fn cli(env: &Env, args: &[&str]) -> (i32, String) {
    let url = env.url("");
    let mut cmd = tokio::process::Command::new(delayq_bin());
    cmd.arg("dead").args(args).arg("--url").arg(url);
    let out = cmd.output().await.expect("run delayq");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_can_be_listed_replayed_and_purged() {
    let stream = "orders";
    let env = Env::start(&delivery(&[stream], "max_attempts = 3")).await;
    let mut conn = env.redis.client();
    create_group(&mut conn, stream, GROUP);
    for id in ["d1", "d2"] {
        let (status, body) = env
            .post("/v1/messages", json!({ "stream": stream, "id": id, "fields": { "order": id, "kind": "reminder" }, "delay_ms": 0 }))
            .await;
        assert_eq!(status, 201, "{body}");
    }
    // A consumer that reads everything and never acknowledges.
    let mut seen: Vec<Entry> = Vec::new();
    eventually(
        Duration::from_secs(15),
        "both messages dead-lettered",
        || {
            seen.extend(read_new(&mut conn, stream, GROUP, CONSUMER));
            std::future::ready((xlen(&mut conn, "orders:dead") == 2).then_some(()))
        },
    )
    .await;
    for id in ["d1", "d2"] {
        let attempts: Vec<&str> = seen
            .iter()
            .filter(|e| e.get("delayq-id") == Some(id))
            .map(|e| e.get("delayq-attempt").unwrap())
            .collect();
        assert_eq!(
            attempts,
            ["1", "2", "3"],
            "{id}: delivered three times, then no more"
        );
        let (_, status) = env.get(&format!("/v1/messages/{id}")).await;
        assert_eq!(status["state"], "dead", "{status}");
        assert_eq!(status["stream"], "orders:dead", "{status}");
    }
    assert_eq!(
        pending(&mut conn, stream, GROUP),
        Vec::<String>::new(),
        "every stale entry acknowledged"
    );

    let (status, list) = env.get(&format!("/v1/streams/{stream}/dead")).await;
    assert_eq!(status, 200, "{list}");
    let letters = list["entries"].as_array().unwrap();
    assert_eq!(letters.len(), 2, "{list}");
    let d1 = letters.iter().find(|l| l["id"] == "d1").expect("d1 listed");
    assert_eq!(d1["reason"], "max_attempts");
    assert_eq!(d1["attempt"], 3);
    assert_eq!(d1["fields"], json!([["order", "d1"], ["kind", "reminder"]]));
    let first_ms = seen
        .iter()
        .find(|e| e.get("delayq-id") == Some("d1"))
        .unwrap()
        .ms();
    let last_ms = seen
        .iter()
        .rfind(|e| e.get("delayq-id") == Some("d1"))
        .unwrap()
        .ms();
    assert_eq!(d1["first_delivery"], first_ms);
    assert_eq!(d1["last_delivery"], last_ms);
    assert_eq!(d1["delayq"]["delayq-group"], GROUP);

    let (code, out) = cli(&env, &["list", stream]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("2 dead letter(s) in orders:dead")
            && out.contains("id=d1")
            && out.contains("reason=max_attempts"),
        "{out}"
    );

    // Replay one by id: back in the stream as attempt 1, gone from the dead letters.
    let (code, out) = cli(&env, &["replay", stream, "--id", "d1"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("replayed 1 dead letter(s)"), "{out}");
    let replayed = eventually(Duration::from_secs(5), "replayed message delivered", || {
        std::future::ready(read_new(&mut conn, stream, GROUP, CONSUMER).pop())
    })
    .await;
    assert_eq!(replayed.get("delayq-id"), Some("d1"));
    assert_eq!(replayed.get("delayq-attempt"), Some("1"));
    assert_eq!(
        producer_fields(&replayed),
        [
            ("order".into(), "d1".into()),
            ("kind".into(), "reminder".into())
        ]
    );
    ack(&mut conn, stream, GROUP, &replayed.id);
    let dead = entries(&mut conn, "orders:dead");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].get("delayq-id"), Some("d2"));

    // An id that is not a dead letter is reported; nothing else changes.
    let (status, body) = env
        .post(
            &format!("/v1/streams/{stream}/dead/replay"),
            json!({ "ids": ["nope"] }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["not_found"], json!(["nope"]));
    assert_eq!(body["replayed"], json!([]));
    let (code, _) = cli(&env, &["replay", stream, "--id", "nope"]).await;
    assert_eq!(code, 1);
    let (status, body) = env
        .post(&format!("/v1/streams/{stream}/dead/replay"), json!({}))
        .await;
    assert_eq!(status, 422, "{body}");

    // Purge the rest.
    let (code, out) = cli(&env, &["purge", stream, "--all"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("purged 1 dead letter(s)"), "{out}");
    assert_eq!(xlen(&mut conn, "orders:dead"), 0);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        read_new(&mut conn, stream, GROUP, CONSUMER),
        Vec::<Entry>::new(),
        "nothing more arrives"
    );
    let (_, status) = env.get("/v1/messages/d1").await;
    assert_eq!(status["state"], "delivered", "{status}");
}

fn process_config(redis: &RedisServer, extra: &str) -> String {
    format!("[redis]\nurl = \"{}\"\nshards = 4\n\n{extra}", redis.url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_sweep_loses_and_doubles_nothing() {
    const N: usize = 100;
    let stream = "kill";
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.client();
    create_group(&mut conn, stream, GROUP);
    // Small passes (10 entries per 100 ms) so the kill lands while the sweep works.
    let config = process_config(
        &redis,
        &delivery(
            &[stream],
            "max_attempts = 5\nsweep_batch = 10\nsweep_interval = \"100ms\"",
        ),
    );
    let mut node = DelayqProcess::start(&delayq_bin(), "n1", &config).unwrap();
    let http = reqwest::Client::new();
    for i in 0..N {
        let resp = http
            .post(node.url("/v1/messages"))
            .json(&json!({ "stream": stream, "id": format!("k{i}"), "payload": i.to_string(), "delay_ms": 0 }))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
    }
    // The consumer drops attempt 1 of everything (as if it crashed) and acks the rest.
    let mut seen: Vec<Entry> = Vec::new();
    let consume = |conn: &mut redis::Connection, seen: &mut Vec<Entry>| {
        for e in read_new(conn, stream, GROUP, CONSUMER) {
            if e.get("delayq-attempt") != Some("1") {
                ack(conn, stream, GROUP, &e.id);
            }
            seen.push(e);
        }
    };
    eventually(Duration::from_secs(20), "the sweep under way", || {
        consume(&mut conn, &mut seen);
        std::future::ready((xlen(&mut conn, stream) >= N + 10).then_some(()))
    })
    .await;
    node.kill();
    let at_kill = xlen(&mut conn, stream);
    assert!(
        at_kill < 2 * N,
        "the sweep had finished before the kill ({at_kill} entries); the test needs a slower sweep"
    );
    node.restart().unwrap();
    eventually(
        Duration::from_secs(30),
        "every message redelivered once and acknowledged",
        || {
            consume(&mut conn, &mut seen);
            let done =
                xlen(&mut conn, stream) >= 2 * N && pending(&mut conn, stream, GROUP).is_empty();
            std::future::ready(done.then_some(()))
        },
    )
    .await;
    // Anything doubled would show up within a few sweep passes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    consume(&mut conn, &mut seen);
    let mut attempts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in entries(&mut conn, stream) {
        attempts
            .entry(e.get("delayq-id").unwrap().to_owned())
            .or_default()
            .push(e.get("delayq-attempt").unwrap().to_owned());
    }
    assert_eq!(attempts.len(), N, "every message arrived");
    for (id, list) in &attempts {
        assert_eq!(
            list,
            &["1", "2"],
            "{id}: once per attempt, nothing lost, nothing doubled\n{}",
            node.log()
        );
    }
    assert_eq!(seen.len(), 2 * N);
    assert_eq!(pending(&mut conn, stream, GROUP), Vec::<String>::new());
    assert_eq!(xlen(&mut conn, "kill:dead"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_does_not_exist_yet_is_waited_for_quietly() {
    let stream = "early";
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.client();
    let node = DelayqProcess::start(
        &delayq_bin(),
        "n1",
        &process_config(&redis, &delivery(&[stream], "")),
    )
    .unwrap();
    let http = reqwest::Client::new();
    let resp = http
        .post(node.url("/v1/messages"))
        .json(&json!({ "stream": stream, "id": "e1", "payload": "x", "delay_ms": 0 }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let metrics = || async { support::metrics(&http, node.url("/metrics")).await.unwrap() };
    let missing = format!("delayq_sweep_group_missing{{stream=\"{stream}\",group=\"{GROUP}\"}}");
    let m = eventually(
        Duration::from_secs(5),
        "the missing group reported",
        || async {
            let m = metrics().await;
            m.contains(&format!("{missing} 1")).then_some(m)
        },
    )
    .await;
    // Many sweep intervals (50 ms) later: still one line in the log, no errors.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = node.log();
    let lines = log
        .lines()
        .filter(|l| l.contains("consumer group does not exist"))
        .count();
    assert_eq!(lines, 1, "{log}");
    assert!(!log.contains("sweep failed"), "{log}");
    assert_eq!(
        support::counter(&m, "delayq_sweep_errors_total"),
        0.0,
        "{m}"
    );

    // Once the group exists, its unacknowledged entries are redelivered.
    create_group(&mut conn, stream, GROUP);
    let first = read_new(&mut conn, stream, GROUP, CONSUMER);
    assert_eq!(first.len(), 1);
    let again = eventually(
        Duration::from_secs(10),
        "redelivery once the group exists",
        || std::future::ready(read_new(&mut conn, stream, GROUP, CONSUMER).pop()),
    )
    .await;
    assert_eq!(again.get("delayq-attempt"), Some("2"));
    assert!(metrics().await.contains(&format!("{missing} 0")));
    assert!(
        node.log().contains("consumer group found"),
        "{}",
        node.log()
    );
}

#[tokio::test]
async fn a_reload_that_changes_the_delivery_settings_sweeps_with_them() {
    let stream = "reloaded";
    let redis = RedisServer::start().unwrap();
    let mut conn = redis.client();
    create_group(&mut conn, stream, GROUP);
    let config = process_config(&redis, &delivery(&[stream], "ack_timeout = \"1h\""));
    let node = DelayqProcess::start(&delayq_bin(), "n1", &config).unwrap();
    let resp = reqwest::Client::new()
        .post(node.url("/v1/messages"))
        .json(&json!({ "stream": stream, "id": "r1", "payload": "x", "delay_ms": 0 }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let first = eventually(Duration::from_secs(5), "first delivery", || {
        std::future::ready(read_new(&mut conn, stream, GROUP, CONSUMER).pop())
    })
    .await;
    assert_eq!(first.get("delayq-attempt"), Some("1"));
    // Under an ack timeout of an hour, nothing comes back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(read_new(&mut conn, stream, GROUP, CONSUMER).is_empty());

    let file = std::fs::read_to_string(node.config_path()).unwrap();
    std::fs::write(
        node.config_path(),
        file.replace("ack_timeout = \"1h\"", "ack_timeout = \"300ms\""),
    )
    .unwrap();
    node.signal(libc::SIGHUP);
    let again = eventually(Duration::from_secs(10), "a redelivery", || {
        std::future::ready(read_new(&mut conn, stream, GROUP, CONSUMER).pop())
    })
    .await;
    assert_eq!(again.get("delayq-id"), Some("r1"));
    assert_eq!(again.get("delayq-attempt"), Some("2"));
    assert!(
        node.full_log()
            .contains("delivery settings reloaded; sweeping with them"),
        "{}",
        node.log()
    );
}
