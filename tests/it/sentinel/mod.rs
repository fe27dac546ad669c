//! Redis behind Sentinel: one master, one replica and three `redis-sentinel`s, a
//! delayq instance that finds the master through them, under a steady load of
//! delayed pushes. A SIGKILLed master (Sentinel promotes the replica) and a planned
//! `SENTINEL FAILOVER` are both followed without a restart; every push confirmed
//! with `redis.min_replicas_acked = 1` is delivered, nothing twice. The figures
//! (time from the kill to forwarding again, lost and duplicated) are printed.
//! With etcd and two instances, presences follow a planned switch at once, so a
//! leader crashing just after it is taken over without waiting out its lease; and
//! a standby that has not followed the switch yet takes nobody for dead.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use delayq_harness::{
    DelayqProcess, EtcdServer, Proxy, RedisServer, SentinelOptions, SentinelServer, SentinelSet,
};
use libc::{SIGCONT, SIGSTOP};
use serde_json::json;

use crate::support::{
    Api, Entry, OneLeader, Tally, counter, delayq_bin, documented_user, entries, eventually, leads,
    logs_of, never, try_entries, within,
};

mod reads;

const NAME: &str = "dq-main";

/// The Redis side: master, replicas, Sentinels that know them all and each other.
type Watched = SentinelSet;

async fn watched(replicas: usize) -> Watched {
    watched_via(replicas, None).await
}

/// With `proxy`, the replicas replicate through it (so a test can stop
/// replication without either side knowing).
async fn watched_via(replicas: usize, proxy: Option<&Proxy>) -> Watched {
    let upstream = proxy.map(|p| p.addr.port());
    // Sentinel re-points a replica that replicates from another address than
    // the master's at the master itself, once failover-timeout has passed
    // (+fix-slave-config): that would bypass the proxy. Through a proxy the
    // timeout is long until the test shortens it (see `failover_timeout`).
    let options = SentinelOptions {
        failover_timeout: proxy.map(|_| Duration::from_secs(600)),
        ..SentinelOptions::default()
    };
    let watched = SentinelSet::start(NAME, replicas, upstream, &options).expect("Sentinel set");
    if let Some(proxy) = proxy {
        proxy.lead_to(&watched.master.url());
    }
    ready(&watched).await;
    watched
}

/// Waits until a failover can happen: a replica in sync that every Sentinel knows,
/// and Sentinels that know each other (to reach the quorum and elect a leader). If
/// not within 30 s, fails saying what is missing, with the Sentinels' logs.
pub(crate) async fn ready(watched: &SentinelSet) {
    if within(Duration::from_secs(30), || async {
        watched.ready().then_some(())
    })
    .await
    .is_none()
    {
        panic!(
            "Sentinels not ready:\n{}\nthe Sentinels' logs:\n{}",
            watched.unready().join("\n"),
            watched.logs()
        );
    }
}

/// A delayq configuration's `[redis]` section on `watched`, two shards.
fn config(watched: &Watched, extra: &str) -> String {
    let lines = watched.redis_section(&format!("shards = 2\n{extra}"));
    format!("[redis]\n{lines}")
}

/// Pushes `n-<i>` at about 200 a second, each due 300 ms later, until stopped:
/// which were confirmed (201), and when each was sent.
struct Load {
    confirmed: Arc<Mutex<Vec<(String, Instant)>>>,
    refused: Arc<Mutex<Vec<String>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(api: Api) -> Load {
        let confirmed = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn({
            let (confirmed, refused, stop) = (confirmed.clone(), refused.clone(), stop.clone());
            let api = api.with_timeout(Duration::from_secs(5));
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                for i in 0.. {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let id = format!("n-{i}");
                    let sent = Instant::now();
                    let body = json!({"id": id, "stream": "s", "payload": "x", "delay_ms": 300});
                    match api
                        .try_call("POST", "/v1/messages", None, Some(&body.to_string()))
                        .await
                    {
                        Ok((201, _)) => confirmed.lock().unwrap().push((id, sent)),
                        _ => refused.lock().unwrap().push(id),
                    }
                }
            }
        });
        Load {
            confirmed,
            refused,
            stop,
            task,
        }
    }

    async fn stop(self) -> (Vec<(String, Instant)>, Vec<String>) {
        self.stop.cancel();
        self.task.await.unwrap();
        let confirmed = self.confirmed.lock().unwrap().clone();
        let refused = self.refused.lock().unwrap().clone();
        (confirmed, refused)
    }
}

enum Failover {
    /// SIGKILL the master.
    Kill,
    /// `SENTINEL FAILOVER`: a planned switch.
    Planned,
}

/// Who delayq is on the data nodes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum User {
    /// The default user.
    Default,
    /// The least-privilege user of docs/redis-rights.md, made from its text.
    Documented,
}

/// `text` (a configuration of `config`) with delayq as the documented user, its
/// password in `password`, pushing to stream `s` only.
fn as_documented_user(text: &str, password: &std::path::Path) -> String {
    let user = format!(
        "url = \"redis://delayq@{NAME}\"\npassword_file = \"{}\"",
        password.display()
    );
    let text = text.replace(&format!("url = \"redis://{NAME}\""), &user);
    format!("{text}[streams]\nallow = [\"s\"]\n")
}

/// Runs the load through a failover; returns the tally of confirmed pushes on the
/// new master, the time from the failover's start to forwarding again, the
/// count of refused pushes and the time from the promotion seen to forwarding
/// again.
async fn through_failover(
    failover: Failover,
    replicas: usize,
    acked: u32,
) -> (Tally, Duration, usize) {
    let (tally, resumed, refused, _) =
        through_failover_as(failover, replicas, acked, User::Default).await;
    (tally, resumed, refused)
}

