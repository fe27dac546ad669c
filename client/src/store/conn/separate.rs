//! Connections apart from the shared one, for blocking reads (the inbox, HTTP long
//! polls, the drill's and the benchmark's reads of target streams).
//!
//! Through Sentinel such a connection follows the master as the shared one does:
//! a command finds it made again on the current master if the master moved since
//! it was made, and a command under way when the master moves (a read blocked on
//! the old master) is given up there and sent to the new one, or ends with
//! [`master_moved`] for a caller that sends it again itself, changed (a long
//! poll's wait, shortened by what has passed). A master demoted in
//! a planned failover goes on answering until Sentinel makes it a replica, seconds
//! or, on a loaded machine, minutes later: reads left on it would find nothing of
//! what is written meanwhile.

use super::*;

/// A connection apart from the shared one: to the one node (following the master
/// through Sentinel), or a cluster connection of its own.
#[derive(Clone)]
pub struct Separate {
    link: Apart,
    /// Through Sentinel: how to make it again on a new master.
    follow: Option<Following>,
}

#[derive(Clone)]
enum Apart {
    Node(redis::aio::MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// What a separate connection needs to follow the master through Sentinel.
#[derive(Clone)]
struct Following {
    /// The shared connection, which knows where the master is.
    shared: Conn,
    /// The master's generation (see `Current::generation`) this one was made at.
    generation: u64,
    config: redis::AsyncConnectionConfig,
    /// A command under way when the master moves ends with [`master_moved`]
    /// instead of being sent to the new master.
    interrupted: bool,
}

/// What a command under way on a [`Separate::interrupted_by_moves`] connection
/// ends with when the master moves: the next command goes to the new master.
const MOVED: &str = "the Redis master moved while the command was under way";

/// Whether `error` is a command given up because the master moved (see
/// [`Separate::interrupted_by_moves`]).
pub(in crate::store) fn master_moved(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Io && error.detail() == Some(MOVED)
}

impl Conn {
    /// A connection apart from this one for blocking reads, without a response
    /// timeout (`config` says so for one node): to the current node, or a cluster
    /// connection.
    pub(in crate::store) async fn separate_any(
        &self,
        config: &redis::AsyncConnectionConfig,
    ) -> redis::RedisResult<Separate> {
        if let Some(cluster) = &self.cluster {
            // The cluster connection wants a timeout: a day is none.
            let c = ClusterConfig::new().set_response_timeout(Duration::from_secs(24 * 3600));
            return Ok(Separate {
                link: Apart::Cluster(cluster.client.get_async_connection_with_config(c).await?),
                follow: None,
            });
        }
        let (link, generation) = self.separate_at(config).await?;
        let link = Apart::Node(link);
        let follow = self.sentinel.is_some().then(|| Following {
            shared: self.clone(),
            generation,
            config: config.clone(),
            interrupted: false,
        });
        Ok(Separate { link, follow })
    }
}

impl Separate {
    /// This connection, whose commands under way when the master moves end with
    /// [`master_moved`] instead of being sent to the new master.
    pub(in crate::store) fn interrupted_by_moves(mut self) -> Separate {
        if let Some(follow) = &mut self.follow {
            follow.interrupted = true;
        }
        self
    }

    /// After a command was given up because the master moved: the error, or
    /// None to send it again.
    fn given_up(&self) -> Option<redis::RedisError> {
        let interrupted = self.follow.as_ref().is_some_and(|f| f.interrupted);
        tracing::debug!(
            generation = self.follow.as_ref().map(|f| f.generation),
            interrupted,
            "the Redis master moved while a command was under way on a separate connection: given up there"
        );
        interrupted.then(|| {
            redis::RedisError::from((redis::ErrorKind::Io, "master moved", MOVED.to_owned()))
        })
    }

    /// Made again on the current master if the master moved since it was made.
    async fn at_master(&mut self) -> redis::RedisResult<()> {
        let Some(follow) = &mut self.follow else {
            return Ok(());
        };
        if follow.shared.generation() == follow.generation {
            return Ok(());
        }
        let (link, generation) = follow.shared.separate_at(&follow.config).await?;
        self.link = Apart::Node(link);
        tracing::debug!(
            from = follow.generation,
            to = generation,
            "the Redis master moved: a separate connection made again there"
        );
        follow.generation = generation;
        Ok(())
    }

    /// Resolves once the master has moved from the one this connection is made to
    /// (never on one Redis or Redis Cluster).
    fn moved(&self) -> impl Future<Output = ()> + use<> {
        let watched = self
            .follow
            .as_ref()
            .and_then(|f| Some((f.shared.master_changes()?, f.generation)));
        async move {
            match watched {
                Some((mut changes, generation)) => {
                    // The count of changes is the generation, counted after it
                    // (`Conn::move_to`).
                    if changes.wait_for(|(n, _)| *n > generation).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn connection(&mut self) -> &mut dyn ConnectionLike {
        match &mut self.link {
            Apart::Node(c) => c,
            Apart::Cluster(c) => c,
        }
    }
}

impl ConnectionLike for Separate {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            loop {
                self.at_master().await?;
                let moved = self.moved();
                tokio::select! {
                    answer = self.connection().req_packed_command(cmd) => return answer,
                    () = moved => if let Some(e) = self.given_up() { return Err(e) },
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            loop {
                self.at_master().await?;
                let moved = self.moved();
                tokio::select! {
                    answer = self.connection().req_packed_commands(pipeline, offset, count) => return answer,
                    () = moved => if let Some(e) = self.given_up() { return Err(e) },
                }
            }
        })
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Apart::Node(c) => c.get_db(),
            Apart::Cluster(_) => 0,
        }
    }
}
