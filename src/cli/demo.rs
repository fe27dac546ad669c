//! `delayq demo`: the quickstart. Starts, on loopback, a redis-server, an etcd and
//! two `delayq run` processes (a primary and a standby), pushes a delayed message
//! and shows it arrive in its stream, then stops the primary and shows the
//! standby take over and deliver the next message. Ctrl-C tears it all down.
//! With `--tls` the two nodes serve HTTPS with a certificate of a throwaway CA the
//! demo makes, and everything the demo says and asks goes through that CA.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

use delayq_harness::{DelayqProcess, EtcdServer, Pki, RedisServer};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Delay of the demo messages.
    #[arg(long, default_value = "3s", value_parser = delayq_client::message::parse_duration)]
    delay: Duration,
    /// Exit after the show instead of serving until Ctrl-C.
    #[arg(long)]
    once: bool,
    /// Serve the API over HTTPS, with a certificate of a CA made for the demo (its
    /// files are shown, for curl --cacert and delayq --ca-file).
    #[arg(long)]
    tls: bool,
}

/// Everything the demo started; dropping it stops every process.
struct Cluster {
    redis: RedisServer,
    etcd: EtcdServer,
    primary: DelayqProcess,
    standby: DelayqProcess,
    /// The demo CA's files when the nodes serve HTTPS (gone with the demo).
    _pki: Option<Pki>,
}

/// The `[api]` section that serves HTTPS with `pki`'s server certificate (made for
/// 127.0.0.1 and localhost).
fn https_section(pki: &Pki) -> String {
    let file = |name: &str| format!("{:?}", pki.path(name).display().to_string());
    format!(
        "[api]\ntls = {{ cert_file = {}, key_file = {} }}\n",
        file("server.pem"),
        file("server-key.pem")
    )
}

pub async fn main(args: DemoArgs) -> anyhow::Result<()> {
    tokio::select! {
        r = show(args) => r,
        _ = tokio::signal::ctrl_c() => {
            println!("\nCtrl-C: stopping everything.");
            Ok(())
        }
    }
}

async fn show(args: DemoArgs) -> anyhow::Result<()> {
    let pki = match args.tls {
        true => Some(Pki::new().context("make the demo's CA")?),
        false => None,
    };
    let ca_file = pki.as_ref().map(|p| p.path("ca.pem"));
    let scheme = if pki.is_some() { "https" } else { "http" };
    let http = crate::cli::https::builder(pki.is_some(), ca_file.as_deref())?
        .timeout(Duration::from_secs(5))
        .build()?;
    let mut cluster = start(pki, &http, scheme).await?;
    let primary = format!("{scheme}://{}", cluster.primary.api);
    let standby = format!("{scheme}://{}", cluster.standby.api);
    let (cacert, ca_flag) = match &ca_file {
        Some(path) => {
            println!("demo CA        {}", path.display());
            (
                format!("--cacert {} ", path.display()),
                format!(" --ca-file {}", path.display()),
            )
        }
        None => (String::new(), String::new()),
    };
    println!("redis-server   {}", cluster.redis.url());
    println!("etcd           {}", cluster.etcd.endpoint());
    println!(
        "primary        {primary}   {}",
        describe(&http, &primary).await
    );
    println!(
        "standby        {standby}   {}",
        describe_once_it_knows(&http, &standby, "primary").await
    );

    let redis = redis::Client::open(cluster.redis.url())?;
    // A connection of the demo's own, without a response timeout: XREAD BLOCK.
    let mut stream = redis
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await?;
    let mut last_entry = "0".to_owned();

    println!("\n1. A delayed message, pushed to the primary:");
    push_and_watch(
        &http,
        &primary,
        &args,
        &mut stream,
        &mut last_entry,
        &cacert,
        "42",
    )
    .await?;

    println!("\n2. Stop the primary (SIGTERM: it finishes its batch, resigns, exits):");
    let stopped = Instant::now();
    cluster.primary.signal(libc::SIGTERM);
    let epoch = wait_leader(&http, &standby, Duration::from_secs(30)).await?;
    println!(
        "   the standby took over after {} ms (epoch {epoch})",
        stopped.elapsed().as_millis()
    );
    let exit = tokio::task::block_in_place(|| cluster.primary.wait_exit(Duration::from_secs(20)));
    println!(
        "   the primary exited: {}",
        exit.map(|s| s.to_string())
            .unwrap_or_else(|| "killed after 20s".into())
    );
    println!(
        "   $ curl {cacert}{standby}/v1/leader\n   {}",
        leader_json(&http, &standby).await
    );

    println!("\n3. The next message, pushed to the new leader:");
    push_and_watch(
        &http,
        &standby,
        &args,
        &mut stream,
        &mut last_entry,
        &cacert,
        "43",
    )
    .await?;

    tokio::task::block_in_place(|| cluster.primary.restart())?;
    let seen = describe_once_it_knows(&http, &primary, "standby").await;
    println!("\n4. The old primary is back ({primary}) and stands by: {seen}");

    if !args.once {
        // The path this binary runs from: after `cargo run` delayq is not on PATH.
        let me = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "delayq".to_owned());
        println!(
            "\nEverything keeps running. Try (in another terminal):\n  {me} push orders hello --delay 5s --url {standby}{ca_flag}\n  curl {cacert}{primary}/v1/leader\nCtrl-C stops everything."
        );
        std::future::pending::<()>().await;
    }
    Ok(())
}

