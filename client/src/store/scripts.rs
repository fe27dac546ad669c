//! The Lua scripts, and how a call of one reaches Redis.
//!
//! Each script is the prelude (the parts of `lua/prelude/`, joined in their names'
//! order, each opening with what it gives) followed by its own body. Sent as
//! `EVALSHA`, every call first defines the prelude's seventy-odd functions again:
//! about 6 µs of Redis time when calls come back to back, and a median 15 µs (mean
//! 26 µs) when they come one at a time among other work (measured during a spread
//! of 1000 msg/s). So where
//! Redis allows it (Redis 7 and an ACL user that may run `FUNCTION LOAD` and
//! `FCALL`), all scripts are one library of Redis Functions, loaded the first time
//! a call finds it missing, and a call is an `FCALL` that defines nothing.
//! Elsewhere, or once Redis has refused the library, calls are `EVALSHA` (`SCRIPT
//! LOAD` on `NOSCRIPT`) as before; the scripts behave the same either way.
//!
//! The library's name and its functions' names carry a hash of its text, so that
//! daemons and producers of different versions never call each other's. A
//! library lost with Redis's data, removed by `FUNCTION FLUSH`, or missing from a
//! Redis Cluster master that joined later is loaded again by the first call that
//! finds it missing (`FUNCTION LOAD REPLACE` goes to every master).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError, RedisResult, Script, ToRedisArgs};

mod sources;
pub(super) use sources::Scripts;
use sources::{Kind, SOURCES};

/// Defines PRELUDE, the parts of `lua/prelude/` joined in their names' order, each
/// using what the ones before it define, and (for the test that holds it to the
/// folder) the list of its parts.
macro_rules! prelude {
    ($first:literal $(, $part:literal)* $(,)?) => {
        /// The prelude: the parts of `lua/prelude/` joined in their names' order.
        pub(super) const PRELUDE: &str = concat!(
            include_str!(concat!("lua/prelude/", $first))
            $(, "\n", include_str!(concat!("lua/prelude/", $part)))*
        );
        /// The prelude's parts, in the order they are joined.
        #[cfg(test)]
        const PRELUDE_PARTS: &[&str] = &[$first $(, $part)*];
    };
}
prelude!(
    "10-calls.lua",
    "15-inbox.lua",
    "20-body.lua",
    "30-call.lua",
    "35-finished.lua",
    "40-records.lua",
    "50-held.lua",
    "60-pending.lua",
    "70-admit.lua",
    "80-keys.lua",
);

/// The prelude's tables that hold what one call has read (id hashes, record
/// generations, pending states): an `EVALSHA` starts each empty, and so must each
/// function call, or one call would act on what an earlier one read.
const PER_CALL_CACHES: [&str; 6] = [
    "call_epoch",
    "id_hashes",
    "generations_of",
    "hash_layout_in_use",
    "pending_states",
    "key_indexes",
];

/// The library: its name, and its text for `FUNCTION LOAD`.
struct LibraryText {
    /// `delayq_<hash>`; its functions are `delayq_<hash>_<script>`.
    name: String,
    text: String,
}

static LIBRARY: LazyLock<LibraryText> = LazyLock::new(|| {
    let mut body = String::from(PRELUDE);
    body.push_str("\nlocal function delayq_fresh_call()\n  ");
    body.push_str(&PER_CALL_CACHES.join(", "));
    body.push_str(" = ");
    body.push_str(&vec!["{}"; PER_CALL_CACHES.len()].join(", "));
    body.push_str("\nend\n");
    let hash = Script::new(&format!("{body}{SOURCES:?}")).get_hash()[..16].to_string();
    let name = format!("delayq_{hash}");
    for (script, source, kind) in SOURCES {
        let flags = match kind {
            Kind::Reads => "'no-writes'",
            Kind::Writes => "",
            Kind::Frees => "'allow-oom'",
        };
        body.push_str(&format!(
            "redis.register_function{{function_name = '{name}_{script}', flags = {{ {flags} }}, \
             callback = function(KEYS, ARGV)\ndelayq_fresh_call()\n{source}\nend}}\n"
        ));
    }
    LibraryText {
        text: format!("#!lua name={name}\n{body}"),
        name,
    }
});

