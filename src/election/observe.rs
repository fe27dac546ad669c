//! Who leads, as etcd says: polled on every node for `/v1/leader` and `/readyz`,
//! and read once by `delayq fence show`.

use super::*;

/// Keeps `/v1/leader` and `/readyz` informed on every node: who leads (as etcd
/// says) and whether etcd answers.
pub(super) async fn observe_leader(
    client: Client,
    config: EtcdConfig,
    info: watch::Sender<LeaderInfo>,
    cancel: CancellationToken,
) {
    let every = Timing::new(config.lease_ttl)
        .renew_every
        .min(Duration::from_secs(1));
    let election = client.election_client();
    loop {
        // One attempt per round (the next round is the retry); an empty election
        // is an error whose text is the only way to tell it from a failure.
        let mut c = election.clone();
        let seen = tokio::select! {
            _ = cancel.cancelled() => return,
            r = tokio::time::timeout(config.connect_timeout, c.leader(config.election_prefix.clone())) => r,
        };
        let leader = match seen {
            Ok(Ok(resp)) => Some(resp.kv().map(|kv| {
                (
                    LeaderValue::parse(kv.value()),
                    kv.create_revision() as u64,
                    kv.lease(),
                )
            })),
            Ok(Err(e)) if e.to_string().contains("election: no leader") => Some(None),
            Ok(Err(e)) => {
                tracing::debug!(error = %readable(&e), "cannot ask etcd who leads");
                None
            }
            Err(_) => None,
        };
        metrics::gauge!(m::ETCD_REACHABLE).set(if leader.is_some() { 1.0 } else { 0.0 });
        info.send_if_modified(|i| {
            let before = i.clone();
            i.etcd_reachable = Some(leader.is_some());
            if let Some(leader) = &leader {
                i.node_id = leader.as_ref().map(|(v, _, _)| v.node_id.clone());
                i.address = leader.as_ref().map(|(v, _, _)| v.address.clone());
                i.epoch = leader.as_ref().map(|(_, epoch, _)| *epoch);
                i.lease = leader.as_ref().map(|(_, _, lease)| *lease);
            }
            *i != before
        });
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// What etcd says about the election, for operators.
#[derive(Clone, Debug)]
pub struct ElectionView {
    /// etcd's current revision: every leader elected from now on gets a higher epoch.
    pub revision: u64,
    /// The current leader and its epoch.
    pub leader: Option<(LeaderValue, u64)>,
}

/// Asks etcd once for its revision and the current leader (the key with the
/// lowest create revision under the election prefix, as etcd's election decides).
pub async fn view(config: &EtcdConfig) -> anyhow::Result<ElectionView> {
    let client = connect(config).await?;
    let prefix = format!("{}/", config.election_prefix);
    let read = campaigners(&client, config, &prefix, Some(1)).await?;
    Ok(ElectionView {
        revision: read.header().map_or(0, |h| h.revision()) as u64,
        leader: read
            .kvs()
            .first()
            .map(|kv| (LeaderValue::parse(kv.value()), kv.create_revision() as u64)),
    })
}

/// The node ids of the nodes campaigning (the leader first), as etcd holds their
/// keys: a node is listed once its campaign has reached etcd.
pub async fn candidates(config: &EtcdConfig) -> anyhow::Result<Vec<String>> {
    let client = connect(config).await?;
    let prefix = format!("{}/", config.election_prefix);
    let read = campaigners(&client, config, &prefix, None).await?;
    Ok(read
        .kvs()
        .iter()
        .map(|kv| LeaderValue::parse(kv.value()).node_id)
        .collect())
}

/// The keys under `prefix` (one per candidate of an election under it, whose lease
/// holds it), oldest first: under one election's `<prefix>/`, the first leads. At
/// most `limit` of them.
pub(super) async fn campaigners(
    client: &Client,
    config: &EtcdConfig,
    prefix: &str,
    limit: Option<i64>,
) -> anyhow::Result<etcd_client::GetResponse> {
    let prefix = prefix.to_owned();
    call(config.connect_timeout, || {
        let mut c = client.clone();
        let prefix = prefix.clone();
        async move {
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend);
            let options = match limit {
                Some(n) => options.with_limit(n),
                None => options,
            };
            c.get(prefix, Some(options)).await
        }
    })
    .await
}
