//! Operator commands: `check-config` (validate and show the effective
//! configuration) and `health` (probe a daemon, for container health checks).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use delayq_client::config::Config;

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// Config file (TOML); without it, the defaults plus DELAYQ_* environment overrides.
    #[arg(long, short, env = "DELAYQ_CONFIG")]
    config: Option<PathBuf>,
    /// Only validate; print nothing when the configuration is good.
    #[arg(long, short)]
    quiet: bool,
    /// Also connect to Redis as configured and check that its user may run what
    /// delayq runs (docs/redis-rights.md): exits 1 naming a command and key it
    /// may not, or Redis unreachable.
    #[arg(long)]
    connect: bool,
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
            if args.connect {
                let checked = match Config::load(args.config.as_deref()) {
                    Ok(config) => runtime().block_on(connect(&config)),
                    Err(e) => Err(e.to_string()),
                };
                match checked {
                    Ok(said) if !args.quiet => eprintln!("{said}"),
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("delayq: {source}: {e}");
                        return ExitCode::FAILURE;
                    }
                }
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

/// Connects to Redis as `config` says and checks the user's rights: what to
/// say when they suffice, or what is wrong.
async fn connect(config: &Config) -> Result<String, String> {
    let target = config.redis_target();
    let within = config.redis.connect_timeout * 3;
    let store = tokio::time::timeout(
        within,
        delayq_client::store::Store::connect(&config.store_config()),
    )
    .await
    .map_err(|_| format!("connect to {target}: no answer within {within:?}"))?
    .map_err(|e| format!("connect to {target}: {e}"))?;
    let rights = tokio::time::timeout(within, store.rights(&config.checked_streams()))
        .await
        .map_err(|_| format!("{target}: the rights check got no answer within {within:?}"))?
        .map_err(|e| format!("{target}: the rights check failed: {e}"))?;
    match rights {
        delayq_client::store::Rights::Granted => Ok(format!(
            "{target}: connected; the Redis user may run what delayq runs"
        )),
        delayq_client::store::Rights::Unknown(why) => Ok(format!(
            "{target}: connected; the Redis user's rights are not checked: {why}"
        )),
        missing => Err(format!(
            "{target}: {}",
            missing.problem().unwrap_or_default()
        )),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("build the tokio runtime")
}

#[derive(Args, Debug)]
pub struct HealthArgs {
    /// The daemon's API. Default: DELAYQ_API_LISTEN (a wildcard address probed
    /// on loopback), else http://127.0.0.1:7070.
    #[arg(long)]
    url: Option<String>,
    /// Give up after this long.
    #[arg(long, default_value = "3s", value_parser = delayq_client::message::parse_duration)]
    timeout: Duration,
    /// PEM file of CAs to trust for an https:// URL besides the system's.
    #[arg(long, env = "DELAYQ_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
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
    let client = match super::https::client(&url, args.ca_file.as_deref(), Some(args.timeout)) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("{url}: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(&url).send().await {
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
