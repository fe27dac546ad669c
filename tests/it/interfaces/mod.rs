//! Producer and operator interfaces against real servers: the HTTP API (with
//! tokens, batches, stats, long polls), the inbox stream, and the `delayq` command.

mod api;
mod cli;
mod consume;
mod inbox;

use serde_json::Value;

use crate::support::Env;

/// The token tests configure when they want authentication.
pub const TOKEN: &str = "t0ken-for-tests";

/// Config sections for a daemon with a token and small limits, so every limit is
/// cheap to cross.
pub fn strict(extra: &str) -> String {
    format!(
        "[api]\nlisten = \"127.0.0.1:0\"\ntokens = [\"{TOKEN}\", \"second-token\"]\nmax_message_bytes = 1000\nmax_delay = \"1h\"\nmax_batch = 3\nmax_body_bytes = 4096\nmax_wait = \"5s\"\n\
         [streams]\nallow = [\"orders*\", \"jobs\"]\n{extra}"
    )
}

/// One request with an optional bearer token and raw body; the status and JSON answer
/// (Null when the answer is not JSON).
pub async fn request(
    env: &Env,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let resp = env.send(method, path, token, body).await;
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A synchronous connection to the test's Redis.
pub fn redis(env: &Env) -> redis::Connection {
    env.redis.client()
}
