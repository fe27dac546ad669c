//! `delayq schedule add|list|get|rm|pause|resume`: recurring schedules, through a
//! running daemon's HTTP API.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Target, call, encode};

#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Create a recurring schedule.
    ///
    /// Examples:
    ///   delayq schedule add orders 'nightly report' --cron '0 3 * * *' --timezone Europe/Berlin --id nightly
    ///   delayq schedule add jobs -f kind=ping --every 15m --misfire once
    #[command(verbatim_doc_comment)]
    Add {
        #[command(flatten)]
        schedule: Box<AddArgs>,
        #[command(flatten)]
        target: Target,
    },
    /// List every schedule with its next occurrences.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Show a schedule, its next five occurrences and the last one made.
    Get {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Delete a schedule (the occurrences it made ahead are withdrawn).
    Rm {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Pause a schedule: no occurrence until it is resumed.
    Pause {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Resume a paused schedule, from now on.
    Resume {
        id: String,
        #[command(flatten)]
        target: Target,
    },
}

/// A new schedule's message and timing, as `POST /v1/schedules` takes them.
#[derive(Args, Debug)]
pub struct AddArgs {
    stream: String,
    /// Payload (the one field `payload`).
    payload: Option<String>,
    /// A field, as name=value (repeatable); instead of a payload.
    #[arg(long = "field", short = 'f', value_name = "NAME=VALUE")]
    fields: Vec<String>,
    #[arg(long)]
    id: Option<String>,
    /// A cron expression: 5 fields, or 6 with seconds first.
    #[arg(long, conflicts_with = "every", required_unless_present = "every")]
    cron: Option<String>,
    /// The IANA zone of --cron (default UTC).
    #[arg(long, requires = "cron")]
    timezone: Option<String>,
    /// Instead of --cron: every this long (at least 1s), e.g. 15m.
    #[arg(long)]
    every: Option<String>,
    /// skip (default), once or all.
    #[arg(long)]
    misfire: Option<String>,
    #[arg(long)]
    max_catch_up: Option<u32>,
    /// Each occurrence due up to this much later.
    #[arg(long)]
    jitter: Option<String>,
    /// The business key of each occurrence's message.
    #[arg(long)]
    key: Option<String>,
}

impl AddArgs {
    fn body(self) -> Result<Value, String> {
        let mut body = json!({ "stream": self.stream });
        super::push::message_part(&mut body, self.payload, &self.fields)?;
        for (name, given) in [
            ("id", self.id),
            ("cron", self.cron),
            ("timezone", self.timezone),
            ("every", self.every),
            ("misfire", self.misfire),
            ("jitter", self.jitter),
            ("key", self.key),
        ] {
            if let Some(given) = given {
                body[name] = Value::String(given);
            }
        }
        if let Some(n) = self.max_catch_up {
            body["max_catch_up"] = json!(n);
        }
        Ok(body)
    }
}

pub async fn main(cmd: ScheduleCommand) -> ExitCode {
    use reqwest::Method;
    let path = |id: &str, tail: &str| format!("/v1/schedules/{}{tail}", encode(id));
    match cmd {
        ScheduleCommand::Add { schedule, target } => match schedule.body() {
            Ok(body) => call(&target, Method::POST, "/v1/schedules", Some(body)).await,
            Err(why) => {
                eprintln!("delayq: {why}");
                ExitCode::from(1)
            }
        },
        ScheduleCommand::List { target } => call(&target, Method::GET, "/v1/schedules", None).await,
        ScheduleCommand::Get { id, target } => {
            call(&target, Method::GET, &path(&id, ""), None).await
        }
        ScheduleCommand::Rm { id, target } => {
            call(&target, Method::DELETE, &path(&id, ""), None).await
        }
        ScheduleCommand::Pause { id, target } => {
            call(&target, Method::POST, &path(&id, "/pause"), None).await
        }
        ScheduleCommand::Resume { id, target } => {
            call(&target, Method::POST, &path(&id, "/resume"), None).await
        }
    }
}
