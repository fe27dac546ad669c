//! One edge case from start to end: a Redis and a `delayq` process with the case's
//! settings; a push one over each limit the case sits at, refused; the workload
//! pushed over HTTP and through the inbox, all falling due at one instant; then
//! exactly once, verbatim, never early and on record, and the redelivery or record
//! trimming the workload asks for.

use std::time::Duration;

use delayq_harness::{DelayqProcess, RedisServer};
use futures::StreamExt;
use serde_json::{Value, json};

use super::checks::{assert_refused_push, check_dead, check_delivered, check_records, records};
use super::{
    GROUP, INBOX, Planned, REJECTED, Workload, config_text, message_fields, push_body, setting,
};
use crate::support::{
    Api, Deliveries, create_group, delayq_bin, eventually, patience, read_group_present,
    redis_now_ms, within, xlen,
};

/// A case's servers, and how to say what went wrong.
struct Edge {
    redis: RedisServer,
    conn: redis::Connection,
    node: DelayqProcess,
    api: Api,
    /// The config file, shown with the log when a check fails.
    text: String,
    streams: Vec<String>,
}

impl Edge {
    /// A Redis and a `delayq` process with the settings a workload needs, then
    /// `settings` over them.
    fn start(settings: &[(&str, &str)], w: &Workload) -> Edge {
        let redis = RedisServer::start().expect("start redis-server");
        let mut conn = redis.client();
        let streams: Vec<String> = (0..w.streams).map(|s| format!("edge-{s}")).collect();
        let mut all: Vec<(String, String)> = vec![("log.level".into(), "\"warn\"".into())];
        if w.redeliver {
            for (k, v) in [
                ("delivery.groups", "[\"g\"]"),
                ("delivery.ack_timeout", "\"100ms\""),
                ("delivery.backoff", "\"10ms\""),
                ("delivery.backoff_max", "\"10ms\""),
                ("delivery.sweep_interval", "\"10ms\""),
            ] {
                all.push((k.into(), v.into()));
            }
            for s in &streams {
                // The group exists before the first delivery, so it sees every entry.
                create_group(&mut conn, s, GROUP);
                all.push((format!("delivery.streams.{s}"), "{}".into()));
            }
        }
        if w.forgotten {
            all.push(("records.retention".into(), "\"0s\"".into()));
            all.push(("records.trim_interval".into(), "\"100ms\"".into()));
        }
        all.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let all: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let text = config_text(&redis.url(), &all);
        let node = DelayqProcess::start(&delayq_bin(), "edge", &text)
            .unwrap_or_else(|e| panic!("start delayq with\n{text}\n{e:#}"));
        // The largest message is 64 MiB: its push takes a while in a debug build.
        let api = Api::new(node.api).with_timeout(Duration::from_secs(600));
        Edge {
            redis,
            conn,
            node,
            api,
            text,
            streams,
        }
    }

    fn ctx(&self, what: &str) -> String {
        format!(
            "{what}\nconfig:\n{}\ndelayq log:\n{}",
            self.text,
            self.node.log()
        )
    }

    /// The target streams, each with `suffix` (`:dead` for the dead letters).
    fn deliveries(&self, suffix: &str) -> Deliveries {
        let streams: Vec<String> = self
            .streams
            .iter()
            .map(|s| format!("{s}{suffix}"))
            .collect();
        let streams: Vec<&str> = streams.iter().map(String::as_str).collect();
        Deliveries::new(&self.redis.url(), &streams)
    }

    /// How many entries the target streams (with `suffix`) hold.
    fn total(&self, suffix: &str) -> usize {
        self.deliveries(suffix).len().expect("Redis answers")
    }

