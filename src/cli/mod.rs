//! The `delayq` command line: `run` starts the daemon; the other subcommands are
//! clients of a running daemon's HTTP API, or tools (bench, demo).

mod bench;
mod client;
mod dead;
mod demo;
mod drill;
mod fence;
mod functions;
mod https;
mod human;
mod journal;
mod logging;
mod ops;
mod push;
mod schedule;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use delayq_client::config::Config;

/// Exit code for a configuration error (EX_CONFIG would be 78; 64 is EX_USAGE,
/// which systemd and operators expect for "fix your input").
pub const EXIT_CONFIG: u8 = 64;

#[derive(Parser, Debug)]
#[command(
    name = "delayq",
    version,
    about = "Delivers delayed messages into Redis Streams on time",
    after_help = client::EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon.
    Run {
        /// Config file (TOML); without it, defaults plus DELAYQ_* environment overrides.
        #[arg(long, short, env = "DELAYQ_CONFIG")]
        config: Option<PathBuf>,
    },
    #[command(flatten)]
    Client(client::ClientCommand),
    /// List, replay or purge a stream's dead letters.
    #[command(subcommand)]
    Dead(dead::DeadCommand),
    /// Recurring schedules: add, list, get, rm, pause, resume.
    #[command(subcommand)]
    Schedule(schedule::ScheduleCommand),
    /// Benchmark: forwarding, the Redis ceiling, the BullMQ peer, ingest and failover.
    Bench(bench::BenchArgs),
    /// Quickstart: a local Redis, etcd and primary/standby pair; a delayed message, a takeover.
    Demo(demo::DemoArgs),
    /// Failover drill: faults against the leader under load, with a report.
    Drill(Box<drill::DrillArgs>),
    /// Validate a config file and print the effective configuration (secrets redacted).
    CheckConfig(ops::CheckConfigArgs),
    /// Probe a daemon's /healthz; exit 0 if healthy (for container health checks).
    Health(ops::HealthArgs),
    /// Show or reset the fence epoch in Redis (after an etcd cluster was rebuilt).
    Fence(fence::FenceArgs),
    /// List delayq's function libraries in Redis; remove those of other versions.
    Functions(functions::FunctionsArgs),
    /// The MySQL / MariaDB journal's schema: create or migrate it, show its version.
    Journal(journal::JournalArgs),
    /// Schedule again what the journal holds and Redis lost (after Redis lost its data).
    Restore(journal::RestoreArgs),
}

pub fn main() -> ExitCode {
    // Every TLS connection (Redis, etcd, the journal) uses ring; chosen here once,
    // so that no other provider a dependency may bring in makes rustls refuse to
    // pick one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => run(config),
        Command::Client(cmd) => runtime().block_on(client::main(cmd)),
        Command::Dead(cmd) => runtime().block_on(dead::main(cmd)),
        Command::Schedule(cmd) => runtime().block_on(schedule::main(cmd)),
        Command::Bench(args) => {
            init_logging("warn", false);
            report(runtime().block_on(bench::main(args)))
        }
        Command::Demo(args) => {
            init_logging("warn", false);
            report(runtime().block_on(demo::main(args)))
        }
        Command::Drill(args) => {
            init_logging("warn", false);
            drill::main(args)
        }
        Command::CheckConfig(args) => ops::check_config(args),
        Command::Health(args) => runtime().block_on(ops::health(args)),
        Command::Fence(args) => {
            init_logging("warn", false);
            report(runtime().block_on(fence::main(args)))
        }
        Command::Functions(args) => {
            init_logging("warn", false);
            report(runtime().block_on(functions::main(args)))
        }
        Command::Journal(args) => {
            init_logging("warn", false);
            report(runtime().block_on(journal::main(args)))
        }
        Command::Restore(args) => {
            init_logging("warn", false);
            report(runtime().block_on(journal::restore(args)))
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime")
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub use logging::{init_logging, init_reloadable_logging};

fn run(path: Option<PathBuf>) -> ExitCode {
    let early = delayq::service::EarlyHangup::install();
    // With a file, keep its effective table: a reload compares against it.
    let loaded = match &path {
        Some(path) => Config::load_effective(path)
            .map(|(config, table)| (config, Some((path.clone(), table)))),
        None => Config::load(None).map(|config| (config, None)),
    };
    let (config, file) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            // Logging is not set up yet: say it in the format the file asked for.
            let json = logging::json_wanted(path.as_deref());
            let source = match &path {
                Some(path) => path.display().to_string(),
                None => "(no file: defaults)".to_owned(),
            };
            let error = format!("{source}: {e}");
            logging::startup_error(json, "bad configuration", &error, EXIT_CONFIG);
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let set_log_level = init_reloadable_logging(&config.log.level, config.log.json);
    match runtime().block_on(delayq::service::run(config, file, set_log_level, early)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), exit_code = 1, "delayq cannot run");
            ExitCode::FAILURE
        }
    }
}
