//! Subcommands that talk to a running daemon over HTTP.

use std::io::Read;
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
    url: String,
    /// Print the raw JSON answer.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Schedule a message.
    ///
    /// Examples:
    ///   delayq push orders 'order 42 reminder' --delay 20m
    ///   delayq push orders --field order=42 --field kind=reminder --at 2026-12-01T09:00:00Z
    ///   echo '{"a":1}' | delayq push orders - --delay 1h --id order-42-reminder
    Push {
        stream: String,
        /// Payload (the one field `payload`); `-` reads it from stdin.
        payload: Option<String>,
        /// A field, as name=value (repeatable, kept in order); instead of a payload.
        #[arg(long = "field", short = 'f', value_name = "NAME=VALUE")]
        fields: Vec<String>,
        /// Delay, e.g. 20m, 1500ms, 1h30m.
        #[arg(long, conflicts_with = "at")]
        delay: Option<String>,
        /// Absolute due time: epoch ms or RFC 3339.
        #[arg(long)]
        at: Option<String>,
        #[arg(long)]
        id: Option<String>,
        #[arg(long, default_value_t = 0)]
        priority: u8,
        /// Give up delivering after due time plus this (e.g. 1h).
        #[arg(long)]
        ttl: Option<String>,
        /// Overwrite a message with the same id instead of reporting a duplicate.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Show a message's state.
    Get {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Cancel a scheduled message.
    Cancel {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Show who leads: node, address, epoch, lease time left.
    Leader {
        #[command(flatten)]
        target: Target,
    },
    /// Planned switchover: ask the leader (--url) to hand over to a standby.
    Resign {
        #[command(flatten)]
        target: Target,
    },
}

/// Exit codes: 0 done, 1 refused or not found, 2 cannot reach delayq.
pub async fn main(cmd: ClientCommand) -> ExitCode {
    match cmd {
        ClientCommand::Push {
            stream,
            payload,
            fields,
            delay,
            at,
            id,
            priority,
            ttl,
            replace,
            target,
        } => {
            let mut body = json!({ "stream": stream, "priority": priority, "replace": replace });
            match (payload, fields.is_empty()) {
                (Some(p), true) => {
                    let text = if p == "-" {
                        let mut s = String::new();
                        if let Err(e) = std::io::stdin().read_to_string(&mut s) {
                            eprintln!("delayq: reading stdin: {e}");
                            return ExitCode::from(1);
                        }
                        s
                    } else {
                        p
                    };
                    body["payload"] = Value::String(text);
                }
                (None, false) => {
                    let mut pairs = Vec::new();
                    for f in &fields {
                        let Some((k, v)) = f.split_once('=') else {
                            eprintln!("delayq: --field {f:?}: write it as name=value");
                            return ExitCode::from(1);
                        };
                        pairs.push(json!([k, v]));
                    }
                    body["fields"] = Value::Array(pairs);
                }
                _ => {
                    eprintln!("delayq: give a payload or --field name=value (not both)");
                    return ExitCode::from(1);
                }
            }
            match (delay, at) {
                (Some(d), _) => body["delay"] = Value::String(d),
                (None, Some(a)) => {
                    body["deliver_at"] = a
                        .parse::<u64>()
                        .map(Value::from)
                        .unwrap_or(Value::String(a));
                }
                (None, None) => body["delay_ms"] = Value::from(0),
            }
            if let Some(id) = id {
                body["id"] = Value::String(id);
            }
            if let Some(ttl) = ttl {
                body["ttl"] = Value::String(ttl);
            }
            call(&target, reqwest::Method::POST, "/v1/messages", Some(body)).await
        }
        ClientCommand::Get { id, target } => {
            call(
                &target,
                reqwest::Method::GET,
                &format!("/v1/messages/{id}"),
                None,
            )
            .await
        }
        ClientCommand::Cancel { id, target } => {
            call(
                &target,
                reqwest::Method::DELETE,
                &format!("/v1/messages/{id}"),
                None,
            )
            .await
        }
        ClientCommand::Leader { target } => {
            call(&target, reqwest::Method::GET, "/v1/leader", None).await
        }
        ClientCommand::Resign { target } => {
            call(&target, reqwest::Method::POST, "/v1/admin/resign", None).await
        }
    }
}

async fn call(
    target: &Target,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> ExitCode {
    let url = format!("{}{}", target.url.trim_end_matches('/'), path);
    let client = reqwest::Client::new();
    let mut req = client.request(method, &url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => {
            eprintln!("delayq: cannot reach {url}: {e}");
            return ExitCode::from(2);
        }
    };
    let status = resp.status();
    let value: Value = resp.json().await.unwrap_or(Value::Null);
    if target.json {
        println!("{value}");
    } else if status.is_success() {
        print_human(&value);
    } else {
        eprintln!(
            "delayq: {} {}: {}",
            status.as_u16(),
            value["error"].as_str().unwrap_or("error"),
            value["detail"].as_str().unwrap_or("")
        );
    }
    if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_human(value: &Value) {
    if let Value::Object(map) = value {
        for (k, v) in map {
            match v {
                Value::String(s) => println!("{k}: {s}"),
                other => println!("{k}: {other}"),
            }
        }
    } else {
        println!("{value}");
    }
}
