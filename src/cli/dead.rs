//! `delayq dead list|replay|purge <stream>`: a stream's dead letters, through a
//! running daemon's HTTP API.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Target, encode};

#[derive(Subcommand, Debug)]
pub enum DeadCommand {
    /// List a stream's dead letters, oldest first.
    ///
    /// Example:
    ///   delayq dead list orders --limit 20
    #[command(verbatim_doc_comment)]
    List {
        stream: String,
        /// Start after this dead-letter entry id (the `next` of a previous page).
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        target: Target,
    },
    #[command(verbatim_doc_comment)]
    /// Schedule dead letters again, due now, and remove them from the dead-letter stream.
    ///
    /// Examples:
    ///   delayq dead replay orders --id order-42-reminder
    ///   delayq dead replay orders --all
    ///   delayq dead replay orders --all --reason expired --since 2026-12-01T00:00:00Z --dry-run
    Replay {
        stream: String,
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        filter: Filter,
        #[command(flatten)]
        target: Target,
    },
    #[command(verbatim_doc_comment)]
    /// Delete dead letters for good.
    ///
    /// Examples:
    ///   delayq dead purge orders --id order-42-reminder
    ///   delayq dead purge orders --all
    ///   delayq dead purge orders --all --reason ack_timeout --until 1796000000000
    Purge {
        stream: String,
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        filter: Filter,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// A message id, the dead letter's `delayq-id` (repeatable); not the entry id
    /// `dead list` shows first.
    #[arg(long = "id", value_name = "MSG_ID")]
    ids: Vec<String>,
    /// Every dead letter of the stream.
    #[arg(long)]
    all: bool,
}

/// With `--all`: which dead letters it takes (the API refuses a filter with
/// `--id`), and whether only to count them.
#[derive(Args, Debug)]
pub struct Filter {
    /// Only dead letters whose reason begins with this (`expired`, `ack_timeout`, …).
    #[arg(long)]
    reason: Option<String>,
    /// Only those dead-lettered at or after this time (epoch ms or RFC 3339).
    #[arg(long, value_parser = instant)]
    since: Option<u64>,
    /// Only those dead-lettered at or before this time (epoch ms or RFC 3339).
    #[arg(long, value_parser = instant)]
    until: Option<u64>,
    /// Count what would be taken; change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Epoch milliseconds, or an RFC 3339 time.
fn instant(text: &str) -> Result<u64, String> {
    text.parse::<u64>().or_else(|_| {
        text.parse::<jiff::Timestamp>()
            .ok()
            .and_then(|t| u64::try_from(t.as_millisecond()).ok())
            .ok_or_else(|| format!("{text:?}: not epoch milliseconds or an RFC 3339 time"))
    })
}

/// Exit codes: as the client commands' ([`super::client::EXIT_CODES`]); a replay or
/// purge naming an id that has no dead letter ends 3 (not found) after doing the rest.
pub async fn main(cmd: DeadCommand) -> ExitCode {
    let result = match cmd {
        DeadCommand::List {
            stream,
            after,
            limit,
            target,
        } => list(&target, &stream, after, limit).await,
        DeadCommand::Replay {
            stream,
            which,
            filter,
            target,
        } => act(&target, &stream, "replay", which, filter).await,
        DeadCommand::Purge {
            stream,
            which,
            filter,
            target,
        } => act(&target, &stream, "purge", which, filter).await,
    };
    result.unwrap_or_else(|code| code)
}

async fn list(
    target: &Target,
    stream: &str,
    after: Option<String>,
    limit: usize,
) -> Result<ExitCode, ExitCode> {
    let mut path = format!("/v1/streams/{}/dead?limit={limit}", encode(stream));
    if let Some(after) = after {
        path.push_str(&format!("&after={}", encode(&after)));
    }
    let answer = request(target, reqwest::Method::GET, &path, None).await?;
    if target.json {
        println!("{answer}");
        return Ok(ExitCode::SUCCESS);
    }
    let entries = answer["entries"].as_array().cloned().unwrap_or_default();
    println!(
        "{} dead letter(s) in {}",
        entries.len(),
        answer["dead_letter_stream"].as_str().unwrap_or("")
    );
    for e in &entries {
        let fields: Vec<String> = e["fields"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "{}={}",
                    p[0].as_str().unwrap_or(""),
                    p[1].as_str().unwrap_or("")
                )
            })
            .collect();
        println!(
            "{}  id={}  reason={}  attempt={}  {}",
            e["entry_id"].as_str().unwrap_or(""),
            e["id"].as_str().unwrap_or("-"),
            e["reason"].as_str().unwrap_or("-"),
            e["attempt"]
                .as_u64()
                .map_or("-".to_owned(), |n| n.to_string()),
            fields.join(" "),
        );
    }
    if let Some(next) = answer["next"].as_str() {
        println!("more: --after {next}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Replays or purges (or counts, `--dry-run`); with `--all`, page after page until
/// the stream's end.
async fn act(
    target: &Target,
    stream: &str,
    action: &str,
    which: Which,
    filter: Filter,
) -> Result<ExitCode, ExitCode> {
    let path = format!("/v1/streams/{}/dead/{action}", encode(stream));
    let mut body = if which.all {
        json!({ "all": true })
    } else {
        json!({ "ids": which.ids })
    };
    for (name, value) in [
        ("reason", filter.reason.map(Value::from)),
        ("since", filter.since.map(Value::from)),
        ("until", filter.until.map(Value::from)),
        ("dry_run", filter.dry_run.then_some(Value::Bool(true))),
    ] {
        if let Some(value) = value {
            body[name] = value;
        }
    }
    let (mut done, mut skipped, mut not_found) = (0u64, Vec::new(), Vec::new());
    loop {
        let answer = request(target, reqwest::Method::POST, &path, Some(body.clone())).await?;
        if target.json {
            println!("{answer}");
        }
        done += match (action, filter.dry_run) {
            (_, true) => answer["matched"].as_u64().unwrap_or(0),
            ("replay", _) => answer["replayed"].as_array().map_or(0, |a| a.len() as u64),
            _ => answer["purged"].as_u64().unwrap_or(0),
        };
        skipped.extend(answer["skipped"].as_array().cloned().unwrap_or_default());
        not_found.extend(answer["not_found"].as_array().cloned().unwrap_or_default());
        match answer["next"].as_str() {
            Some(next) => body["after"] = json!(next),
            None => break,
        }
    }
    if !target.json {
        let verb = match (action, filter.dry_run) {
            ("replay", true) => "would replay",
            (_, true) => "would purge",
            ("replay", false) => "replayed",
            _ => "purged",
        };
        println!("{verb} {done} dead letter(s) of {stream}");
        for s in &skipped {
            println!(
                "skipped {} ({}): {}",
                s["id"].as_str().unwrap_or("-"),
                s["entry_id"].as_str().unwrap_or(""),
                s["why"].as_str().unwrap_or("")
            );
        }
        for id in &not_found {
            println!("not found: {}", id.as_str().unwrap_or(""));
        }
    }
    Ok(if not_found.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::client::EXIT_NOT_FOUND)
    })
}

/// One API call: the JSON answer of a success, or the exit code of a failure
/// (reported on stderr).
async fn request(
    target: &Target,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, ExitCode> {
    let (status, value) = super::client::send(target, method, path, body).await?;
    if status.is_success() {
        return Ok(value);
    }
    super::client::report_refusal(status, &value);
    Err(ExitCode::from(super::client::exit_code(status, &value)))
}
