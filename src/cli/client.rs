//! Subcommands that talk to a running daemon over HTTP.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

#[derive(Args, Debug, Clone)]
pub struct Target {
    /// Base URL of a delayq instance.
    #[arg(
        long,
        env = "DELAYQ_URL",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub(super) url: String,
    /// Print the raw JSON answer.
    #[arg(long, global = true)]
    pub(super) json: bool,
    /// Bearer token, when the daemon has api.tokens set.
    #[arg(long, env = "DELAYQ_TOKEN", global = true, hide_env_values = true)]
    pub(super) token: Option<String>,
    /// PEM file of CAs to trust for an https:// URL besides the system's (the
    /// daemon's api.tls certificate's CA).
    #[arg(long, env = "DELAYQ_CA_FILE", global = true)]
    pub(super) ca_file: Option<std::path::PathBuf>,
}

/// How client commands end, for scripts.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  refused: the input breaks a rule (HTTP 400, 413, 422), or a local input error
  2  command line not understood
  3  not found (HTTP 404)
  4  conflict: the message is already delivered, expired or dead, or (reschedule)
     cancelled (HTTP 409 already_final); cancelling a cancelled message is 0
  5  not authorized: missing or unknown token (HTTP 401), a token of too low a scope or
     a stream not allowed (HTTP 403)
  6  delayq cannot do it now: Redis unreachable or busy, delayq overloaded (HTTP 5xx,
     429); retry later
  7  cannot reach delayq at --url
  8  not possible in the deployment's present state: not the leader, no standby,
     standalone (no etcd), no configuration file or journal, a key of another type
     (any other HTTP 409)";