async fn through_failover_as(
    failover: Failover,
    replicas: usize,
    acked: u32,
    user: User,
) -> (Tally, Duration, usize, Duration) {
    let mut watched = watched(replicas).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("min_replicas_acked = {acked}");
    let mut text = config(&watched, &extra);
    if user == User::Documented {
        let nodes: Vec<&RedisServer> = std::iter::once(&watched.master)
            .chain(&watched.replicas)
            .collect();
        let password = documented_user(&nodes, "s", &[], dir.path());
        text = as_documented_user(&text, &password);
    }
    let node = DelayqProcess::start(&delayq_bin(), "sentinel", &text).expect("start delayq");
    let api = Api::new(node.api);
    if user == User::Documented {
        // The documented user has every right delayq checks.
        let (status, body) = eventually(Duration::from_secs(10), "ready", || async {
            let (status, body) = api.get("/readyz").await;
            (status == 200).then_some((status, body))
        })
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let load = Load::start(api.clone());
    // Enough confirmed before the failover that every run counts over a hundred,
    // however slowly a loaded machine pushes (about 1.5 s at 200 a second).
    eventually(Duration::from_secs(30), "300 pushes confirmed", || {
        let n = load.confirmed.lock().unwrap().len();
        std::future::ready((n >= 300).then_some(()))
    })
    .await;

    let started = Instant::now();
    match failover {
        Failover::Kill => watched.master.kill(),
        Failover::Planned => {
            let () = redis::cmd("SENTINEL")
                .arg("failover")
                .arg(NAME)
                .query(&mut watched.sentinels[0].client())
                .expect("SENTINEL FAILOVER");
        }
    }
    let promoted = eventually(Duration::from_secs(30), "a replica promoted", || async {
        let port = watched.master_port()?;
        watched.replicas.iter().position(|r| r.port == port)
    })
    .await;
    let promoted_at = Instant::now();
    // Forwarding again: a message pushed after the failover began reaches the new
    // master's stream.
    let new_master = &watched.replicas[promoted];
    let deadline = Instant::now() + Duration::from_secs(30);
    let resumed = loop {
        let after: BTreeSet<String> = load
            .confirmed
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, sent)| *sent > started)
            .map(|(id, _)| id.clone())
            .collect();
        let arrived = entries_on(new_master, "s")
            .iter()
            .any(|e| e.get("delayq-id").is_some_and(|id| after.contains(id)));
        if arrived {
            break started.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "not forwarding again 30 s after the failover began ({} confirmed since, {} refused in all); its log:\n{}",
            after.len(),
            load.refused.lock().unwrap().len(),
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (confirmed, refused) = load.stop().await;
    let ids: Vec<String> = confirmed.into_iter().map(|(id, _)| id).collect();
    // A refused push (503: stored on the master but not confirmed by a replica, or
    // no answer) may still arrive, once: its producer would send it again under
    // the same id.
    let refused_arrived = |tally: &mut Tally| {
        tally
            .unexpected
            .retain(|(id, n)| !(refused.contains(id) && *n == 1));
    };
    // Every confirmed push is due by now; the last ones get a while to arrive, on
    // the master as the Sentinels name it now: a loaded machine's Sentinels may
    // fail over a second time, to the other replica, and the first one promoted
    // then holds a replica's copy, stale until it has synchronized again.
    let deadline = Instant::now() + Duration::from_secs(15);
    let master_now = || watched.current_master().unwrap_or(new_master);
    let tally = loop {
        let mut tally = Tally::of_ids(&ids, &entries_on(master_now(), "s"));
        refused_arrived(&mut tally);
        if tally.lost.is_empty() || Instant::now() > deadline {
            break tally;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if !tally.lost.is_empty() {
        // What each node holds and how it replicates, and what the Sentinels did:
        // the story of a loss.
        let nodes: Vec<String> = watched
            .replicas
            .iter()
            .map(|r| {
                format!(
                    "replica {} ({}, offset {:?}, {} entries in s); its log:\n{}",
                    r.port,
                    r.replication("role").unwrap_or_default(),
                    r.replication("master_repl_offset"),
                    entries_on(r, "s").len(),
                    r.log()
                )
            })
            .collect();
        println!(
            "lost {}: new master {}, master now {}\n{}\nthe Sentinels' logs:\n{}\ndelayq's log:\n{}",
            tally.lost.len(),
            new_master.port,
            master_now().port,
            nodes.join("\n"),
            watched.logs(),
            node.log()
        );
    }
    // The whole log: a loaded machine's Sentinels may fail over twice, and the
    // start line is then far from the end.
    let log = node.full_log();
    assert!(log.contains("following it"), "{}", node.log());
    // The start line names the Sentinels and the master, not a default URL.
    assert!(log.contains(" via sentinels 127.0.0.1:"), "{}", node.log());
    let after_promotion = (started + resumed).saturating_duration_since(promoted_at);
    (tally, resumed, refused.len(), after_promotion)
}

/// As deployed: the least-privilege user of docs/redis-rights.md, made from its
/// text (no `ROLE`, no admin command), `min_replicas_acked = 1`. A killed master
/// is followed, whichever replica Sentinel promotes, within 5 s of the promotion,
/// and every push confirmed by a replica is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_followed_and_every_push_confirmed_by_a_replica_is_delivered() {
    let (tally, resumed, refused, after_promotion) =
        through_failover_as(Failover::Kill, 2, 1, User::Documented).await;
    println!(
        "SIGKILL of the master, documented ACL user, min_replicas_acked = 1: forwarding again after {resumed:?} ({after_promotion:?} after the promotion was seen); {tally}; {refused} pushes refused meanwhile"
    );
    tally.assert_exact("documented user, min_replicas_acked = 1");
    assert!(tally.expected > 100, "{tally}");
    assert!(
        after_promotion < Duration::from_secs(5),
        "forwarding again {after_promotion:?} after the promotion"
    );
}

/// The same user through a planned `SENTINEL FAILOVER`. One replica: once it is
/// promoted the old master has none left to confirm a push, so nothing it still
/// takes before it is demoted is confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_sentinel_failover_loses_and_duplicates_nothing() {
    let (tally, resumed, refused, after_promotion) =
        through_failover_as(Failover::Planned, 1, 1, User::Documented).await;
    println!(
        "SENTINEL FAILOVER, documented ACL user: forwarding again after {resumed:?} ({after_promotion:?} after the promotion was seen); {tally}; {refused} pushes refused meanwhile"
    );
    tally.assert_exact("documented user, planned failover");
    assert!(tally.expected > 100, "{tally}");
    assert!(
        after_promotion < Duration::from_secs(5),
        "forwarding again {after_promotion:?} after the promotion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_without_replica_acks_may_lose_the_last_pushes_but_duplicates_nothing() {
    let (tally, resumed, refused) = through_failover(Failover::Kill, 2, 0).await;
    println!(
        "SIGKILL of the master, min_replicas_acked = 0: forwarding again after {resumed:?}; {tally}; {refused} pushes refused meanwhile"
    );
    assert!(
        tally.duplicated.is_empty() && tally.unexpected.is_empty(),
        "{tally}"
    );
    assert!(tally.expected > 100, "{tally}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_too_few_replicas_confirm_is_refused_with_503_yet_kept_and_sent_once() {
    // A lone Redis: no replica ever confirms.
    let redis = RedisServer::start().expect("redis");
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\nmin_replicas_acked = 64\nreplicas_ack_timeout = \"1ms\"\n",
        redis.url()
    );
    let node = DelayqProcess::start(&delayq_bin(), "acked", &config).expect("start delayq");
    let api = Api::new(node.api);
    let body = json!({"id": "lonely", "stream": "s", "payload": "x", "delay_ms": 10});
    for _ in 0..2 {
        let (status, answer) = api.post("/v1/messages", body.clone()).await;
        assert_eq!(status, 503, "{answer}");
        assert_eq!(answer["error"], "not_replicated", "{answer}");
        let detail = answer["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("redis.min_replicas_acked") && detail.contains("0 of the 64"),
            "{answer}"
        );
    }
    // Stored on the master all the same, once: sending it again was safe.
    let arrived = eventually(Duration::from_secs(10), "delivered", || async {
        let e = entries(&mut redis.client(), "s");
        (!e.is_empty()).then_some(e)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Tally::of_ids(["lonely"], &entries(&mut redis.client(), "s")).assert_exact(&node.log());
    assert_eq!(arrived.len(), 1);

    // A reschedule and a cancel wait for the replicas as a push does: applied, and
    // answered 503 not_replicated; repeating either is safe.
    let body = json!({"id": "moved", "stream": "s", "payload": "x", "delay": "1h"});
    assert_eq!(api.post("/v1/messages", body).await.0, 503);
    let (status, answer) = api
        .post("/v1/messages/moved/reschedule", json!({"delay": "2h"}))
        .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("not_replicated")),
        "{answer}"
    );
    let (status, answer) = api.get("/v1/messages/moved").await;
    let due = answer["deliver_at"].as_u64().unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        status == 200 && due > now + 5_400_000,
        "rescheduled all the same: {answer}"
    );
    let (status, answer) = api.call("DELETE", "/v1/messages/moved", None, None).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("not_replicated")),
        "{answer}"
    );
    // The repeat is not confirmed either: never a 200 no replica had.
    let (status, answer) = api.call("DELETE", "/v1/messages/moved", None, None).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (503, Some("not_replicated")),
        "the repeat: {answer}"
    );
    let (_, answer) = api.get("/v1/messages/moved").await;
    assert_eq!(answer["state"], "cancelled", "{answer}");
}

