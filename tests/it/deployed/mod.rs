//! Deployments as production runs them, every feature at once, each fault in
//! turn against real processes: what each feature's own tests prove must still
//! hold when they are combined.

mod cluster;
mod sentinel;

use std::time::Duration;

use delayq_harness::DelayqProcess;

use crate::support::{Api, delayq_bin, eventually};

/// `delayq run` processes named `names`, all on `config`, once each is ready
/// (`/readyz` 200: Redis writable, the Redis user's rights granted), with their
/// APIs.
async fn ready_nodes(names: &[String], config: &str) -> (Vec<DelayqProcess>, Vec<Api>) {
    let nodes: Vec<DelayqProcess> = names
        .iter()
        .map(|name| DelayqProcess::start(&delayq_bin(), name, config).expect("start delayq"))
        .collect();
    let apis: Vec<Api> = nodes
        .iter()
        .map(|n| Api::new(n.api).with_timeout(Duration::from_secs(5)))
        .collect();
    for api in &apis {
        eventually(
            Duration::from_secs(20),
            "ready as the documented user",
            || async { (api.get("/readyz").await.0 == 200).then_some(()) },
        )
        .await;
    }
    (nodes, apis)
}

/// Waits until `confirmed()` has grown by `more`: each phase of a deployment test
/// runs under load by a count of confirmed pushes as well as by time, however slow
/// the machine.
async fn confirmed_more(confirmed: impl Fn() -> usize, more: usize, phase: &str) {
    let wanted = confirmed() + more;
    eventually(
        Duration::from_secs(60),
        &format!("{more} pushes confirmed {phase}"),
        || async { (confirmed() >= wanted).then_some(()) },
    )
    .await;
}
