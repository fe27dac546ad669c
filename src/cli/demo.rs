//! `delayq demo`: the quickstart. Starts a local redis-server and a delayq on
//! loopback, pushes a delayed message over HTTP, and shows it arrive in its stream.

use std::time::{Duration, Instant};

use clap::Args;
use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};
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
    let reply: StreamReadReply = conn
        .xread_options(
            &["orders"],
            &["0"],
            &StreamReadOptions::default().block(args.delay.as_millis() as usize + 10_000),
        )
        .await?;
    let entry = reply
        .keys
        .first()
        .and_then(|k| k.ids.first())
        .ok_or_else(|| anyhow::anyhow!("the message did not arrive"))?;
    let fields: Vec<String> = entry
        .map
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}={}",
                redis::from_redis_value_ref::<String>(v).unwrap_or_default()
            )
        })
        .collect();
    let due = resp["deliver_at"].as_u64().unwrap_or(0);
    let entry_ms: u64 = entry
        .id
        .split('-')
        .next()
        .unwrap_or("0")
        .parse()
        .unwrap_or(0);
    println!(
        "arrived after {:.3}s: orders {} {}  (due {due}, entry time {entry_ms}: {} ms late)",
        sent.elapsed().as_secs_f64(),
        entry.id,
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
