//! `delayq stats`: the answer of `GET /v1/stats` as a person reads it.

use serde_json::Value;

use super::human::plain as text;

pub(super) fn print(v: &Value) {
    let leader = &v["leader"];
    let role = if leader["is_leader"].as_bool() == Some(true) {
        "leader"
    } else {
        "standby"
    };
    println!(
        "node {} ({role}); leader {} epoch {} ({})",
        text(&v["node_id"]),
        text(&leader["node_id"]),
        text(&leader["epoch"]),
        text(&leader["mode"])
    );
    let pending = &v["pending"];
    let next = match pending["next_due_in_ms"].as_u64() {
        // Whole seconds past a second: milliseconds only matter up close.
        Some(ms) if ms >= 1000 => format!(
            "next due in {}",
            delayq_client::human::duration(std::time::Duration::from_secs(ms / 1000))
        ),
        Some(ms) => format!("next due in {ms}ms"),
        None => "nothing due".to_owned(),
    };
    println!("pending: {} ({next})", text(&pending["total"]));
    if let Some(streams) = pending["per_stream"].as_object() {
        let exact = if pending["per_stream_exact"].as_bool() == Some(false) {
            " (counted in part)"
        } else {
            ""
        };
        for (stream, n) in streams {
            println!("  {stream}: {n}{exact}");
        }
    }
    if let Some(shards) = pending["per_shard"].as_array() {
        let counts: Vec<String> = shards.iter().map(text).collect();
        println!("per shard: {}", counts.join(" "));
    }
    for (label, key) in [
        ("lateness, last minutes", "recent"),
        ("lateness, since start", "since_start"),
    ] {
        let l = &v["lateness_ms"][key];
        if l.is_object() {
            println!(
                "{label}: p50 {} ms, p99 {} ms, max {} ms ({} messages)",
                text(&l["p50"]),
                text(&l["p99"]),
                text(&l["max"]),
                text(&l["count"])
            );
        }
    }
    let inbox = &v["inbox"];
    if inbox.is_object() {
        println!(
            "inbox {}: {} entries, {} being scheduled",
            text(&inbox["stream"]),
            text(&inbox["length"]),
            text(&inbox["pending"])
        );
    }
}
