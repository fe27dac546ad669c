//! Malformed input of many kinds at a running `delayq` process, from a fixed seed
//! (`DELAYQ_FUZZ_SEED` picks another): requests to every endpoint of the OpenAPI
//! document (`requests`), some over raw TCP (`raw`), and entries in the inbox
//! (`inbox`), with valid ones mixed in. No answer is a 5xx, every 4xx is
//! `{"error","detail"}` JSON (except hyper's own bare 400s for requests it cannot
//! parse), the daemon stays up, every accepted message is delivered once with its
//! fields verbatim, and every rejected inbox entry appears once in the rejected
//! stream.

mod inbox;
mod raw;
mod requests;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use delayq_harness::{DelayqProcess, RedisServer};
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::support::{
    Api, Entry, Tally, delayq_bin, entries, patience, redis_now_ms, within, xlen,
};

const DEFAULT_SEED: u64 = 0x5eed_0fde_1a79;
const REQUESTS: usize = 3000;
const RAW_REQUESTS: usize = 60;
const INBOX_ENTRIES: usize = 400;
const INBOX: &str = "delayq:inbox";
const REJECTED: &str = "delayq:inbox:rejected";
const STREAMS: &[&str] = &["fz-0", "fz-1", "fz-2"];

const CONFIG: &str = "[api]\nmax_message_bytes = 4096\nmax_fields = 50\nmax_batch = 20\n\
    max_body_bytes = 65536\nmax_wait = \"100ms\"\nmax_delay = \"1h\"\n\
    [streams]\nallow = [\"fz*\"]\n[log]\nlevel = \"warn\"\n";

/// An inbox entry's field/value pairs, as bytes.
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Status, content type and body of an answer.
type Answer = (u16, Option<String>, Vec<u8>);

/// One HTTP request as generated.
#[derive(Clone, Debug)]
struct Req {
    kind: &'static str,
    method: String,
    path: String,
    body: Option<Vec<u8>>,
}

/// A message the daemon accepted: where it must arrive, with what, not before when.
#[derive(Clone, Debug)]
struct Accepted {
    stream: String,
    fields: Vec<(String, String)>,
    due_ms: u64,
    how: String,
}

