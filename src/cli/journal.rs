//! `delayq journal`: the MySQL / MariaDB journal's schema (`[journal]`).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use delayq::journal::Journal;
use delayq::restore::RestoreOptions;
use delayq_client::config::Config;
use delayq_client::store::Store;

#[derive(Args, Debug)]
pub struct JournalArgs {
    /// Config file naming the journal (`[journal] url`, `password_file`); without
    /// it, defaults plus DELAYQ_* environment overrides.
    #[arg(long, short, env = "DELAYQ_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    action: JournalAction,
}

#[derive(Subcommand, Debug)]
enum JournalAction {
    /// Create the journal's tables, or migrate them to this delayq's schema (safe to
    /// run again, and from several hosts at once).
    Migrate,
    /// Print the journal's schema version and this delayq's.
    Version,
}

pub async fn main(args: JournalArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("read the configuration")?;
    let Some(journal_config) = &config.journal else {
        bail!("no journal configured: set journal.url (and journal.password_file)");
    };
    let journal = Journal::new(journal_config)?;
    let target = format!("the journal at {:?}", journal_config.url);
    match args.action {
        JournalAction::Migrate => {
            let migrated = journal
                .migrate()
                .await
                .with_context(|| format!("migrate {target}"))?;
            if migrated.from == migrated.to {
                println!("journal schema: version {} (up to date)", migrated.to);
            } else {
                println!(
                    "journal schema: version {} -> {}",
                    migrated.from, migrated.to
                );
            }
        }
        JournalAction::Version => {
            let version = journal
                .version()
                .await
                .with_context(|| format!("read {target}"))?;
            println!(
                "journal schema: version {version} (this delayq: {})",
                delayq::journal::SCHEMA_VERSION
            );
        }
    }
    journal.close().await?;
    Ok(())
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// Config file naming Redis and the journal; without it, defaults plus
    /// DELAYQ_* environment overrides.
    #[arg(long, short, env = "DELAYQ_CONFIG")]
    config: Option<PathBuf>,
    /// Also messages whose due time has passed (they go out at once).
    #[arg(long)]
    include_overdue: bool,
    /// This message only (overdue or not).
    #[arg(long)]
    id: Option<String>,
    /// Count only: schedule nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as JSON only (no progress bar).
    #[arg(long)]
    json: bool,
}

/// `delayq restore`: every message the journal holds not finished and Redis does
/// not is scheduled again (see `delayq::restore`); a full restore then writes the
/// journal's marker back to Redis, which lets a held leader forward again.
pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("read the configuration")?;
    let Some(journal_config) = &config.journal else {
        bail!("no journal configured: set journal.url (and journal.password_file)");
    };
    let id = args
        .id
        .as_deref()
        .map(delayq_client::message::MessageId::parse)
        .transpose()
        .context("--id")?;
    let journal = Journal::new(journal_config)?;
    let store = Store::connect(&config.store_config())
        .await
        .with_context(|| format!("connect to {}", config.redis_target()))?;
    // Restored messages of a rate-limited stream are stored as the daemon stores them.
    store.keep_apart(config.kept_apart());
    let options = RestoreOptions {
        include_overdue: args.include_overdue || id.is_some(),
        dry_run: args.dry_run,
        id,
        lost_seen_ms: None,
        records_retention: config.records.retention,
        by: delayq::journal::Who {
            token: Some("delayq journal restore".into()),
            ..Default::default()
        },
    };
    delayq::restore::check_safe(&store, config.records.retention, &options)
        .await
        .context("restore")?;
    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(0)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {elapsed:>4} {bar:24} {pos}/{len} messages",
        )
        .expect("a valid template"),
    );
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let report = delayq::restore::restore(
        &store,
        &journal,
        &options,
        config.api.limits.max_delay,
        &progress,
    )
    .await
    .context("restore")?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let verb = if report.dry_run {
            "would restore"
        } else {
            "restored"
        };
        println!(
            "{verb} {} of {} messages the journal holds not finished: {} already in Redis, \
             {} finished in Redis, {} overdue and left (--include-overdue), {} refused by Redis; \
             {} possibly sent before (due before the restore began or the loss was seen); \
             {} paused streams {}; {} schedules {}",
            report.restored,
            report.journaled,
            report.already_present,
            report.finished_in_redis,
            report.overdue,
            report.refused,
            report.possibly_duplicate,
            report.streams_paused,
            if report.dry_run {
                "would be paused again"
            } else {
                "paused again"
            },
            report.schedules_restored,
            if report.dry_run {
                "in the journal"
            } else {
                "put back"
            }
        );
    }
    journal.close().await?;
    Ok(())
}
