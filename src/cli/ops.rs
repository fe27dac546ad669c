//! Operator commands: `check-config` (validate and show the effective
//! configuration) and `health` (probe a daemon, for container health checks).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::Config;

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// Config file (TOML); without it, the defaults plus DELAYQ_* environment overrides.
    #[arg(long, short, env = "DELAYQ_CONFIG")]
    config: Option<PathBuf>,
    /// Only validate; print nothing when the configuration is good.
    #[arg(long, short)]
    quiet: bool,
}

/// Exits 0 and prints every key with the value the daemon would use (defaults
/// filled in, environment applied, secrets redacted), or exits 64 naming the key.
pub fn check_config(args: CheckConfigArgs) -> ExitCode {
    let loaded = match &args.config {
        Some(path) => Config::load_effective(path),
        None => Config::effective("", std::env::vars()),
    };
    let source = match &args.config {
        Some(path) => path.display().to_string(),
        None => "(no file: defaults)".to_owned(),
    };
    match loaded {
        Ok((_, table)) => {
            if !args.quiet {
                let text = toml::to_string(&table).unwrap_or_else(|e| format!("# {e}\n"));
                println!(
                    "# Effective configuration of {source}: defaults filled in, DELAYQ_* \
                     environment applied, secrets redacted.\n\n{text}"
                );
            }
            if !args.quiet {
                eprintln!("{source}: configuration OK");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("delayq: bad configuration: {source}: {e}");
            ExitCode::from(super::EXIT_CONFIG)
        }
    }
}

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// The daemon's API. Default: DELAYQ_API_LISTEN (a wildcard address probed
    /// on loopback), else http://127.0.0.1:7070.
    #[arg(long)]
    url: Option<String>,
    /// Give up after this long.
    #[arg(long, default_value = "3s", value_parser = crate::message::parse_duration)]
    timeout: Duration,
}

fn default_health_url() -> String {
    let listen = std::env::var("DELAYQ_API_LISTEN").unwrap_or_else(|_| "127.0.0.1:7070".into());
    let probe = match listen.parse::<std::net::SocketAddr>() {
        Ok(addr) if addr.ip().is_unspecified() => format!("127.0.0.1:{}", addr.port()),
        _ => listen,
    };
    format!("http://{probe}")
}

/// Exits 0 when `GET /healthz` answers 200 (the daemon runs and Redis answers).
pub async fn health(args: HealthArgs) -> ExitCode {
    let base = args.url.unwrap_or_else(default_health_url);
    let url = format!("{}/healthz", base.trim_end_matches('/'));
    let client = reqwest::Client::builder().timeout(args.timeout).build();
    let result = match client {
        Ok(client) => client.get(&url).send().await,
        Err(e) => Err(e),
    };
    match result {
        Ok(resp) if resp.status().is_success() => {
            println!("{url}: healthy");
            ExitCode::SUCCESS
        }
        Ok(resp) => {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            eprintln!("{url}: unhealthy: {status} {body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{url}: unreachable: {e}");
            ExitCode::FAILURE
        }
    }
}
