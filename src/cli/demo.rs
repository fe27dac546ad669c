//! `delayq demo`: the quickstart. Starts a local redis-server and a delayq on
//! loopback, pushes a delayed message over HTTP, and shows it arrive in its stream.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use crate::config::Config;
use crate::harness::RedisServer;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Delay of the demo message.
    #[arg(long, default_value = "3s", value_parser = crate::message::parse_duration)]
    delay: Duration,
    /// Exit after the message arrived instead of serving until Ctrl-C.
    #[arg(long)]
    once: bool,
}

pub async fn main(args: DemoArgs) -> anyhow::Result<()> {
    let redis = RedisServer::start()?;
    println!(
        "redis-server   {} (pid {})",
        redis.url(),
        redis.pid().unwrap_or(0)
    );
    let config = Config::from_toml(
        &format!(
            "[redis]\nurl = \"{}\"\n[api]\nlisten = \"127.0.0.1:0\"\n[log]\nlevel = \"warn\"\n",
            redis.url()
        ),
        std::iter::empty(),
    )?;
    let daemon = crate::start(config).await?;
    let api = format!("http://{}", daemon.api_addr);
    println!("delayq API     {api}");

    let body = json!({ "stream": "orders", "fields": { "order": "42", "event": "reminder" }, "delay": humantime::format_duration(args.delay).to_string() });
    println!("\n$ curl -X POST {api}/v1/messages -d '{body}'");
    let resp: serde_json::Value = reqwest::Client::new()
        .post(format!("{api}/v1/messages"))
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    println!("{resp}");
    let id = resp["id"].as_str().unwrap_or_default().to_owned();
    let status: serde_json::Value = reqwest::get(format!("{api}/v1/messages/{id}"))
        .await?
        .json()
        .await?;
    println!("\n$ curl {api}/v1/messages/{id}\n{status}");

    println!("\nwaiting for the message in stream \"orders\" (XREAD BLOCK)...");
    let sent = Instant::now();
    let mut conn = daemon.store.separate_connection().await?;
    // Read the raw reply: it keeps the fields in the order they were written.
    let reply: redis::Value = redis::cmd("XREAD")
        .arg("BLOCK")
        .arg(args.delay.as_millis() as u64 + 10_000)
        .arg("STREAMS")
        .arg("orders")
        .arg("0")
        .query_async(&mut conn)
        .await?;
    let (entry_id, fields) =
        first_entry(&reply).ok_or_else(|| anyhow::anyhow!("the message did not arrive"))?;
    let due = resp["deliver_at"].as_u64().unwrap_or(0);
    let entry_ms: u64 = entry_id
        .split('-')
        .next()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    println!(
        "arrived after {:.3}s: orders {} {}  (due {due}, entry time {entry_ms}: {} ms late)",
        sent.elapsed().as_secs_f64(),
        entry_id,
        fields.join(" "),
        entry_ms.saturating_sub(due)
    );
    let status: serde_json::Value = reqwest::get(format!("{api}/v1/messages/{id}"))
        .await?
        .json()
        .await?;
    println!("\n$ curl {api}/v1/messages/{id}\n{status}");

    if !args.once {
        println!(
            "\ndelayq keeps running at {api}; try `delayq push orders hello --delay 5s --url {api}`. Ctrl-C stops everything."
        );
        tokio::signal::ctrl_c().await?;
    }
    daemon.stop().await;
    drop(redis);
    Ok(())
}

/// The first entry of an `XREAD` reply: its id and `name=value` fields in order.
fn first_entry(reply: &redis::Value) -> Option<(String, Vec<String>)> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    // XREAD answers [[stream, [[id, [field, value, ...]], ...]]] (RESP2) or a map (RESP3).
    let streams: Vec<&Value> = match reply {
        Value::Array(items) => items.iter().collect(),
        Value::Map(pairs) => pairs.iter().map(|(_, v)| v).collect(),
        _ => return None,
    };
    let entries = match streams.first()? {
        Value::Array(pair) if pair.len() == 2 => &pair[1],
        other => other,
    };
    let Value::Array(entries) = entries else {
        return None;
    };
    let Value::Array(entry) = entries.first()? else {
        return None;
    };
    let id = text(entry.first()?)?;
    let Value::Array(kv) = entry.get(1)? else {
        return None;
    };
    let fields = kv
        .chunks(2)
        .filter_map(|p| Some(format!("{}={}", text(&p[0])?, text(p.get(1)?)?)))
        .collect();
    Some((id, fields))
}
