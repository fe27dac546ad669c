//! Shared test support: a Redis plus an in-process delayq, stream readers that keep
//! field order, and `eventually` with a patience multiplier for slow machines.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use delayq::config::Config;
use delayq::harness::{RedisOptions, RedisServer};
use delayq::store::Store;
use redis::Value;

/// The `delayq` binary cargo built for these tests.
pub fn delayq_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_delayq"))
}

/// Multiplies test timeouts: `DELAYQ_TEST_PATIENCE` (default 1, or 3 when `CI` is set).
pub fn patience() -> u32 {
    std::env::var("DELAYQ_TEST_PATIENCE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var_os("CI").is_some() {
            3
        } else {
            1
        })
}

/// Polls `check` until it returns Some, or panics with `what` after `timeout` × patience.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout * patience();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out after {:?} waiting for: {what}",
                timeout * patience()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A config for tests: the given Redis, 4 shards, an ephemeral API port, with
/// `extra` (TOML) merged over it key by key.
pub fn config(redis_url: &str, extra: &str) -> Config {
    let mut base: toml::Table =
        format!("[redis]\nurl = \"{redis_url}\"\nshards = 4\n[api]\nlisten = \"127.0.0.1:0\"\n")
            .parse()
            .expect("base config");
    let extra: toml::Table = extra
        .parse()
        .unwrap_or_else(|e| panic!("test config: {e}\n{extra}"));
    merge(&mut base, extra);
    let text = toml::to_string(&base).expect("serialize config");
    Config::from_toml(&text, std::iter::empty())
        .unwrap_or_else(|e| panic!("test config: {e}\n{text}"))
}

fn merge(base: &mut toml::Table, extra: toml::Table) {
    for (key, value) in extra {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(e)) => merge(b, e),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// A Redis server and a store on it, without a daemon.
pub struct Bare {
    pub redis: RedisServer,
    pub store: Store,
    pub config: Config,
}

impl Bare {
    pub async fn start(extra: &str) -> Bare {
        Self::start_with(RedisOptions::default(), extra).await
    }

    pub async fn start_with(options: RedisOptions, extra: &str) -> Bare {
        let redis = RedisServer::start_with(options).expect("start redis-server");
        let config = config(&redis.url(), extra);
        let store = Store::connect(&config.store_config())
            .await
            .expect("connect");
        Bare {
            redis,
            store,
            config,
        }
    }
}

/// A Redis server and an in-process daemon on it.
pub struct Env {
    pub daemon: Option<delayq::Daemon>,
    pub store: Store,
    pub config: Config,
    pub http: reqwest::Client,
    pub redis: RedisServer,
}

impl Env {
    pub async fn start(extra: &str) -> Env {
        Self::start_with(RedisOptions::default(), extra).await
    }

    pub async fn start_with(options: RedisOptions, extra: &str) -> Env {
        let Bare {
            redis,
            store,
            config,
        } = Bare::start_with(options, extra).await;
        let daemon = delayq::start(config.clone()).await.expect("start delayq");
        Env {
            daemon: Some(daemon),
            store,
            config,
            http: reqwest::Client::new(),
            redis,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!(
            "http://{}{path}",
            self.daemon.as_ref().expect("running").api_addr
        )
    }

    /// Sends one request with an optional bearer token and raw JSON body (at most
    /// 30 s); the response as it came.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> reqwest::Response {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = self
            .http
            .request(method, self.url(path))
            .timeout(Duration::from_secs(30));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        req.send().await.expect("request")
    }

    /// Waits until this node leads (`/leader` answers 200): the daemon takes its
    /// standalone epoch from Redis after it starts, so a test that checks
    /// `/leader` must not race that.
    pub async fn leading(&self) {
        eventually(Duration::from_secs(10), "this node leads", || async {
            let resp = self.http.get(self.url("/leader")).send().await.ok()?;
            (resp.status() == 200).then_some(())
        })
        .await;
    }

    pub async fn stop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop().await;
        }
    }

    /// POSTs JSON text as is; returns status and JSON body.
    pub async fn post_raw(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let resp = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.post_raw(path, &body.to_string()).await
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = self.http.get(self.url(path)).send().await.expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn delete(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = self
            .http
            .delete(self.url(path))
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(serde_json::Value::Null))
    }
}

/// A stream entry: id and fields, in the order they were written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub fields: Vec<(String, String)>,
}

impl Entry {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Milliseconds part of the entry id: when Redis wrote it.
    pub fn ms(&self) -> u64 {
        self.id.split('-').next().unwrap().parse().unwrap()
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

/// Every entry of a stream, in order, with field order kept.
pub fn entries(conn: &mut redis::Connection, stream: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut start = "-".to_owned();
    loop {
        let reply: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(10_000)
            .query(conn)
            .expect("XRANGE");
        let Value::Array(items) = reply else {
            panic!("XRANGE reply")
        };
        if items.is_empty() {
            return out;
        }
        for item in items {
            let Value::Array(parts) = item else {
                panic!("entry")
            };
            let id = text(&parts[0]);
            let Value::Array(kv) = &parts[1] else {
                panic!("fields")
            };
            let fields = kv.chunks(2).map(|p| (text(&p[0]), text(&p[1]))).collect();
            start = format!("({id}");
            out.push(Entry { id, fields });
        }
    }
}

/// `CONFIG SET key value` on a test's Redis.
pub fn redis_config(conn: &mut redis::Connection, key: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(key)
        .arg(value)
        .query(conn)
        .unwrap_or_else(|e| panic!("CONFIG SET {key} {value}: {e}"));
}

/// Redis's `used_memory` (INFO memory), bytes.
pub fn used_memory(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("memory").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// A node's `/metrics` text at `url`; None if it does not answer.
pub async fn metrics(http: &reqwest::Client, url: String) -> Option<String> {
    http.get(url).send().await.ok()?.text().await.ok()
}

/// The sum of a counter's series in a `/metrics` text (0 if it has none).
pub fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Asserts that an API answer is the refusal expected: its status, its error code
/// (`"error"`) and a `"detail"` that mentions `detail_part`. `case` names the case
/// in a failure message.
#[track_caller]
pub fn assert_refused(
    (status, answer): (u16, &serde_json::Value),
    (want_status, code, detail_part): (u16, &str, &str),
    case: &str,
) {
    assert_eq!(status, want_status, "{case}: status; answer {answer}");
    assert_eq!(answer["error"], code, "{case}: error code; answer {answer}");
    let detail = answer["detail"]
        .as_str()
        .unwrap_or_else(|| panic!("{case}: no detail in {answer}"));
    assert!(
        detail.contains(detail_part),
        "{case}: detail {detail:?} should mention {detail_part:?}"
    );
}