    /// One over each limit the case sits at is refused, as JSON. `one` is a message
    /// of the workload to start from.
    async fn refuse_one_over(&mut self, settings: &[(&str, &str)], w: &Workload, one: &Planned) {
        // Refused for the limit alone, not for their due time.
        let far_ms = redis_now_ms(&mut self.conn) + 3_600_000;
        let over_by = |id: &str, change: &dyn Fn(&mut Planned)| {
            let mut m = Planned {
                id: id.into(),
                stream: one.stream.clone(),
                fields: one.fields.clone(),
                due_ms: 0,
            };
            change(&mut m);
            push_body(&m, far_ms)
        };
        if setting(settings, "api.max_batch") == Some(&w.chunk.to_string()) {
            let over = json!({ "messages": vec![push_body(one, far_ms); w.chunk + 1] });
            assert_refused_push(
                &self.api,
                "/v1/messages/batch",
                &over,
                ("a batch one over api.max_batch", "api.max_batch"),
            )
            .await;
        }
        if setting(settings, "api.max_fields") == Some(&w.fields.to_string()) {
            let single = over_by("over-fields", &|m| {
                m.fields.push(("one-more".into(), "x".into()))
            });
            assert_refused_push(
                &self.api,
                "/v1/messages",
                &single,
                ("a message one field over api.max_fields", "fields"),
            )
            .await;
            let (_, resp) = self
                .api
                .post("/v1/messages/batch", json!({ "messages": [single] }))
                .await;
            assert!(
                resp["failed"].as_u64() == Some(1)
                    && resp["results"][0]["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("fields")),
                "{}",
                self.ctx(&format!("one field over in a batch: {resp:.300}"))
            );
        }
        if w.bytes > 0 && setting(settings, "api.max_message_bytes") == Some(&w.bytes.to_string()) {
            assert_refused_push(
                &self.api,
                "/v1/messages",
                &over_by("over-bytes", &|m| m.fields[0].1.push('x')),
                (
                    "a message one byte over api.max_message_bytes",
                    "max_message_bytes",
                ),
            )
            .await;
        }
    }

    /// The first `w.http` messages over HTTP, in batches of `w.chunk`, due at `at_ms`.
    async fn push_http(&self, planned: &[Planned], w: &Workload, at_ms: u64) {
        futures::stream::iter(planned[..w.http].chunks(w.chunk).enumerate())
            .for_each_concurrent(4, |(c, chunk)| self.push_batch(c, chunk, at_ms))
            .await;
    }

    /// One batch, every item scheduled. As any producer, it sends again the items
    /// Redis did not take in time (503, on a loaded machine), or the whole batch when
    /// none was taken (a 503 for the batch); an item sent again may have been stored
    /// the first time, and is then a duplicate.
    async fn push_batch(&self, c: usize, chunk: &[Planned], at_ms: u64) {
        let mut left: Vec<&Planned> = chunk.iter().collect();
        for attempt in 1..=5 {
            let messages: Vec<Value> = left.iter().map(|m| push_body(m, at_ms)).collect();
            let (status, answer) = self
                .api
                .post("/v1/messages/batch", json!({ "messages": messages }))
                .await;
            if status == 503 && attempt < 5 {
                eprintln!("batch {c}: not taken in time ({answer:.200}), sent again");
                tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
                continue;
            }
            assert_eq!(
                status,
                200,
                "{}",
                self.ctx(&format!("batch {c}: {answer:.500}"))
            );
            let results = answer["results"].as_array().expect("results");
            let mut again = Vec::new();
            for r in results {
                let m = left[r["index"].as_u64().expect("index") as usize];
                match r["status"].as_u64() {
                    Some(201) => {}
                    Some(200) if attempt > 1 && r["duplicate"] == true => {}
                    Some(503) => again.push(m),
                    _ => panic!(
                        "{}",
                        self.ctx(&format!(
                            "batch {c}: every item scheduled: {}: {r:.500}",
                            m.id
                        ))
                    ),
                }
            }
            assert_eq!(results.len(), left.len(), "batch {c}: {answer:.500}");
            if again.is_empty() {
                return;
            }
            eprintln!(
                "batch {c}: {} items not taken in time, sent again",
                again.len()
            );
            left = again;
        }
        panic!(
            "{}",
            self.ctx(&format!(
                "batch {c}: {} items still not taken after 5 tries",
                left.len()
            ))
        );
    }

    /// The rest through the inbox: reserved fields first or last, at the instant
    /// (`at_ms`) or after a delay (`lead_ms`, from the XADD by Redis's clock, which
    /// becomes their due time).
    fn push_inbox(&mut self, planned: &mut [Planned], w: &Workload, at_ms: u64, lead_ms: u64) {
        if w.inbox == 0 {
            return;
        }
        let mut pipe = redis::pipe();
        for (k, m) in planned[w.http..].iter().enumerate() {
            pipe.cmd("XADD").arg(INBOX).arg("*");
            let mut reserved = vec![
                ("delayq-stream".to_owned(), m.stream.clone()),
                ("delayq-id".to_owned(), m.id.clone()),
            ];
            if k % 2 == 0 {
                reserved.push(("delayq-at".to_owned(), at_ms.to_string()));
            } else {
                reserved.push(("delayq-delay".to_owned(), lead_ms.to_string()));
            }
            let (first, last) = if k % 4 < 2 {
                (&reserved, &m.fields)
            } else {
                (&m.fields, &reserved)
            };
            for (f, v) in first.iter().chain(last.iter()) {
                pipe.arg(f).arg(v);
            }
        }
        let inbox_ids: Vec<String> = pipe.query(&mut self.conn).expect("XADD to the inbox");
        for (k, inbox_id) in inbox_ids.iter().enumerate() {
            if k % 2 == 1 {
                let xadd_ms: u64 = inbox_id.split('-').next().unwrap().parse().unwrap();
                planned[w.http + k].due_ms = xadd_ms + lead_ms;
            }
        }
    }

    /// Waits until the target streams (with `suffix`) hold `want` entries, at most
    /// `timeout` × patience; a failure shows the daemon's log.
    async fn wait_total(&self, suffix: &str, want: usize, timeout: Duration, what: &str) {
        let arrived = within(timeout, || {
            std::future::ready(self.deliveries(suffix).len().filter(|n| *n >= want))
        })
        .await;
        if arrived.is_none() {
            panic!(
                "{}",
                self.ctx(&format!(
                    "{what}: {} of {want} in {timeout:?}",
                    self.total(suffix)
                ))
            );
        }
    }
}

/// Starts a Redis and a `delayq` process with `settings`, pushes `w`, waits for every
/// message, and checks exactly once, verbatim, never early and on record; then the
/// redelivery or record trimming the workload asks for.
pub(super) async fn check_edge(settings: &[(&str, &str)], w: Workload) {
    let n = w.http + w.inbox;
    // Everything falls due at one instant, far enough ahead that every push lands
    // first (a debug build takes about a second per 10 MB of message). When pushing
    // takes longer (a loaded machine), the case starts again on fresh servers, with
    // twice the time the pushing took.
    let bytes = (n * w.bytes) as u64;
    let mut lead_ms = (1000 + n as u64 / 5 + bytes / 10_000) * u64::from(patience());
    let mut tries = 0;
    let (edge, planned) = loop {
        tries += 1;
        let mut edge = Edge::start(settings, &w);
        let mut planned: Vec<Planned> = (0..n)
            .map(|i| {
                let stream = edge.streams[i % edge.streams.len()].clone();
                Planned {
                    id: format!("{}-{i}", if i < w.http { "h" } else { "i" }),
                    fields: message_fields(i, &stream, &w),
                    stream,
                    due_ms: 0,
                }
            })
            .collect();
        edge.refuse_one_over(settings, &w, &planned[0]).await;
        let started_ms = redis_now_ms(&mut edge.conn);
        let at_ms = started_ms + lead_ms;
        for m in &mut planned {
            m.due_ms = at_ms;
        }
        edge.push_http(&planned, &w, at_ms).await;
        edge.push_inbox(&mut planned, &w, at_ms, lead_ms);
        let pushed_by = redis_now_ms(&mut edge.conn);
        if pushed_by < at_ms {
            break (edge, planned);
        }
        assert!(
            tries < 3,
            "{}",
            edge.ctx(&format!(
                "pushing took past the due instant ({pushed_by} >= {at_ms}), {tries} times: raise DELAYQ_TEST_PATIENCE"
            ))
        );
        lead_ms = 2 * (pushed_by - started_ms);
        eprintln!("pushing took past the due instant; again with a lead of {lead_ms} ms");
    };

    // Every message arrives.
    let timeout =
        Duration::from_millis(lead_ms) + Duration::from_secs(10) + Duration::from_millis(n as u64);
    edge.wait_total("", n, timeout, "messages delivered").await;
    let ctx = |what: &str| edge.ctx(what);
    let first = check_delivered(&mut edge.redis.client(), &edge.streams, &planned, 1, &ctx);
    assert_eq!(
        xlen(&mut edge.redis.client(), REJECTED),
        0,
        "{}",
        ctx("no inbox entry rejected")
    );

    if w.forgotten {
        eventually(
            Duration::from_secs(10),
            "every record forgotten",
            || async {
                let answers = records(&edge.api, &planned).await;
                answers
                    .iter()
                    .all(|(_, status, _)| *status == 404)
                    .then_some(())
            },
        )
        .await;
    } else {
        check_records(&edge.api, &planned, &first, "delivered", &ctx).await;
    }

    let max_attempts: u32 =
        setting(settings, "delivery.max_attempts").map_or(10, |v| v.parse().unwrap());
    let redelivered = w.redeliver && max_attempts != 1;
    if w.redeliver {
        // Read every entry through the group, acknowledge none: only those there
        // now, not the redeliveries the sweep adds meanwhile (read, they would be
        // redelivered once more).
        let mut conn = edge.redis.client();
        for s in &edge.streams {
            read_group_present(&mut conn, s, GROUP, "c");
        }
        let (suffix, want_state, want) = if redelivered {
            ("", "delivered", 2 * n)
        } else {
            (":dead", "dead", n)
        };
        edge.wait_total(
            suffix,
            want,
            timeout,
            &format!("every message {want_state} again"),
        )
        .await;
        let again = if redelivered {
            check_delivered(&mut conn, &edge.streams, &planned, 2, &ctx)
        } else {
            let dead: Vec<String> = edge.streams.iter().map(|s| format!("{s}:dead")).collect();
            check_dead(&mut conn, &dead, &planned, &ctx)
        };
        check_records(&edge.api, &planned, &again, want_state, &ctx).await;
    }

    // Nothing more arrived meanwhile: still exactly once (twice with a redelivery).
    let want = if redelivered { 2 * n } else { n };
    assert_eq!(edge.total(""), want, "{}", ctx("nothing delivered again"));
    // Still up, and healthy again: while Redis moves the largest messages on a loaded
    // machine a health probe may time out, and /healthz answers 503 until the next
    // probe (every second) succeeds.
    let healthy = within(Duration::from_secs(20), || async {
        (edge.api.status("/healthz").await == Some(200)).then_some(())
    });
    assert!(healthy.await.is_some(), "{}", ctx("the daemon is still up"));
}
