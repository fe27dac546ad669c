//! `delayq journal`: the MySQL / MariaDB journal's schema (`[journal]`).

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use crate::config::Config;
use crate::journal::Journal;

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
                crate::journal::SCHEMA_VERSION
            );
        }
    }
    journal.close().await?;
    Ok(())
}