/// A log in brief: its lines grouped by their text with every number as `#` (times,
/// ids and counts aside, the lines that say the same), most frequent first, each
/// with its first instance, so that a cause is seen however many lines follow it.
fn log_kinds(log: &str) -> String {
    let mut kinds: HashMap<String, (usize, usize, &str)> = HashMap::new();
    for (i, line) in log.lines().enumerate() {
        let mut key = String::with_capacity(line.len());
        for c in line.chars() {
            if !c.is_ascii_digit() {
                key.push(c);
            } else if !key.ends_with('#') {
                key.push('#');
            }
        }
        kinds.entry(key).or_insert((0, i, line)).0 += 1;
    }
    let mut kinds: Vec<_> = kinds.into_values().collect();
    kinds.sort_by_key(|&(n, first, _)| (std::cmp::Reverse(n), first));
    kinds
        .iter()
        .take(25)
        .map(|(n, _, line)| format!("{n:>6} × {line:.400}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_and_inbox_entries_never_break_the_daemon_or_lose_a_message() {
    let seed = std::env::var("DELAYQ_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let started = Instant::now();
    let budget = Duration::from_secs(60) * patience();
    let redis = RedisServer::start().expect("start redis-server");
    let mut conn = redis.client();
    let config = format!("[redis]\nurl = \"{}\"\n{CONFIG}", redis.url());
    let mut node = DelayqProcess::start(&delayq_bin(), "fuzz", &config).expect("start delayq");
    let ctx = |node: &DelayqProcess, what: &str| {
        format!(
            "seed {seed} (DELAYQ_FUZZ_SEED): {what}\ndelayq log, by kind of line:\n{}\nits last lines:\n{}",
            log_kinds(&node.full_log()),
            node.log()
        )
    };
    let api = Api::new(node.api)
        .with_timeout(Duration::from_secs(30))
        .unpooled();
    let mut rng = StdRng::seed_from_u64(seed);
    let endpoints = endpoints(&api).await;

    // The inbox first, so that its entries are handled while the requests come in.
    let (mut accepted, must_reject) = fill_inbox(&mut conn, &mut rng);

    // The requests, a few at a time.
    let requests: Vec<Req> = (0..REQUESTS)
        .map(|i| requests::generate(&mut rng, &endpoints, i))
        .collect();
    let answers = send_all(&api, requests, started, budget).await;
    let mut problems: Vec<String> = Vec::new();
    let by_kind = judge(&answers, &mut accepted, &mut problems);
    let sent = answers
        .iter()
        .filter(|(_, r)| !matches!(r, Err(e) if e.starts_with("skipped")))
        .count();
    assert!(
        sent >= REQUESTS / 2,
        "{}",
        ctx(
            &node,
            &format!("only {sent} requests sent within {budget:?}")
        )
    );

    // Raw requests: refused with a 4xx and the JSON shape, the HTTP server's own
    // refusals (a request line or header that does not parse) included.
    let addr = node.api;
    let raw: Vec<(&str, Vec<u8>, bool)> = (0..RAW_REQUESTS)
        .map(|_| raw::raw_request(&mut rng))
        .collect();
    for (kind, bytes, half_close) in raw {
        let status = tokio::task::spawn_blocking(move || raw::send_raw(addr, &bytes, half_close))
            .await
            .unwrap();
        match status {
            Some((status, body)) if (400..500).contains(&status) => {
                let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
                if !json.is_some_and(|j| j["error"].is_string() && j["detail"].is_string()) {
                    problems.push(format!(
                        "raw [{kind}]: {status} without the JSON shape: {:?}",
                        String::from_utf8_lossy(&body)
                    ));
                }
            }
            other => problems.push(format!("raw [{kind}]: answered {other:?}, want a 4xx")),
        }
    }
    // The daemon is up and answers.
    let health = api.status("/healthz").await;
    if health != Some(200) {
        problems.push(format!("healthz after the run: {health:?}"));
    }
    if !node.is_running() {
        problems.push("the process exited".into());
    }

    // The requests may have paused streams (POST /v1/streams/{stream}/pause): what
    // they hold must go out once each when they are resumed.
    let paused: Vec<String> = redis::cmd("SMEMBERS")
        .arg("delayq:paused")
        .query(&mut conn)
        .expect("SMEMBERS");
    for stream in &paused {
        let escaped: String = stream
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => {
                    (b as char).to_string()
                }
                other => format!("%{other:02X}"),
            })
            .collect();
        let path = format!("/v1/streams/{escaped}/resume");
        let (status, body) = api.post(&path, serde_json::json!({})).await;
        if status != 200 {
            problems.push(format!("resume {stream:?}: {status} {body}"));
        }
    }
    check_deliveries(&api, &mut conn, &accepted, &mut problems).await;
    check_rejections(&mut conn, &must_reject, &mut problems).await;
    if node.full_log().contains("panicked") {
        problems.push("a panic in the log".into());
    }
    let mut by_kind: Vec<_> = by_kind.into_iter().collect();
    by_kind.sort();
    let summary = format!(
        "{sent} requests, {} accepted messages, {} malformed inbox entries, {:?}; by kind and status: {by_kind:?}",
        accepted.len(),
        must_reject.len(),
        started.elapsed(),
    );
    assert!(
        problems.is_empty(),
        "{}",
        ctx(
            &node,
            &format!(
                "{} problems, e.g.\n{}\n{summary}",
                problems.len(),
                problems[..problems.len().min(20)].join("\n")
            )
        )
    );
    eprintln!("fuzz seed {seed}: {summary}");
}

/// Every endpoint the OpenAPI document names, with its methods.
async fn endpoints(api: &Api) -> Vec<(String, String)> {
    let (_, doc) = api.get("/v1/openapi.json").await;
    let mut endpoints: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("operations").keys() {
            // Besides methods a path item may hold "parameters", "summary" and the like.
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                endpoints.push((method.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    endpoints.sort();
    assert!(endpoints.len() >= 10, "{endpoints:?}");
    endpoints
}

/// Writes the inbox entries in one pipeline; returns the messages the valid ones
/// must become (by id) and the inbox ids of the malformed ones.
fn fill_inbox(
    conn: &mut redis::Connection,
    rng: &mut StdRng,
) -> (HashMap<String, Accepted>, Vec<String>) {
    let mut plan: Vec<(Pairs, Option<Accepted>)> = (0..INBOX_ENTRIES)
        .map(|k| inbox::inbox_entry(rng, k))
        .collect();
    let mut pipe = redis::pipe();
    for (fields, _) in &plan {
        pipe.cmd("XADD").arg(INBOX).arg("*");
        for (f, v) in fields {
            pipe.arg(f.as_slice()).arg(v.as_slice());
        }
    }
    let inbox_ids: Vec<String> = pipe.query(conn).expect("XADD to the inbox");
    let mut accepted = HashMap::new();
    let mut must_reject = Vec::new();
    for (k, ((fields, valid), inbox_id)) in plan.iter_mut().zip(&inbox_ids).enumerate() {
        match valid.take() {
            Some(mut a) => {
                let delay: u64 = fields
                    .iter()
                    .find(|(f, _)| f == b"delayq-delay")
                    .map(|(_, v)| String::from_utf8_lossy(v).parse().unwrap())
                    .unwrap();
                a.due_ms = inbox_id.split('-').next().unwrap().parse::<u64>().unwrap() + delay;
                accepted.insert(format!("oki-{k}"), a);
            }
            None => must_reject.push(inbox_id.clone()),
        }
    }
    (accepted, must_reject)
}

/// Sends the requests, 8 at a time, until the run's time is up; each with its answer.
async fn send_all(
    api: &Api,
    requests: Vec<Req>,
    started: Instant,
    budget: Duration,
) -> Vec<(Req, Result<Answer, String>)> {
    futures::stream::iter(requests)
        .map(|req| async move {
            if started.elapsed() > budget {
                return (req, Err("skipped: the run's time is up".to_owned()));
            }
            let result = match api
                .send(&req.method, &req.path, None, req.body.as_deref())
                .await
            {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let ct = resp
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let bytes = resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                    Ok((status, ct, bytes))
                }
                Err(e) => Err(format!("{e:?}")),
            };
            (req, result)
        })
        .buffer_unordered(8)
        .collect()
        .await
}

/// Judges every answer: no 5xx, every 4xx as JSON, a valid push accepted; records
/// what was accepted. Answers counted by kind of request and status.
fn judge(
    answers: &[(Req, Result<Answer, String>)],
    accepted: &mut HashMap<String, Accepted>,
    problems: &mut Vec<String>,
) -> HashMap<(&'static str, u16), usize> {
    let mut by_kind = HashMap::new();
    let show = |req: &Req| {
        let body = req
            .body
            .as_deref()
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned());
        format!(
            "[{}] {} {:.200} body {:?}",
            req.kind, req.method, req.path, body
        )
    };
    for (req, result) in answers {
        let (status, ct, bytes) = match result {
            Ok(r) => r,
            Err(e) if e.starts_with("skipped") => continue,
            Err(e) => {
                problems.push(format!("{}: no answer: {e:.300}", show(req)));
                continue;
            }
        };
        *by_kind.entry((req.kind, *status)).or_default() += 1;
        let answer: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        if *status >= 500 {
            problems.push(format!(
                "{}: {status} {:.300}",
                show(req),
                String::from_utf8_lossy(bytes)
            ));
        } else if *status >= 400 {
            let json = ct
                .as_deref()
                .is_some_and(|c| c.starts_with("application/json"));
            if !json || !answer["error"].is_string() || !answer["detail"].is_string() {
                problems.push(format!(
                    "{}: {status} not {{error, detail}} JSON: {ct:?} {:.300}",
                    show(req),
                    String::from_utf8_lossy(bytes)
                ));
            }
        } else if req.kind == "valid"
            && req.method == "POST"
            && req.path.starts_with("/v1/messages")
            && !req.path.ends_with("/reschedule")
            && !(*status == 201 || answer["failed"] == 0)
        {
            problems.push(format!(
                "{}: a valid push answered {status} {:.300}",
                show(req),
                answer.to_string()
            ));
        } else if let Err(e) = requests::record_accepted(req, *status, &answer, accepted) {
            problems.push(format!(
                "{}: {status} {e}: {:.300}",
                show(req),
                answer.to_string()
            ));
        }
    }
    by_kind
}

/// Every accepted message due by now is delivered once, verbatim, not early; the
/// rest are still scheduled.
async fn check_deliveries(
    api: &Api,
    conn: &mut redis::Connection,
    accepted: &HashMap<String, Accepted>,
    problems: &mut Vec<String>,
) {
    let now_ms = redis_now_ms(conn);
    let due: Vec<&String> = accepted
        .iter()
        .filter(|(_, a)| a.due_ms <= now_ms + 2000)
        .map(|(id, _)| id)
        .collect();
    let mut streams: Vec<String> = accepted.values().map(|a| a.stream.clone()).collect();
    streams.sort();
    streams.dedup();
    let delivered = |conn: &mut redis::Connection| -> Vec<Entry> {
        streams.iter().flat_map(|s| entries(conn, s)).collect()
    };
    let _ = within(Duration::from_secs(20), || {
        let found = Tally::of_ids(&due, &delivered(conn));
        std::future::ready(found.lost.is_empty().then_some(()))
    })
    .await;
    let found = delivered(conn);
    let tally = Tally::of_ids(accepted.keys(), &found);
    for (id, n) in &tally.unexpected {
        problems.push(format!("{id}: delivered but never accepted ({n} times)"));
    }
    for (id, n) in &tally.duplicated {
        problems.push(format!("{id}: delivered {n} times ({})", accepted[id].how));
    }
    for e in &found {
        let Some((id, a)) = e.get("delayq-id").and_then(|id| accepted.get_key_value(id)) else {
            continue;
        };
        let mut want = a.fields.clone();
        want.push(("delayq-id".into(), id.clone()));
        want.push(("delayq-attempt".into(), "1".into()));
        if e.fields != want {
            problems.push(format!(
                "{id}: fields {:.300} want {:.300} ({})",
                format!("{:?}", e.fields),
                format!("{want:?}"),
                a.how
            ));
        }
        if e.ms() < a.due_ms {
            problems.push(format!(
                "{id}: delivered at {} before {} ({})",
                e.ms(),
                a.due_ms,
                a.how
            ));
        }
    }
    for id in &tally.lost {
        let a = &accepted[id];
        if a.due_ms <= now_ms + 2000 {
            problems.push(format!(
                "{id}: accepted, due by {}, never delivered ({})",
                a.due_ms, a.how
            ));
            continue;
        }
        let state = api.try_get(&format!("/v1/messages/{id}")).await;
        let state = state.map_or(Value::Null, |(_, v)| v);
        if state["state"] != "scheduled" {
            problems.push(format!("{id}: due later, but {state} ({})", a.how));
        }
    }
}

/// Every malformed inbox entry is in the rejected stream once, no valid one is, and
/// the inbox is empty.
async fn check_rejections(
    conn: &mut redis::Connection,
    must_reject: &[String],
    problems: &mut Vec<String>,
) {
    let _ = within(Duration::from_secs(20), || {
        std::future::ready((xlen(conn, REJECTED) >= must_reject.len()).then_some(()))
    })
    .await;
    let rejected = entries(conn, REJECTED);
    let tally = Tally::count(
        must_reject,
        rejected
            .iter()
            .map(|e| e.get("delayq-inbox-id").unwrap_or_default()),
    );
    for line in tally.problems() {
        problems.push(format!("inbox entry rejections: {line}"));
    }
    let left = xlen(conn, INBOX);
    if left != 0 {
        problems.push(format!("{left} entries left in the inbox"));
    }
}

#[test]
fn log_kinds_groups_lines_that_differ_only_in_numbers() {
    let log = "10:00:01 WARN held entry=5-0\nINFO up\n10:00:02 WARN held entry=17-3\n";
    assert_eq!(
        log_kinds(log),
        "     2 × 10:00:01 WARN held entry=5-0\n     1 × INFO up"
    );
}