#[test]
fn sentinel_settings_are_checked_naming_the_key() {
    #[rustfmt::skip]
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("redis://m", "master = \"m\", nodes = [\"10.0.0.1:26379\", \"s2:26379\", \"[::1]:26379\"]", None),
        ("rediss://u@m", "master = \"m\", nodes = [\"s:26379\"], tls = false", None),
        ("redis://m", "master = \"\", nodes = [\"s:26379\"]", Some("redis.sentinel.master")),
        ("redis://m", "master = \"a b\", nodes = [\"s:26379\"]", Some("redis.sentinel.master")),
        ("redis://m", "master = \"m\", nodes = []", Some("redis.sentinel.nodes")),
        ("redis://m", "master = \"m\", nodes = [\"s\"]", Some("redis.sentinel.nodes")),
        ("redis://m", "master = \"m\", nodes = [\"s:0\"]", Some("redis.sentinel.nodes")),
        ("redis://m", "master = \"m\", nodes = [\":26379\"]", Some("redis.sentinel.nodes")),
        ("redis://m", "master = \"m\", nodes = [\"s:26379\"], user = \"u\"", Some("redis.sentinel.password_file")),
        ("redis://m", "master = \"m\", nodes = [\"s:26379\"], password_file = \"/no/such\"", Some("redis.sentinel.password_file")),
        ("redis://m", "master = \"m\", nodes = [\"s:26379\"], port = 1", Some("redis")),
        ("unix:///run/redis.sock", "master = \"m\", nodes = [\"s:26379\"]", Some("redis.sentinel")),
    ];
    for (url, sentinel, refused) in cases {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delayq.toml");
        std::fs::write(
            &file,
            format!("[redis]\nurl = \"{url}\"\nsentinel = {{ {sentinel} }}\n"),
        )
        .unwrap();
        let out = std::process::Command::new(delayq_bin())
            .args(["check-config", "--config"])
            .arg(&file)
            .output()
            .expect("run check-config");
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match refused {
            None => assert!(out.status.success(), "{sentinel}: {shown}"),
            Some(key) => assert!(
                !out.status.success() && shown.contains(key),
                "{sentinel}: {shown}"
            ),
        }
    }
}