/// The name of this build's library.
pub(super) fn library_name() -> &'static str {
    &LIBRARY.name
}

/// Whether `name` is the name of a library of delayq's, this build's or another
/// version's: `delayq_` and sixteen hex digits.
pub(super) fn is_library_name(name: &str) -> bool {
    name.strip_prefix("delayq_").is_some_and(|hash| {
        hash.len() == 16
            && hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Whether calls go as `FCALL`, shared by one store's scripts. It starts on, and
/// goes off for good once Redis has refused the library or `FCALL` (the reason
/// is logged once).
#[derive(Debug)]
pub(super) struct Functions {
    on: AtomicBool,
}

impl Functions {
    fn refused(&self, error: &RedisError) {
        if self.on.swap(false, Ordering::Relaxed) {
            tracing::info!(
                error = %error,
                "Redis does not run delayq's function library here: scripts go as EVALSHA"
            );
        }
    }

    /// Whether calls go as `FCALL` now.
    fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
}

/// One script.
pub(super) struct Lua {
    script: Script,
    /// Its function in the library.
    function: String,
    functions: Arc<Functions>,
}

impl Lua {
    /// A call of this script; add keys and arguments, then `invoke_async`.
    pub(super) fn prepare_invoke(&self) -> Call<'_> {
        Call {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// A call with its first key.
    pub(super) fn key<T: ToRedisArgs>(&self, key: T) -> Call<'_> {
        let mut call = self.prepare_invoke();
        call.key(key);
        call
    }
}

impl Functions {
    /// On until Redis refuses.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Functions {
            on: AtomicBool::new(true),
        })
    }
}

/// The script `lua/<name>.lua`, switched between `FCALL` and `EVALSHA` by `functions`.
pub(super) fn lua(name: &str, functions: &Arc<Functions>) -> Lua {
    let (_, source, _) = SOURCES
        .iter()
        .find(|(n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("no script {name}"));
    Lua {
        script: Script::new(&format!("{PRELUDE}\n{source}")),
        function: format!("{}_{name}", LIBRARY.name),
        functions: functions.clone(),
    }
}

/// One call of a script being built: its keys and arguments.
pub(super) struct Call<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call<'_> {
    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// Runs the call: as `FCALL` while the library is usable (loading it when
    /// Redis does not have it), else as `EVALSHA` (loading the script when Redis
    /// does not have it).
    pub(super) async fn invoke_async<T: FromRedisValue, C: ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> RedisResult<T> {
        let (reply, _) = self.invoke_with(conn, None).await?;
        Ok(redis::from_redis_value(reply)?)
    }

    /// Runs the call and `WAIT wanted timeout` right behind it, as one pipeline on
    /// one connection, so that the replicas are counted of the very master that
    /// ran the call (WAIT counts the writes of the connection it comes on). On
    /// Redis Cluster the pipeline goes where the call's key lives, and a
    /// redirection sends both again to the node named. The call's reply, and how
    /// many replicas confirmed: none when WAIT failed (a replica answering, a
    /// master demoted meanwhile).
    pub(super) async fn invoke_then_wait<C: ConnectionLike>(
        &self,
        conn: &mut C,
        wanted: u32,
        timeout: std::time::Duration,
    ) -> RedisResult<(redis::Value, u32)> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(wanted).arg(timeout.as_millis() as u64);
        let (reply, waited) = self.invoke_then(conn, &wait).await?;
        let acked = match waited {
            redis::Value::Int(n) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
            _ => 0,
        };
        Ok((reply, acked))
    }

    /// Runs the call and `behind` right after it, as one pipeline on one
    /// connection: the call's reply (an error reply fails it) and `behind`'s (an
    /// error reply as a value).
    pub(super) async fn invoke_then<C: ConnectionLike>(
        &self,
        conn: &mut C,
        behind: &redis::Cmd,
    ) -> RedisResult<(redis::Value, redis::Value)> {
        let (reply, behind) = self.invoke_with(conn, Some(behind)).await?;
        Ok((reply, behind.unwrap_or(redis::Value::Nil)))
    }

    /// The one way a call is sent (see [`Call::invoke_async`]), with a command
    /// behind it when given (see [`Call::invoke_then`]): a library Redis does not have is loaded
    /// once, a library it refuses sends this and later calls as `EVALSHA`, and a
    /// script it does not have is loaded once.
    async fn invoke_with<C: ConnectionLike>(
        &self,
        conn: &mut C,
        behind: Option<&redis::Cmd>,
    ) -> RedisResult<(redis::Value, Option<redis::Value>)> {
        let functions = &self.lua.functions;
        let mut fcall = functions.on();
        let (mut library_loaded, mut script_loaded) = (false, false);
        loop {
            let cmd = if fcall {
                self.fcall_cmd()
            } else {
                self.evalsha_cmd()
            };
            let error = match send(conn, cmd, behind).await {
                Ok(done) => return Ok(done),
                Err(e) => e,
            };
            if fcall && !library_loaded && says(&error, "Function not found") {
                library_loaded = true;
                match load(conn).await {
                    Ok(()) => {}
                    Err(e) if refusal(&e) => {
                        functions.refused(&e);
                        fcall = false;
                    }
                    // A Redis at `maxmemory` takes no library, but still runs a
                    // script that reads or frees: this call goes as `EVALSHA`.
                    Err(e) if e.code() == Some("OOM") => fcall = false,
                    Err(e) => return Err(e),
                }
            } else if fcall && !library_loaded && refusal(&error) {
                functions.refused(&error);
                fcall = false;
            } else if !fcall && !script_loaded && error.code() == Some("NOSCRIPT") {
                script_loaded = true;
                self.lua.script.load_async(conn).await?;
            } else {
                return Err(error);
            }
        }
    }

    fn fcall_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&self.lua.function)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    fn evalsha_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.lua.script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

