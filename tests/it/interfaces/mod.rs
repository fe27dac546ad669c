//! Producer and operator interfaces against real servers: the HTTP API (with
//! tokens, batches, stats, long polls; in a process of its own and in-process, `api`
//! and `in_process`), its hygiene (`http`: load shedding, timeouts, access log), the
//! inbox stream and its poison entries (`inbox`, `poison`), bad input (`refusals`),
//! the `delayq` command (`cli`), business keys through all of them (`keys`), and
//! recurring schedules over HTTP (`schedules`).

mod api;
mod cli;
mod consume;
mod finished;
mod http;
mod in_process;
mod inbox;
mod keys;
mod poison;
mod refusals;
mod schedules;

/// The token tests configure when they want authentication.
pub const TOKEN: &str = "t0ken-for-tests";

/// The token, as the requests of a table of cases send it.
pub const T: Option<&str> = Some(TOKEN);

/// Config sections for a daemon with a token and small limits, so every limit is
/// cheap to cross.
pub fn strict(extra: &str) -> String {
    format!(
        "[api]\nlisten = \"127.0.0.1:0\"\ntokens = [\"{TOKEN}\", \"second-token\"]\nmax_message_bytes = 1000\nmax_delay = \"1h\"\nmax_batch = 3\nmax_body_bytes = 4096\nmax_wait = \"5s\"\n\
         [streams]\nallow = [\"orders*\", \"jobs\"]\n{extra}"
    )
}

/// Runs the `delayq` command against `env`'s daemon with [`TOKEN`]: its exit code,
/// and what it printed (stdout when it succeeded, stderr when not).
pub async fn delayq_says(env: &crate::support::Env, args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(crate::support::delayq_bin())
        .args(args)
        .env("DELAYQ_URL", env.url(""))
        .env("DELAYQ_TOKEN", TOKEN)
        .output()
        .await
        .expect("run delayq");
    let said = if out.status.success() {
        &out.stdout
    } else {
        &out.stderr
    };
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(said).into_owned(),
    )
}
