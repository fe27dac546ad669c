//! `delayq fence`: shows and resets the fence epoch in Redis, for operators whose
//! etcd cluster was rebuilt from scratch. Its revisions, and so the epochs of new
//! leaders, then start low again, below the fence the old leaders raised, and every
//! new leader is refused (`FENCED`) until the fence is reset.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use delayq::election;
use delayq_client::config::Config;
use delayq_client::store::Store;

#[derive(Args, Debug)]
pub struct FenceArgs {
    /// Config file of the deployment (Redis, shards, etcd); without it, defaults
    /// plus DELAYQ_* environment overrides.
    #[arg(long, short, env = "DELAYQ_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    action: FenceAction,
}

#[derive(Subcommand, Debug)]
enum FenceAction {
    /// Show the fence, etcd's revision and the current leader (with `election.mode
    /// = "per_shard"`, each group's).
    Show,
    /// Set the fence of every shard to EPOCH (downwards too). Stop every instance
    /// that ran against the old etcd cluster first: a deposed leader is only
    /// kept out by the fence.
    Reset {
        /// The new fence. It must not exceed etcd's current revision, or new
        /// leaders stay fenced; 0 lets the next leader raise it afresh.
        #[arg(long)]
        epoch: u64,
        /// Reset even when etcd cannot be asked for its revision.
        #[arg(long)]
        force: bool,
    },
}

pub async fn main(args: FenceArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("read the configuration")?;
    let store = Store::connect(&config.store_config())
        .await
        .with_context(|| format!("connect to {}", config.redis_target()))?;
    let fence = store.highest_fence().await.context("read the fences")?;
    let view =
        match &config.etcd {
            None => None,
            Some(etcd) => Some(election::view(etcd).await.with_context(|| {
                format!("ask etcd at {} for its revision", etcd.endpoints.join(","))
            })),
        };
    println!(
        "fence: {fence} (highest over {})",
        shards_shown(&store).await?
    );
    match &view {
        None => println!("etcd: not configured (standalone epochs come from Redis)"),
        Some(Ok(v)) => {
            println!("etcd revision: {}", v.revision);
            match &v.leader {
                Some((leader, epoch)) => {
                    println!(
                        "leader: {} at {} (epoch {epoch})",
                        leader.node_id, leader.address
                    )
                }
                None => println!("leader: none"),
            }
        }
        Some(Err(e)) => println!("etcd: {e:#}"),
    }
    if let Some(etcd) = config.etcd.as_ref().filter(|_| config.election.per_shard) {
        // Each group's election (its prefix beside the single leader's).
        for group in 0..config.election.groups {
            let shards = config.election.shards_of(group, config.redis.shards);
            let etcd = election::group_config(etcd, group);
            let leader = match election::view(&etcd).await {
                Ok(v) => match v.leader {
                    Some((leader, epoch)) => {
                        format!("{} at {} (epoch {epoch})", leader.node_id, leader.address)
                    }
                    None => "none".to_owned(),
                },
                Err(e) => format!("{e:#}"),
            };
            println!("group {group} (shards {shards:?}): leader {leader}");
        }
    }

    match args.action {
        FenceAction::Show => {
            if let Some(Ok(v)) = &view
                && v.revision < fence
            {
                println!(
                    "\nwarning: etcd's revision is below the fence, so new leaders are refused (FENCED).\n\
                     If the etcd cluster was rebuilt: stop every delayq instance, then run\n  \
                     delayq fence reset --epoch 0\nand start them again."
                );
            }
            Ok(())
        }
        FenceAction::Reset { epoch, force } => {
            match &view {
                Some(Ok(v)) if epoch > v.revision => bail!(
                    "--epoch {epoch} is above etcd's revision {}: leaders elected now would still be fenced (use 0, or at most {})",
                    v.revision,
                    v.revision
                ),
                Some(Err(_)) if !force => bail!(
                    "cannot check the epoch against etcd's revision; pass --force to reset anyway"
                ),
                _ => {}
            }
            store
                .reset_fences(epoch)
                .await
                .context("reset the fences")?;
            println!(
                "fence reset: {fence} -> {epoch} on {}",
                shards_shown(&store).await?
            );
            Ok(())
        }
    }
}

/// "16 shards", or on Redis Cluster "3 hash slots in use".
async fn shards_shown(store: &Store) -> anyhow::Result<String> {
    if !store.is_cluster() {
        return Ok(format!("{} shards", store.shards()));
    }
    let n = store
        .shards_in_use()
        .await
        .context("read the hash slots in use")?
        .len();
    Ok(format!(
        "{n} hash slot{} in use",
        if n == 1 { "" } else { "s" }
    ))
}
