//! The `delayq` command line: `run` starts the daemon; the other subcommands are
//! clients of a running daemon's HTTP API, or tools (bench, demo).

mod bench;
mod client;
mod demo;
mod fence;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Config;

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
    /// Measure forwarding throughput and lateness, ingest rates and push latency against a local Redis.
    Bench(bench::BenchArgs),
    /// Start a local Redis and a delayq, push a delayed message and watch it arrive.
    Demo(demo::DemoArgs),
    /// Show or reset the fence epoch in Redis (after an etcd cluster was rebuilt).
    Fence(fence::FenceArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => run(config),
        Command::Client(cmd) => runtime().block_on(client::main(cmd)),
        Command::Bench(args) => {
            init_logging("warn", false);
            report(runtime().block_on(bench::main(args)))
        }
        Command::Demo(args) => {
            init_logging("warn", false);
            report(runtime().block_on(demo::main(args)))
        }
        Command::Fence(args) => {
            init_logging("warn", false);
            report(runtime().block_on(fence::main(args)))
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

/// Sets up tracing: `RUST_LOG` wins over the configured level.
pub fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

fn run(path: Option<PathBuf>) -> ExitCode {
    let config = match Config::load(path.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("delayq: bad configuration: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    init_logging(&config.log.level, config.log.json);
    report(runtime().block_on(async move {
        let shutdown = shutdown_signal()?;
        crate::run(config, shutdown).await
    }))
}

/// Completes on the first SIGTERM or SIGINT. A second one exits at once.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    use futures::StreamExt;
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook_tokio::Signals::new([SIGTERM, SIGINT])?;
    Ok(async move {
        if let Some(sig) = signals.next().await {
            tracing::info!(
                signal = sig,
                "signal received; stopping (send again to exit at once)"
            );
        }
        tokio::spawn(async move {
            if signals.next().await.is_some() {
                eprintln!("delayq: second signal; exiting without draining");
                std::process::exit(130);
            }
        });
    })
}