/// `cmd` alone, or with `WAIT wanted timeout` behind it in one pipeline: its
/// reply, and with the WAIT how many replicas confirmed (0 when WAIT failed).
async fn send<C: ConnectionLike>(
    conn: &mut C,
    cmd: redis::Cmd,
    behind: Option<&redis::Cmd>,
) -> RedisResult<(redis::Value, Option<redis::Value>)> {
    let Some(behind) = behind else {
        return Ok((cmd.query_async(conn).await?, None));
    };
    let mut pipe = redis::pipe();
    pipe.add_command(cmd);
    pipe.add_command(behind.clone());
    let mut replies = conn.req_packed_commands(&pipe, 0, 2).await?.into_iter();
    let (Some(reply), Some(second)) = (replies.next(), replies.next()) else {
        return Err(RedisError::from((
            redis::ErrorKind::Parse,
            "two replies were expected: the call's and the command's behind it",
        )));
    };
    if let redis::Value::ServerError(e) = reply {
        return Err(RedisError::from(e));
    }
    Ok((reply, Some(second)))
}

/// Loads the library (on Redis Cluster, into every master).
async fn load<C: ConnectionLike>(conn: &mut C) -> RedisResult<()> {
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&LIBRARY.text)
        .query_async(conn)
        .await?;
    tracing::debug!(library = %LIBRARY.name, "loaded delayq's function library");
    Ok(())
}

/// Whether Redis will never run the library here: too old for functions, an ACL
/// user that may not load or call them, or a library it cannot compile. Anything
/// else (a connection lost, a failover, a master down) is tried again next call.
fn refusal(error: &RedisError) -> bool {
    error.code() == Some("NOPERM")
        || says(error, "unknown command")
        || says(error, "Error compiling")
        || says(error, "Error registering")
}

fn says(error: &RedisError, what: &str) -> bool {
    error.to_string().contains(what)
}

/// A redis-server of its own with `body` loaded after the prelude as one script, as
/// `EVALSHA` sends it: the server (stopped on drop), a connection for the calls of a
/// property test (in a `RefCell`: its cases borrow it in turn), and the script's
/// SHA. For tests of the prelude's functions in Redis.
#[cfg(test)]
pub(super) fn prelude_lab(
    body: &str,
) -> (
    delayq_harness::RedisServer,
    std::cell::RefCell<redis::Connection>,
    String,
) {
    let redis = delayq_harness::RedisServer::start().expect("start redis-server");
    let mut conn = redis.client();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(format!("{PRELUDE}\n{body}"))
        .query(&mut conn)
        .unwrap();
    (redis, std::cell::RefCell::new(conn), sha)
}