const EXIT_REFUSED: u8 = 1;
pub(super) const EXIT_NOT_FOUND: u8 = 3;
const EXIT_CONFLICT: u8 = 4;
const EXIT_UNAUTHORIZED: u8 = 5;
const EXIT_UNAVAILABLE: u8 = 6;
pub(super) const EXIT_UNREACHABLE: u8 = 7;
const EXIT_NOT_NOW: u8 = 8;

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Schedule a message
    ///
    /// Examples:
    ///   delayq push orders 'order 42' --delay 20m --token "$TOKEN"
    ///   delayq push orders 'order 42 reminder' --delay 20m
    ///   delayq push orders --field order=42 --field kind=reminder --at 2026-12-01T09:00:00Z
    ///   echo '{"a":1}' | delayq push orders - --delay 1h --id order-42-reminder
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Push {
        #[command(flatten)]
        message: super::push::PushArgs,
        #[command(flatten)]
        target: Target,
    },
    /// Show a message's state
    ///
    /// Examples:
    ///   delayq get 01M80K2AE02CJQBD3JZ9KCS0JC
    ///   delayq get order-42-reminder --json
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Get {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Cancel a scheduled message, or every one of a business key in a stream
    ///
    /// Examples:
    ///   delayq cancel order-42-reminder
    ///   delayq cancel order-42-reminder || [ $? -eq 4 ]   # already delivered is fine
    ///   delayq cancel --key order-42 --stream orders
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Cancel {
        #[arg(required_unless_present = "key", conflicts_with = "key")]
        id: Option<String>,
        /// Every pending message of this business key (in --stream) instead.
        #[arg(long, requires = "stream")]
        key: Option<String>,
        #[arg(long, requires = "key")]
        stream: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List a business key's messages in a stream: pending first, then finished
    ///
    /// Examples:
    ///   delayq key orders order-42
    ///   delayq key orders order-42 --after <next of the page before>
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Key {
        stream: String,
        key: String,
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
        #[command(flatten)]
        target: Target,
    },
    /// Move a scheduled message to a new due time (fields, priority and ttl stay).
    ///
    /// Examples:
    ///   delayq reschedule order-42-reminder --delay 1h
    ///   delayq reschedule order-42-reminder --at 2026-12-01T09:00:00Z
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Reschedule {
        id: String,
        /// New delay from now, e.g. 20m, 1500ms, 1h30m.
        #[arg(long, conflicts_with = "at", required_unless_present = "at")]
        delay: Option<String>,
        /// New absolute due time: epoch ms or RFC 3339.
        #[arg(long)]
        at: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Show what is scheduled, what is due next, recent lateness, the inbox and the leader
    ///
    /// Examples:
    ///   delayq stats
    ///   delayq stats --json | jq .pending.per_stream
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Stats {
        #[command(flatten)]
        target: Target,
    },
    /// Show who leads, as the instance at --url sees it
    ///
    /// Examples:
    ///   delayq leader
    ///   delayq leader --url http://10.0.0.7:7070 --json
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Leader {
        #[command(flatten)]
        target: Target,
    },
    /// Planned switchover: ask the leader (--url) to hand over to a standby.
    Resign {
        #[command(flatten)]
        target: Target,
    },
    /// Hand leadership to a chosen standby (or any), from any node
    ///
    /// Examples:
    ///   delayq switchover --to node-2
    ///   delayq switchover
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Switchover {
        /// The node to lead; left out: any standby.
        #[arg(long)]
        to: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List the nodes: role, epoch, API address, version, last seen
    #[command(after_help = EXIT_CODES)]
    Nodes {
        #[command(flatten)]
        target: Target,
    },
    /// Show a message's journey as the journal keeps it (with an id), or the
    /// leadership history: who led, from when to when, why it ended (without)
    ///
    /// Examples:
    ///   delayq history order-42-reminder
    ///   delayq history order-42-reminder --json
    ///   delayq history
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    History {
        /// A message id: its steps, oldest first (needs the journal).
        id: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List the next messages due, of every stream or one
    ///
    /// Examples:
    ///   delayq upcoming --limit 20
    ///   delayq upcoming --stream orders --after <next of the page before>
    #[command(after_help = EXIT_CODES, verbatim_doc_comment)]
    Upcoming {
        #[arg(long)]
        stream: Option<String>,
        #[arg(long)]
        after: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[command(flatten)]
        target: Target,
    },
    /// Pause forwarding to a stream: its messages wait, in due order
    #[command(after_help = EXIT_CODES)]
    Pause {
        stream: String,
        #[command(flatten)]
        target: Target,
    },
    /// Resume forwarding to a paused stream: what waited goes first, in due order
    #[command(after_help = EXIT_CODES)]
    Resume {
        stream: String,
        #[command(flatten)]
        target: Target,
    },
    /// Ask the node at --url to reread its configuration file (as SIGHUP does)
    #[command(after_help = EXIT_CODES)]
    Reload {
        #[command(flatten)]
        target: Target,
    },
}

/// Runs a client command; the exit code tells scripts what happened ([`EXIT_CODES`]).
pub async fn main(cmd: ClientCommand) -> ExitCode {
    match cmd {
        ClientCommand::Push { message, target } => {
            let body = super::push::body(message);
            let body = match body {
                Ok(body) => body,
                Err(why) => {
                    eprintln!("delayq: {why}");
                    return ExitCode::from(EXIT_REFUSED);
                }
            };
            call(&target, reqwest::Method::POST, "/v1/messages", Some(body)).await
        }
        ClientCommand::Get { id, target } => {
            let path = format!("/v1/messages/{}", encode(&id));
            call(&target, reqwest::Method::GET, &path, None).await
        }
        ClientCommand::Cancel {
            id,
            key,
            stream,
            target,
        } => {
            let path = match (id, key, stream) {
                (Some(id), _, _) => format!("/v1/messages/{}", encode(&id)),
                (None, Some(key), Some(stream)) => {
                    format!("/v1/streams/{}/keys/{}", encode(&stream), encode(&key))
                }
                _ => unreachable!("clap requires an id, or --key with --stream"),
            };
            call(&target, reqwest::Method::DELETE, &path, None).await
        }
        ClientCommand::Key {
            stream,
            key,
            after,
            limit,
            target,
        } => {
            let mut path = format!(
                "/v1/streams/{}/keys/{}?limit={limit}",
                encode(&stream),
                encode(&key)
            );
            if let Some(after) = after {
                path.push_str(&format!("&after={}", encode(&after)));
            }
            call(&target, reqwest::Method::GET, &path, None).await
        }
        ClientCommand::Reschedule {
            id,
            delay,
            at,
            target,
        } => {
            let Some((name, value)) = super::push::due_field(delay, at) else {
                eprintln!("delayq: give --delay or --at");
                return ExitCode::from(EXIT_REFUSED);
            };
            let body = json!({ name: value });
            let path = format!("/v1/messages/{}/reschedule", encode(&id));
            call(&target, reqwest::Method::POST, &path, Some(body)).await
        }
        ClientCommand::Stats { target } => {
            call_with(
                &target,
                reqwest::Method::GET,
                "/v1/stats",
                None,
                super::stats::print,
            )
            .await
        }
        ClientCommand::Leader { target } => {
            call(&target, reqwest::Method::GET, "/v1/leader", None).await
        }
        ClientCommand::Resign { target } => {
            call(&target, reqwest::Method::POST, "/v1/admin/resign", None).await
        }
        ClientCommand::Switchover { to, target } => {
            let body = match to {
                Some(to) => json!({ "to": to }),
                None => json!({}),
            };
            let path = "/v1/admin/switchover";
            call(&target, reqwest::Method::POST, path, Some(body)).await
        }
        ClientCommand::Nodes { target } => {
            call(&target, reqwest::Method::GET, "/v1/nodes", None).await
        }
        ClientCommand::History { id, target } => {
            let path = match id {
                Some(id) => format!("/v1/messages/{}/history", encode(&id)),
                None => "/v1/leadership/history".to_owned(),
            };
            call(&target, reqwest::Method::GET, &path, None).await
        }
        ClientCommand::Upcoming {
            stream,
            after,
            limit,
            target,
        } => {
            let mut path = format!("/v1/upcoming?limit={limit}");
            if let Some(stream) = stream {
                path += &format!("&stream={}", encode(&stream));
            }
            if let Some(after) = after {
                path += &format!("&after={}", encode(&after));
            }
            call(&target, reqwest::Method::GET, &path, None).await
        }
        ClientCommand::Pause { stream, target } => {
            let path = format!("/v1/streams/{}/pause", encode(&stream));
            call(&target, reqwest::Method::POST, &path, None).await
        }
        ClientCommand::Resume { stream, target } => {
            let path = format!("/v1/streams/{}/resume", encode(&stream));
            call(&target, reqwest::Method::POST, &path, None).await
        }
        ClientCommand::Reload { target } => {
            call(&target, reqwest::Method::POST, "/v1/admin/reload", None).await
        }
    }
}

/// Percent-encodes an id, a stream name or a query value as one URL component:
/// anything but unreserved characters and ':' is escaped, so the daemon sees (and
/// judges) the text as it is, rather than as another path or parameter.
pub(super) fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b':' | b'-' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

pub(super) async fn call(
    target: &Target,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> ExitCode {
    call_with(target, method, path, body, super::human::print).await
}

/// Sends one request (with the target's token, if any): the status and the JSON answer
/// (Null when it is not JSON), or the exit code of an unreachable daemon (on stderr).
pub(super) async fn send(
    target: &Target,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<(reqwest::StatusCode, Value), ExitCode> {
    let url = format!("{}{}", target.url.trim_end_matches('/'), path);
    let client = super::https::client(&url, target.ca_file.as_deref(), None).map_err(|e| {
        eprintln!("delayq: {e:#}");
        ExitCode::from(EXIT_REFUSED)
    })?;
    let mut req = client.request(method, &url);
    if let Some(token) = &target.token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.map_err(|e| {
        // With its causes ("certificate not valid for name", "connection refused").
        eprintln!("delayq: cannot reach {url}: {:#}", anyhow::Error::from(e));
        ExitCode::from(EXIT_UNREACHABLE)
    })?;
    let status = resp.status();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

/// Reports a refusal on stderr: the status, the error code and the detail.
pub(super) fn report_refusal(status: reqwest::StatusCode, answer: &Value) {
    eprintln!(
        "delayq: {} {}: {}",
        status.as_u16(),
        answer["error"].as_str().unwrap_or("error"),
        answer["detail"].as_str().unwrap_or("")
    );
}

/// Sends one request; prints the answer (`render` for people, raw with `--json`)
/// or the error, and turns the status into an exit code.
async fn call_with(
    target: &Target,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
    render: fn(&Value),
) -> ExitCode {
    let (status, value) = match send(target, method, path, body).await {
        Ok(answer) => answer,
        Err(code) => return code,
    };
    if target.json {
        println!("{value}");
    } else if status.is_success() {
        render(&value);
    } else {
        report_refusal(status, &value);
    }
    ExitCode::from(exit_code(status, &value))
}

/// The exit code of an answer: its status, and for a 409 its error code ([`EXIT_CODES`]).
pub(super) fn exit_code(status: reqwest::StatusCode, answer: &Value) -> u8 {
    match status.as_u16() {
        200..=299 => 0,
        401 | 403 => EXIT_UNAUTHORIZED,
        404 => EXIT_NOT_FOUND,
        409 if answer["error"] == "already_final" => EXIT_CONFLICT,
        409 => EXIT_NOT_NOW,
        429 | 500..=599 => EXIT_UNAVAILABLE,
        _ => EXIT_REFUSED,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn statuses_map_to_exit_codes() {
        for (status, error, code) in [
            (200, "", 0),
            (201, "", 0),
            (400, "bad_request", 1),
            (413, "too_large", 1),
            (422, "invalid_field", 1),
            (401, "missing_token", 5),
            (403, "insufficient_scope", 5),
            (404, "not_found", 3),
            (409, "already_final", 4),
            (409, "not_leader", 8),
            (409, "standalone", 8),
            (429, "overloaded", 6),
            (503, "unavailable", 6),
        ] {
            let status = reqwest::StatusCode::from_u16(status).unwrap();
            assert_eq!(
                super::exit_code(status, &json!({ "error": error })),
                code,
                "{status} {error}"
            );
        }
    }
}
