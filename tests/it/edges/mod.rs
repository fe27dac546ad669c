//! Every numeric setting at its minimum and at its maximum, through a real `delayq`
//! process and a real Redis: each message delivered exactly once, with its fields
//! verbatim, never before its due time, and on record (`run`, `checks`). Bounds that
//! cannot be exercised whole in a test are checked for what they mean: `delayq
//! check-config` accepts each bound and refuses one step outside it, naming the key
//! (`bounds`). And a Redis at its memory limit while messages fall due (`full`).

mod bounds;
mod checks;
mod full;
mod run;

use serde_json::{Value, json};

use crate::support::toml_layers;
use run::check_edge;

const INBOX: &str = "delayq:inbox";
const REJECTED: &str = "delayq:inbox:rejected";
const GROUP: &str = "g";

/// What a case pushes, and what it does after the first delivery.
#[derive(Clone, Copy, Debug)]
struct Workload {
    /// Messages pushed through `POST /v1/messages/batch`, all due at one instant.
    http: usize,
    /// Messages per batch request.
    chunk: usize,
    /// Messages XADDed to the inbox: half due at that instant, half after a delay.
    inbox: usize,
    /// Target streams the messages are spread over.
    streams: usize,
    /// Field/value pairs per message.
    fields: usize,
    /// Size of every message as the API counts it (stream name, field names and
    /// values), reached by padding the last value; 0 leaves values short.
    bytes: usize,
    /// After the first delivery every entry is read through a watched group and left
    /// unacknowledged: the sweep redelivers each once as attempt 2, or dead-letters
    /// it when `delivery.max_attempts` is 1.
    redeliver: bool,
    /// `records.retention` is tiny: the records must be forgotten after delivery,
    /// and nothing delivered again.
    forgotten: bool,
}

const W: Workload = Workload {
    http: 200,
    chunk: 100,
    inbox: 100,
    streams: 3,
    fields: 3,
    bytes: 0,
    redeliver: false,
    forgotten: false,
};

/// One message of a workload, and the earliest time it may arrive.
struct Planned {
    id: String,
    stream: String,
    fields: Vec<(String, String)>,
    /// Epoch ms before which it must not be in its stream (filled once pushed).
    due_ms: u64,
}

/// A config file: the given Redis, then `settings` (dotted key, TOML value) over it.
fn config_text(redis_url: &str, settings: &[(&str, &str)]) -> String {
    let url = format!("redis.url = \"{redis_url}\"");
    let lines: Vec<String> = settings.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    let layers: Vec<&str> = std::iter::once(url.as_str())
        .chain(lines.iter().map(String::as_str))
        .collect();
    toml_layers(&layers)
}

fn setting<'a>(settings: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    settings
        .iter()
        .rev()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
}

/// Field/value pairs of message `i`: values with quotes, backslashes, a tab and
/// non-ASCII text, the last one padded so that the message is `bytes` long.
fn message_fields(i: usize, stream: &str, w: &Workload) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = (0..w.fields)
        .map(|j| (format!("f{j}"), format!("{i}/{j} \"q\" \\ \t ü ✓")))
        .collect();
    if w.bytes > 0 {
        let last = fields.len() - 1;
        fields[last].1 = format!("{i}:");
        let size: usize =
            stream.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        assert!(
            size <= w.bytes,
            "message {i} is {size} bytes before padding"
        );
        fields[last].1.push_str(&"x".repeat(w.bytes - size));
    }
    fields
}

fn push_body(m: &Planned, at_ms: u64) -> Value {
    let pairs: Vec<Value> = m.fields.iter().map(|(k, v)| json!([k, v])).collect();
    json!({ "stream": m.stream, "fields": pairs, "deliver_at": at_ms, "id": m.id })
}

macro_rules! edges {
    ($($name:ident: [$(($key:literal, $value:literal)),* $(,)?], $workload:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                check_edge(&[$(($key, $value)),*], $workload).await;
            }
        )*
    };
}