#[cfg(test)]
mod prelude_shortcuts;

#[cfg(test)]
mod tests {
    use super::*;

    /// The prelude joins every part of `lua/prelude/`, in their names' order, and each
    /// part opens with its name and what it gives.
    #[test]
    fn the_prelude_is_every_part_in_order() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/lua/prelude");
        let mut files: Vec<String> = std::fs::read_dir(&folder)
            .expect("read the prelude's folder")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.ends_with(".lua"))
            .collect();
        files.sort();
        assert_eq!(files, PRELUDE_PARTS);
        let mut joined = Vec::new();
        for name in PRELUDE_PARTS {
            let text = std::fs::read_to_string(folder.join(name)).expect("read a part");
            assert!(
                text.starts_with(&format!("-- {name}: ")),
                "{name} opens with its name and what it gives"
            );
            joined.push(text);
        }
        assert_eq!(PRELUDE, joined.join("\n"));
    }

    /// The caches the library empties before each call are exactly the prelude's
    /// top-level tables: one added to the prelude must be added here.
    #[test]
    fn every_top_level_table_of_the_prelude_is_emptied_per_call() {
        let tables: Vec<&str> = PRELUDE
            .lines()
            .filter_map(|l| l.strip_prefix("local "))
            .filter_map(|l| l.strip_suffix(" = {}"))
            .collect();
        assert_eq!(tables, PER_CALL_CACHES);
    }

    /// Each script is a function of the library, named with its hash, flagged by
    /// its kind; only the library's first line names it.
    /// Every script compiles as `EVALSHA` sends it (the prelude and the script as one
    /// chunk), in a real Redis: its Lua allows a chunk at most 200 locals at once, a
    /// limit the library's functions (a function each) never come near, so only this
    /// mode can pass it, and a script that does is refused for good.
    #[test]
    fn every_script_compiles_as_eval() {
        let redis = delayq_harness::RedisServer::start().expect("start redis-server");
        let mut conn = redis.client();
        for (name, source, _) in SOURCES {
            let loaded: redis::RedisResult<String> = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(format!("{PRELUDE}\n{source}"))
                .query(&mut conn);
            assert!(loaded.is_ok(), "{name}: {loaded:?}");
        }
    }

    #[test]
    fn the_library_registers_every_script_once() {
        let lib = &*LIBRARY;
        assert!(lib.text.starts_with(&format!("#!lua name={}\n", lib.name)));
        assert_eq!(lib.name.len(), "delayq_".len() + 16);
        for (name, _, kind) in SOURCES {
            let registered = format!("function_name = '{}_{name}',", lib.name);
            assert_eq!(lib.text.matches(&registered).count(), 1, "{name}");
            let flags = match kind {
                Kind::Reads => "flags = { 'no-writes' }",
                Kind::Writes => "flags = {  }",
                Kind::Frees => "flags = { 'allow-oom' }",
            };
            assert!(
                lib.text.contains(&format!("{registered} {flags}")),
                "{name}"
            );
        }
        let functions = Functions::new();
        for (name, _, _) in SOURCES {
            assert_eq!(
                lua(name, &functions).function,
                format!("{}_{name}", lib.name)
            );
        }
    }

    /// This build's library is recognised as delayq's, and so is another
    /// version's; names that only start like one are someone else's.
    #[test]
    fn library_names_of_delayq_and_of_others() {
        assert!(is_library_name(library_name()));
        assert!(is_library_name("delayq_0123456789abcdef"));
        for other in [
            "delayq_",
            "delayq_mine",
            "delayq_0123456789abcde",
            "delayq_0123456789abcdef0",
            "delayq_0123456789ABCDEF",
            "Delayq_0123456789abcdef",
            "x_delayq_0123456789abcdef",
        ] {
            assert!(!is_library_name(other), "{other}");
        }
    }
}