fn fences(redis: &RedisServer) -> Vec<u64> {
    (0..2)
        .map(|shard| {
            let fence: Option<u64> = redis::cmd("GET")
                .arg(format!("{{delayq:{shard}}}:fence"))
                .query(&mut redis.client())
                .expect("GET fence");
            fence.unwrap_or(0)
        })
        .collect()
}

async fn forwarded_so_far(api: &Api) -> f64 {
    counter(
        &api.metrics().await.expect("metrics"),
        "delayq_messages_forwarded_total",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_loses_the_last_fence_raise_lets_no_stale_leader_move_a_message() {
    // The replica replicates through a proxy the test can cut.
    let proxy = Proxy::start().await;
    let mut watched = watched_via(1, Some(&proxy)).await;
    let etcd = EtcdServer::start().expect("etcd");
    let config = format!(
        "{}[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"2s\"\n",
        config(&watched, ""),
        etcd.endpoint()
    );
    let a = DelayqProcess::start(&delayq_bin(), "a", &config).expect("start a");
    let a_api = Api::new(a.api).with_timeout(Duration::from_secs(2));
    eventually(Duration::from_secs(20), "a leads", || async {
        leads(&a_api).await.map(|_| ())
    })
    .await;
    let b = DelayqProcess::start(&delayq_bin(), "b", &config).expect("start b");
    let b_api = Api::new(b.api).with_timeout(Duration::from_secs(2));

    // a forwards one message, so its counter is known not to be stuck at 0.
    let (status, body) = a_api
        .post(
            "/v1/messages",
            json!({"id": "warm", "stream": "w", "payload": "x", "delay_ms": 0}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut master = watched.master.client();
    eventually(Duration::from_secs(10), "warm forwarded", || {
        let n = entries(&mut master, "w").len();
        async move { (n == 1).then_some(()) }
    })
    .await;
    let e1 = leads(&a_api).await.expect("a leads");
    // Messages that fall due after the failover, on master and replica alike.
    let ids: Vec<String> = (0..40).map(|i| format!("f-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let delay_ms = if i % 2 == 0 { 5_000 } else { 9_000 };
        let body = json!({"id": id, "stream": "s", "payload": "x", "delay_ms": delay_ms});
        assert_eq!(a_api.post("/v1/messages", body).await.0, 201);
    }
    eventually(Duration::from_secs(10), "replicated", || async {
        (fences(&watched.replicas[0]) == fences(&watched.master)
            && entries(&mut watched.replicas[0].client(), "w").len() == 1)
            .then_some(())
    })
    .await;
    // a counts a forward once the call's answer is back, after the entry is written.
    let before = eventually(
        Duration::from_secs(10),
        "a counts the warm forward",
        || async {
            let n = forwarded_so_far(&a_api).await;
            (n >= 1.0).then_some(n)
        },
    )
    .await;

    // Replication stops; a freezes; b takes over and raises the fences (on the
    // master only).
    proxy.cut();
    a.signal(SIGSTOP);
    let e2 = eventually(Duration::from_secs(20), "b leads", || async {
        leads(&b_api).await
    })
    .await;
    assert!(e2 > e1, "{e2} > {e1}");
    eventually(
        Duration::from_secs(10),
        "b's fences on the master",
        || async {
            fences(&watched.master)
                .iter()
                .all(|&f| f == e2)
                .then_some(())
        },
    )
    .await;
    assert!(
        fences(&watched.replicas[0]).iter().all(|&f| f < e2),
        "the replica has not seen b's fences: {:?}\n{}",
        fences(&watched.replicas[0]),
        watched
            .sentinels
            .iter()
            .map(|s| s.log())
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The master dies; Sentinel promotes the replica, whose fences went back.
    // With the master down, Sentinel re-points no replica, so the failover
    // timeout can be the usual one again (a split vote is retried after twice it).
    watched.master.kill();
    watched.failover_timeout(Duration::from_secs(10)).unwrap();
    let replica_port = watched.replicas[0].port;
    eventually(Duration::from_secs(30), "the replica promoted", || async {
        (watched.master_port() == Some(replica_port)).then_some(())
    })
    .await;
    // a wakes up believing it leads with e1, above nothing on the new master.
    a.signal(SIGCONT);

    let new_master = &watched.replicas[0];
    let tally = eventually(Duration::from_secs(30), "every message delivered", || {
        let tally = Tally::of_ids(&ids, &entries_on(new_master, "s"));
        async move { tally.lost.is_empty().then_some(tally) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Tally::of_ids(&ids, &entries_on(new_master, "s")).assert_exact(&a.log());
    assert!(tally.expected == 40);

    // a's term of e1 moved nothing after it woke: it ends saying what it forwarded.
    let ended = eventually(Duration::from_secs(20), "a's term e1 over", || {
        let log = a.log();
        let line = log
            .lines()
            .find(|l| l.contains("leader loops stopped") && l.contains(&format!("epoch={e1} ")))
            .map(str::to_owned);
        async move { line }
    })
    .await;
    assert!(
        ended.contains(&format!("forwarded={}", before as u64)),
        "a moved messages in its old term after waking: {ended}\n{}",
        a.log()
    );
    let raised = fences(&watched.replicas[0]);
    assert!(
        raised.iter().all(|&f| f > e2),
        "{raised:?} above {e2}\n{}",
        b.log()
    );
    let (apis, nodes) = ([a_api, b_api], [a, b]);
    let (_, now) = OneLeader::among(&apis).wait(|| logs_of(&nodes)).await;
    assert!(now > e2, "{now} > {e2}");
    println!(
        "epochs {e1} -> {e2} (lost on the new master) -> {now}; a's term saw the move: {}",
        nodes[0].log().contains("the Redis master moved")
    );
}

const LEASES_ENDED: &str = "delayq_leader_leases_ended_total";

/// Presence channels subscribed on `redis`.
fn presences(redis: &RedisServer) -> usize {
    presence_channels(redis).len()
}

/// The presence channels somebody is subscribed to on `redis`.
fn presence_channels(redis: &RedisServer) -> BTreeSet<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*:presence:*")
        .query(&mut redis.client())
        .unwrap_or_default()
}

/// delayq instances of the given names and configurations, and their APIs.
fn instances(named: &[(&str, &String)]) -> (Vec<DelayqProcess>, Vec<Api>) {
    named
        .iter()
        .map(|(name, config)| {
            let node = DelayqProcess::start(&delayq_bin(), name, config).expect("start delayq");
            let api = Api::new(node.api).with_timeout(Duration::from_secs(2));
            (node, api)
        })
        .unzip()
}

/// Leases ended by the instances behind `apis`, in all.
async fn leases_ended(apis: &[Api]) -> f64 {
    let mut sum = 0.0;
    for api in apis {
        sum += counter(&api.metrics().await.expect("metrics"), LEASES_ENDED);
    }
    sum
}

/// Pushes message `id` to stream `s`, due in `delay_ms`.
async fn push(api: &Api, id: &str, delay_ms: u64) {
    let body = json!({"id": id, "stream": "s", "payload": "x", "delay_ms": delay_ms});
    let (status, answer) = api.post("/v1/messages", body).await;
    assert_eq!(status, 201, "{answer}");
}

/// Waits for every one of `ids` in stream `s` on `node`, then checks each came once.
async fn delivered_once(node: &RedisServer, ids: &[String], context: &str) {
    eventually(Duration::from_secs(20), "every message delivered", || {
        let tally = Tally::of_ids(ids, &entries_on(node, "s"));
        async move { tally.lost.is_empty().then_some(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Tally::of_ids(ids, &entries_on(node, "s")).assert_exact(context);
}

/// The etcd section of instances with a 10 s lease: a takeover by lease expiry
/// would take 6 s or more.
fn long_lease(etcd: &EtcdServer) -> String {
    format!(
        "[etcd]\nendpoints = [\"{}\"]\nlease_ttl = \"10s\"\n",
        etcd.endpoint()
    )
}

/// `SENTINEL FAILOVER` to the (one) replica: returns it once Sentinel names it and
/// `presences` presences are subscribed there.
async fn planned_failover(watched: &Watched, presences_there: usize) -> &RedisServer {
    let () = redis::cmd("SENTINEL")
        .arg("failover")
        .arg(NAME)
        .query(&mut watched.sentinels[0].client())
        .expect("SENTINEL FAILOVER");
    let new_master = &watched.replicas[0];
    // As the first Sentinel says (not `Watched::master_port`, which asks them all:
    // a test may have stopped one).
    eventually(Duration::from_secs(30), "the replica promoted", || async {
        (watched.sentinels[0].master_port(NAME) == Some(new_master.port)).then_some(())
    })
    .await;
    let what = format!("{presences_there} presences on the new master");
    eventually(Duration::from_secs(10), &what, || async {
        (presences(new_master) == presences_there).then_some(())
    })
    .await;
    new_master
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_planned_failover_presences_follow_the_master_and_a_crash_is_taken_over_at_once() {
    let watched = watched(1).await;
    let etcd = EtcdServer::start().expect("etcd");
    let config = format!("{}{}", config(&watched, ""), long_lease(&etcd));
    let (mut nodes, apis) = instances(&[("a", &config), ("b", &config)]);
    eventually(
        Duration::from_secs(20),
        "both presences on the master",
        || async { (presences(&watched.master) == 2).then_some(()) },
    )
    .await;

    // A planned switch: the old master stays up, and Sentinel reconfigures it
    // (breaking its clients' connections) only seconds after naming the new one.
    let new_master = planned_failover(&watched, 2).await;
    // Forwarding on the new master; then the leader dies with messages due.
    let (leader, _) = OneLeader::among(&apis)
        .within(Duration::from_secs(20))
        .wait(|| logs_of(&nodes))
        .await;
    let survivor = 1 - leader;
    push(&apis[survivor], "warm", 0).await;
    eventually(
        Duration::from_secs(20),
        "forwarding on the new master",
        || async { (!entries_on(new_master, "s").is_empty()).then_some(()) },
    )
    .await;
    // They moved by themselves, before Sentinel reconfigured the old master; and
    // are there too for a while, for nodes that have not followed the move yet,
    // each with the lease it campaigns or leads with now: the switch ended the
    // leader's term, and it campaigns again with a new lease.
    eventually(
        Duration::from_secs(5),
        "the same presences on the old master, while it is still a master",
        || async {
            let master = watched.master.replication("role").as_deref() == Some("master");
            let now = presence_channels(new_master);
            (master && now.len() == 2 && presence_channels(&watched.master) == now).then_some(())
        },
    )
    .await;
    let ids: Vec<String> = (0..20).map(|i| format!("k-{i}")).collect();
    for id in &ids {
        push(&apis[survivor], id, 1_000).await;
    }
    // The switch itself moved leadership (the leader ends its term when the
    // master moves): a standby that has not yet seen the new leader's presence
    // beside its own waits out its 2 s of grace before judging.
    let ended = leases_ended(&apis).await;
    assert_eq!(ended, 0.0, "the switch ended a lease\n{}", logs_of(&nodes));
    let killed_at = Instant::now();
    nodes[leader].kill();
    eventually(Duration::from_secs(10), "the standby leads", || async {
        leads(&apis[survivor]).await.map(|_| ())
    })
    .await;
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "took over {took:?} after the kill (by lease expiry: 6 s or more)\n{}",
        logs_of(&nodes)
    );
    let ended = leases_ended(&apis[survivor..=survivor]).await;
    assert!(
        ended >= 1.0,
        "the survivor ended no lease\n{}",
        logs_of(&nodes)
    );
    let mut all = ids.clone();
    all.push("warm".into());
    delivered_once(new_master, &all, &logs_of(&nodes)).await;
    println!("after a planned failover: SIGKILLed leader replaced in {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_has_not_followed_a_failover_yet_takes_nobody_for_dead() {
    let watched = watched(1).await;
    let etcd = EtcdServer::start().expect("etcd");
    let etcd_section = long_lease(&etcd);
    // a and b ask every Sentinel; c only the third, which will miss the failover.
    let config = format!("{}{etcd_section}", config(&watched, ""));
    let late = format!(
        "[redis]\n{}{etcd_section}",
        watched.redis_section_asking("shards = 2\n", &watched.sentinels[2..])
    );
    // c campaigns last, so that the leader's successor at the switch is one that
    // follows it: the test is about c as a standby.
    let (mut nodes, mut apis) = instances(&[("a", &config), ("b", &config)]);
    OneLeader::among(&apis)
        .within(Duration::from_secs(20))
        .wait(|| logs_of(&nodes))
        .await;
    let (c_node, c_api) = instances(&[("c", &late)]);
    nodes.extend(c_node);
    apis.extend(c_api);
    let logs = || logs_of(&nodes);
    eventually(
        Duration::from_secs(20),
        "three presences on the master",
        || async { (presences(&watched.master) == 3).then_some(()) },
    )
    .await;

    watched.sentinels[2].signal(SIGSTOP);
    let new_master = planned_failover(&watched, 2).await;
    // c still asks the old master, where the others' presences linger: it takes
    // nobody for gone (without them, it ends the leader's lease within 0.2 s). A
    // fixed window: Sentinel reconfigures the old master about 8 s after the
    // switch. The leader's probe, written on the new master now, ages on the old
    // one, and from 3 s after the switch c may take the leader for cut off
    // (*silent*): a wrong suspicion that costs a term, the cut-off rule's, which a
    // loaded machine reaches within the window. Only a *gone* judgement is wrong
    // here. (Should c lead, when the successor won before following the switch and
    // ended that term at once, the others may end c's lease, which is not on the
    // new master: only c's own judgements are the test's.)
    let window = Instant::now() + Duration::from_secs(2);
    while Instant::now() < window {
        let c_log = nodes[2].full_log();
        assert!(
            !c_log.contains("ended the leader's lease: its presence in Redis is gone"),
            "c took the leader for gone\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        watched.master.replication("role").as_deref(),
        Some("master"),
        "the old master was reconfigured during the check\n{}",
        logs()
    );
    watched.sentinels[2].signal(SIGCONT);
    eventually(Duration::from_secs(30), "c follows too", || async {
        (presences(new_master) == 3).then_some(())
    })
    .await;

    // Forwarding goes on, once, on the new master.
    let ids: Vec<String> = (0..10).map(|i| format!("l-{i}")).collect();
    for id in &ids {
        push(&apis[0], id, 200).await;
    }
    delivered_once(new_master, &ids, &logs()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_a_password_are_asked_with_it() {
    let master = RedisServer::start().expect("master");
    let sentinel = SentinelServer::start_with(
        NAME,
        master.port,
        1,
        Duration::from_secs(5),
        &SentinelOptions {
            password: Some("sentinel-s3cret".into()),
            ..SentinelOptions::default()
        },
    )
    .expect("sentinel");
    let dir = tempfile::tempdir().unwrap();
    let config = |password: &str| {
        let file = dir.path().join("sentinel-password");
        std::fs::write(&file, format!("{password}\n")).unwrap();
        format!(
            "[redis]\nurl = \"redis://{NAME}\"\nshards = 2\nsentinel = {{ master = \"{NAME}\", nodes = [\"{}\"], password_file = \"{}\" }}\n",
            sentinel.address(),
            file.display()
        )
    };
    let node = DelayqProcess::start(&delayq_bin(), "pw", &config("sentinel-s3cret"))
        .expect("start delayq");
    let (status, body) = Api::new(node.api)
        .post(
            "/v1/messages",
            json!({"id": "p", "stream": "s", "payload": "x", "delay_ms": 10}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    eventually(Duration::from_secs(10), "delivered", || async {
        (entries(&mut master.client(), "s").len() == 1).then_some(())
    })
    .await;
    assert!(
        !node.full_log().contains("sentinel-s3cret"),
        "{}",
        node.log()
    );
    drop(node);

    // A wrong password: the start fails, naming the setting, never the password.
    let refused = match DelayqProcess::start(&delayq_bin(), "wrong", &config("not-it")) {
        Err(e) => format!("{e:#}"),
        Ok(node) => {
            eventually(Duration::from_secs(10), "the refusal logged", || async {
                let log = node.log();
                log.contains("redis.sentinel").then_some(log)
            })
            .await
        }
    };
    assert!(refused.contains("redis.sentinel"), "{refused}");
    assert!(!refused.contains("not-it"), "{refused}");
}

/// The entries of `stream` on a node Sentinel has just promoted: Sentinel cuts a
/// node's clients as it reconfigures it (`CLIENT KILL TYPE normal` after
/// `REPLICAOF`), possibly after the test saw the new master's address, so a cut
/// read is made again on a fresh connection.
fn entries_on(node: &RedisServer, stream: &str) -> Vec<Entry> {
    let mut cut = Vec::new();
    while cut.len() < 20 {
        let read = redis::Client::open(node.url())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| try_entries(&mut c, stream));
        match read {
            Ok(entries) => return entries,
            Err(e) => cut.push(e.to_string()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("XRANGE {stream} on {}: {cut:?}\n{}", node.port, node.log())
}

/// ACL users are each node's own: a replica Sentinel promotes may lack a right
/// its master granted. After following the failover the rights are checked
/// again at once (not a minute later): `/readyz` answers 503 naming the missing
/// right, and 200 again within seconds of an operator granting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rights_are_checked_again_on_the_master_a_failover_moved_to() {
    let watched = watched(1).await;
    let dir = tempfile::tempdir().unwrap();
    let password = documented_user(&[&watched.master], "s", &[], dir.path());
    documented_user(&[&watched.replicas[0]], "s", &["~{delayq:*"], dir.path());
    let text = as_documented_user(&config(&watched, ""), &password);
    let node = DelayqProcess::start(&delayq_bin(), "rights", &text).expect("start delayq");
    let api = Api::new(node.api).with_timeout(Duration::from_secs(2));
    eventually(
        Duration::from_secs(10),
        "ready on the first master",
        || async { (api.get("/readyz").await.0 == 200).then_some(()) },
    )
    .await;

    let new_master = planned_failover(&watched, 0).await;
    let body = eventually(Duration::from_secs(15), "a missing right named", || async {
        let (status, body) = api.get("/readyz").await;
        (status == 503 && body["error"] == "redis_permission").then_some(body)
    })
    .await;
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("{delayq:"), "{body}");

    documented_user(&[new_master], "s", &[], dir.path());
    eventually(Duration::from_secs(10), "ready once granted", || async {
        (api.get("/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert!(node.log().contains("following it"), "{}", node.log());
}

/// A move to the master Sentinel announced that failed (here: the user is
/// disabled there at first) is tried again every second, though no command fails
/// meanwhile: a store that sends nothing follows within seconds of the user being
/// enabled. (A demoted master may go on taking writes for a while after a planned
/// failover, so a failed command cannot be counted on to ask again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_the_new_master_that_failed_is_tried_again_without_a_failed_command() {
    let watched = watched(1).await;
    let replica = &watched.replicas[0];
    let dir = tempfile::tempdir().unwrap();
    let password = documented_user(&[&watched.master, replica], "s", &[], dir.path());
    let set_user = |rule: &str| {
        let () = redis::cmd("ACL")
            .arg(&["SETUSER", "delayq", rule])
            .query(&mut replica.client())
            .expect("ACL SETUSER");
    };
    set_user("off");
    let text = as_documented_user(&config(&watched, ""), &password);
    let (_store, changes) = following_store(&text).await;
    let moves = changes.borrow().0;

    planned_failover(&watched, 0).await;
    // Every Sentinel has announced the switch, and the moves it asked for were
    // refused (a move tries the login a few times).
    let announced = watched.sentinels.len() as i64;
    eventually(Duration::from_secs(15), "the moves refused", || async {
        let all_switched = watched.master_port() == Some(replica.port);
        (all_switched && refused_logins(replica) > 2 * announced + 2).then_some(())
    })
    .await;
    assert_eq!(
        changes.borrow().0,
        moves,
        "moved to a node that refused the login"
    );

    set_user("on");
    // At the master the Sentinels name (the new one, or where a loaded machine's
    // Sentinels failed over to since).
    eventually(Duration::from_secs(10), "the new master followed", || {
        let (count, address) = changes.borrow().clone();
        let master = watched.master_port();
        let there = master.is_some_and(|p| address.ends_with(&format!(":{p}")));
        std::future::ready((count > moves && there).then_some(()))
    })
    .await;
}

/// Every Sentinel announces a switch, and a store follows their announcements side
/// by side: one failover is one move, whichever announcement comes first (each move
/// counts a new generation of the master, which ends the leader's term pinned to
/// the one before and gives up the blocking reads under way on it). Moves are
/// slowed down here so that the announcements are followed at once, as they were
/// on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failover_announced_by_every_sentinel_is_one_move() {
    delayq_client::store::faults::slow_master_moves(Duration::from_millis(500));
    let watched = watched(1).await;
    let (_store, changes) = following_store(&config(&watched, "")).await;
    let new_master = planned_failover(&watched, 0).await;
    let there = format!(":{}", new_master.port);
    eventually(Duration::from_secs(10), "the new master followed", || {
        std::future::ready(changes.borrow().1.ends_with(&there).then_some(()))
    })
    .await;
    // Every Sentinel has announced the switch by the time each names the new master.
    eventually(
        Duration::from_secs(10),
        "every Sentinel switched",
        || async { (watched.master_port() == Some(new_master.port)).then_some(()) },
    )
    .await;
    never(Duration::from_secs(1), "more than one move", || {
        let (count, address) = changes.borrow().clone();
        std::future::ready((count != 1).then_some((count, address)))
    })
    .await;
}

/// A store of config `text`, connected through Sentinel, and its master changes
/// (a count of moves and the address it is at).
async fn following_store(
    text: &str,
) -> (
    delayq_client::store::Store,
    tokio::sync::watch::Receiver<(u64, String)>,
) {
    let config = delayq_client::config::Config::from_toml(text, std::iter::empty()).unwrap();
    let store = delayq_client::store::Store::connect(&config.store_config())
        .await
        .expect("connect through Sentinel");
    let changes = store
        .master_changes()
        .expect("a store that follows Sentinel");
    (store, changes)
}

/// How many logins of user `delayq` `node` refused (its `ACL LOG`).
fn refused_logins(node: &RedisServer) -> i64 {
    let log: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query(&mut node.client())
        .expect("ACL LOG");
    log.iter()
        .filter(|e| {
            let text = |k: &str| match e.get(k) {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            text("reason") == "auth" && text("username") == "delayq"
        })
        .map(|e| match e.get("count") {
            Some(redis::Value::Int(n)) => *n,
            _ => 0,
        })
        .sum()
}

/// Dead letters of stream `s` as delayq writes them (a message's fields, then its
/// id, attempt and reason), added to `s:dead` on `master`: their entry ids.
fn dead_letters_on(master: &RedisServer, ids: &[&str]) -> Vec<String> {
    let mut conn = master.client();
    ids.iter()
        .map(|id| {
            redis::cmd("XADD")
                .arg("s:dead")
                .arg("*")
                .arg(&["payload", "x", "delayq-id", id, "delayq-attempt", "1"])
                .arg(&["delayq-reason", "max_attempts"])
                .query::<String>(&mut conn)
                .expect("XADD a dead letter")
        })
        .collect()
}

/// Each kind of change a user is answered for, made once through `api`, with its
/// answer: cancel `c`, reschedule `r` to `delay` from now, replay `d1`, purge
/// `purged`, pause `p`, resume `resumed`.
async fn each_kind_of_change(
    api: &Api,
    delay: &str,
    purged: &[&str],
    resumed: &str,
) -> [(&'static str, (u16, serde_json::Value)); 6] {
    [
        ("cancel", api.delete("/v1/messages/c").await),
        (
            "reschedule",
            api.post("/v1/messages/r/reschedule", json!({ "delay": delay }))
                .await,
        ),
        (
            "replay",
            api.post("/v1/streams/s/dead/replay", json!({"ids": ["d1"]}))
                .await,
        ),
        (
            "purge",
            api.post("/v1/streams/s/dead/purge", json!({ "ids": purged }))
                .await,
        ),
        ("pause", api.post("/v1/streams/p/pause", json!({})).await),
        (
            "resume",
            api.post(&format!("/v1/streams/{resumed}/resume"), json!({}))
                .await,
        ),
    ]
}

/// Each kind of change answered 200 (cancel, reschedule, replay, purge, pause,
/// resume), the master SIGKILLed right after the last answer: on the replica
/// promoted in its place every one of them holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_answered_200_survives_a_killed_master() {
    let mut watched = watched(1).await;
    let text = config(&watched, "min_replicas_acked = 1");
    let node = DelayqProcess::start(&delayq_bin(), "changes", &text).expect("start delayq");
    let api = Api::new(node.api);
    let _ = dead_letters_on(&watched.master, &["d1", "d2", "d3"]);
    for (id, delay) in [("c", "4s"), ("r", "1h")] {
        let body = json!({"id": id, "stream": "s", "payload": id, "delay": delay});
        let (status, answer) = api.post("/v1/messages", body).await;
        assert_eq!(status, 201, "{answer}");
    }
    let (status, answer) = api.post("/v1/streams/q/pause", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    let changes = each_kind_of_change(&api, "1s", &["d2", "d3"], "q").await;
    watched.master.kill();
    for (what, (status, answer)) in &changes {
        assert_eq!(*status, 200, "{what}: {answer}");
    }
    let promoted = within(Duration::from_secs(30), || async {
        let port = watched.master_port()?;
        watched.replicas.iter().position(|r| r.port == port)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no replica promoted; the Sentinels' logs:\n{}",
            watched.logs()
        )
    });
    let new_master = &watched.replicas[promoted];
    // The rescheduled and the replayed messages arrive (the first an hour early).
    let arrived = eventually(Duration::from_secs(30), "r and d1 delivered", || {
        let ids: BTreeSet<String> = entries_on(new_master, "s")
            .iter()
            .filter_map(|e| e.get("delayq-id").map(str::to_owned))
            .collect();
        std::future::ready((ids.contains("r") && ids.contains("d1")).then_some(ids))
    })
    .await;
    let mut conn = new_master.client();
    let dead: Vec<String> = entries(&mut conn, "s:dead")
        .iter()
        .filter_map(|e| e.get("delayq-id").map(str::to_owned))
        .collect();
    assert!(dead.is_empty(), "dead letters left: {dead:?}");
    let paused: BTreeSet<String> = redis::cmd("SMEMBERS")
        .arg("delayq:paused")
        .query(&mut conn)
        .unwrap();
    assert_eq!(paused, BTreeSet::from(["p".to_owned()]));
    // The cancelled message stays cancelled past its due time.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ids: Vec<String> = entries_on(new_master, "s")
        .iter()
        .filter_map(|e| e.get("delayq-id").map(str::to_owned))
        .collect();
    assert!(
        !ids.contains(&"c".to_owned()),
        "the cancelled message came: {ids:?} (before: {arrived:?})\n{}",
        node.log()
    );
}

/// With more replicas asked for than exist, each kind of change is answered 503
/// not_replicated, and made all the same (asking again is safe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_too_few_replicas_confirm_is_answered_503_yet_made() {
    let redis = RedisServer::start().expect("redis");
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 2\nmin_replicas_acked = 64\nreplicas_ack_timeout = \"1ms\"\n",
        redis.url()
    );
    let node = DelayqProcess::start(&delayq_bin(), "acked", &config).expect("start delayq");
    let api = Api::new(node.api);
    let _ = dead_letters_on(&redis, &["d1", "d2"]);
    for id in ["c", "r"] {
        let body = json!({"id": id, "stream": "s", "payload": id, "delay": "1h"});
        let (status, answer) = api.post("/v1/messages", body).await;
        assert_eq!(status, 503, "{answer}");
    }
    let changes = each_kind_of_change(&api, "2h", &["d2"], "p").await;
    for (what, (status, answer)) in &changes {
        assert_eq!(
            (*status, &answer["error"]),
            (503, &json!("not_replicated")),
            "{what}: {answer}"
        );
    }
    let (_, c) = api.get("/v1/messages/c").await;
    assert_eq!(c["state"], "cancelled", "{c}");
    let (_, r) = api.get("/v1/messages/r").await;
    let due = r["deliver_at"].as_u64().unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(due > now + 3_600_000, "{r}");
    let mut conn = redis.client();
    assert_eq!(entries(&mut conn, "s:dead").len(), 0, "replayed and purged");
    // Replayed due now: scheduled, or delivered already.
    let (_, d1) = api.get("/v1/messages/d1").await;
    assert!(
        d1["state"] == "scheduled" || d1["state"] == "delivered",
        "{d1}"
    );
    let paused: BTreeSet<String> = redis::cmd("SMEMBERS")
        .arg("delayq:paused")
        .query(&mut conn)
        .unwrap();
    assert!(paused.is_empty(), "paused, then resumed: {paused:?}");
}
