//! One round of a scenario: the fault against the leader, the takeover waited for and
//! timed, the fault undone.

use super::*;

/// Runs one round: waits for one leader, injects the fault, measures the
/// takeover, undoes the fault and waits for the cluster to settle.
pub(super) async fn run_round(
    target: &mut Target,
    http: &reqwest::Client,
    traffic: &Arc<Traffic>,
    (store, stream): (&delayq_client::store::Store, &str),
    round: Round,
) -> anyhow::Result<RoundResult> {
    let Round {
        scenario,
        index: round,
        timeout,
        hold,
    } = round;
    let nodes = target.nodes();
    let (leader, epoch) = wait_single_leader(http, &nodes, timeout).await?;
    let fault = scenario.fault();
    let (victim, measured) = match scenario {
        Scenario::Etcd => {
            let members = target.etcd_members();
            let member = round % members.len();
            let started = Instant::now();
            let (injected, watched) = tokio::join!(
                target.inject(fault, member),
                watch_leadership(http, &nodes, epoch, hold)
            );
            injected?;
            let (gap, changed) = watched;
            let left = hold.saturating_sub(started.elapsed());
            tokio::time::sleep(left).await;
            (member, (Some(gap), changed))
        }
        Scenario::Switchover => {
            let url = format!("{}/v1/admin/resign", nodes[leader].url);
            let started = Instant::now();
            let resign = async {
                let resp = http
                    .post(&url)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await?;
                let status = resp.status();
                if !status.is_success() {
                    bail!("{url}: {status} {}", resp.text().await.unwrap_or_default());
                }
                Ok(())
            };
            let (resigned, took) =
                tokio::join!(resign, wait_takeover(http, &nodes, leader, epoch, timeout));
            resigned?;
            (
                leader,
                (took.map(|t| t.duration_since(started)), took.is_some()),
            )
        }
        Scenario::RedisFailover => {
            // Nobody is down: the leader follows the new master, or a standby
            // takes over; either way forwarding resumes there.
            let resumed = redis_failover(store, stream, timeout).await?;
            (leader, (resumed, false))
        }
        _ => {
            traffic.set_up(leader, false);
            let started = Instant::now();
            let (injected, took) = tokio::join!(
                target.inject(fault, leader),
                wait_takeover(http, &nodes, leader, epoch, timeout)
            );
            injected?;
            let takeover = took.map(|t| t.duration_since(started));
            (leader, (takeover, takeover.is_some()))
        }
    };
    let (takeover, leader_changed) = measured;
    target.restore(fault, victim, timeout).await?;
    if scenario == Scenario::RedisFailover {
        // Sentinel makes the old master a replica at its next look at it (in
        // sync about 15 s after the switch here): longer than a takeover may take.
        redis_settled(store, timeout.max(Duration::from_secs(60))).await?;
    }
    if matches!(
        fault,
        Fault::Kill | Fault::Term | Fault::Pause | Fault::RedisCut
    ) {
        traffic.set_up(victim, true);
    }
    settle(http, &nodes, traffic, timeout).await?;
    let leader_changed = if scenario == Scenario::RedisFailover {
        wait_single_leader(http, &nodes, timeout).await?.1 != epoch
    } else {
        leader_changed
    };
    let problem = takeover.is_none().then(|| match scenario {
        Scenario::RedisFailover => format!(
            "nothing written on the new Redis master within {}",
            ms(timeout)
        ),
        _ => format!("no new leader within {}", ms(timeout)),
    });
    Ok(RoundResult {
        takeover,
        leader_changed,
        problem,
    })
}
