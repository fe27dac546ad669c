//! Whether the Redis user may run what delayq runs, asked of Redis's own ACLs
//! (`redis.acl_check_cmd` in `rights.lua`) on every master, so that a right the
//! user lacks shows at start and on `/readyz`, naming the command and key,
//! instead of failing each push.

use redis::Value;

use super::{Result, Store, text};

const RIGHTS: &str = include_str!("lua/rights.lua");

/// Each command the scripts or the daemon run on a key of delayq's own (`K`, a
/// shard key and a key under the prefix in turn; `K2` another shard key), with
/// arguments of its arity.
const OWN_KEYS: &[&str] = &[
    "DEL K",
    "EXISTS K",
    "GET K",
    "SET K v",
    "SET K v NX GET",
    "INCR K",
    "PTTL K",
    "TYPE K",
    "RENAME K K2",
    "HDEL K f",
    "HGET K f",
    "HGETALL K",
    "HINCRBY K f 1",
    "HLEN K",
    "HRANDFIELD K 1",
    "HSCAN K 0",
    "HSET K f v",
    "HSETNX K f v",
    "LINDEX K 0",
    "LINSERT K BEFORE a b",
    "LLEN K",
    "LPOP K 1",
    "LPUSH K v",
    "LRANGE K 0 1",
    "LREM K 0 v",
    "LTRIM K 0 1",
    "RPUSH K v",
    "SADD K m",
    "SMEMBERS K",
    "SREM K m",
    "ZADD K 1 m",
    "ZCARD K",
    "ZCOUNT K 0 1",
    "ZLEXCOUNT K - +",
    "ZRANGE K 0 1",
    "ZRANGEBYLEX K - +",
    "ZRANGEBYSCORE K 0 1",
    "ZREM K m",
    "ZREVRANGEBYLEX K + -",
    "ZSCORE K m",
    "XADD K * f v",
    "XRANGE K - +",
    "EVALSHA 0000000000000000000000000000000000000000 1 K",
];

/// Each command run on a target stream, its dead-letter stream or the inbox (`S`).
const STREAMS: &[&str] = &[
    "XADD S * f v",
    "XACK S g 0-1",
    "XAUTOCLAIM S g c 0 0-0",
    "XCLAIM S g c 0 0-1",
    "XDEL S 0-1",
    "XGROUP CREATE S g $ MKSTREAM",
    "XGROUP CREATECONSUMER S g c",
    "XGROUP DELCONSUMER S g c",
    "XGROUP SETID S g 0",
    "XINFO CONSUMERS S g",
    "XINFO GROUPS S",
    "XINFO STREAM S",
    "XLEN S",
    "XPENDING S g - + 1",
    "XRANGE S - +",
    "XREAD STREAMS S 0",
    "XREADGROUP GROUP g c STREAMS S >",
    "XREVRANGE S + -",
    "XTRIM S MAXLEN 1",
];

/// Commands on pub/sub channels under the prefix (`C`).
const CHANNELS: &[&str] = &["PUBLISH C x", "SUBSCRIBE C"];

/// What the rights check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rights {
    /// Every right delayq needs is granted.
    Granted,
    /// Redis cannot tell (older than 7, or the check itself was refused: then
    /// its text says which).
    Unknown(String),
    /// The commands the user may not run, as `COMMAND key …`, with the master
    /// that said so on Redis Cluster.
    Missing(Vec<String>),
}

impl Rights {
    /// Why this node cannot do its job, when a right is missing.
    pub fn problem(&self) -> Option<String> {
        match self {
            Rights::Missing(refused) => Some(format!(
                "the Redis user may not run {} (grant the rule in docs/redis-rights.md)",
                refused.join("; ")
            )),
            _ => None,
        }
    }
}

