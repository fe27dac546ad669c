//! The docs' Rust client example: schedules, reschedules and cancels a message
//! through Redis directly. `cargo run -p delayq-client --example producer` against
//! the Redis that config/delayq.toml names (or DELAYQ_REDIS_URL).

use std::time::Duration;

use delayq_client::client::{Producer, ProducerOptions, Sent};
use delayq_client::message::Due;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    // The daemon's own configuration, so both agree on redis.prefix and redis.shards.
    let config = delayq_client::config::Config::load(Some("config/delayq.toml".as_ref()))?;
    let producer = Producer::with_options(ProducerOptions::from_config(&config)).await?;
    let fields = [("order", "42"), ("kind", "reminder")];
    let Sent::Scheduled { id, due_ms } = producer
        .send("orders", &fields, Duration::from_secs(1200))
        .await?
    else {
        anyhow::bail!("a delay of 20 minutes schedules the message");
    };
    println!("scheduled {id}, due at {due_ms} (epoch ms)");
    producer
        .reschedule(id.as_str(), Due::In(Duration::from_secs(3600)))
        .await?;
    println!("rescheduled {id} to an hour from now");
    println!("cancel: {:?}", producer.cancel(id.as_str()).await?);
    Ok(())
}
