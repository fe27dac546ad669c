//! A Redis of a test's own, with a store on it (`Bare`) and, for most tests, an
//! in-process daemon (`Env`); and the configuration texts tests write.

use std::time::Duration;

use delayq_client::config::Config;
use delayq_client::store::{BatchItem, Scheduled, Store};
use delayq_harness::{RedisOptions, RedisServer};

use super::{Api, OneLeader};

/// One TOML text from `layers`, each merged over the ones before it key by key.
pub fn toml_layers(layers: &[&str]) -> String {
    let mut merged = toml::Table::new();
    for layer in layers {
        let table: toml::Table = layer
            .parse()
            .unwrap_or_else(|e| panic!("test config: {e}\n{layer}"));
        merge(&mut merged, table);
    }
    toml::to_string(&merged).expect("serialize config")
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

/// A config for tests: the given Redis, 4 shards, an ephemeral API port, with
/// `extra` (TOML) merged over it key by key.
pub fn config(redis_url: &str, extra: &str) -> Config {
    let base =
        format!("[redis]\nurl = \"{redis_url}\"\nshards = 4\n[api]\nlisten = \"127.0.0.1:0\"\n");
    let text = toml_layers(&[&base, extra]);
    Config::from_toml(&text, std::iter::empty())
        .unwrap_or_else(|e| panic!("test config: {e}\n{text}"))
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
        Self::start_on(redis, extra).await
    }

    /// On a Redis the test prepared (an ACL user, say), which `extra` may name.
    pub async fn start_on(redis: RedisServer, extra: &str) -> Bare {
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

    /// Starts the daemon on this Redis, as prepared so far: what the test put there
    /// is what the daemon finds at its start.
    pub async fn daemon(self) -> Env {
        let daemon = delayq::start(self.config.clone())
            .await
            .expect("start delayq");
        Env {
            api: Api::new(daemon.api_addr),
            daemon: Some(daemon),
            store: self.store,
            config: self.config,
            redis: self.redis,
        }
    }
}

/// A Redis server and an in-process daemon on it.
pub struct Env {
    pub daemon: Option<delayq::Daemon>,
    pub store: Store,
    pub config: Config,
    /// The daemon's HTTP API.
    pub api: Api,
    pub redis: RedisServer,
}

impl Env {
    pub async fn start(extra: &str) -> Env {
        Self::start_with(RedisOptions::default(), extra).await
    }

    pub async fn start_with(options: RedisOptions, extra: &str) -> Env {
        Bare::start_with(options, extra).await.daemon().await
    }

    /// How many messages are scheduled, in every shard.
    pub async fn scheduled(&self) -> u64 {
        let per_shard = self
            .store
            .pending_per_shard()
            .await
            .expect("pending per shard");
        per_shard.iter().map(|(_, n)| n).sum()
    }

    pub fn url(&self, path: &str) -> String {
        self.api.url(path)
    }

    /// Waits until this node leads: the daemon takes its standalone epoch from Redis
    /// after it starts, so a test that checks `/leader` must not race that.
    pub async fn leading(&self) {
        OneLeader::among(std::slice::from_ref(&self.api))
            .within(Duration::from_secs(10))
            .wait(String::new)
            .await;
    }

    /// Puts `daemon` in the place of the one stopped, with its API.
    pub fn run(&mut self, daemon: delayq::Daemon) {
        self.api = Api::new(daemon.api_addr);
        self.daemon = Some(daemon);
    }

    pub async fn stop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.stop().await;
        }
    }
}

/// Schedules `items` in one call (`max_delay` the furthest due time taken); panics
/// unless each one is stored anew.
pub async fn schedule_new(store: &Store, items: &[BatchItem], max_delay: Duration) {
    for (item, answer) in items
        .iter()
        .zip(store.schedule_many(items, max_delay, None).await)
    {
        assert!(
            matches!(answer, Ok(Scheduled::Scheduled { .. })),
            "{}: {answer:?}",
            item.msg.id
        );
    }
}

/// Ids of messages to `stream`, `per_shard` in each of the store's shards.
pub fn ids_in_every_shard(store: &Store, stream: &str, per_shard: usize) -> Vec<String> {
    let mut count = vec![0; usize::from(store.shards())];
    let mut ids = Vec::new();
    for i in 0.. {
        let id = format!("m{i}");
        let shard = usize::from(store.shard_of(
            &delayq_client::message::MessageId::parse(&id).unwrap(),
            stream,
        ));
        if count[shard] < per_shard {
            count[shard] += 1;
            ids.push(id);
        }
        if count.iter().all(|&c| c == per_shard) {
            return ids;
        }
    }
    unreachable!()
}

/// Adds ACL user `user` with `rules` (after `on` and its password) to `redis`, and
/// returns the `[redis]` settings that connect as it, its password in a file in `dir`.
pub fn acl_user(redis: &RedisServer, user: &str, rules: &[&str], dir: &std::path::Path) -> String {
    let password = format!("pw-{user}");
    let mut args = vec!["SETUSER", user, "on"];
    let secret = format!(">{password}");
    args.push(&secret);
    args.extend_from_slice(rules);
    let () = redis::cmd("ACL")
        .arg(&args[..])
        .query(&mut redis.client())
        .expect("ACL SETUSER");
    let file = dir.join("redis-password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    let url = redis.url().replace("redis://", &format!("redis://{user}@"));
    format!(
        "[redis]\nurl = \"{url}\"\npassword_file = \"{}\"\n",
        file.display()
    )
}