impl Store {
    /// Asks every master whether this user may run what delayq runs on its own
    /// keys and channels, on `streams` (targets, their dead-letter streams, the
    /// inbox), and `WAIT` with `redis.min_replicas_acked`, `HELLO` through
    /// Sentinel and `CLUSTER SLOTS` on Redis Cluster.
    pub async fn rights(&self, streams: &[String]) -> Result<Rights> {
        let mut eval = redis::cmd("EVAL");
        eval.arg(RIGHTS).arg(0);
        for check in checks(self, streams) {
            eval.arg(check).arg("");
        }
        let replies = match self.conn.on_every_master(eval).await {
            Ok(replies) => replies,
            Err(e) if e.code() == Some("NOPERM") => {
                return Ok(Rights::Missing(vec![format!("EVAL ({e})")]));
            }
            Err(e) => return Err(e.into()),
        };
        let mut missing = Vec::new();
        for (node, reply) in replies {
            let Value::Array(refused) = reply else {
                return Err(super::StoreError::Reply(format!(
                    "the rights check said {reply:?}"
                )));
            };
            for refused in refused {
                let refused = text(&refused)?;
                if refused == "cannot-tell" {
                    return Ok(Rights::Unknown(
                        "Redis older than 7 cannot tell a user's rights (redis.acl_check_cmd)"
                            .to_owned(),
                    ));
                }
                missing.push(match &node {
                    Some(node) => format!("{refused} (on {node})"),
                    None => refused,
                });
            }
        }
        Ok(if missing.is_empty() {
            Rights::Granted
        } else {
            Rights::Missing(missing)
        })
    }
}

/// Every check, as the words of a command, for the store's keys and `streams`.
fn checks(store: &Store, streams: &[String]) -> Vec<Vec<String>> {
    let shard = store.keys.shard(0);
    let other = store
        .keys
        .shard(1.min(store.keys.shards().saturating_sub(1)));
    let words = |template: &str, at: &str, with: &str| -> Vec<String> {
        template
            .split(' ')
            .map(|w| match w {
                "K2" => other.fence.clone(),
                w if w == at => with.to_owned(),
                w => w.to_owned(),
            })
            .collect()
    };
    let mut checks = Vec::new();
    for key in [&shard.due, &store.keys.shards_in_use()] {
        checks.extend(OWN_KEYS.iter().map(|t| words(t, "K", key)));
    }
    for stream in streams {
        checks.extend(STREAMS.iter().map(|t| words(t, "S", stream)));
    }
    for channel in [store.keys.wake_channel(), store.keys.presence_channel(1)] {
        checks.extend(CHANNELS.iter().map(|t| words(t, "C", &channel)));
    }
    // Commands on no key, by what the store runs on.
    let keyless = [
        ("TIME", true),
        ("WAIT 1 0", store.replicas_acked.is_some()),
        ("HELLO", store.conn.master_changes().is_some()),
        ("CLUSTER SLOTS", store.conn.is_cluster()),
    ];
    for (command, needed) in keyless {
        if needed {
            checks.push(command.split(' ').map(str::to_owned).collect());
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command a script calls is checked: one added to a script must be
    /// added here, or a user without it would pass the check.
    #[test]
    fn every_command_the_scripts_run_is_checked() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/lua");
        let checked: std::collections::BTreeSet<String> = OWN_KEYS
            .iter()
            .chain(STREAMS)
            .chain(CHANNELS)
            .map(|t| t.split(' ').next().unwrap().to_owned())
            .chain(["TIME".to_owned()])
            .collect();
        let mut seen = 0;
        let files = std::fs::read_dir(dir)
            .unwrap()
            .chain(std::fs::read_dir(format!("{dir}/prelude")).unwrap())
            .map(|file| file.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "lua"));
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let calls = text
                .split("redis.call('")
                .skip(1)
                .chain(text.split("redis.pcall('").skip(1))
                .filter_map(|after| after.split_once('\'').map(|(name, _)| name));
            for name in calls {
                if name.contains(' ') || name.is_empty() {
                    continue;
                }
                let command = name.to_ascii_uppercase();
                seen += 1;
                assert!(
                    checked.contains(&command),
                    "{command} (called in {}) is not among the rights checked",
                    path.display()
                );
            }
        }
        assert!(seen > 50, "only {seen} calls found: is the pattern right?");
    }

    #[test]
    fn a_missing_right_is_a_problem_named_by_its_command_and_key() {
        assert_eq!(Rights::Granted.problem(), None);
        assert_eq!(Rights::Unknown("old".into()).problem(), None);
        let problem = Rights::Missing(vec!["XADD orders * f v".into()])
            .problem()
            .unwrap();
        assert!(problem.contains("XADD orders"), "{problem}");
    }
}