/// Starts Redis, etcd and the primary, waits until the primary leads, then starts
/// the standby behind it.
async fn start(pki: Option<Pki>, http: &reqwest::Client, scheme: &str) -> anyhow::Result<Cluster> {
    let bin = std::env::current_exe().context("find the delayq binary")?;
    let (redis, etcd) = tokio::task::block_in_place(|| -> anyhow::Result<_> {
        let redis =
            RedisServer::start().context("start redis-server (.ci/install-deps installs it)")?;
        let etcd = EtcdServer::start().context("start etcd (.ci/install-deps installs it)")?;
        Ok((redis, etcd))
    })?;
    let config = format!(
        "[redis]\nurl = \"{}\"\nshards = 4\n\n[etcd]\nendpoints = [\"{}\"]\ncluster = \"demo\"\nlease_ttl = \"2s\"\n\n[log]\nlevel = \"warn\"\n\n{}",
        redis.url(),
        etcd.endpoint(),
        pki.as_ref().map(https_section).unwrap_or_default()
    );
    // The primary starts first and wins; the standby lines up behind it.
    let primary = tokio::task::block_in_place(|| DelayqProcess::start(&bin, "primary", &config))?;
    let url = format!("{scheme}://{}", primary.api);
    if let Err(e) = wait_leader(http, &url, Duration::from_secs(20)).await {
        bail!(
            "the primary did not win the election ({e}); its log:\n{}",
            primary.log()
        );
    }
    let standby = tokio::task::block_in_place(|| DelayqProcess::start(&bin, "standby", &config))?;
    Ok(Cluster {
        redis,
        etcd,
        primary,
        standby,
        _pki: pki,
    })
}

async fn leader_json(http: &reqwest::Client, api: &str) -> Value {
    match http.get(format!("{api}/v1/leader")).send().await {
        Ok(resp) => resp.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// [`describe`], once the node names `leader` as the leader: a standby learns who
/// leads from etcd within a second or so. Gives up (and says what it saw) after 5 s.
async fn describe_once_it_knows(http: &reqwest::Client, api: &str, leader: &str) -> String {
    let expected = format!("leader: {leader})");
    let asked = Instant::now();
    let mut seen = describe(http, api).await;
    while !seen.contains(&expected) && asked.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        seen = describe(http, api).await;
    }
    seen
}

async fn describe(http: &reqwest::Client, api: &str) -> String {
    let v = leader_json(http, api).await;
    match (v["is_leader"].as_bool(), v["epoch"].as_u64()) {
        (Some(true), Some(epoch)) => format!("leader (epoch {epoch})"),
        (Some(false), _) => format!(
            "standby (leader: {})",
            v["leader"]["node_id"].as_str().unwrap_or("unknown")
        ),
        _ => "not answering".into(),
    }
}

async fn wait_leader(http: &reqwest::Client, api: &str, timeout: Duration) -> anyhow::Result<u64> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(resp) = http.get(format!("{api}/leader")).send().await
            && resp.status() == 200
            && let Ok(v) = resp.json::<Value>().await
            && let Some(epoch) = v["epoch"].as_u64()
        {
            return Ok(epoch);
        }
        if Instant::now() > deadline {
            bail!("{api} did not take over within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn push_and_watch(
    http: &reqwest::Client,
    api: &str,
    args: &DemoArgs,
    stream: &mut redis::aio::MultiplexedConnection,
    last_entry: &mut String,
    cacert: &str,
    order: &str,
) -> anyhow::Result<()> {
    let delay = delayq_client::human::duration(args.delay);
    let body = json!({ "stream": "orders", "fields": { "order": order, "event": "reminder" }, "delay": delay });
    println!("   $ curl {cacert}-X POST {api}/v1/messages -d '{body}'");
    let resp: Value = http
        .post(format!("{api}/v1/messages"))
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    println!("   {resp}");
    let due = resp["deliver_at"].as_u64().unwrap_or(0);
    println!("   waiting for it in stream \"orders\" (XREAD BLOCK)...");
    let sent = Instant::now();
    // Read raw, to show the fields in the order they were written.
    let reply: redis::Value = redis::cmd("XREAD")
        .arg("COUNT")
        .arg(1)
        .arg("BLOCK")
        .arg(args.delay.as_millis() as u64 + 15_000)
        .arg("STREAMS")
        .arg("orders")
        .arg(last_entry.as_str())
        .query_async(stream)
        .await?;
    let (entry_id, fields) = first_entry(&reply).context("the message did not arrive")?;
    let fields: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let entry_ms: u64 = entry_id
        .split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0);
    println!(
        "   arrived after {:.3}s: orders {} {}  ({} ms after its due time, by Redis's clock)",
        sent.elapsed().as_secs_f64(),
        entry_id,
        fields.join(" "),
        entry_ms.saturating_sub(due)
    );
    *last_entry = entry_id;
    Ok(())
}

/// The first entry of an XREAD reply: its id and fields, in order.
fn first_entry(reply: &redis::Value) -> Option<(String, Vec<(String, String)>)> {
    use redis::Value;
    let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
    let Value::Array(streams) = reply else {
        return None;
    };
    let Value::Array(stream) = streams.first()? else {
        return None;
    };
    let Value::Array(entries) = stream.get(1)? else {
        return None;
    };
    let Value::Array(entry) = entries.first()? else {
        return None;
    };
    let Value::Array(kv) = entry.get(1)? else {
        return None;
    };
    let fields = kv
        .chunks(2)
        .filter_map(|p| Some((text(p.first()?)?, text(p.get(1)?)?)))
        .collect();
    Some((text(entry.first()?)?, fields))
}
