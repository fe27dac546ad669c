//! Redelivery of unacknowledged entries, and dead letters: the redeliver script as
//! one-line cases against a real Redis (`script`), then whole daemons with consumers
//! that ack, never ack, or hold on (`consumers`), and real processes killed,
//! reloaded, or started before their consumer group exists (`processes`).

mod consumers;
mod processes;
mod script;

use std::time::Duration;

use crate::support::{Entry, eventually, read_group, toml_layers};

const GROUP: &str = "g";
const CONSUMER: &str = "c";

/// The delivery settings of the daemons here: a fast sweep, a short ack timeout,
/// short backoffs.
const DELIVERY: &str = "[delivery]
groups = [\"g\"]
ack_timeout = \"500ms\"
sweep_interval = \"50ms\"
backoff = \"100ms\"
backoff_max = \"200ms\"
backoff_jitter = 0.0
";

/// `DELIVERY`, with `extra` lines (`key = value`) added or in the place of its own,
/// watching `streams`.
fn delivery(streams: &[&str], extra: &str) -> String {
    let watched: String = streams
        .iter()
        .map(|s| format!("[delivery.streams.\"{s}\"]\n"))
        .collect();
    toml_layers(&[DELIVERY, &format!("[delivery]\n{extra}\n"), &watched])
}

/// Waits for the first delivery to `stream` that the consumer reads through the group.
async fn first_delivery(conn: &mut redis::Connection, stream: &str) -> Entry {
    let first = eventually(Duration::from_secs(5), "first delivery", || {
        std::future::ready(read_group(conn, stream, GROUP, CONSUMER).pop())
    })
    .await;
    assert_eq!(first.get("delayq-attempt"), Some("1"), "{first:?}");
    first
}