edges! {
    shards_min: [("redis.shards", "1")], W;
    shards_max: [("redis.shards", "1024")], W;
    forwarder_batch_min: [("forwarder.batch_size", "1")], W;
    // More due at one instant in one shard than the largest batch holds.
    forwarder_batch_max_one_shard: [("redis.shards", "1"), ("forwarder.batch_size", "10000"), ("api.max_batch", "5000")], Workload { http: 12_000, chunk: 5000, inbox: 0, ..W };
    forwarder_batch_half_max_one_shard: [("redis.shards", "1"), ("forwarder.batch_size", "5000"), ("api.max_batch", "5000")], Workload { http: 6000, chunk: 3000, inbox: 0, ..W };
    idle_wakeup_min: [("forwarder.idle_wakeup", "\"10ms\"")], W;
    // One message a second: five take about four seconds, each once.
    max_rate_min: [("forwarder.max_rate", "1")], Workload { http: 3, chunk: 3, inbox: 2, ..W };
    max_rate_max: [("forwarder.max_rate", "10000000")], W;
    // One stream at one message a second, the two others unlimited.
    stream_max_rate_min: [("streams.max_rate.edge-0", "1")], Workload { http: 6, chunk: 3, inbox: 3, ..W };
    stream_max_rate_max: [("streams.max_rate.edge-0", "10000000")], W;
    redis_timeout_min: [("redis.timeout", "\"50ms\"")], W;
    max_batch_min: [("api.max_batch", "1")], Workload { http: 60, chunk: 1, inbox: 0, ..W };
    max_batch_max: [("api.max_batch", "5000")], Workload { http: 5000, chunk: 5000, inbox: 0, ..W };
    max_fields_min: [("api.max_fields", "1")], Workload { fields: 1, ..W };
    max_fields_max: [("api.max_fields", "2000")], Workload { http: 4, chunk: 2, inbox: 4, fields: 2000, ..W };
    // The smallest message a limit can usefully allow (name, one field, a value).
    max_message_bytes_small: [("api.max_message_bytes", "24")], Workload { fields: 1, bytes: 24, ..W };
    // One message of exactly the largest size: through a batch (whose body may be
    // larger than the default max_body_bytes) and through the inbox.
    max_message_bytes_max: [("api.max_message_bytes", "67108864"), ("api.max_body_bytes", "268435456"), ("redis.timeout", "\"30s\"")], Workload { http: 1, chunk: 1, inbox: 1, streams: 1, fields: 1, bytes: 64 << 20, ..W };
    inbox_batch_min: [("inbox.batch_size", "1")], Workload { http: 0, inbox: 100, ..W };
    inbox_batch_max: [("inbox.batch_size", "5000")], Workload { http: 0, inbox: 6000, ..W };
    // An instance takes over its own entries while it still works on them.
    inbox_reclaim_after_min: [("inbox.reclaim_after", "\"100ms\""), ("inbox.batch_size", "5000")], Workload { http: 0, inbox: 6000, ..W };
    records_retention_min: [], Workload { forgotten: true, ..W };
    // Ten years of records, in either layout: pushes, lookups and trimming work.
    records_retention_max: [("records.retention", "\"3650days\"")], W;
    records_retention_max_hash: [("records.retention", "\"3650days\""), ("records.layout", "\"hash\"")], W;
    sweep_batch_min_and_ack_timeout_min: [("delivery.sweep_batch", "1"), ("delivery.ack_timeout", "\"10ms\"")], Workload { http: 40, inbox: 20, redeliver: true, ..W };
    sweep_batch_max: [("delivery.sweep_batch", "10000"), ("delivery.backoff_jitter", "1.0")], Workload { http: 3000, chunk: 1000, inbox: 0, redeliver: true, ..W };
    max_attempts_min: [("delivery.max_attempts", "1"), ("delivery.backoff_jitter", "0.0")], Workload { redeliver: true, ..W };
    max_attempts_max: [("delivery.max_attempts", "1000")], Workload { redeliver: true, ..W };
    default_maxlen_max: [("streams.default_maxlen", "9223372036854775807")], W;
    // The low ends (1 request at once, 100ms) are in tests/it/http.rs: there they refuse.
    max_concurrent_requests_max: [("api.max_concurrent_requests", "100000")], W;
    request_timeout_max: [("api.request_timeout", "\"1h\"")], W;
    redis_connect_timeout_min: [("redis.connect_timeout", "\"50ms\"")], W;
    max_delay_max: [("api.max_delay", "\"36500d\"")], W;
    max_body_bytes_max: [("api.max_body_bytes", "1073741824")], W;
    max_polls_min: [("api.max_polls", "1")], W;
    max_polls_max: [("api.max_polls", "10000")], W;
    max_wait_min: [("api.max_wait", "\"100ms\"")], W;
    max_wait_max: [("api.max_wait", "\"1h\"")], W;
}
