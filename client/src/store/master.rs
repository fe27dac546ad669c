//! Which data node is the master behind Sentinel, found with no right a
//! least-privilege user lacks: the Sentinels are asked `SENTINEL
//! GET-MASTER-ADDR-BY-NAME` (with the Sentinels' own user), and the node named
//! confirms it is a master in its `HELLO` reply (its `role`). `ROLE` and `INFO`,
//! which the redis crate's Sentinel client asks, are admin or dangerous commands
//! such a user may not run: asked with them, a failover was never followed.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};

use super::tls::RedisTls;

/// The role a node names in its `HELLO` reply (`master` or `replica`), read from
/// either protocol's shape (RESP3's map, RESP2's flat list of pairs).
pub(super) fn hello_role(reply: &Value) -> Option<String> {
    let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
    match reply {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).as_deref() == Some("role"))
            .and_then(|(_, v)| text(v)),
        Value::Array(items) => items
            .chunks(2)
            .find(|pair| pair.len() == 2 && text(&pair[0]).as_deref() == Some("role"))
            .and_then(|pair| text(&pair[1])),
        _ => None,
    }
}

/// Whether the node `conn` reaches says it is a master (`HELLO`, which any user
/// may run). An error is Redis's answer (`NOPERM` for a user without `HELLO`).
pub(super) async fn says_master<C: ConnectionLike + Send>(
    conn: &mut C,
    within: Duration,
) -> redis::RedisResult<bool> {
    let reply = tokio::time::timeout(within, redis::cmd("HELLO").query_async::<Value>(conn))
        .await
        .map_err(|_| io("the node did not answer HELLO in time"))??;
    Ok(hello_role(&reply).as_deref() == Some("master"))
}

/// A client of the master the first answering Sentinel names for `name`, once
/// that node confirms it is one; each Sentinel and node asked within `within`.
pub(super) async fn ask_master(
    sentinels: &[redis::Client],
    name: &str,
    data: &redis::ConnectionInfo,
    tls: Option<&RedisTls>,
    within: Duration,
) -> redis::RedisResult<redis::Client> {
    let mut why = io("no Sentinel is configured");
    for sentinel in sentinels {
        let named = tokio::time::timeout(within, async {
            let mut c = sentinel.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(name)
                .query_async::<Option<(String, u16)>>(&mut c)
                .await
        })
        .await
        .unwrap_or_else(|_| Err(io("a Sentinel did not answer in time")));
        let (host, port) = match named {
            Ok(Some(address)) => address,
            Ok(None) => {
                why = RedisError::from((
                    redis::ErrorKind::Client,
                    "a Sentinel knows no master of this name (redis.sentinel.master)",
                    name.to_owned(),
                ));
                continue;
            }
            Err(e) => {
                why = e;
                continue;
            }
        };
        let (_, client) = super::tls::node_client(data, tls, &host, port)?;
        let confirmed = tokio::time::timeout(within, async {
            let mut c = client.get_multiplexed_async_connection().await?;
            says_master(&mut c, within).await
        })
        .await
        .unwrap_or_else(|_| Err(io("the named master did not answer in time")));
        match confirmed {
            Ok(true) => return Ok(client),
            Ok(false) => {
                why = RedisError::from((
                    redis::ErrorKind::Client,
                    "the node a Sentinel names does not say it is a master (yet)",
                    format!("{host}:{port}"),
                ))
            }
            Err(e) => why = e,
        }
    }
    Err(why)
}

fn io(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Io, what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn resp2(role: &str) -> Value {
        let pairs = [
            ("server", bulk("redis")),
            ("version", bulk("7.0.15")),
            ("proto", Value::Int(2)),
            ("id", Value::Int(7)),
            ("mode", bulk("standalone")),
            ("role", bulk(role)),
            ("modules", Value::Array(vec![])),
        ];
        Value::Array(pairs.into_iter().flat_map(|(k, v)| [bulk(k), v]).collect())
    }

    #[test]
    fn the_role_is_read_from_either_protocols_hello() {
        assert_eq!(hello_role(&resp2("master")).as_deref(), Some("master"));
        assert_eq!(hello_role(&resp2("replica")).as_deref(), Some("replica"));
        let map = Value::Map(vec![
            (bulk("proto"), Value::Int(3)),
            (bulk("role"), Value::SimpleString("master".into())),
        ]);
        assert_eq!(hello_role(&map).as_deref(), Some("master"));
    }

    #[test]
    fn a_reply_without_a_role_names_none() {
        assert_eq!(hello_role(&Value::Nil), None);
        assert_eq!(hello_role(&Value::Array(vec![bulk("role")])), None);
        assert_eq!(hello_role(&Value::Array(vec![])), None);
        assert_eq!(hello_role(&bulk("master")), None);
    }
}
